"""observability_wsgi: what `--access-log` and `--metrics` cost a WSGI app,
against the same server without them.

m0serve's WSGI plugin serving bench/apps/hello_wsgi.py, one worker pinned
to CPU 0, wrk one thread on CPU 1, keep-alive at 8 and 64 connections, as
in `wsgi`. The rows differ only in the flags: none (the anchor),
`--access-log` to a file in the server's scratch folder (emptied before
each start, JSON lines), `--metrics` (nobody scrapes), and both.
"""

from harness import Load, Server, fmt_ratio

TITLE = "observability_wsgi — m0serve's WSGI hello with and without --access-log and --metrics"
ABOUT = ("The price of an access log line and of the Prometheus counters per response "
         "when the app is Python, whose own cost per request dwarfs hello_c's.")
TARGET = "--access-log at least 0.8x the req/s of the same server without it; --metrics at least 0.95x."
NEEDS = ["wrk", "venv", "m0serve"]

BODY = b"hello, world\n"
BASE = ["{m0serve}", "--plugin", "wsgi", "--app-dir", "{bench}/apps", "hello_wsgi:app",
        "--host", "127.0.0.1", "--port", "{port}", "--workers", "1",
        "--max-keepalive-requests", "0"]
METRICS = ["--metrics", "127.0.0.1:0"]
ACCESS_LOG = ["--access-log", "{out}/access.jsonl", "--access-log-format", "json"]


def _fresh_log(server, port, outdir) -> None:
    # A run writes millions of lines: each start begins with an empty file.
    (outdir / "access.jsonl").unlink(missing_ok=True)


SERVERS = [
    Server("m0serve wsgi", BASE, cpus="0", expect=BODY),
    Server("m0serve wsgi --access-log", BASE + ACCESS_LOG, cpus="0", expect=BODY,
           prepare=_fresh_log),
    Server("m0serve wsgi --metrics", BASE + METRICS, cpus="0", expect=BODY),
    Server("m0serve wsgi --metrics --access-log", BASE + METRICS + ACCESS_LOG, cpus="0",
           expect=BODY, prepare=_fresh_log),
]
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "m0serve wsgi"
ROUNDS = 3
DURATION = 10
WARMUP = 2


def verdict(summary) -> str:
    parts = []
    for conns in (ld.conns for ld in LOADS):
        a = summary[("m0serve wsgi --access-log", conns)]["rps_ratio"]
        m = summary[("m0serve wsgi --metrics", conns)]["rps_ratio"]
        parts.append(f"c{conns}: --access-log {fmt_ratio(a)} ({'met' if a >= 0.8 else '**not met**'}), "
                     f"--metrics {fmt_ratio(m)} ({'met' if m >= 0.95 else '**not met**'})")
    return "Target: " + "; ".join(parts) + ". Ratios within the spread column are ties."
