"""observability: what `--metrics` and `--access-log` cost, against the same
server without them.

m0serve's C hello plugin, one worker pinned to CPU 0, wrk one thread on
CPU 1, keep-alive at 8 and 64 connections, as in `hello`. The rows differ
only in the flags: none (the anchor), `--metrics` (every response counted
in the worker's block of the metrics page; nobody scrapes), `--access-log`
to a file in the server's scratch folder (emptied before each start, JSON
lines), and both.
"""

from harness import M0SERVE, Load, Server, fmt_ratio

TITLE = "observability — m0serve hello_c with and without --metrics and --access-log"
ABOUT = ("The price of counting every response for Prometheus and of writing an "
         "access log line per response, on the fastest path there is.")
TARGET = ("--metrics at least 0.95x the req/s of the same server without it; "
          "--access-log at least 0.8x.")
NEEDS = ["wrk", "m0serve"]

BODY = b"hello, world\n"
BASE = [str(M0SERVE), "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
        "--workers", "1", "--max-keepalive-requests", "0"]
METRICS = ["--metrics", "127.0.0.1:0"]
ACCESS_LOG = ["--access-log", "{out}/access.jsonl", "--access-log-format", "json"]


def _fresh_log(server, port, outdir) -> None:
    # A run writes millions of lines: each start begins with an empty file.
    (outdir / "access.jsonl").unlink(missing_ok=True)


SERVERS = [
    Server("m0serve", BASE, cpus="0", expect=BODY),
    Server("m0serve --metrics", BASE + METRICS, cpus="0", expect=BODY),
    Server("m0serve --access-log", BASE + ACCESS_LOG, cpus="0", expect=BODY,
           prepare=_fresh_log),
    Server("m0serve --metrics --access-log", BASE + METRICS + ACCESS_LOG, cpus="0",
           expect=BODY, prepare=_fresh_log),
]
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "m0serve"
ROUNDS = 3
DURATION = 10
WARMUP = 2


def verdict(summary) -> str:
    parts = []
    for conns in (ld.conns for ld in LOADS):
        m = summary[("m0serve --metrics", conns)]["rps_ratio"]
        a = summary[("m0serve --access-log", conns)]["rps_ratio"]
        parts.append(f"c{conns}: --metrics {fmt_ratio(m)} ({'met' if m >= 0.95 else '**not met**'}), "
                     f"--access-log {fmt_ratio(a)} ({'met' if a >= 0.8 else '**not met**'})")
    return "Target: " + "; ".join(parts) + ". Ratios within the spread column are ties."
