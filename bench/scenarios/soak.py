"""soak: ten minutes of mixed load on two servers at once; errors counted,
memory and descriptors sampled, their slope reported.

Two servers run side by side, unpinned, two workers each:
  hello_c  `m0serve --plugin hello_c --workers 2`;
  wsgi     `m0serve --plugin wsgi --app-dir tests/apps conformance:application --workers 2`
           (the WSGI conformance app of the test suite).
The load, all at once for the whole run:
  - wrk -c16 keep-alive GET / on hello_c;
  - wrk -c8 with `Connection: close` GET / on wsgi: a new connection a request;
  - a client thread POSTing bodies of 1 MiB and of 1 KiB (random bytes, new
    each time) alternately to hello_c's /echo and wsgi's /input/echo on one
    keep-alive connection per server, checking every echoed byte;
  - a client thread opening a connection, sending one GET, reading the
    answer and closing, on both servers in turn.
Every SAMPLE s each process of both servers (supervisor, each worker) is
read from /proc: VmRSS and the count of open descriptors. The slope is a
least-squares line over the samples after the first WARM s (allocators and
caches settle), per minute; a leak shows as a slope that holds over the
run, where noise shows as one near zero against the values' spread.
"""

from __future__ import annotations

import http.client
import os
import re
import socket
import threading
import time

import harness as h

TITLE = "soak — 10 minutes of mixed load on hello_c and WSGI: errors, RSS and open fds over time"
ABOUT = ("Keep-alive and new connections, small and 1 MiB bodies, two servers of two workers "
         "each, for ten minutes: nothing may fail, and memory and descriptors stay flat.")
TARGET = "Zero errors; RSS and open fds flat (slope reported)."
NEEDS = ["wrk", "m0serve"]
HELLO_PORT, WSGI_PORT = 18400, 18401
SAMPLE = 10
WARM = 60


def servers() -> list[tuple[h.Server, int]]:
    common = ["--host", "127.0.0.1", "--port", "{port}", "--workers", "2"]
    return [
        (h.Server("hello_c", ["{m0serve}", "--plugin", "hello_c", *common], cpus=None,
                  expect=b"hello, world\n"), HELLO_PORT),
        (h.Server("wsgi", ["{m0serve}", "--plugin", "wsgi", "--app-dir", str(h.ROOT / "tests" / "apps"),
                           "conformance:application", *common], cpus=None,
                  expect=b"conformance\n"), WSGI_PORT),
    ]


def proc_sample(pid: int) -> tuple[int, int] | None:
    try:
        rss = next(int(line.split()[1]) for line in open(f"/proc/{pid}/status")
                   if line.startswith("VmRSS:"))
        fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, StopIteration):
        return None
    return rss, fds


def slope_per_min(points: list[tuple[float, float]]) -> float:
    if len(points) < 2:
        return 0.0
    n = len(points)
    mt = sum(t for t, _ in points) / n
    mv = sum(v for _, v in points) / n
    den = sum((t - mt) ** 2 for t, _ in points)
    return 60.0 * sum((t - mt) * (v - mv) for t, v in points) / den if den else 0.0


class Bodies(threading.Thread):
    """POSTs 1 MiB and 1 KiB bodies to both echo routes, checking each answer."""

    def __init__(self, stop: threading.Event):
        super().__init__(daemon=True)
        self.stop, self.requests, self.errors, self.bytes = stop, 0, [], 0

    def run(self) -> None:
        conns = {HELLO_PORT: None, WSGI_PORT: None}
        paths = {HELLO_PORT: "/echo", WSGI_PORT: "/input/echo"}
        i = 0
        while not self.stop.is_set():
            port = HELLO_PORT if i % 2 == 0 else WSGI_PORT
            body = os.urandom(1 << 20 if (i // 2) % 2 == 0 else 1024)
            i += 1
            try:
                if conns[port] is None:
                    conns[port] = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                c = conns[port]
                c.request("POST", paths[port], body=body,
                          headers={"Content-Type": "application/octet-stream"})
                r = c.getresponse()
                got = r.read()
                self.requests += 1
                self.bytes += len(body)
                if r.status != 200 or got != body:
                    self.errors.append(f"{paths[port]}: {r.status}, {len(got)} of {len(body)} bytes")
                if r.getheader("Connection", "").lower() == "close":
                    c.close()
                    conns[port] = None
            except (OSError, http.client.HTTPException) as e:
                self.errors.append(f"{paths[port]}: {e!r}")
                conns[port] = None


class Fresh(threading.Thread):
    """One request a connection, on both servers in turn."""

    def __init__(self, stop: threading.Event):
        super().__init__(daemon=True)
        self.stop, self.requests, self.errors = stop, 0, []

    def run(self) -> None:
        want = {HELLO_PORT: b"hello, world\n", WSGI_PORT: b"conformance\n"}
        i = 0
        while not self.stop.is_set():
            port = HELLO_PORT if i % 2 == 0 else WSGI_PORT
            i += 1
            try:
                with socket.create_connection(("127.0.0.1", port), 10) as s:
                    s.sendall(b"GET / HTTP/1.1\r\nHost: soak\r\nConnection: close\r\n\r\n")
                    out = b""
                    while chunk := s.recv(65536):
                        out += chunk
                self.requests += 1
                if not (out.startswith(b"HTTP/1.1 200") and out.endswith(want[port])):
                    self.errors.append(f"port {port}: {out[:60]!r}")
            except OSError as e:
                self.errors.append(f"port {port}: {e!r}")
            time.sleep(0.005)


def run(opts) -> h.Report:
    seconds = 40 if opts.quick else (opts.duration or 600)
    warm = 10 if opts.quick else WARM
    runs = []
    log_start = {}
    for server, port in servers():
        h.wait_port_free(port)
        log = h.server_dir(server) / "server.log"
        # The log is appended to across runs: count this run's lines only.
        log_start[server.name] = log.stat().st_size if log.exists() else 0
        runs.append(h.start(server, port))
    try:
        stop = threading.Event()
        results = {}

        def wrk(name, argv):
            out = h.subprocess.run(argv, capture_output=True, text=True)
            results[name] = h.parse_wrk(out.stdout + out.stderr)

        loads = [
            threading.Thread(target=wrk, args=("hello_c keep-alive", [
                "wrk", "-t1", "-c16", f"-d{seconds}s", "--latency", f"http://127.0.0.1:{HELLO_PORT}/"])),
            threading.Thread(target=wrk, args=("wsgi new connections", [
                "wrk", "-t1", "-c8", f"-d{seconds}s", "--latency", "-H", "Connection: close",
                f"http://127.0.0.1:{WSGI_PORT}/"])),
        ]
        bodies, fresh = Bodies(stop), Fresh(stop)
        for t in (*loads, bodies, fresh):
            t.start()
        samples: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(SAMPLE)
            now = time.monotonic() - t0
            for run in runs:
                workers = [p for p in h.tree_pids(run.pid) if p != run.pid]
                for role, pid in [("supervisor", run.pid), *[(f"worker pid {p}", p) for p in workers]]:
                    s = proc_sample(pid)
                    if s:
                        samples.setdefault((run.server.name, role), []).append((now, *s))
        stop.set()
        for t in (*loads, bodies, fresh):
            t.join(120)
        worker_starts = {}
        for run in runs:
            with open(run.logpath, "rb") as f:
                f.seek(log_start[run.server.name])
                text = f.read().decode(errors="replace")
            worker_starts[run.server.name] = len(re.findall(r"worker \d+ pid=\d+ started", text))
        # Every sample, for a look at the shape behind a slope.
        with open(h.OUT / "soak-samples.csv", "w") as f:
            f.write("server,process,seconds,rss_kib,fds\n")
            for (name, role), pts in sorted(samples.items()):
                for t, r, n in pts:
                    f.write(f"{name},{role},{t:.0f},{r},{n}\n")
    finally:
        for run in runs:
            h.stop(run)
    rows = []
    for (name, role), pts in sorted(samples.items()):
        settled = [p for p in pts if p[0] >= warm]
        if not settled:
            continue
        rss = [(t, r) for t, r, _ in settled]
        fds = [(t, f) for t, _, f in settled]
        # A leak holds its slope to the end; an allocator reaching the
        # high-water mark of its concurrency steps up early, then stays.
        late = [(t, r) for t, r in rss if t >= (rss[0][0] + rss[-1][0]) / 2]
        rows.append([name, role, f"{settled[0][1] / 1024:.1f}", f"{settled[-1][1] / 1024:.1f}",
                     f"{slope_per_min(rss):+.1f}", f"{slope_per_min(late):+.1f}", f"{min(r for _, r in rss) / 1024:.1f}-{max(r for _, r in rss) / 1024:.1f}",
                     str(settled[0][2]), str(settled[-1][2]), f"{slope_per_min(fds):+.2f}",
                     f"{min(f for _, f in fds)}-{max(f for _, f in fds)}", str(len(settled))])
    load_lines = []
    total_errors = 0
    for name, r in results.items():
        total_errors += r["errors"]
        load_lines.append(f"{name}: {r['requests']:,} requests, {h.fmt_rps(r['rps'])} req/s, p99 "
                          f"{h.fmt_us(r['p99'])}, errors {r['errors']} {r['error_detail'] or ''}")
    total_errors += len(bodies.errors) + len(fresh.errors)
    load_lines.append(f"bodies (1 MiB and 1 KiB echoed, every byte checked): {bodies.requests:,} requests, "
                      f"{bodies.bytes / 2**30:.1f} GiB sent, errors {len(bodies.errors)} {bodies.errors[:3]}")
    load_lines.append(f"one request a connection: {fresh.requests:,} requests, errors {len(fresh.errors)} "
                      f"{fresh.errors[:3]}")
    load_lines.append(f"worker starts logged (2 each at start; more means a worker died): {worker_starts}")
    return h.Report(
        TITLE,
        ["server", "process", "RSS MiB after warm-up", "at end", "RSS slope KiB/min", "slope, 2nd half", "RSS range MiB",
         "fds after warm-up", "at end", "fd slope /min", "fd range", "samples"],
        rows,
        setup=[f"{seconds} s, both servers unpinned with 2 workers, all loads at once; samples every "
               f"{SAMPLE} s, slopes over those after the first {warm} s."] + load_lines,
        notes=[f"Target: zero errors: {total_errors} ({'met' if total_errors == 0 else '**not met**'}); "
               "RSS and fds flat: see the slopes against the ranges (a leak keeps its slope in the "
               "second half; a high-water mark reached early does not)."])
