"""slowloris: eight ordinary clients beside connections that hold the server
without finishing, against the same clients alone.

m0serve hello_c, one worker pinned to CPU 0; wrk -t1 -c8 (the ordinary
clients, keep-alive GET /) pinned to CPU 1, as is the attacker,
bench/tools/slowloris.c, a process of its own; what it sent per second
while measured and the CPU it used are reported, so an attack starved of
CPU, or one that starves wrk, shows.

On a box this small the load generator, the attacker and the server share
two CPUs, and the p99 of 8 clients against a saturated server is as much
the scheduler's as the server's: the baseline alone measured 112 us to
1.16 ms over runs. Every microsecond the attacker takes of CPU 1 is one
wrk reads its answers late and books as the server's. The attacker was a
thread of this harness, in Python: with 10,000 idle connections that it
did not even write to, the p99 was 14.8x of none (1.27x with the C
process). Its timing matters as much as its cost: the same bytes sent in
one burst a second (sends at 1 s ticks instead of 10 ms) gave a p99 of
1.3-1.7 ms against 270-450 us spread over the second, and 10 ms ticks
(ten sends at once) against 1 ms ticks gave 170-230 us against 106-134 us
(none: 78-91 us), the server's CPU per request 3% up in both.

Each row is one attack, measured for DURATION s after the attack has run
WARM s (so its connections have been cut and reopened at least once):

- none: the baseline, started with the same flags;
- slow heads: 1,000 connections, opened over the first second, each
  sending a request head a byte a second at its own phase; one that is cut
  (408 or a close) is reopened at once, so 1,000 are always open, as a
  real slowloris keeps them;
- slow bodies: 1,000 POSTs whose head arrives whole and whose body then
  arrives a byte a second (below `--body-min-rate`), reopened when cut;
- never reading: 16 connections pipelining GET /stream and reading
  nothing, reopened when closed (at `--idle-timeout`, which also bounds a
  response the client stops reading);
- 10,000 idle: 10,000 keep-alive connections, each served once, then
  silent; none may be closed during the run (the idle timeout is longer).

The server runs with `--header-timeout 5 --body-timeout 5 --idle-timeout 5`
(120 for the idle row and its own baseline is the same server), so a run
sees each attack cut about twice. What the attack connections got is
counted: 408, closed without an answer, or answered (which no slow head
or body may be).
"""

import json
import os
import resource
import signal
import subprocess
import threading
import time

import harness as h

TITLE = "slowloris — 8 ordinary clients beside slow heads, slow bodies, non-readers, 10k idle connections"
ABOUT = ("Whether connections that never finish, or never read, or sit idle by the "
         "thousand slow down the clients that behave, and whether each is cut.")
TARGET = ("The ordinary clients' p99 within 2x of the run without the attack; every slow "
          "connection gets 408 or is closed at its timeout, none answered; 10,000 idle "
          "connections all held.")
NEEDS = ["wrk", "m0serve"]
# The first run's port; each run has a port of its own (PORT + its number):
# a run leaves thousands of server-side TIME_WAIT connections on its port
# for a minute, which the next attack's connects would have to step around.
PORT = 18300
WARM = 7
BODY = b"hello, world\n"


def flags(idle_timeout: int) -> list[str]:
    return ["{m0serve}", "--plugin", "hello_c", "--host", "127.0.0.1", "--port", "{port}",
            "--workers", "1", "--max-keepalive-requests", "0", "--header-timeout", "5",
            "--body-timeout", "5", "--idle-timeout", str(idle_timeout)]


ATTACKER_SRC = h.ROOT / "bench" / "tools" / "slowloris.c"
ATTACKER = h.OUT / "slowloris"
# The attacker's name for each attack.
KINDS = {"slow heads": "heads", "slow bodies": "bodies", "never reading": "stream", "idle": "idle"}


def build_attacker() -> None:
    if ATTACKER.exists() and ATTACKER.stat().st_mtime >= ATTACKER_SRC.stat().st_mtime:
        return
    h.OUT.mkdir(parents=True, exist_ok=True)
    subprocess.run(["cc", "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(ATTACKER), str(ATTACKER_SRC)],
                   check=True)


class Attack:
    """The attacker process (bench/tools/slowloris.c) on CPU 1: keeps `count`
    attack connections open until stopped and tallies how each one that
    ended was ended."""

    def __init__(self, kind: str, count: int, port: int):
        self.kind, self.count = kind, count
        self.proc = subprocess.Popen(["taskset", "-c", "1", str(ATTACKER), KINDS[kind], str(count), str(port)],
                                     stdout=subprocess.PIPE, text=True)

    def wait_ready(self, timeout: float) -> None:
        ready = threading.Event()
        # readline has no timeout: a thread reads it, the harness waits.
        t = threading.Thread(target=lambda: self.proc.stdout.readline() == "ready\n" and ready.set(),
                             daemon=True)
        t.start()
        if not ready.wait(timeout):
            self.proc.kill()
            raise h.BenchError(f"{self.kind}: the attacker's {self.count:,} connections were not "
                               f"{'served' if self.kind == 'idle' else 'open'} within {timeout:.0f} s")

    def tally(self) -> dict:
        """Its counts now (SIGUSR1 makes it print them)."""
        self.proc.send_signal(signal.SIGUSR1)
        return json.loads(self.proc.stdout.readline())

    def cpu_ticks(self) -> int:
        return h.tree_ticks(self.proc.pid).get(self.proc.pid, 0)

    def finish(self) -> dict:
        self.proc.send_signal(signal.SIGTERM)
        out, _ = self.proc.communicate(timeout=30)
        t = json.loads(out.strip().splitlines()[-1])
        return {"opened": t["opened"], "408": t["408"], "closed": t["closed"],
                "answered": t["answered"], "sent": t["sent"], "open at end": t["open"]}


ATTACKS = [("none", 0, 300), ("slow heads", 1000, 300), ("slow bodies", 1000, 300),
           ("never reading", 16, 5), ("idle", 10_000, 300)]


def one(kind: str, count: int, idle_timeout: int, seconds: float, port: int) -> dict:
    server = h.Server(f"m0serve ({kind})", flags(idle_timeout), cpus="0", expect=BODY)
    h.wait_port_free(port)
    run = h.start(server, port)
    attack = None
    try:
        if count:
            attack = Attack(kind, count, port)
            attack.wait_ready(90)
            # Long enough for the first cuts and reopenings (5 s timeouts).
            time.sleep(WARM if kind != "idle" else 3)
        rss0 = rss_kib(run.pid)
        if attack:
            sent0, a0, t0 = attack.tally()["sent"], attack.cpu_ticks(), time.monotonic()
        r = h.measure(run, h.Load(conns=8), seconds)
        if attack:
            wall = time.monotonic() - t0
            r["sent_per_s"] = (attack.tally()["sent"] - sent0) / wall
            r["attack_cpu"] = 100.0 * (attack.cpu_ticks() - a0) / h.CLK_TCK / wall
            # The attacker is a process of its own: not the noise of others.
            r["other"] = max(0.0, r["other"] - r["attack_cpu"])
        with open(h.server_dir(server) / "wrk.log", "a") as f:  # for inspection
            f.write(f"\n# port {port}\n{r['raw']}")
        r["rss"] = rss_kib(run.pid)
        r["rss0"] = rss0
        r["attack"] = attack.finish() if attack else {}
        attack = None
    finally:
        if attack:
            attack.proc.kill()
            attack.proc.wait()
        h.stop(run)
    return r


def rss_kib(supervisor: int) -> int:
    total = 0
    for pid in h.tree_pids(supervisor):
        if pid == supervisor:
            continue
        try:
            for line in open(f"/proc/{pid}/status"):
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
        except OSError:
            pass
    return total


def run(opts) -> h.Report:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard < 10_500:
        raise h.BenchError(f"RLIMIT_NOFILE hard limit {hard} is below 10,500: raise it to run the idle row")
    # The server inherits it: 10,000 idle connections need the descriptors.
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    os.sched_setaffinity(0, {1})
    build_attacker()
    seconds = 3 if opts.quick else (opts.duration or 10)
    rounds = opts.rounds or (1 if opts.quick else 3)
    results: dict[str, list[dict]] = {k: [] for k, _, _ in ATTACKS}
    for i in range(rounds):
        order = ATTACKS if i % 2 == 0 else ATTACKS[::-1]
        for j, (kind, count, idle) in enumerate(order):
            r = one(kind, count, idle, seconds, PORT + i * len(ATTACKS) + j)
            h.log(f"round {i + 1} {kind}: {h.fmt_rps(r['rps'])} req/s, p99 {h.fmt_us(r['p99'])}, "
                  f"attack {r['attack']}")
            results[kind].append(r)
    base = results["none"]
    base_p99 = h.median([r["p99"] for r in base])
    base_p50 = h.median([r["p50"] for r in base])
    base_rps = h.median([r["rps"] for r in base])
    rows = []
    for kind, count, _ in ATTACKS:
        rs = results[kind]
        p99, p50, rps = (h.median([r[k] for r in rs]) for k in ("p99", "p50", "rps"))
        tally = {k: sum(r["attack"].get(k, 0) for r in rs) for k in ("opened", "408", "closed", "answered", "open at end")}
        if kind == "idle":
            per_conn = h.median([(r["rss0"] - base_rss(base)) / count for r in rs])
            fate = f"{tally['open at end']:,} of {count * len(rs):,} held; {per_conn:.2f} KiB RSS each"
        elif count:
            fate = (f"{tally['opened']:,} opened: {tally['408']:,} got 408, {tally['closed']:,} closed, "
                    f"{tally['answered']} answered; sent {h.median([r['sent_per_s'] for r in rs]):,.0f} B/s "
                    "while measured")
        else:
            fate = "-"
        rows.append([kind, f"{count:,}", h.fmt_rps(rps), h.fmt_ratio(rps / base_rps), h.fmt_us(p50),
                     h.fmt_ratio(p50 / base_p50), h.fmt_us(p99), h.fmt_ratio(p99 / base_p99),
                     f"{h.median([r['cpu'] for r in rs]):.0f}%", f"{h.median([r['wrk_cpu'] for r in rs]):.0f}%",
                     f"{h.median([r.get('attack_cpu', 0.0) for r in rs]):.1f}%",
                     f"{max(r['other'] for r in rs):.0f}%", fate])
    worst = max(h.median([r["p99"] for r in results[k]]) / base_p99 for k, c, _ in ATTACKS if c)
    return h.Report(
        TITLE,
        ["attack", "connections", "req/s (8 clients)", "÷ none", "p50", "÷ none", "p99", "÷ none",
         "server CPU", "wrk CPU", "attacker CPU", "other load", "attack connections' fate"],
        rows,
        setup=[f"`m0serve --plugin hello_c --workers 1 --header-timeout 5 --body-timeout 5 "
               f"--idle-timeout 5|300` on CPU 0; `wrk -t1 -c8 -d{seconds}s` and the attacker "
               f"(`bench/tools/slowloris.c`, a process of its own) on CPU 1; "
               f"{rounds} round(s), attacks alternating in order; medians; the fate column sums the rounds."],
        notes=[f"Target: p99 within 2x of none for every attack: worst {h.fmt_ratio(worst)} "
               f"({'met' if worst <= 2.0 else '**not met**'}).",
               "The attacker shares wrk's CPU; 'attacker CPU' is what it used of that CPU while measured, "
               "'sent' what it sent per second meanwhile (slow heads and bodies: a byte a second each, "
               "about 1,000 B/s at full strength).",
               "Slow bodies send 1 byte/s, below the default `--body-min-rate` of 500 bytes/s, so each is "
               "cut (408) after `--body-timeout` (5 s) plus a second per 500 bytes received; without the "
               "rate rule a body whose gaps stay under `--body-timeout` is never cut.",
               "never reading: the server stops writing to a connection whose socket is full, and closes "
               "it when it has made no progress for `--idle-timeout`.",
               "idle: RSS per connection = (worker RSS with the 10,000 idle - the baseline's worker RSS) / "
               "10,000; the kernel's socket buffers are not in it. Here the 10,000 send their one request "
               "together, so their read buffers are in use at once and the freed memory stays in the "
               "allocator's heap; `tests/idle_connections.rs` serves them one at a time and measures "
               "about 0.4 KiB each."])


def base_rss(base: list[dict]) -> float:
    return h.median([r["rss0"] for r in base])
