"""accept_share: two m0serve workers with accept sharing on, off, and one worker.

Part 1, a GIL-holding view (bench/apps/cpu_wsgi.py, about 1 ms of pure
Python per request, its service time measured on this machine at the start):
`--workers 1`, `--workers 2` with M0_ACCEPT_SHARE=1 (on, the default) and
`--workers 2` with M0_ACCEPT_SHARE=0 (off), wrk at 8 and 32 keep-alive
connections. Anchor: one worker.

Part 2, the cost of sharing on the cheapest route: the hello_c plugin,
`--workers 2`, sharing on against off, 64 connections keep-alive and 64
connections with `Connection: close` (one accept per request, which is
where sharing does its work). Anchor: sharing off.

Part 3, where connections land when clients come and go
(`_bursts.py`): the part 1 view with two workers, sharing on against
`--no-accept-share`: twenty back-to-back bursts of 32 connections (one
request each, all closed, the next burst at once) and a churn load (wrk, 16
clients, `Connection: close`), each with the per-worker split. Anchor:
sharing off.

The server is unpinned in all parts (two workers need both cores) and wrk
runs one thread pinned to CPU 1, so one worker shares CPU 1 with wrk. At
~2k req/s wrk needs a few % of a core (part 1); in part 2 wrk needs most of
CPU 1 and is the limit on keep-alive, so compare CPU µs/req there. The server
CPU and wrk CPU columns give what each side used. Each part alternates its
servers in rounds; the two parts run one after the other in one run.
"""

import re
import subprocess
import sys
import types
from pathlib import Path

import harness as h
from harness import Load, Server, fmt_ratio

sys.path.insert(0, str(Path(__file__).parent))
import _bursts  # noqa: E402

TITLE = "accept_share — m0serve two workers: accept sharing on vs off vs one worker"
ABOUT = ("Whether handing each new connection to the least-loaded worker lets two workers "
         "serve a GIL-bound WSGI view twice as fast, and what it costs on a hello route.")
TARGET = ("GIL-holding view: two workers with sharing ≥ 1.7× one worker's req/s, with a p99 "
          "that drops rather than rises; hello_c: sharing on within 3% of off; bursts of 32 "
          "back to back: every burst within 21/11 with sharing on, the first 16/16.")
NEEDS = ["wrk", "venv", "m0serve"]
ROUNDS = 3
DURATION = 10
WARMUP = 2

CPU_BODY = b"done\n"
HELLO_BODY = b"hello, world\n"


def _wsgi(name: str, workers: int, share: str | None) -> Server:
    env = {} if share is None else {"M0_ACCEPT_SHARE": share}
    return Server(name, ["{m0serve}", "--plugin", "wsgi", "--app-dir", "{bench}/apps", "cpu_wsgi:app",
                         "--host", "127.0.0.1", "--port", "{port}", "--workers", str(workers)],
                  cpus=None, env=env, expect=CPU_BODY)


def _hello(name: str, share: str) -> Server:
    return Server(name, ["{m0serve}", "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
                         "--workers", "2"],
                  cpus=None, env={"M0_ACCEPT_SHARE": share}, expect=HELLO_BODY)


CPU = types.SimpleNamespace(
    __name__="accept_share/cpu",
    TITLE="GIL-holding view",
    SERVERS=[_wsgi("cpu: 1 worker", 1, None),
             _wsgi("cpu: 2 workers, sharing on", 2, "1"),
             _wsgi("cpu: 2 workers, sharing off", 2, "0")],
    LOADS=[Load(conns=8), Load(conns=32)],
    ANCHOR="cpu: 1 worker",
)


def _hello_part(kind: str, headers: tuple[str, ...]) -> types.SimpleNamespace:
    servers = [_hello(f"hello_c {kind}: sharing on", "1"), _hello(f"hello_c {kind}: sharing off", "0")]
    return types.SimpleNamespace(__name__=f"accept_share/hello {kind}", TITLE=f"hello_c {kind}",
                                 SERVERS=servers, LOADS=[Load(conns=64, headers=headers)],
                                 ANCHOR=servers[1].name)


# Two parts, not two loads of one part: the harness keys a load by its connection count.
HELLO_KA = _hello_part("keep-alive", ())
HELLO_CLOSE = _hello_part("close", ("Connection: close",))


def _verdict_cpu(summary) -> str:
    parts = []
    for ld in CPU.LOADS:
        one, on, off = (summary[(s.name, ld.conns)] for s in CPU.SERVERS)
        x, p = on["rps"] / one["rps"], on["p99"] / one["p99"]
        ok = x >= 1.7 and p < 1.0
        parts.append(f"c{ld.conns} {'met' if ok else '**not met**'} (sharing on: {fmt_ratio(x)} one "
                     f"worker's req/s, p99 {fmt_ratio(p)} of one worker's; sharing off: "
                     f"{fmt_ratio(off['rps'] / one['rps'])} req/s, p99 {fmt_ratio(off['p99'] / one['p99'])})")
    return "Target (GIL-holding view, ≥ 1.70× one worker, p99 lower): " + "; ".join(parts) + "."


def _verdict_hello(part):
    def verdict(summary) -> str:
        on, off = (summary[(s.name, 64)] for s in part.SERVERS)
        x, c = on["rps"] / off["rps"], on["cpu_per_req"] / off["cpu_per_req"]
        return (f"Target ({part.TITLE}, sharing on ≥ 0.97× off): {'met' if x >= 0.97 else '**not met**'} "
                f"(on/off: {fmt_ratio(x)} req/s, {fmt_ratio(c)} CPU per request, "
                f"{fmt_ratio(on['p99'] / off['p99'])} p99).")
    return verdict


CPU.verdict = _verdict_cpu
HELLO_KA.verdict = _verdict_hello(HELLO_KA)
HELLO_CLOSE.verdict = _verdict_hello(HELLO_CLOSE)


def _bursts_server(name: str, share: bool) -> Server:
    return Server(name, ["{m0serve}", "--plugin", "wsgi", "--app-dir", "{bench}/apps", "cpu_wsgi:app",
                         "--host", "127.0.0.1", "--port", "{port}", "--workers", "2"]
                  + ([] if share else ["--no-accept-share"]),
                  cpus=None, expect=CPU_BODY)


BURSTS_ON = _bursts_server("bursts: 2 workers, sharing on", True)
BURSTS_OFF = _bursts_server("bursts: 2 workers, --no-accept-share", False)


def _verdict_bursts(summary, bursts: int) -> str:
    on, off = summary[BURSTS_ON.name], summary[BURSTS_OFF.name]
    first_ok = all(f == [16, 16] for f in on["first"])
    worst_ok = on["bursts_worst"] <= 21
    ok = first_ok and worst_ok
    return (f"Target (bursts of 32 back to back, sharing on): {'met' if ok else '**not met**'} "
            f"(first bursts {', '.join(f'{a}/{b}' for a, b in on['first'])}; busiest worker of the "
            f"later {bursts - 1} per sample at most {on['bursts_worst']} of 32, median "
            f"{on['bursts_median']:g}; p99 {fmt_ratio(on['bursts_p99'] / off['bursts_p99'])} of "
            f"sharing off, whose busiest worker took up to {off['bursts_worst']}). Churn: "
            f"{fmt_ratio(on['churn_rps'] / off['churn_rps'])} sharing off's req/s, p99 "
            f"{fmt_ratio(on['churn_p99'] / off['churn_p99'])}.")


def service_time() -> str:
    """The view's pure-Python loop timed in-process, pinned to CPU 0."""
    r = subprocess.run(["taskset", "-c", "0", str(h.VENV / "bin" / "python"),
                        str(h.BENCH / "apps" / "cpu_wsgi.py")], capture_output=True, text=True,
                       timeout=60)
    m = re.search(r"(\d+) loops: ([\d.]+) ms", r.stdout)
    return f"{m.group(1)} loops, {m.group(2)} ms per call" if m else f"? ({r.stdout}{r.stderr})"


def run(opts) -> h.Report:
    parts = (CPU, HELLO_KA, HELLO_CLOSE)
    for part in parts:
        part.ROUNDS, part.DURATION, part.WARMUP = ROUNDS, DURATION, WARMUP
    st = service_time()
    h.log(f"cpu_wsgi service time: {st}")
    reps = [h.throughput(part, opts) for part in parts]
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    duration = opts.duration or (3 if opts.quick else DURATION)
    b_heads, b_rows, b_summary, bursts = _bursts.run([BURSTS_ON, BURSTS_OFF], BURSTS_OFF.name, opts,
                                                      rounds, duration)
    st2 = service_time()
    m = re.search(r"([\d.]+) ms", st)
    cap = f", so one worker tops out near {1000 / float(m.group(1)):,.0f} req/s" if m else ""
    setup = [f"Part 1 view: bench/apps/cpu_wsgi.py, {st} (median of 300 in-process calls, CPU 0, "
             f"before the run; after the run: {st2}){cap}.",
             "Part 2 (hello_c, two workers): 64 connections keep-alive, then 64 connections with "
             "`-H 'Connection: close'` (one accept per request), each alternating on/off.",
             "Servers unpinned (CPUs 0-1), wrk pinned to CPU 1. `÷ anchor` is against one worker "
             "in part 1 and against sharing off in part 2."]
    setup += [f"Part 1: {s}" for s in reps[0].setup]
    for p, r in zip(parts[1:], reps[1:]):
        if p.LOADS[0].headers:     # the harness's setup line assumes keep-alive
            r.setup[0] = r.setup[0].replace(", keep-alive.", ", `Connection: close`.")
        setup += [f"Part 2 {p.TITLE}: {s}" for s in r.setup[:2]]
    setup.append(f"Part 3: {rounds} sample(s) per server, alternated; each sample {bursts} bursts of "
                 f"{_bursts.CONNS} (the first one's split listed per sample, the later ones' "
                 f"latencies pooled) then wrk `-c{_bursts.CHURN_CONNS}` `Connection: close` for "
                 f"{duration:g} s after a 1 s warm-up (its split: each worker's drained count, "
                 "warm-up included).")
    rows = [r for rep in reps for r in rep.rows]
    notes = [n for rep in reps for n in rep.notes]
    notes.insert(0, _verdict_bursts(b_summary, bursts))
    return TwoTables(TITLE, reps[0].headers, rows, setup, notes, b_heads, b_rows)


class TwoTables(h.Report):
    """Parts 1-2's table, then part 3's, whose columns differ."""

    def __init__(self, title, headers, rows, setup, notes, headers2, rows2):
        super().__init__(title, headers, rows, setup, notes)
        self.second = h.Report("", headers2, rows2)

    def table(self) -> str:
        return super().table() + "\n\nPart 3, where connections land:\n\n" + self.second.table()
