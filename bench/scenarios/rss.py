"""rss: memory of the supervisor and of each worker, per plugin, with one worker and with two.

What a deployment sizes its memory by (a systemd MemoryMax=, a Kubernetes memory request):
for each plugin, `m0serve --workers W` (W = 1, then 2; fork mode, unpinned) is started and
waited for until the supervisor logs `ready:` (every worker's plugin loaded), then measured
from /proc, loaded, and measured again:
  hello_c   `--plugin hello_c`;
  wsgi      `--plugin wsgi --app-dir bench/apps hello_wsgi:app` (a plain WSGI callable);
  flask     `--plugin wsgi --app-dir bench/apps hello_flask:app` (Flask 3.1, one route);
  embed     `--plugin embed` (all-MiniLM-L6-v2 from bench/.venv, the native encoder), and
            again under `taskset -c 0`: one usable CPU, so one handler thread a worker,
            what a Kubernetes pod with a CPU limit of 1 runs;
  pyembed   `--plugin pyembed --app-dir backends numpy_minilm` (the numpy forward pass);
all with `--venv bench/.venv`. The load: hello_c, wsgi and flask get 800 GET / from 8
threads on fresh connections; embed and pyembed get, from 4 threads, 16 one-sentence POST
/embed each, then 2 POST /embed each of 32 inputs cut at the model's 256 tokens (TEI's
largest request), then 2 POST /v1/embeddings at once of 128 such inputs each (with
M0_EMBED_AUTO_TRUNCATE=1, since OpenAI's API has no `truncate`): forward passes of the
plugin's largest size (16,384 tokens), as many at once as a worker here has handler
threads, which is the most a worker holds.

Per process: RSS (VmRSS), its peak (VmHWM), and from /proc/PID/smaps_rollup the PSS (shared
pages split among the processes that map them: the sum over a server is what its cgroup is
charged for them, once) and the private pages (USS: what this process alone holds, which
leaves with it). The table gives medians over rounds (and over the workers of a server):
"server PSS" is supervisor + workers after the load, what a container holding this server
needs; "+1 worker" is server PSS with two workers minus with one, what each further
worker costs.
"""

from __future__ import annotations

import json
import os
import re
import socket
import threading
import time

import harness as h

TITLE = "rss — memory per worker with each plugin (supervisor, workers, peak; 1 and 2 workers)"
ABOUT = ("Resident memory of `m0serve --workers 1` and `--workers 2` with each plugin, after "
         "start and after a load that reaches each plugin's largest request, from /proc.")
NEEDS = ["venv", "pyembed", "flask", "m0serve"]
ROUNDS = 2
PORT = 18300
WORKER_COUNTS = [1, 2]
SENTENCES = h.BENCH / "embed" / "sentences.json"
ONE_BLAS_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1",
                   "MKL_NUM_THREADS": "1", "M0_PYEMBED_BLAS_THREADS": "1"}
APPS = h.BENCH / "apps"

# (key, what it runs, m0serve arguments after --plugin, embedding load?, taskset CPUs)
CONFIGS = [
    ("hello_c", "hello_c (C)", ["hello_c"], False, None),
    ("wsgi", "wsgi, plain WSGI callable", ["wsgi", "--app-dir", str(APPS), "hello_wsgi:app"],
     False, None),
    ("flask", "wsgi, Flask app", ["wsgi", "--app-dir", str(APPS), "hello_flask:app"], False,
     None),
    ("embed", "embed (native MiniLM)", ["embed"], True, None),
    # What a pod with a CPU limit of 1 runs: one handler thread a worker, so one forward
    # pass at a time.
    ("embed1", "embed on 1 CPU (taskset -c 0)", ["embed"], True, "0"),
    ("pyembed", "pyembed numpy_minilm", ["pyembed", "--app-dir", str(h.ROOT / "backends"),
                                         "numpy_minilm"], True, None),
]


def status_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile", "RssShmem"):
                out[key] = int(rest.split()[0])
    return out


def rollup_kib(pid: int) -> dict[str, int]:
    out = {}
    with open(f"/proc/{pid}/smaps_rollup") as f:
        for line in f:
            m = re.match(r"(\w+):\s+(\d+) kB", line)
            if m:
                out[m.group(1)] = int(m.group(2))
    return out


def sample(pid: int) -> dict[str, int]:
    s = status_kib(pid)
    r = rollup_kib(pid)
    return {"rss": s["VmRSS"], "hwm": s["VmHWM"], "anon": s.get("RssAnon", 0),
            "pss": r.get("Pss", 0), "uss": r.get("Private_Clean", 0) + r.get("Private_Dirty", 0)}


def children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(p) for p in f.read().split()]


def http(port: int, request: bytes, timeout: float = 120.0) -> int:
    """One request on a fresh connection; its status."""
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(request)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    return int(data.split(b" ", 2)[1])


def post(port: int, path: str, body: dict) -> bytes:
    data = json.dumps(body).encode()
    return (f"POST {path} HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\nConnection: close\r\n\r\n").encode() + data


def load(port: int, embedding: bool) -> int:
    """The load of the module docs; returns how many requests failed."""
    failed = []
    if embedding:
        sentences = json.loads(SENTENCES.read_text())["sentences"]
        long = [" ".join(sentences[i:] + sentences[:i]) for i in range(len(sentences))]

        def client(k: int) -> None:
            for i in range(16):
                if http(port, post(port, "/embed", {"inputs": sentences[(k * 16 + i) % 64]})) != 200:
                    failed.append(1)
            for i in range(2):
                rows = [long[(k * 2 + i + j) % 64] for j in range(32)]
                if http(port, post(port, "/embed", {"inputs": rows, "truncate": True})) != 200:
                    failed.append(1)
        threads = [threading.Thread(target=client, args=(k,)) for k in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

        def openai(k: int) -> None:
            big = [long[(k + j) % 64] for j in range(128)]
            if http(port, post(port, "/v1/embeddings", {"input": big, "model": "m"})) != 200:
                failed.append(1)
        # As many at once as a worker on this box has handler threads (2 CPUs,
        # 1 compute thread a call): the most forward passes one worker holds.
        threads = [threading.Thread(target=openai, args=(k,)) for k in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    else:
        get = b"GET / HTTP/1.1\r\nHost: b\r\nConnection: close\r\n\r\n"

        def client() -> None:
            for _ in range(100):
                if http(port, get) != 200:
                    failed.append(1)
        threads = [threading.Thread(target=client) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return len(failed)


def wait_ready(run: h.Running, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "ready: serving" in run.logpath.read_text(errors="replace"):
            return
        if run.proc.poll() is not None:
            raise h.BenchError(f"{run.server.name} exited {run.proc.returncode}; see {run.logpath}")
        time.sleep(0.05)
    raise h.BenchError(f"{run.server.name}: no `ready:` line in {timeout:.0f} s; see {run.logpath}")


def measure(key: str, plugin_args: list[str], embedding: bool, cpus: str | None,
            workers: int) -> dict:
    argv = ["{m0serve}", "--plugin", *plugin_args[:1], "--venv", str(h.VENV), "--host",
            "127.0.0.1", "--port", "{port}", "--workers", str(workers), *plugin_args[1:]]
    # The positional ARG goes last, after every flag.
    server = h.Server(f"m0serve rss {key} w{workers}", argv, cpus=cpus,
                      env={**ONE_BLAS_THREAD, "M0_LOG_LEVEL": "info",
                           # OpenAI's route takes no `truncate`: cut there too.
                           "M0_EMBED_AUTO_TRUNCATE": "1"}, start_timeout=120.0)
    for var in ("M0_WORKERS", "M0_EMBED_THREADS", "M0_EMBED_MODEL_DIR"):
        os.environ.pop(var, None)
    h.wait_port_free(PORT)
    run = h.start(server, PORT)
    try:
        wait_ready(run)
        time.sleep(1.0)             # the loops settle; nothing is in flight
        pids = children(run.pid)
        if len(pids) != workers:
            raise h.BenchError(f"{server.name}: {len(pids)} workers, not {workers}")
        at_ready = {p: sample(p) for p in pids}
        failed = load(PORT, embedding)
        time.sleep(1.0)
        after = {p: sample(p) for p in pids}
        sup = sample(run.pid)
    finally:
        h.stop(run)
    return {"workers": workers, "failed": failed, "supervisor": sup,
            "ready": list(at_ready.values()), "after": list(after.values())}


def mib(kib: float) -> str:
    return f"{kib / 1024:.1f}"


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    results: dict[tuple[str, int], list[dict]] = {}
    for r in range(rounds):
        order = CONFIGS if r % 2 == 0 else CONFIGS[::-1]
        for key, _, plugin_args, embedding, cpus in order:
            for w in WORKER_COUNTS:
                m = measure(key, plugin_args, embedding, cpus, w)
                results.setdefault((key, w), []).append(m)
                h.log(f"round {r + 1}/{rounds} {key} --workers {w}: supervisor "
                      f"{mib(m['supervisor']['rss'])} MiB, workers "
                      + ", ".join(f"{mib(s['rss'])}/{mib(s['hwm'])} MiB" for s in m["after"])
                      + f" (RSS/peak); {m['failed']} failed")

    def med(key: str, w: int, f) -> float:
        return h.median([f(m) for m in results[(key, w)]])

    def worker_med(key: str, w: int, phase: str, field: str) -> float:
        return h.median([s[field] for m in results[(key, w)] for s in m[phase]])

    def total_pss(m: dict) -> float:
        return m["supervisor"]["pss"] + sum(s["pss"] for s in m["after"])

    rows = []
    notes = []
    for key, label, _, _, _ in CONFIGS:
        one = med(key, 1, total_pss)
        two = med(key, 2, total_pss)
        for w in WORKER_COUNTS:
            rows.append([
                label if w == 1 else "",
                str(w),
                mib(med(key, w, lambda m: m["supervisor"]["rss"])),
                mib(worker_med(key, w, "ready", "rss")),
                mib(worker_med(key, w, "after", "rss")),
                mib(worker_med(key, w, "after", "hwm")),
                mib(worker_med(key, w, "after", "uss")),
                mib(worker_med(key, w, "after", "anon")),
                mib(med(key, w, total_pss)),
                mib(two - one) if w == 2 else "",
            ])
        failed = sum(m["failed"] for w in WORKER_COUNTS for m in results[(key, w)])
        if failed:
            notes.append(f"**{label}: {failed} request(s) failed** during the loads")
    notes.append("MiB = 2^20 bytes. Per process: RSS = VmRSS; peak = VmHWM; private = "
                 "Private_Clean + Private_Dirty of smaps_rollup (USS); anon = RssAnon. "
                 "server PSS = the supervisor's PSS + every worker's, after the load.")
    notes.append("Raw samples (KiB, per round: supervisor rss/pss; each worker rss/hwm/pss/uss "
                 "after the load): " + "; ".join(
                     f"{key} w{w}: " + " | ".join(
                         f"{m['supervisor']['rss']}/{m['supervisor']['pss']}; " + ", ".join(
                             f"{s['rss']}/{s['hwm']}/{s['pss']}/{s['uss']}" for s in m["after"])
                         for m in ms)
                     for (key, w), ms in results.items()))
    return h.Report(TITLE, ["plugin", "workers", "supervisor RSS", "worker RSS at ready",
                            "worker RSS after load", "worker peak RSS", "worker private",
                            "worker anon", "server PSS", "+1 worker (PSS)"], rows,
                    setup=[f"{rounds} round(s); per round each plugin with --workers 1 then 2, "
                           "the plugins in order then reversed; medians over rounds and "
                           "workers; MiB.",
                           "Fork mode, unpinned (but the 1-CPU row), `--venv bench/.venv`, one BLAS thread "
                           "(OPENBLAS/OMP/MKL_NUM_THREADS=1, M0_PYEMBED_BLAS_THREADS=1); "
                           "the embedding plugins at their defaults (M0_EMBED_THREADS 1, "
                           "M0_EMBED_MAX_BATCH_BYTES 65536: passes of at most 16,384 tokens).",
                           "Load: see bench/scenarios/rss.py (hello/wsgi/flask: 800 GET /; "
                           "embed/pyembed: 64 one-sentence and 8 32x256-token POST /embed, "
                           "then 2 /v1/embeddings of 128x256 tokens at once)."],
                    notes=notes)
