#!/usr/bin/env python3
"""The torch bf16 anchor of the embed benchmark: all-MiniLM-L6-v2 as sentence-transformers runs
it, SentenceTransformer(MODEL_DIR) on the CPU in bfloat16, called in-process back to back over
the sentences of bench/embed/sentences.json, as ort_inproc.py calls ONNX Runtime.

    target/families-venv/bin/python bench/embed/torch_inproc.py --model-dir DIR
        [--threads 2] [--batch 1,32] [--duration S] [--warmup S] [--mode bf16|autocast]

bf16 (the default) is `model.to(torch.bfloat16)`: the weights cast once, so every product is
bf16 x bf16 (on AMX or AVX512-BF16 where the CPU has them; on a CPU with neither, torch's
fallback, far slower than its f32: RESULTS.md's embed notes) and so are the layer norms' and
GELU's inputs and outputs; what sentence-transformers' users do for bf16 on a CPU. `--mode autocast` runs the f32 model under
torch.autocast("cpu", dtype=torch.bfloat16), which casts each weight again at every call and
keeps the norms and softmax in f32; it is there to compare, not for the bench. `--mode f32`
is the model as loaded, for the same reason.

One call is `model.encode(sentences, batch_size=len(sentences))` (tokenize, forward, pool,
normalize) then the vectors as float32 numpy; torch.set_num_threads(--threads), unpinned.
Timed by ort_inproc.measure() (its time_calls loop; GFLOP/s of the real tokens). Before
timing, the accuracy: every sentence of tests/data/minilm_reference.json alone, then all of
them in one call, against sentence-transformers' fp32 vectors there; min_cosine is the worst.

One JSON object per configuration on stdout (config "torch-bf16 t2 b32", ...), as ort_inproc.py.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402
import ort_inproc  # noqa: E402


def encoder(mdir: Path, mode: str, threads: int):
    import torch
    from sentence_transformers import SentenceTransformer
    torch.set_num_threads(threads)
    model = SentenceTransformer(str(mdir), device="cpu")
    if mode == "bf16":
        model.to(torch.bfloat16)

    def encode(texts: list[str]) -> np.ndarray:
        ctx = (torch.autocast("cpu", dtype=torch.bfloat16) if mode == "autocast"
               else contextlib.nullcontext())
        with ctx:
            out = model.encode(texts, batch_size=len(texts), convert_to_tensor=True)
        return out.float().numpy()
    return encode


def min_cosine(encode) -> float:
    ref = json.loads(minilm.REFERENCE.read_text())
    want = np.array(ref["embeddings"], dtype=np.float64)
    got = [np.concatenate([encode([s]) for s in ref["sentences"]]), encode(ref["sentences"])]
    cos = [(g * want).sum(1) / (np.linalg.norm(g, axis=1) * np.linalg.norm(want, axis=1))
           for g in (np.asarray(x, dtype=np.float64) for x in got)]
    return float(min(c.min() for c in cos))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True, help="all-MiniLM-L6-v2's folder")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", default="1,32", help="sentences per call (default 1,32)")
    ap.add_argument("--duration", type=float, default=10.0)
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--mode", choices=["bf16", "autocast", "f32"], default="bf16")
    ap.add_argument("--reverse", action="store_true", help="run the batch sizes in reverse order")
    args = ap.parse_args()
    import torch
    encode = encoder(args.model_dir, args.mode, args.threads)
    cosine = min_cosine(encode)
    tok = minilm.tokenizer(args.model_dir)
    sentences = json.loads(minilm.SENTENCES.read_text())["sentences"]
    batches = [int(b) for b in args.batch.split(",")]
    for batch in (reversed(batches) if args.reverse else batches):
        r = ort_inproc.measure(minilm, encode, tok, sentences, batch, args.duration, args.warmup)
        r = {"config": f"torch-{args.mode} t{args.threads} b{batch}", "threads": args.threads,
             "batch": batch, "torch": torch.__version__, "min_cosine": cosine, **r}
        print(f"torch {torch.__version__} {args.mode} threads={args.threads} batch={batch}: "
              f"{r['sentences_per_s']:.0f} sentences/s, p50 {r['p50_ms']:.2f} ms, "
              f"min cosine {cosine:.6f}, other load {r['other_pct']:.0f}%", file=sys.stderr, flush=True)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
