"""Drive one server of several models with the real clients users have,
for tests/embed_models.rs: the `openai` package (embeddings with `model=`,
and `models.list()`), huggingface_hub's InferenceClient with the model's
`/models/{name}` as its base URL, and the `cohere` package's rerank with
`model=`.

    python models_clients.py openai BASE_URL MODEL TEXT...
    python models_clients.py hf BASE_URL MODEL TEXT...
    python models_clients.py cohere BASE_URL MODEL QUERY TEXT...
    python models_clients.py list BASE_URL
    python models_clients.py unknown BASE_URL EMBEDDER RERANKER

Prints one JSON object of what the client parsed, for the test to check
against the reference.
"""

import json
import sys


def openai_client(base):
    from openai import OpenAI

    return OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)


def openai_embed(base, model, texts):
    r = openai_client(base).embeddings.create(model=model, input=texts, encoding_format="float")
    return {"model": r.model, "vectors": [d.embedding for d in r.data]}


def hf_embed(base, model, texts):
    from huggingface_hub import InferenceClient

    hf = InferenceClient(base_url=f"{base}/models/{model}")
    return {"vectors": [hf.feature_extraction(t).reshape(-1).tolist() for t in texts]}


def cohere_rerank(base, model, query, texts):
    import cohere

    r = cohere.ClientV2(api_key="unused", base_url=base).rerank(
        model=model, query=query, documents=texts
    )
    return {"results": [[x.index, x.relevance_score] for x in r.results]}


def models_list(base):
    return {"ids": [m.id for m in openai_client(base).models.list()]}


def unknown(base, embedder, reranker):
    """The clients' exceptions for a model that is not served, and for a
    model of the wrong kind."""
    import cohere
    import openai

    out = {}
    client = openai_client(base)
    for key, model in [("openai_unknown", "gpt-x"), ("openai_wrong_kind", reranker)]:
        try:
            client.embeddings.create(model=model, input="a")
            out[key] = None
        except openai.APIStatusError as e:
            out[key] = {"type": type(e).__name__, "status": e.status_code, "body": e.body}
    v2 = cohere.ClientV2(api_key="unused", base_url=base)
    for key, model in [("cohere_unknown", "rerank-x"), ("cohere_wrong_kind", embedder)]:
        try:
            v2.rerank(model=model, query="q", documents=["a"])
            out[key] = None
        except cohere.core.api_error.ApiError as e:
            out[key] = {"type": type(e).__name__, "status": e.status_code, "body": e.body}
    return out


def main():
    what, base, rest = sys.argv[1], sys.argv[2], sys.argv[3:]
    if what == "openai":
        out = openai_embed(base, rest[0], rest[1:])
    elif what == "hf":
        out = hf_embed(base, rest[0], rest[1:])
    elif what == "cohere":
        out = cohere_rerank(base, rest[0], rest[1], rest[2:])
    elif what == "list":
        out = models_list(base)
    elif what == "unknown":
        out = unknown(base, rest[0], rest[1])
    else:
        raise SystemExit(f"unknown mode {what}")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
