#!/usr/bin/env python3
"""Make the static-embedding fixture of issue #55: a sentence-transformers StaticEmbedding
model (a token embedding table, mean pooled, no special tokens) saved with
SentenceTransformer.save, and reference.json, what SentenceTransformer.encode gives for it.

The Rust tests never run this: the folder is checked in and they need no torch. Run it once,
in the families' throwaway venv:

    python3.11 -m venv target/families-venv
    target/families-venv/bin/pip install -r tests/data/families/requirements.txt
    target/families-venv/bin/python tests/data/static/make_static.py

    # the bench's bigger one (all-MiniLM-L6-v2's 30522-token vocabulary), not checked in:
    target/families-venv/bin/python tests/data/static/make_static.py \
        --tokenizer MINILM_DIR/tokenizer.json --dim 256 --out target/static-minilm --no-reference

The tokenizer is the distilbert family fixture's (tests/data/families/distilbert: WordPiece,
553 tokens); the table is drawn from torch with a fixed seed, N(0, 1), [vocab, dim] float32.
reference.json has the keys of tests/data/minilm_reference.json (sentences, tokens,
embeddings: encode(normalize_embeddings=True), unnormalized: encode() as the model pools)
plus ids, the token ids StaticEmbedding packs for each sentence (add_special_tokens=False).
The sentences are minilm_reference.json's (the empty one included: the plugin refuses it), but
for the blank one (see BLANK_STANDIN); encode() gives a blank text zeros, asserted here.
"""

import argparse
import importlib.metadata as md
import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch
from sentence_transformers import SentenceTransformer
from sentence_transformers.sentence_transformer.modules import StaticEmbedding
from tokenizers import Tokenizer

HERE = Path(__file__).resolve().parent
DATA = HERE.parent
SEED = 55
# The blank sentence of minilm_reference.json pools no token here (no special tokens): its
# vector is zeros, whose cosine is undefined. The tests check that on its own; in its place
# (the tests' bursts index the sentences as minilm_reference.json's) stands this one.
BLANK_STANDIN = "a blank line stood here"


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(DATA / "families/distilbert/tokenizer.json"))
    ap.add_argument("--dim", type=int, default=64)
    ap.add_argument("--out", default=str(HERE / "model"))
    ap.add_argument("--no-reference", action="store_true")
    args = ap.parse_args()
    out = Path(args.out)
    tokenizer = Tokenizer.from_file(args.tokenizer)
    vocab = tokenizer.get_vocab_size()
    gen = torch.Generator().manual_seed(SEED)
    table = torch.randn(vocab, args.dim, generator=gen, dtype=torch.float32)
    model = SentenceTransformer(modules=[StaticEmbedding(tokenizer, embedding_weights=table)])
    if out.exists():
        shutil.rmtree(out)
    model.save(str(out))
    if args.no_reference:
        return
    back = SentenceTransformer(str(out), device="cpu")
    minilm = json.loads((DATA / "minilm_reference.json").read_text())
    sentences = [BLANK_STANDIN if s and not s.strip() else s for s in minilm["sentences"]]
    static = back[0]
    ids = [static.tokenizer.encode(s, add_special_tokens=False).ids for s in sentences]
    emb = back.encode(sentences, batch_size=1, convert_to_numpy=True, normalize_embeddings=True)
    raw = back.encode(sentences, batch_size=1, convert_to_numpy=True)
    assert emb.dtype == np.float32 and raw.dtype == np.float32
    blank = back.encode(["   "], convert_to_numpy=True)[0]
    assert not blank.any(), "a blank text pools no token: a zero vector"
    reference = {
        "model": "static (tests/data/static/make_static.py)",
        "package": None,
        "generated_by": f"sentence-transformers {md.version('sentence-transformers')}, "
        f"torch {md.version('torch')}, SentenceTransformer.encode in float32",
        "max_seq_length": 0,
        "sentences": sentences,
        "tokens": [len(i) for i in ids],
        "ids": ids,
        "embeddings": emb.tolist(),
        "unnormalized": raw.tolist(),
    }
    (HERE / "reference.json").write_text(json.dumps(reference, indent=1) + "\n")
    print(f"wrote {out} ({vocab} x {args.dim}) and reference.json ({len(sentences)} sentences)")
    for f in sorted(out.rglob("*")):
        print(" ", f.relative_to(out), os.path.getsize(f) if f.is_file() else "")


if __name__ == "__main__":
    main()
