"""hello: m0serve's C hello plugin against nginx's `return 200`, one process each.

Both servers are single processes pinned to CPU 0 (nginx: one worker, plus
its idle master); wrk runs one thread pinned to CPU 1. Keep-alive, 8 and 64
connections. Both answer GET / with the 13-byte body "hello, world\n".
Neither closes a keep-alive connection on its own: nginx gets
`keepalive_requests 1000000000`, m0serve `--max-keepalive-requests 0` (both
default to 1000, which makes wrk reconnect every 1000 requests).
"""

from harness import M0SERVE, Load, Server, nginx, fmt_ratio

TITLE = "hello — m0serve hello_c vs nginx `return 200`, one process on CPU 0"
ABOUT = ("Plain-text hello world over keep-alive HTTP/1.1: the cost of m0serve's "
         "accept/parse/dispatch/write path against nginx's fastest path.")
TARGET = "m0serve at least nginx's req/s, and a p99 no worse than nginx's, at each connection count."
NEEDS = ["wrk", "nginx", "m0serve"]

BODY = b"hello, world\n"

SERVERS = [
    Server("m0serve hello_c",
           [str(M0SERVE), "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
            "--workers", "1", "--max-keepalive-requests", "0"],
           cpus="0", expect=BODY),
    nginx("nginx", '        location = / { return 200 "hello, world\\n"; }', cpus="0", expect=BODY),
]
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "nginx"
ROUNDS = 3
DURATION = 10
WARMUP = 2


def verdict(summary) -> str:
    parts = []
    for conns in (ld.conns for ld in LOADS):
        s = summary[("m0serve hello_c", conns)]
        ok = s["rps_ratio"] >= 1.0 and s["p99_ratio"] <= 1.0
        n = summary[("nginx", conns)]
        parts.append(f"c{conns} {'met' if ok else '**not met**'} ({fmt_ratio(s['rps_ratio'])} req/s, "
                     f"{fmt_ratio(s['p99_ratio'])} p99, "
                     f"{fmt_ratio(s['cpu_per_req'] / n['cpu_per_req'])} CPU per request)")
    return "Target: " + "; ".join(parts) + ". Ratios within the spread column are ties."
