"""disruption: what a client sees when a worker is killed, the server reloads
or stops, in the middle of a wrk run.

m0serve hello_c --workers 2, unpinned; wrk -t2 -c64 for 8 s, keep-alive. At
3 s one event: none (the baseline), kill -9 of worker 0, SIGHUP (every
worker replaced one at a time), SIGTERM (drain and exit). wrk counts what
failed: read and write errors and timeouts are requests that failed in
flight; connect errors are new connections refused once a stop has begun
(the listener is closed then, by design) and are not failed requests.
"""

import os
import re
import signal
import subprocess
import threading
import time

import harness as h

TITLE = "disruption — failed requests when a worker dies, the server reloads, or stops, under wrk"
ABOUT = ("m0serve hello_c with two workers under wrk -t2 -c64; at 3 s of 8 one event. "
         "Counts of what wrk saw fail.")
TARGET = ("kill -9: only that worker's requests in flight fail (at most its connections); "
          "SIGHUP: 0 failed; SIGTERM: 0 failed requests and exit 0.")
NEEDS = ["wrk", "m0serve"]
PORT = 18200
EVENTS = ["none", "kill -9 worker 0", "SIGHUP", "SIGTERM"]


def worker_pids(logpath) -> list[int]:
    pids = {}
    for line in open(logpath, encoding="utf-8", errors="replace"):
        m = re.search(r"supervisor: worker (\d+) pid=(\d+) started", line)
        if m:
            pids[int(m.group(1))] = int(m.group(2))
    return [pids[k] for k in sorted(pids)]


def one(event: str, seconds: float) -> list[str]:
    server = h.Server("m0serve x2", ["{m0serve}", "--plugin", "hello_c", "--host", "127.0.0.1",
                                     "--port", "{port}", "--workers", "2"], cpus=None,
                      expect=b"hello, world\n")
    h.wait_port_free(PORT)
    run = h.start(server, PORT)
    result = {}

    def load():
        out = subprocess.run(["wrk", "-t2", "-c64", f"-d{seconds:g}s", "--latency",
                              f"http://127.0.0.1:{PORT}/"], capture_output=True, text=True)
        result["out"] = out.stdout + out.stderr

    t = threading.Thread(target=load)
    t.start()
    time.sleep(3)
    exit_code = "-"
    if event.startswith("kill"):
        os.kill(worker_pids(run.logpath)[0], signal.SIGKILL)
    elif event == "SIGHUP":
        os.kill(run.pid, signal.SIGHUP)
    elif event == "SIGTERM":
        os.kill(run.pid, signal.SIGTERM)
        exit_code = str(run.proc.wait(30))
    t.join()
    h.stop(run)
    r = h.parse_wrk(result["out"]) if "Requests/sec" in result["out"] else {"requests": 0, "error_detail": {}}
    d = r.get("error_detail", {})
    # After a stop, wrk's reconnects are refused, and wrk counts a refused
    # connect as a write error: no request was sent on those.
    writes = 0 if event == "SIGTERM" else d.get("write", 0)
    failed = d.get("read", 0) + writes + d.get("timeout", 0) + d.get("non-2xx/3xx", 0)
    h.log(f"{event}: {r['requests']:,} requests, failed {failed}, detail {d}, exit {exit_code}")
    return [event, f"{r['requests']:,}", str(failed), str(d.get("read", 0)), str(d.get("write", 0)),
            str(d.get("timeout", 0)), str(d.get("non-2xx/3xx", 0)), str(d.get("connect", 0)), exit_code]


def run(opts) -> h.Report:
    seconds = 5 if opts.quick else 8
    rounds = opts.rounds or (1 if opts.quick else 2)
    rows = []
    for i in range(rounds):
        for event in EVENTS:
            rows.append(one(event, seconds) + [str(i + 1)])
    return h.Report(
        TITLE,
        ["event at 3 s", "requests", "failed", "read err", "write err", "timeouts", "non-2xx",
         "connect refused", "server exit", "round"],
        rows,
        setup=[f"`m0serve --plugin hello_c --workers 2` unpinned; `wrk -t2 -c64 -d{seconds}s`; "
               f"{rounds} round(s) of each event."],
        notes=["failed = read + write errors + timeouts + non-2xx: requests that were sent and "
               "not answered with a success. After SIGTERM the listener is closed, so wrk's "
               "reconnects are refused, and wrk counts a refused connect as a write error: the "
               "SIGTERM rows' write errors are those (no request was sent on them) and are not "
               "in `failed`."])
