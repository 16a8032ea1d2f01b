"""Drive the embed plugin with the real clients users have, for
tests/embed_api.rs: the `openai` package and huggingface_hub's
InferenceClient, each against the sentence-transformers reference.

    python clients.py BASE_URL REFERENCE_JSON

Prints one JSON object: per client and mode, the cosine of every sentence's
embedding against the reference, and what the client saw besides (model
echoed, usage, dimensions).
"""

import json
import sys

import numpy as np


def cosines(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    num = (got * want).sum(axis=1)
    den = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return (num / den).tolist()


def main():
    base, ref_path = sys.argv[1], sys.argv[2]
    ref = json.load(open(ref_path, encoding="utf-8"))
    # The reference's sentences that every client may send: not the empty
    # string (both APIs refuse it) nor the one past the model's limit.
    keep = [
        i
        for i, (s, n) in enumerate(zip(ref["sentences"], ref["tokens"]))
        if s and n < ref["max_seq_length"]
    ]
    sentences = [ref["sentences"][i] for i in keep]
    want = [ref["embeddings"][i] for i in keep]
    out = {"sentences": len(sentences)}

    from openai import OpenAI

    client = OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0)
    # The client's default encoding: it asks for base64 and decodes it.
    r = client.embeddings.create(model="all-MiniLM-L6-v2", input=sentences)
    out["openai_default"] = {
        "cosines": cosines([d.embedding for d in r.data], want),
        "indices": [d.index for d in r.data],
        "model": r.model,
        "prompt_tokens": r.usage.prompt_tokens,
        "total_tokens": r.usage.total_tokens,
        "dims": sorted({len(d.embedding) for d in r.data}),
    }
    r = client.embeddings.create(
        model="all-MiniLM-L6-v2", input=sentences[0], encoding_format="float"
    )
    out["openai_float"] = {
        "cosines": cosines([d.embedding for d in r.data], want[:1]),
        "model": r.model,
        "prompt_tokens": r.usage.prompt_tokens,
    }
    try:
        client.embeddings.create(model="all-MiniLM-L6-v2", input=[])
        out["openai_empty"] = "no error"
    except Exception as e:  # the client's own exception type and status
        out["openai_empty"] = {
            "type": type(e).__name__,
            "status": getattr(e, "status_code", None),
        }

    from huggingface_hub import InferenceClient

    hf = InferenceClient(base_url=base)
    got = [np.asarray(hf.feature_extraction(s)).reshape(-1) for s in sentences]
    out["hf_feature_extraction"] = {"cosines": cosines(got, want)}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
