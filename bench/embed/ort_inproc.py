#!/usr/bin/env python3
"""The in-process anchor of the embed benchmark: ONNX Runtime's CPU provider, called from
Python, on the fp32 graph that export_onnx.py builds (made first if it is missing); with
--model mpnet, all-mpnet-base-v2's from export_mpnet_onnx.py (the embed_families scenario's).

    bench/.venv/bin/python bench/embed/ort_inproc.py [--model minilm|mpnet] [--threads 1,2]
                                                     [--batch 1,32] [--duration S] [--warmup S]

Per configuration (intra_op_num_threads x sentences per call) it calls the model back to
back for --duration seconds after --warmup, over the 64 held-out sentences of
bench/embed/sentences.json: batch 1 cycles through them one per call, batch 32 sends
sentences 0-31 then 32-63. One call is what a server must do for a request: tokenize
(tokenizers, padded to the longest of the call, cut at max_seq_length: 256 for MiniLM, 384
for MPNet) and session.run, returning the normalized [batch, hidden] embeddings. One thread
runs pinned to CPU 0 (inter_op 1), two threads unpinned.

Printed per configuration, on stderr for people and as one JSON object per line on stdout
for bench/scenarios/embed.py:
    sentences/s      sentences embedded / wall time of the measured calls
    p50, p99         latency of one call (ms)
    cpu              process CPU time (all threads, user+system) / wall, % of one core;
                     ORT's pool threads spin a little after each call, which counts here
    gflops           FLOPs of the real tokens / wall, with minilm.flops() (mpnet.flops()): per
                     sentence of n tokens 6 x n x (2 x (4 x 384^2 + 2 x 384 x 1536) + 2 x 2 x n x 384)
                     for MiniLM, 12 x n x (2 x (4 x 768^2 + 2 x 768 x 3072) + 2 x 2 x n x 768) for MPNet;
                     padding is not counted, so padded work shows as a lower rate
    other            the most CPU (% of one core) the rest of the machine used meanwhile
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402
import mpnet  # noqa: E402

# --model: the module that knows the model's folder, tokenizer and FLOPs.
MODELS = {"minilm": minilm, "mpnet": mpnet}

CLK_TCK = os.sysconf("SC_CLK_TCK")


def machine_busy_ticks() -> int:
    v = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return sum(v) - v[3] - v[4]


def percentile(xs: list[float], p: float) -> float:
    xs = sorted(xs)
    k = (len(xs) - 1) * p / 100.0
    lo, hi = int(k), min(int(k) + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (k - lo)


def session(path: Path, threads: int):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.inter_op_num_threads = 1
    so.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    return ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])


def ort_call(model, sess, tok):
    """One call of the anchor: tokenize a list of sentences and run the graph."""
    names = [i.name for i in sess.get_inputs()]       # MPNet's graph has no token_type_ids

    def one(c):
        out = sess.run(["sentence_embedding"], dict(zip(names, model.encode_batch(tok, c))))[0]
        assert out.shape == (len(c), model.HIDDEN)
        return out
    return one


def measure(model, one, tok, sentences: list[str], batch: int, duration: float, warmup: float) -> dict:
    """time_calls() of one(sentences) over calls of `batch` sentences (batch 1 cycles through
    them one per call, batch 32 sends 0-31 then 32-63), plus the GFLOP/s of their real tokens
    (counted with `tok`, the timed path's tokenizer). torch_inproc.py times its calls so too."""
    if batch == 1:
        calls = [[s] for s in sentences]
    else:
        calls = [sentences[i:i + batch] for i in range(0, len(sentences) - batch + 1, batch)]
    call_flops = [sum(model.flops(sum(e.attention_mask)) for e in tok.encode_batch(c)) for c in calls]
    r = time_calls(one, calls, duration, warmup)
    fl = sum(call_flops[i % len(calls)] for i in range(r["calls"]))
    return {"sentences_per_s": r.pop("inputs_per_s"), **r, "gflops": fl / r["wall_s"] / 1e9}


def time_calls(one, calls: list, duration: float, warmup: float) -> dict:
    """Call one(c) for c in `calls`, in turn: `warmup` s untimed, then for `duration` s (the
    last call ends past it). inputs_per_s counts len(c) per call; p50/p99 per call; cpu_pct is
    this process's CPU time over the wall time, other_pct what the rest of the machine used
    meanwhile (the noise the sample saw), % of one core."""
    end, i = time.perf_counter() + warmup, 0
    while time.perf_counter() < end:
        one(calls[i % len(calls)])
        i += 1
    lat, done = [], 0
    m0, c0, t0 = machine_busy_ticks(), time.process_time(), time.perf_counter()
    end, i = t0 + duration, 0
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
        "inputs_per_s": done / wall,
        "calls": len(lat),
        "p50_ms": 1e3 * statistics.median(lat),
        "p99_ms": 1e3 * percentile(lat, 99),
        "cpu_pct": 100.0 * cpu / wall,
        "other_pct": max(0.0, 100.0 * ((m1 - m0) / CLK_TCK - cpu) / wall),
        "wall_s": wall,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", choices=sorted(MODELS), default="minilm",
                    help="all-MiniLM-L6-v2 (default) or all-mpnet-base-v2")
    ap.add_argument("--onnx", type=Path, help="the graph (default: the model's under bench/out/embed)")
    ap.add_argument("--name", default="ort",
                    help="the configurations' names start with it (quantize_onnx.py's graph: ort-int8)")
    ap.add_argument("--threads", default="1,2", help="intra_op_num_threads values (default 1,2)")
    ap.add_argument("--batch", default="1,32", help="sentences per call (default 1,32)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--reverse", action="store_true", help="run the configurations in reverse order")
    ap.add_argument("--describe", action="store_true",
                    help="print the sentences' token counts and FLOPs as one JSON line, and exit")
    args = ap.parse_args()
    model = MODELS[args.model]
    onnx_path = args.onnx or model.DEFAULT_ONNX

    if args.describe:
        tok = model.tokenizer()
        sentences = json.loads(minilm.SENTENCES.read_text())["sentences"]
        tokens = [sum(e.attention_mask) for e in tok.encode_batch(sentences)]
        print(json.dumps({"sentences": len(sentences), "tokens": tokens,
                          "flops": [model.flops(n) for n in tokens]}))
        return 0

    if not onnx_path.exists():
        export = "export_onnx.py" if model is minilm else "export_mpnet_onnx.py"
        r = subprocess.run([sys.executable, str(minilm.HERE / export), "--out", str(onnx_path)],
                           stdout=sys.stderr)
        if r.returncode != 0:
            return r.returncode
    import onnxruntime as ort
    tok = model.tokenizer()
    sentences = json.loads(minilm.SENTENCES.read_text())["sentences"]
    configs = [(t, b) for t in map(int, args.threads.split(",")) for b in map(int, args.batch.split(","))]
    if args.reverse:
        configs.reverse()
    all_cpus = os.sched_getaffinity(0)
    for threads, batch in configs:
        os.sched_setaffinity(0, {min(all_cpus)} if threads == 1 else all_cpus)
        sess = session(onnx_path, threads)
        r = measure(model, ort_call(model, sess, tok), tok, sentences, batch, args.duration, args.warmup)
        del sess
        r = {"config": f"{args.name} t{threads} b{batch}", "model": model.NAME if model is mpnet else "all-MiniLM-L6-v2", "threads": threads, "batch": batch,
             "pinned": "CPU 0" if threads == 1 else "none", "onnxruntime": ort.__version__, **r}
        print(f"{args.name} {ort.__version__} threads={threads} batch={batch}: "
              f"{r['sentences_per_s']:.0f} sentences/s, p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, "
              f"CPU {r['cpu_pct']:.0f}%, {r['gflops']:.1f} GFLOP/s, other load {r['other_pct']:.0f}% "
              f"({r['calls']} calls)", file=sys.stderr, flush=True)
        print(json.dumps(r), flush=True)
    os.sched_setaffinity(0, all_cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
