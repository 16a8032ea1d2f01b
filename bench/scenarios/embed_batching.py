"""embed_batching: the core's dynamic batching on the embed plugin (all-MiniLM-L6-v2).

A plugin that declares M0_CAP_BATCH gets every request already queued in one handle_batch
call, up to its limits; `--no-batch` (M0_NO_BATCH=1) turns that off. The question: do many
clients sending one sentence each get what one client sending 32 per request gets?

Three configurations of `m0serve --plugin embed --venv bench/.venv --workers 1`, default
settings otherwise, unpinned as a user starts the server (the plugin may use both cores;
wrk -t1 pinned to CPU 1 with bench/embed/embed.lua, keep-alive, POST /embed):
  on   batching on (the default), one sentence per request ({"inputs": "..."});
  off  `--no-batch`, one sentence per request;
  b32  batching on, 32 sentences per request ({"inputs": [...]}), where batching matters
       little: the client batched already;
each at 1, 8 and 32 connections. The sentences are the 64 held-out ones of
bench/embed/sentences.json (as in the embed scenario), in the same order in both body files.

One server per (configuration, load): it is started, probed (POST /embed must give 384 floats
per sentence), warmed up, left to finish what the warm-up left in flight (_embed.settle(): at
32 connections x 32 sentences that is over a second of both cores, which would otherwise open
the measured run and lower the 32-per-request reference), measured once, then SIGTERMed, and the worker's closing line
`batching: C call(s) for R request(s), mean M per call; sizes 1:a 2-3:b ...` read from its log
gives the mean batch of that load alone (it counts the 2 probe requests and the warm-up too).
Per round and per connection count, the configurations alternate: on, off, b32, then reversed
in the next round, so the three at one load run next to each other in time. A sample during
which others used more than harness.NOISY % of a core is measured again, as
harness.throughput() does.

Until the embed plugin declares M0_CAP_BATCH, on and off run the same code and the batching
line is absent: the mean batch column says "-" and a note quotes the worker's start line.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402

TITLE = "embed_batching — dynamic batching on the embed plugin: one sentence per request, batched or not"
ABOUT = ("all-MiniLM-L6-v2 embeddings over HTTP, one sentence per request, with the core's dynamic "
         "batching on (default) and off (--no-batch), against clients that batch 32 sentences per "
         "request themselves; one worker, unpinned.")
TARGET = ("at 32 connections, batching on gives >= 2x the sentences/s of batching off with a p99 no "
          "worse; batching on reaches >= 0.8x the sentences/s of 32 sentences per request at the same "
          "connections (judged at 32 connections); at 1 connection, on is within noise of off.")
NEEDS = ["wrk", "venv", "embed", "m0serve"]

PORT = h.BASE_PORT + 52
CONNS = [1, 8, 32]
ROUNDS, DURATION, WARMUP = 3, 10, 2
TIE = 0.05          # at 1 connection, on and off within this of each other tie even when the
                    # rounds' ranges do not overlap (one quick round has no range at all)


class Config(NamedTuple):
    key: str                    # "on", "off", "b32"
    label: str                  # row label
    batch: int                  # sentences per request
    server: h.Server


def _server(key: str, extra: tuple[str, ...] = ()) -> h.Server:
    return _embed.m0_server(f"m0serve embed batching {key}", 1, None, None, extra)


CONFIGS = [
    Config("on", "batching on (default)", 1, _server("on")),
    Config("off", "batching off (--no-batch)", 1, _server("off", ("--no-batch",))),
    Config("b32", "32 per request, batching on", 32, _server("b32")),
]
RETRIED: dict[str, int] = {}      # samples measured again because of other load

BATCH_LINE = re.compile(r"batching: (\d+) call\(s\) for (\d+) request\(s\), mean ([\d.]+) per call; "
                        r"sizes ((?:\S+:\d+ ?)+)")
START_LINE = re.compile(r"; batching (on|off) (\(.*\))\s*$")


def read_log(path: Path, offset: int) -> dict:
    """What the server logged from offset on: its start line's batching plan and, if it was
    batching, the closing `batching:` line (the last one of each)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            text = f.read().decode(errors="replace")
    except OSError:
        text = ""
    out: dict = {"plan": None, "batch": None}
    for line in text.splitlines():
        m = START_LINE.search(line)
        if m:
            out["plan"] = f"batching {m.group(1)} {m.group(2)}"
            out["batching"] = m.group(1) == "on"
        m = BATCH_LINE.search(line)
        if m:
            out["batch"] = {"calls": int(m.group(1)), "requests": int(m.group(2)),
                            "mean": float(m.group(3)),
                            "sizes": dict(kv.split(":") for kv in m.group(4).split())}
    return out


def run_one(cfg: Config, c: int, bodies: dict[int, str], dur: float, warm: float) -> dict:
    """Start a server for this configuration, measure one load, stop it, read its log."""
    logpath = h.server_dir(cfg.server) / "server.log"
    offset = logpath.stat().st_size if logpath.exists() else 0
    run, why = _embed.start_probed(cfg.server, PORT)
    if why:
        raise h.BenchError(f"{cfg.label}: {why}")
    try:
        affinity = h._affinity(run.pid)
        r = _embed.measure_load(run, f"({cfg.key})", cfg.batch, c, bodies, dur, warm, RETRIED,
                                drain=True)
    finally:
        _embed.stop(run)         # SIGTERM: the worker writes its closing lines
    r["affinity"] = affinity
    r.update(read_log(logpath, offset))
    b = r["batch"]
    h.log(f"  ({cfg.key}) c{c}: " + (f"mean batch {b['mean']:.2f} over {b['calls']} call(s)" if b
                                     else f"no batching line ({r['plan'] or 'no start line'})"))
    return r


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP

    why = _embed.unavailable()
    if why:
        raise h.BenchError(why)
    for var in ("M0_EMBED_THREADS", "M0_NO_BATCH"):     # the defaults: no variable
        os.environ.pop(var, None)
    sentences = _embed.sentences()
    bodies = _embed.write_bodies(sentences, sorted({cfg.batch for cfg in CONFIGS}))

    res: dict[tuple[str, int], list[dict]] = {}
    for rnd in range(rounds):
        order = CONFIGS if rnd % 2 == 0 else list(reversed(CONFIGS))
        for c in CONNS:
            for cfg in order:
                h.log(f"round {rnd + 1}/{rounds}: c{c} ({cfg.key}) {cfg.label}")
                res.setdefault((cfg.key, c), []).append(run_one(cfg, c, bodies, dur, warm))

    def med(rs, key):
        return h.median([r[key] for r in rs])

    def div(a: float, b: float) -> float:
        return a / b if b else float("nan")      # a sample with no request done: no ratio

    def ratio(a: float, b: float) -> str:
        return h.fmt_ratio(a / b) if b else "-"

    summary: dict[tuple[str, int], dict] = {}
    for (key, c), rs in res.items():
        xs = [r["sentences_per_s"] for r in rs]
        means = [r["batch"]["mean"] for r in rs if r["batch"]]
        summary[(key, c)] = {"sps": h.median(xs), "p99": med(rs, "p99"), "lo": min(xs), "hi": max(xs),
                             "mean_batch": h.median(means) if means else None}

    headers = ["config", "sentences/request", "conns", "sentences/s", "p50", "p99", "server CPU",
               "CPU per sentence", "mean batch", "sentences/s ÷ off", "p99 ÷ off",
               "sentences/s ÷ 32/request", "spread", "other load"]
    rows, notes = [], []
    for c in CONNS:
        off, b32 = summary[("off", c)], summary[("b32", c)]
        for cfg in CONFIGS:
            rs, s = res[(cfg.key, c)], summary[(cfg.key, c)]
            per = [1e4 * r["cpu"] / r["sentences_per_s"] for r in rs if r["sentences_per_s"]]  # µs
            mb = s["mean_batch"]
            if mb is None:
                mean = "-"
            elif cfg.batch > 1:
                mean = f"{mb:.2f} ({mb * cfg.batch:.0f} sentences)"
            else:
                mean = f"{mb:.2f}"
            vs_off = cfg.batch == 1
            rows.append([cfg.label, str(cfg.batch), str(c), f"{s['sps']:,.0f}",
                         h.fmt_us(med(rs, "p50")), h.fmt_us(s["p99"]), f"{med(rs, 'cpu'):.0f}%",
                         h.fmt_us(h.median(per)) if per else "-", mean,
                         ratio(s["sps"], off["sps"]) if vs_off else "-",
                         ratio(s["p99"], off["p99"]) if vs_off else "-",
                         ratio(s["sps"], b32["sps"]),
                         _embed.spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other'] for r in rs):.0f}%"])
            errs = sum(r["errors"] for r in rs)
            if errs:
                kinds: dict[str, int] = {}
                for r in rs:
                    for k, v in r.get("error_detail", {}).items():
                        kinds[k] = kinds.get(k, 0) + v
                notes.append(f"**({cfg.key}) c{c}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests ("
                             + ", ".join(f"{k} {v}" for k, v in kinds.items() if v) + ")")

    # Targets, one verdict each.
    on, off = summary[("on", 32)], summary[("off", 32)]
    r_sps, r_p99 = div(on["sps"], off["sps"]), div(on["p99"], off["p99"])
    notes.append(f"**Target 1** (32 connections: on ≥ 2× off sentences/s, p99 no worse): "
                 f"{h.fmt_ratio(r_sps)} sentences/s ({on['sps']:,.0f} vs {off['sps']:,.0f}), "
                 f"p99 {h.fmt_ratio(r_p99)}: {'met' if r_sps >= 2.0 and r_p99 <= 1.0 else '**not met**'}.")
    parts = []
    for c in reversed(CONNS):
        r = div(summary[("on", c)]["sps"], summary[("b32", c)]["sps"])
        parts.append(f"c{c} {h.fmt_ratio(r)}" + (f": {'met' if r >= 0.8 else '**not met**'}" if c == 32
                                                  else " (for information)"))
    notes.append("**Target 2** (on ≥ 0.8× the sentences/s of 32 sentences per request, same connections; "
                 "judged at 32 connections, where a batch can hold as many sentences as one 32-sentence "
                 "request; at 1 connection only one request is ever queued): " + "; ".join(parts) + ".")
    on1, off1 = summary[("on", 1)], summary[("off", 1)]
    r1 = div(on1["sps"], off1["sps"])
    overlap = on1["hi"] >= off1["lo"] and off1["hi"] >= on1["lo"]
    tie = overlap or abs(r1 - 1) <= TIE
    how = ("the rounds' ranges overlap" if overlap
           else f"{'within' if tie else 'beyond'} {TIE:.0%} (ranges apart)")
    notes.append(f"**Target 3** (1 connection: on within noise of off): {h.fmt_ratio(r1)} sentences/s "
                 f"({on1['sps']:,.0f} vs {off1['sps']:,.0f}), p99 {h.fmt_ratio(div(on1['p99'], off1['p99']))}"
                 f"; {how}: "
                 f"{'met' if tie else '**not met**'}.")

    # What the servers said about batching.
    plans = {}
    for (key, c), rs in res.items():
        for r in rs:
            plans.setdefault(key, set()).add(r["plan"] or "no start line found")
    on_runs = [r for cfg in CONFIGS if cfg.key != "off" for c in CONNS for r in res[(cfg.key, c)]]
    if not any(r["batch"] for r in on_runs):
        notes.insert(0, "**No batching happened**: the worker never wrote a `batching:` line, so batching "
                        "on and off ran the same code and the mean batch column is \"-\"; the start line "
                        "said: " + "; ".join(f"({k}) {', '.join(sorted(v))}" for k, v in plans.items())
                     + ". (The embed plugin does not declare M0_CAP_BATCH yet?)")
    sizes = []
    for c in CONNS:
        for cfg in CONFIGS:
            tot: dict[str, int] = {}
            for r in res[(cfg.key, c)]:
                for k, v in (r["batch"] or {}).get("sizes", {}).items():
                    tot[k] = tot.get(k, 0) + int(v)
            if tot:
                sizes.append(f"({cfg.key}) c{c} " + " ".join(f"{k}:{v}" for k, v in tot.items() if v))
    if sizes:
        notes.append("Calls per batch size (requests per handle_batch call: calls, empty sizes left out; "
                     "all rounds, probe and warm-up included): " + "; ".join(sizes) + ".")
    settled = {k: max(r.get("settled_s", 0.0) for r in rs) for k, rs in res.items()}
    notes.append("After the warm-up, waited for the server to finish the requests wrk left in flight "
                 "(longest wait per load): " + ", ".join(f"({k}) c{c} {v:.1f} s"
                                                          for (k, c), v in settled.items()) + ".")
    wrk_cpu = {k: med(rs, "wrk_cpu") for k, rs in res.items()}
    top = max(wrk_cpu, key=wrk_cpu.get)
    notes.append(f"wrk shares CPU 1 with the unpinned server: at most {wrk_cpu[top]:.0f}% of a core, "
                 f"({top[0]}) c{top[1]}.")
    if RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in RETRIED.items()) + ".")

    def threads(key: str) -> str:
        n = sorted({r["threads"] for c in CONNS for r in res[(key, c)]})
        return f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}"

    first = {cfg.key: res[(cfg.key, CONNS[0])][0] for cfg in CONFIGS}
    setup = [
        f"{rounds} round(s) × {dur:g} s per load after a {warm:g} s warm-up; one server per "
        "(configuration, load), started, probed, warmed up, drained of what the warm-up left in "
        "flight, measured, SIGTERMed; per round and "
        "connection count the configurations alternate (on, off, b32, then reversed); medians over rounds.",
        "Server: `m0serve --plugin embed --venv bench/.venv --host 127.0.0.1 --workers 1 "
        "--max-keepalive-requests 0` (+ `--no-batch` for off), no M0_EMBED_THREADS / M0_NO_BATCH, "
        "unpinned: " + "; ".join(f"({k}) {r['affinity']}, {threads(k)} threads in the process tree "
                                 f"(over the loads), {r['plan'] or '?'}" for k, r in first.items()) + ".",
        f"wrk -t1 pinned to CPU 1, bench/embed/embed.lua, keep-alive, POST /embed; bodies: the "
        f"{len(sentences)} sentences of bench/embed/sentences.json (10-17 tokens), 1 per request "
        "({\"inputs\": \"...\"}) or 32 per request ({\"inputs\": [...]}), cycled.",
        "p50/p99 per request (of 32 sentences for b32); server CPU = utime+stime of the server's "
        "process tree, % of one core; CPU per sentence = server CPU time / sentences; mean batch = "
        "requests per handle_batch call from the worker's closing `batching:` line (median over rounds; "
        "it counts the probe and the warm-up too; for b32 also in sentences); ÷ off = against batching "
        "off at the same connections; ÷ 32/request = against b32's sentences/s at the same connections; "
        "spread = (max−min)/2 of sentences/s over rounds, relative to the median; other load = most CPU "
        "(% of one core) used by anything but server and wrk during one run.",
        f"Versions: m0serve: {h.version_of(CONFIGS[0].server)}.",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
