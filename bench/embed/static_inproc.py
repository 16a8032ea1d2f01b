"""The in-process bars of the embed_native bench: a StaticEmbedding model encoding the same
32-sentence calls as the bench's requests, back to back in one process (no HTTP, no JSON, no
queueing), one thread pinned to CPU 0:

  st      SentenceTransformer(MODEL_DIR).encode(32 sentences, batch_size=32) (torch, float32;
          torch.set_num_threads(1)): the model as its users run it;
  numpy   the same computation by hand: the folder's tokenizer.json (tokenizers,
          add_special_tokens=False, as StaticEmbedding encodes), the table of model.safetensors
          as a float32 array, np.add.reduceat over the packed ids / counts.

    python static_inproc.py --model-dir DIR --modes st,numpy --duration S --warmup S

One JSON line per mode: config, sentences_per_s, calls, p50_ms, p99_ms, cpu_pct (process CPU /
wall, % of one core), other_pct (the rest of the machine, % of one core), and for numpy the
worst cosine against st's vectors of the first call (st_cosine) when st ran too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import ort_inproc  # noqa: E402

SENTENCES = Path(__file__).resolve().parent / "sentences.json"
BATCH = 32


def calls() -> list[list[str]]:
    s = json.loads(SENTENCES.read_text())["sentences"]
    return [s[i:i + BATCH] for i in range(0, len(s) - BATCH + 1, BATCH)]


def numpy_encoder(model_dir: Path):
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    tok.no_padding()
    raw = (model_dir / "model.safetensors").read_bytes()
    n = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + n])["embedding.weight"]
    a, b = meta["data_offsets"]
    table = np.frombuffer(raw, "<f4", (b - a) // 4, 8 + n + a).reshape(meta["shape"])

    def encode(texts: list[str]) -> np.ndarray:
        ids = [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]
        counts = np.array([len(i) for i in ids])
        flat = np.fromiter((t for i in ids for t in i), np.int64, counts.sum())
        starts = np.concatenate([[0], np.cumsum(counts)[:-1]])
        sums = np.add.reduceat(table[flat], starts, axis=0)
        return sums / np.maximum(counts, 1)[:, None]
    return encode


def st_encoder(model_dir: Path):
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(1)
    model = SentenceTransformer(str(model_dir), device="cpu")
    return lambda texts: model.encode(texts, batch_size=BATCH, convert_to_numpy=True)


def measure(encode, duration: float, warmup: float) -> dict:
    batches = calls()
    r = ort_inproc.time_calls(encode, batches, duration, warmup)
    del r["wall_s"]
    return {"sentences_per_s": r.pop("inputs_per_s"), **r}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--modes", default="st,numpy")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    opts = ap.parse_args()
    os.sched_setaffinity(0, {0})
    makers = {"st": st_encoder, "numpy": numpy_encoder}
    first = calls()[0]
    st_vectors = None
    for mode in opts.modes.split(","):
        encode = makers[mode](opts.model_dir)
        r = {"config": f"{mode} b{BATCH}", **measure(encode, opts.duration, opts.warmup)}
        got = np.asarray(encode(first), dtype=np.float64)
        if mode == "st":
            st_vectors = got
        elif st_vectors is not None:
            cos = (got * st_vectors).sum(1) / (np.linalg.norm(got, axis=1) * np.linalg.norm(st_vectors, axis=1))
            r["st_cosine"] = float(cos.min())
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
