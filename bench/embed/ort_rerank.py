#!/usr/bin/env python3
"""The in-process anchor of the rerank benchmark: ONNX Runtime's CPU provider, called from
Python, on the MiniLM stand-in reranker's graph (export_reranker_onnx.py, built and checked
against tests/data/minilm_reranker_reference.json first).

    bench/.venv/bin/python bench/embed/ort_rerank.py --model-dir DIR [--threads 1,2]
                                                     [--duration S] [--warmup S]
    bench/.venv/bin/python bench/embed/ort_rerank.py --bodies FILE
        writes the /rerank bodies of the same calls for wrk (one JSON body per line)

The calls: 1 query x 32 texts of bench/embed/sentences.json's held-out sentences, in turn
(sentence 40 against sentences 0-31, then sentence 8 against 32-63): what /rerank gets from
bench/scenarios/embed_rerank.py, body for body. One call is what a server must do for a
request: tokenize the 32 (query, text) pairs (tokenizers; longest-first truncation at 512,
padded to the longest pair of the call) and session.run, returning [32] logits. One thread
pinned to CPU 0, two threads unpinned, as ort_inproc.py (whose session and measurements this
reuses).

Printed per thread count, on stderr for people and as one JSON object per line on stdout:
pairs_per_s, calls, p50_ms, p99_ms, cpu_pct (process CPU / wall, % of one core), other_pct
(the most the rest of the machine used), tokens_per_call (real tokens, padding left out) and
padded_per_call (what ORT computes: 32 x the longest pair).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402
import ort_inproc  # noqa: E402
from export_reranker_onnx import DEFAULT_ONNX, rerank_tokenizer  # noqa: E402

TEXTS = 32


def calls() -> list[tuple[str, list[str]]]:
    s = json.loads(minilm.SENTENCES.read_text())["sentences"]
    return [(s[40], s[0:TEXTS]), (s[8], s[TEXTS:2 * TEXTS])]


def measure(sess, tok, duration: float, warmup: float) -> dict:
    import numpy as np
    batches = [[(q, t) for t in texts] for q, texts in calls()]
    encoded = [tok.encode_batch(b) for b in batches]
    real = [sum(sum(e.attention_mask) for e in enc) for enc in encoded]
    padded = [len(enc) * len(enc[0].ids) for enc in encoded]

    def one(pairs):
        ids, mask, tt = minilm.encode_batch(tok, pairs)
        out = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})[0]
        assert out.shape == (len(pairs), 1) and np.isfinite(out).all()
        return out

    r = ort_inproc.time_calls(one, batches, duration, warmup)
    return {
        "pairs_per_s": r.pop("inputs_per_s"),
        **r,
        "tokens_per_call": sum(real) / len(real),
        "padded_per_call": sum(padded) / len(padded),
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, help="the assembled reranker folder")
    ap.add_argument("--onnx", type=Path, default=DEFAULT_ONNX)
    ap.add_argument("--threads", default="1,2", help="intra_op_num_threads values (default 1,2)")
    ap.add_argument("--duration", type=float, default=10.0, help="measured seconds per configuration")
    ap.add_argument("--warmup", type=float, default=2.0)
    ap.add_argument("--reverse", action="store_true", help="run the configurations in reverse order")
    ap.add_argument("--bodies", type=Path, help="write the wrk bodies of the calls here, and exit")
    args = ap.parse_args()
    if args.bodies:
        args.bodies.parent.mkdir(parents=True, exist_ok=True)
        args.bodies.write_text("".join(json.dumps({"query": q, "texts": t}, ensure_ascii=False) + "\n"
                                       for q, t in calls()))
        return 0
    if not args.model_dir:
        ap.error("--model-dir is needed to measure")
    if not args.onnx.exists():
        r = subprocess.run([sys.executable, str(minilm.HERE / "export_reranker_onnx.py"),
                            "--model-dir", str(args.model_dir), "--out", str(args.onnx)], stdout=sys.stderr)
        if r.returncode != 0:
            return r.returncode
    import onnxruntime as ort
    tok = rerank_tokenizer(args.model_dir)
    threads = [int(t) for t in args.threads.split(",")]
    if args.reverse:
        threads.reverse()
    all_cpus = os.sched_getaffinity(0)
    for t in threads:
        os.sched_setaffinity(0, {min(all_cpus)} if t == 1 else all_cpus)
        sess = ort_inproc.session(args.onnx, t)
        r = measure(sess, tok, args.duration, args.warmup)
        del sess
        r = {"config": f"ort t{t} b{TEXTS}", "threads": t, "batch": TEXTS,
             "pinned": "CPU 0" if t == 1 else "none", "onnxruntime": ort.__version__, **r}
        print(f"ORT {ort.__version__} threads={t} batch={TEXTS}: {r['pairs_per_s']:.0f} pairs/s, "
              f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms, CPU {r['cpu_pct']:.0f}%, "
              f"other load {r['other_pct']:.0f}% ({r['calls']} calls, {r['tokens_per_call']:.0f} "
              f"real / {r['padded_per_call']:.0f} padded tokens per call)", file=sys.stderr, flush=True)
        print(json.dumps(r), flush=True)
    os.sched_setaffinity(0, all_cpus)
    return 0


if __name__ == "__main__":
    sys.exit(main())
