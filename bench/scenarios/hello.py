"""hello: m0serve's C hello plugin against nginx's `return 200`, one process each.

Both servers are single processes pinned to CPU 0 (nginx: one worker, plus
its idle master); wrk runs one thread pinned to CPU 1. Keep-alive, 8 and 64
connections. Both answer GET / with the 13-byte body "hello, world\n".
The unpinned rows run the same two with no taskset for the server or wrk,
as a user runs them (hello_c's calls are inline: the loop answers them
itself on any topology).
Neither closes a keep-alive connection on its own: nginx gets
`keepalive_requests 1000000000`, m0serve `--max-keepalive-requests 0` (both
default to 1000, which makes wrk reconnect every 1000 requests).
"""

from harness import M0SERVE, Load, Server, nginx, fmt_ratio

TITLE = "hello — m0serve hello_c vs nginx `return 200`, one process on CPU 0"
ABOUT = ("Plain-text hello world over keep-alive HTTP/1.1: the cost of m0serve's "
         "accept/parse/dispatch/write path against nginx's fastest path.")
TARGET = ("m0serve at least nginx's req/s, and a p99 no worse than nginx's, at each connection "
          "count, pinned and unpinned.")
NEEDS = ["wrk", "nginx", "m0serve"]

BODY = b"hello, world\n"

SERVERS = [
    Server("m0serve hello_c",
           [str(M0SERVE), "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
            "--workers", "1", "--max-keepalive-requests", "0"],
           cpus="0", expect=BODY),
    nginx("nginx", '        location = / { return 200 "hello, world\\n"; }', cpus="0", expect=BODY),
    Server("m0serve hello_c unpinned",
           [str(M0SERVE), "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
            "--workers", "1", "--max-keepalive-requests", "0"],
           cpus=None, unpinned_load=True, expect=BODY),
    nginx("nginx unpinned", '        location = / { return 200 "hello, world\\n"; }', cpus=None,
          unpinned_load=True, expect=BODY),
]
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "nginx"
ROUNDS = 3
DURATION = 10
WARMUP = 2


def verdict(summary) -> str:
    parts = []
    for tag in ("", " unpinned"):
        for conns in (ld.conns for ld in LOADS):
            s = summary[(f"m0serve hello_c{tag}", conns)]
            n = summary[(f"nginx{tag}", conns)]
            rps, p99 = s["rps"] / n["rps"], s["p99"] / n["p99"]
            ok = rps >= 1.0 and p99 <= 1.0
            parts.append(f"{tag.strip() or 'pinned'} c{conns} {'met' if ok else '**not met**'} "
                         f"({fmt_ratio(rps)} req/s, {fmt_ratio(p99)} p99, "
                         f"{fmt_ratio(s['cpu_per_req'] / n['cpu_per_req'])} CPU per request)")
    return "Target: " + "; ".join(parts) + ". Ratios within the spread column are ties."
