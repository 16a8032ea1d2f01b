"""Shared by pool_cpu, pool_release and pool_sleep: the adaptive handler pool
against fixed sizes on one WSGI view, in three groups, each alternated in
one run and judged against the best fixed size of its own sweep:

- "x1 CPU 0": one worker pinned to CPU 0, wrk on CPU 1, 8 and 64
  connections, fixed sizes 1, 2, 4, 8 (and a "loop calls" row);
- "x1 unpinned": one worker with both CPUs (2 usable CPUs per worker),
  wrk unpinned too, 8 and 32 connections;
- "x2": `--workers 2` unpinned (the workers share the two CPUs), wrk
  unpinned, 8 and 32 connections.

The unpinned groups sweep the sizes each scenario names (`sweep`): per
worker, so "x2 fixed 1" is one thread in each of the two workers.

The target (SPEC P9): the adaptive pool reaches at least 0.95x the best fixed
size's req/s on every view, with a p99 no worse than the best fixed size's
by more than 10%. The sweep picks the best fixed size; a held-out check then
measures adaptive beside it alone, and that check is the verdict (see
CONFIRM_ROUNDS for why).

Every pool runs with --no-inline: on one CPU a worker would otherwise make
loop calls (the loop's thread calls the app itself while no handler thread
is busy), and the pool would sit idle for any view that neither blocks for
2 ms nor computes for 8. One more row, "loop calls", is the default
configuration (adaptive pool, loop calls on) for comparison; the verdict
does not read it.
"""

import os
import types

import harness as h
from harness import M0SERVE, Load, Server, fmt_ratio

# POOL_SIZES=adaptive,1,2 narrows a run while tuning (never for a recorded one).
SIZES = os.environ.get("POOL_SIZES", "adaptive,1,2,4,8,loop").split(",")
NEEDS = ["wrk", "m0serve"]
ANCHOR = "adaptive"
# Four short rounds rather than two long ones, for the same measured time:
# between rounds the same fixed size moved by 10-20% here (and by 30%
# between two sittings of the same day), so a median of two, which is their
# mean, let one slow round decide a 0.95x or 1.10x verdict; a median of four
# (A..F, F..A, A..F, F..A) needs two.
ROUNDS = 4
DURATION = 5
WARMUP = 3  # the adaptive pool settles within the warm-up


def servers(path: str, body: bytes, sizes=None, prefix: str = "", workers: int = 1,
            cpus: str | None = "0") -> list:
    out = []
    for size in sizes or SIZES:
        size = str(size)
        # Debug: the log then carries the pool's decisions and its closing line, which
        # the notes quote (`closing_lines`); a handful of lines a run.
        cmd = [str(M0SERVE), "--plugin", "wsgi", "--app-dir", "{root}/tests/apps",
               "--host", "127.0.0.1", "--port", "{port}", "--workers", str(workers),
               "--log-level", "debug"]
        if size == "loop":
            name = "loop calls"
        elif size == "adaptive":
            name = size
            cmd.append("--no-inline")
        else:
            name = f"fixed {size}"
            cmd += ["--no-inline", "--blocking-threads", size]
        cmd.append("pool_app:application")
        out.append(Server(prefix + name, cmd, cpus=cpus, expect=body, path=path,
                          unpinned_load=cpus is None))
    return out


def loads(path: str) -> list:
    return [Load(conns=8, path=path), Load(conns=64, path=path)]


# Fixed sizes within this of the best req/s tie; the tie with the lowest p99
# is the reference, so the verdict does not flip with noise between sizes.
TIE = 0.03
# Rounds of the held-out check: adaptive against the sweep's best fixed size
# only, alternated (A,B / B,A), judged on the median of the per-round ratios.
# Why: the sweep's best is the lowest of several noisy p99 medians, which is
# biased low (a winner's curse): the last sweeps failed adaptive against
# fixed 1 by 1.22-1.37x on the pinned GIL-holding view, where adaptive
# settles on one thread within 0.15 s and runs what fixed 1 runs. Rounds that
# did not pick the reference cannot flatter it, and pairing each round's two
# neighbouring runs takes out the drift between rounds (10-20% here). Six
# rather than four: on the pinned GIL-holding view the per-round ratios of
# the same configuration spread 0.83-1.02, and a median of four (the mean of
# the middle two) let one such round decide the 0.95x verdict.
CONFIRM_ROUNDS = 6


def best_fixed(summary, conns: int, prefix: str = "") -> tuple[str, dict]:
    """The sweep's best fixed size at `conns`: of the sizes within TIE of the top
    req/s, the one with the lowest p99."""
    fixed = [(name, s) for (name, c), s in summary.items()
             if c == conns and name.startswith(prefix + "fixed")]
    top = max(s["rps"] for _, s in fixed)
    ties = [(name, s) for name, s in fixed if s["rps"] >= top * (1 - TIE)]
    return min(ties, key=lambda kv: kv[1]["p99"])


def _judge(rps: float, p99: float) -> bool:
    return rps >= 0.95 and p99 <= 1.10


def verdict(summary, conns_list=(8, 64), prefix: str = "") -> str:
    parts = []
    for conns in conns_list:
        best_name, best = best_fixed(summary, conns, prefix)
        a = summary[(prefix + "adaptive", conns)]
        rps = a["rps"] / best["rps"]
        p99 = a["p99"] / best["p99"]
        parts.append(f"c{conns} {'met' if _judge(rps, p99) else 'not met'}: adaptive {fmt_ratio(rps)} the req/s "
                     f"of the best fixed size ({best_name}), p99 {fmt_ratio(p99)} of its p99")
    return (f"{prefix.strip() or 'x1 CPU 0'}, sweep (for information: the reference is picked and judged on the "
            f"same rounds; the held-out check above decides): of the sizes within {TIE:.0%} of the top req/s, "
            "the one with the lowest p99: " + "; ".join(parts) + ".")


def paired(summary, a_name: str, b_name: str, conns: int) -> tuple[float, float, list[str]]:
    """Median over rounds of a's req/s and p99 over b's in the same round."""
    pairs = list(zip(summary[(a_name, conns)]["rounds"], summary[(b_name, conns)]["rounds"]))
    rps = h.median([a[0] / b[0] for a, b in pairs])
    p99 = h.median([a[1] / b[1] for a, b in pairs])
    each = [f"{a[0] / b[0]:.2f}/{a[1] / b[1]:.2f}" for a, b in pairs]
    return rps, p99, each


def closing_lines(srvs: list) -> list[str]:
    """What each adaptive pool concluded in its last round (the call path and
    the pool's reason, from each worker's closing line), so that a verdict
    can be read beside what the controller did."""
    notes = []
    for s in srvs:
        if not s.name.endswith("adaptive"):
            continue
        log = (h.server_dir(s) / "server.log").read_text(errors="replace")
        last = log.rsplit("\n$ ", 1)[-1]
        ends = [line.split("call path: ", 1)[1] for line in last.splitlines()
                if "thread(s) at the end" in line and "call path: " in line]
        if ends:
            notes.append(f"{s.name}, closing line(s) of its last round: " + " | ".join(ends))
    return notes


# POOL_GROUPS=x2 narrows a run while tuning (never for a recorded one).
GROUPS = os.environ.get("POOL_GROUPS", "pinned,unpinned,x2").split(",")
# The unpinned groups' measured runs: shorter, as they add 16 runs each.
UNPINNED_DURATION = 4


def run_groups(title: str, opts, path: str, body: bytes, sweep1: list, sweep2: list) -> "h.Report":
    """The three groups of the module docstring, one harness run each, in
    one table; `sweep1`/`sweep2`: the fixed sizes of the unpinned groups
    with one worker and with two."""
    unpinned_loads = [Load(conns=8, path=path, cpus=None), Load(conns=32, path=path, cpus=None)]
    groups = []
    if "pinned" in GROUPS:
        groups.append(("", servers(path, body), loads(path), (8, 64), None))
    if "unpinned" in GROUPS:
        groups.append(("x1 unpinned ", servers(path, body, ["adaptive", *sweep1], "x1 unpinned ", 1, None),
                       unpinned_loads, (8, 32), UNPINNED_DURATION))
    if "x2" in GROUPS:
        groups.append(("x2 ", servers(path, body, ["adaptive", *sweep2, "loop"], "x2 ", 2, None),
                       unpinned_loads, (8, 32), UNPINNED_DURATION))
    merged = None
    for prefix, srvs, lds, conns, duration in groups:
        sub = types.SimpleNamespace(
            __name__="pool", TITLE=title, SERVERS=srvs, LOADS=lds,
            ANCHOR=prefix + "adaptive", ROUNDS=ROUNDS, DURATION=DURATION, WARMUP=WARMUP)
        sub_opts = opts
        if duration and not opts.duration and not opts.quick:
            sub_opts = types.SimpleNamespace(**{**vars(opts), "duration": duration})
        swept = {}
        sub.verdict = lambda summary, c=conns, p=prefix: (swept.update(summary), verdict(summary, c, p))[1]
        report = h.throughput(sub, sub_opts)
        report.notes += closing_lines(srvs)
        checks = held_out(sub, sub_opts, swept, srvs, lds, prefix)
        report.rows += checks.rows
        report.notes.insert(0, checks.verdict)
        if merged is None:
            merged = report
            merged.setup = [f"Group {prefix.strip() or 'x1 CPU 0'}: {line}" if i < 2 else line
                            for i, line in enumerate(report.setup)]
        else:
            merged.rows += report.rows
            merged.setup += [f"Group {prefix.strip()}: {line}" for line in report.setup[:2]]
            merged.notes += report.notes
    return merged


def held_out(sub, opts, swept: dict, srvs: list, lds: list, prefix: str) -> types.SimpleNamespace:
    """The held-out check of CONFIRM_ROUNDS: for each load, adaptive against the
    sweep's best fixed size, alone and alternated; judged on the paired ratios."""
    rows, parts, rounds = [], [], 0
    by_name = {s.name: s for s in srvs}
    for ld in lds:
        best_name, _ = best_fixed(swept, ld.conns, prefix)
        a_name = prefix + "adaptive"
        check = types.SimpleNamespace(**{**vars(sub), "SERVERS": [by_name[a_name], by_name[best_name]],
                                         "LOADS": [ld], "ROUNDS": CONFIRM_ROUNDS})
        got = {}
        check.verdict = lambda summary: (got.update(summary), "")[1]
        # --rounds sizes the sweep; the check keeps its own CONFIRM_ROUNDS.
        report = h.throughput(check, types.SimpleNamespace(**{**vars(opts), "rounds": None}))
        rows += [[f"held-out: {row[0]}", *row[1:]] for row in report.rows]
        rps, p99, each = paired(got, a_name, best_name, ld.conns)
        rounds = len(each)   # as the harness ran them (--quick: one)
        parts.append(f"c{ld.conns} {'met' if _judge(rps, p99) else '**not met**'}: adaptive {fmt_ratio(rps)} the "
                     f"req/s of {best_name}, p99 {fmt_ratio(p99)} of its p99 (per round, req/s/p99: "
                     + ", ".join(each) + ")")
    group = prefix.strip() or "x1 CPU 0"
    text = (f"**{group}, held-out check** (target: >= 0.95x req/s, p99 <= 1.10x, against the sweep's best fixed "
            f"size, re-measured beside adaptive in {rounds} round(s) of their own; medians of the per-round "
            "ratios): " + "; ".join(parts) + ".")
    return types.SimpleNamespace(rows=rows, verdict=text)
