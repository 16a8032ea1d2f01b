"""Shared by pool_cpu, pool_release and pool_sleep: the adaptive handler pool
against fixed sizes 1, 2, 4, 8 on one WSGI view, one worker pinned to CPU 0,
wrk on CPU 1 at 8 and 64 connections, alternated in one run.

The target (SPEC P9): the adaptive pool reaches at least 0.95x the best fixed
size's req/s on every view, with a p99 no worse than the best fixed size's
by more than 10%.

Every pool runs with --no-inline: on one CPU a worker would otherwise make
loop calls (the loop's thread calls the app itself while no handler thread
is busy), and the pool would sit idle for any view that neither blocks for
2 ms nor computes for 8. One more row, "loop calls", is the default
configuration (adaptive pool, loop calls on) for comparison; the verdict
does not read it.
"""

import os

from harness import M0SERVE, Load, Server, fmt_ratio

# POOL_SIZES=adaptive,1,2 narrows a run while tuning (never for a recorded one).
SIZES = os.environ.get("POOL_SIZES", "adaptive,1,2,4,8,loop").split(",")
NEEDS = ["wrk", "m0serve"]
ANCHOR = "adaptive"
ROUNDS = 2
DURATION = 8
WARMUP = 3  # the adaptive pool settles within the warm-up


def servers(path: str, body: bytes) -> list:
    out = []
    for size in SIZES:
        cmd = [str(M0SERVE), "--plugin", "wsgi", "--app-dir", "{root}/tests/apps",
               "--host", "127.0.0.1", "--port", "{port}", "--workers", "1"]
        if size == "loop":
            name = "loop calls"
        elif size == "adaptive":
            name = size
            cmd.append("--no-inline")
        else:
            name = f"fixed {size}"
            cmd += ["--no-inline", "--blocking-threads", size]
        cmd.append("pool_app:application")
        out.append(Server(name, cmd, cpus="0", expect=body, path=path))
    return out


def loads(path: str) -> list:
    return [Load(conns=8, path=path), Load(conns=64, path=path)]


# Fixed sizes within this of the best req/s tie; the tie with the lowest p99
# is the reference, so the verdict does not flip with noise between sizes.
TIE = 0.03


def verdict(summary, conns_list=(8, 64)) -> str:
    parts = []
    for conns in conns_list:
        fixed = [(name, s) for (name, c), s in summary.items()
                 if c == conns and name.startswith("fixed")]
        top = max(s["rps"] for _, s in fixed)
        ties = [(name, s) for name, s in fixed if s["rps"] >= top * (1 - TIE)]
        best_name, best = min(ties, key=lambda kv: kv[1]["p99"])
        a = summary[("adaptive", conns)]
        rps = a["rps"] / best["rps"]
        p99 = a["p99"] / best["p99"]
        ok = rps >= 0.95 and p99 <= 1.10
        parts.append(f"c{conns} {'met' if ok else '**not met**'}: adaptive {fmt_ratio(rps)} the req/s "
                     f"of the best fixed size ({best_name}), p99 {fmt_ratio(p99)} of its p99")
    return ("Target (>= 0.95x req/s, p99 <= 1.10x, against the best fixed size: of the sizes within "
            f"{TIE:.0%} of the top req/s, the one with the lowest p99): " + "; ".join(parts) + ".")
