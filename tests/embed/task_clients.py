"""Drive #52's routes with the real clients users have, for
tests/embed_tasks.rs: the `cohere` package's Client.rerank (v1) and
ClientV2.rerank (v2) against a reranker, huggingface_hub's
InferenceClient.text_classification against a classifier and
sentence_similarity against an embedder.

    python task_clients.py cohere BASE_URL QUERY TEXT...
    python task_clients.py classify BASE_URL TEXT
    python task_clients.py similarity BASE_URL SOURCE SENTENCE...

Prints one JSON object of what the client parsed, for the test to check
against the reference.
"""

import json
import sys


def cohere_rerank(base, query, texts):
    import cohere

    out = {}
    # v1's results carry the document when asked; v2's (cohere 7) have no
    # such field, nor the parameter.
    v1 = cohere.Client(api_key="unused", base_url=base)
    r = v1.rerank(
        model="rerank-v3.5", query=query, documents=texts, top_n=1, return_documents=True
    )
    out["v1"] = {
        "id": r.id,
        "results": [
            [x.index, x.relevance_score, x.document.text if x.document else None]
            for x in r.results
        ],
        "version": r.meta.api_version.version if r.meta and r.meta.api_version else None,
    }
    v2 = cohere.ClientV2(api_key="unused", base_url=base)
    r = v2.rerank(model="rerank-v3.5", query=query, documents=texts)
    out["v2"] = {
        "id": r.id,
        "results": [[x.index, x.relevance_score, None] for x in r.results],
        "version": r.meta.api_version.version if r.meta and r.meta.api_version else None,
    }
    # A mistake: the client raises its 400 exception, with the message.
    try:
        v2.rerank(model="m", query=query, documents=[])
        out["empty"] = None
    except cohere.BadRequestError as e:
        out["empty"] = {"status": e.status_code, "body": e.body}
    return out


def classify(base, text):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=base)
    return {
        "labels": [[x.label, x.score] for x in client.text_classification(text, top_k=None)]
    }


def similarity(base, source, sentences):
    from huggingface_hub import InferenceClient

    client = InferenceClient(base_url=base)
    return {"cosines": list(client.sentence_similarity(source, other_sentences=sentences))}


def main():
    mode, base, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if mode == "cohere":
        out = cohere_rerank(base, rest[0], rest[1:])
    elif mode == "classify":
        out = classify(base, rest[0])
    else:
        out = similarity(base, rest[0], rest[1:])
    print(json.dumps(out))


if __name__ == "__main__":
    main()
