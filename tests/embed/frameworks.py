"""Drive the embed plugin's /v1/embeddings with the RAG frameworks' OpenAI
embedding classes, for tests/embed_api.rs, and tokenize with the model's
own tokenizer for the token-id tests.

    python frameworks.py langchain BASE_URL REFERENCE_JSON
    python frameworks.py llamaindex BASE_URL REFERENCE_JSON
    python frameworks.py ids MODEL_DIR REFERENCE_JSON

Prints one JSON object. For the frameworks: the cosine of every vector
against the reference and how many vectors came back; the Rust test counts
the requests on the server's side. For `ids`: each reference sentence's ids
as the model's tokenizer gives them, [CLS] and [SEP] included, untruncated.

Nothing here may reach the network: the frameworks are made so that they
need no download (LangChain with check_embedding_ctx_length=False sends text
and never asks tiktoken for an encoding; tiktoken's loaders are replaced by
ones that fail, so a change in that would fail this script, not hang it).
"""

import json
import sys

import numpy as np

DOCUMENTS = 1000


def cosines(got, want):
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    num = (got * want).sum(axis=1)
    den = np.linalg.norm(got, axis=1) * np.linalg.norm(want, axis=1)
    return (num / den).tolist()


def documents(ref, n):
    """n texts, the reference's embeddable sentences over and over (not the
    empty one, refused, nor the one past the model's limit, which truncation
    off refuses), and the reference vector of each."""
    keep = [
        i
        for i, (s, t) in enumerate(zip(ref["sentences"], ref["tokens"]))
        if s and t < ref["max_seq_length"]
    ]
    picks = [keep[k % len(keep)] for k in range(n)]
    texts = [ref["sentences"][i] for i in picks]
    want = [ref["embeddings"][i] for i in picks]
    return picks, texts, want


def no_tiktoken_downloads():
    import tiktoken

    def refuse(*args, **kwargs):
        raise RuntimeError(f"tiktoken was asked for an encoding: {args} {kwargs}")

    tiktoken.get_encoding = refuse
    tiktoken.encoding_for_model = refuse
    import langchain_openai.embeddings.base as lc_base

    lc_base.tiktoken.get_encoding = refuse
    lc_base.tiktoken.encoding_for_model = refuse


def langchain(base, ref):
    no_tiktoken_downloads()
    from langchain_openai import OpenAIEmbeddings

    emb = OpenAIEmbeddings(
        base_url=base + "/v1",
        api_key="unused",
        model="text-embedding-3-small",
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    picks, texts, want = documents(ref, DOCUMENTS)
    got = emb.embed_documents(texts)
    query = emb.embed_query(texts[3])
    return {
        "chunk_size": emb.chunk_size,
        "picks": picks,
        "documents": len(got),
        "dims": sorted({len(v) for v in got}),
        "cosines": cosines(got, want),
        "query_cosine": cosines([query], [want[3]])[0],
    }


def llamaindex(base, ref):
    from llama_index.embeddings.openai_like import OpenAILikeEmbedding

    default = OpenAILikeEmbedding(
        model_name="all-MiniLM-L6-v2", api_base=base + "/v1", api_key="unused"
    )
    # OpenAIEmbedding's default batch (the OpenAI-like class's is 10).
    emb = OpenAILikeEmbedding(
        model_name="all-MiniLM-L6-v2",
        api_base=base + "/v1",
        api_key="unused",
        embed_batch_size=100,
        max_retries=0,
    )
    picks, texts, want = documents(ref, 250)
    got = emb.get_text_embedding_batch(texts)
    query = emb.get_query_embedding(texts[5])
    return {
        "default_batch": default.embed_batch_size,
        "batch": emb.embed_batch_size,
        "documents": len(got),
        "cosines": cosines(got, want),
        "query_cosine": cosines([query], [want[5]])[0],
    }


def ids(model_dir, ref):
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(model_dir + "/tokenizer.json")
    # The file pads to 128 and truncates at 128: a client sends a
    # sequence's own ids, and the long one whole, for the server to cut.
    tok.no_padding()
    tok.no_truncation()
    return {
        "ids": [tok.encode(s).ids for s in ref["sentences"]],
        "vocab": tok.get_vocab_size(),
    }


def main():
    what, where, ref_path = sys.argv[1], sys.argv[2], sys.argv[3]
    ref = json.load(open(ref_path, encoding="utf-8"))
    run = {"langchain": langchain, "llamaindex": llamaindex, "ids": ids}[what]
    print(json.dumps(run(where, ref)))


if __name__ == "__main__":
    main()
