"""startup: launch to first answered request, fork workers vs spawned workers.

`m0serve --workers 2` forks its workers from the supervisor; with
`--spawn-workers` each worker is forked and then execs the binary afresh.
Each trial launches the server and polls connect + GET / (0.2 ms between
failed tries) until a 200 arrives; the time from just before the launch to
that response is the startup time. Modes alternate, median of 5 each.
Unpinned: the server and its two workers have both CPUs.
"""

import subprocess
import time

import harness as h

TITLE = "startup — m0serve --workers 2: fork vs --spawn-workers, launch to first response"
ABOUT = ("Wall time from launching the server to the first answered GET / "
         "(hello_c plugin, 127.0.0.1), polled in a tight loop.")
NEEDS = ["m0serve"]
TRIALS = 5
PORT = 18100
BASE = ["--plugin", "hello_c", "--host", "127.0.0.1", "--port", str(PORT), "--workers", "2"]
MODES = [("fork", []), ("spawn", ["--spawn-workers"])]
ANCHOR = "fork"


def first_response(argv: list[str], logpath) -> tuple[float, int, int]:
    """Seconds from launch to the first 200; then the process count and how
    many of those processes were exec'd (M0_WORKER_SPAWNED=1 in their environ)."""
    h.wait_port_free(PORT)
    with open(logpath, "ab") as log:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, cwd=h.ROOT, stdout=log, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
    run = h.Running(h.Server("m0serve", argv, cpus=None), PORT, proc, logpath)
    try:
        deadline = t0 + 30
        while True:
            try:
                status, _ = h.http_get(PORT, "/", timeout=1.0)
                if status == 200:
                    dt = time.perf_counter() - t0
                    break
            except OSError:
                pass
            if proc.poll() is not None:
                raise h.BenchError(f"{' '.join(argv)} exited {proc.returncode} before answering; "
                                   f"see {logpath}")
            if time.perf_counter() > deadline:
                raise h.BenchError(f"no answer 30 s after launching {' '.join(argv)}")
            time.sleep(0.0002)
        time.sleep(0.5)                       # let every worker come up, then count
        pids = h.tree_pids(proc.pid)
        spawned = sum(b"M0_WORKER_SPAWNED=1" in _environ(p) for p in pids)
    finally:
        h.stop(run)
    return dt, len(pids), spawned


def _environ(pid: int) -> bytes:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f.read()
    except OSError:
        return b""


def run(opts) -> h.Report:
    helptext = subprocess.run([str(h.M0SERVE), "--help"], capture_output=True, text=True).stdout
    missing = [f for f in ("--workers", "--spawn-workers") if f not in helptext]
    if missing:
        raise h.BenchError(f"{h.M0SERVE} has no {' / '.join(missing)} yet; this scenario waits for it")
    trials = opts.rounds or (2 if opts.quick else TRIALS)
    logdir = h.OUT / "startup"
    logdir.mkdir(parents=True, exist_ok=True)
    times: dict[str, list[float]] = {m: [] for m, _ in MODES}
    procs: dict[str, set[str]] = {m: set() for m, _ in MODES}
    for i in range(trials):
        for mode, extra in (MODES if i % 2 == 0 else MODES[::-1]):
            dt, n, spawned = first_response([str(h.M0SERVE), *BASE, *extra], logdir / f"{mode}.log")
            times[mode].append(dt * 1000)
            procs[mode].add(f"{n} ({spawned} exec'd)")
            h.log(f"trial {i + 1}/{trials} {mode}: {dt * 1000:.1f} ms ({n} processes, {spawned} exec'd)")
    a = h.median(times[ANCHOR])
    rows = [[mode + (" (anchor)" if mode == ANCHOR else ""), f"{h.median(ts):.1f} ms",
             f"{min(ts):.1f} ms", f"{max(ts):.1f} ms", h.fmt_ratio(h.median(ts) / a),
             " / ".join(sorted(procs[mode]))]
            for mode, ts in times.items()]
    return h.Report(TITLE, ["mode", "median", "min", "max", "÷ anchor", "processes"], rows,
                    setup=[f"{trials} trials per mode, alternated; argv "
                           f"`m0serve {' '.join(BASE)} [--spawn-workers]`; unpinned.",
                           "processes = size of the server's process tree 0.5 s after the first "
                           "response (supervisor + workers); exec'd = those with "
                           "M0_WORKER_SPAWNED=1, which checks that spawn mode really exec'd."],
                    notes=["All trials (ms): " + "; ".join(
                        f"{m} " + ", ".join(f"{t:.1f}" for t in ts) for m, ts in times.items())])
