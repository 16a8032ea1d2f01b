"""wsgi: m0serve's WSGI plugin against the Python WSGI servers, one process, then two.

Every server serves bench/apps/hello_wsgi.py (13-byte "hello, world\\n" with
Content-Length) over keep-alive HTTP/1.1; wrk runs one thread pinned to
CPU 1, 8 and 64 connections. All eleven configurations alternate in one run.

* One process: the server is pinned to CPU 0 (taskset covers every thread
  it starts). m0serve --workers 1 (its supervisor idles beside the worker),
  granian --workers 1 default and --blocking-threads 1, bjoern, gunicorn -w 1
  (sync worker, the default: it answers Connection: close, so wrk reconnects
  for every request), uvicorn --workers 1 --interface wsgi (no access log).
* Two processes: --workers 2 / -w 2, unpinned, because pinning two workers
  to CPU 0 would measure one core. The workers share the machine with wrk
  (CPU 1): read the server CPU and wrk CPU columns. bjoern has no workers and
  two bjoern processes cannot share one port without SO_REUSEPORT support:
  n/a at two processes.
* Unpinned, one process: m0serve --workers 1 and granian (default) with
  neither the server nor wrk under taskset, as a user runs them; the
  worker has 2 usable CPUs for itself and wrk.
* m0serve makes loop calls in all (the thread leading the event loop calls
  the app itself, as bjoern's only thread does; unpinned, the controller
  measures them against the pool alone and keeps whichever serves more).
  Its start line in bench/out/m0serve-N/server.log says so, and its
  closing line counts loop calls and hand-offs and names the call path.
Anchor: granian (default settings) at one process.
"""

import dataclasses

from harness import BENCH, Load, Server, fmt_ratio

TITLE = "wsgi — WSGI hello on m0serve vs granian, bjoern, gunicorn, uvicorn; one process, then two"
ABOUT = ("A minimal WSGI hello app (bench/apps/hello_wsgi.py) behind each server: the per-request "
         "cost of the server plus its Python bridge, keep-alive HTTP/1.1.")
TARGET = ("m0serve above every peer in req/s with a lower p99 (one process against one process, "
          "two against two), and at least 1.3× granian's req/s at one process; unpinned, at "
          "least 0.95× its own pinned req/s and 1.3× granian unpinned with a lower p99.")
NEEDS = ["wrk", "venv", "m0serve"]

BODY = b"hello, world\n"
APP = "hello_wsgi:app"
ENV = {"PYTHONPATH": str(BENCH / "apps")}   # the peers import APP from bench/apps


def servers(n: int) -> list[Server]:
    cpus = "0" if n == 1 else None
    tag = f"×{n}"
    env = ENV
    out = [
        Server(f"m0serve {tag}",
               ["{m0serve}", "--plugin", "wsgi", "--app-dir", "{bench}/apps", APP,
                "--host", "127.0.0.1", "--port", "{port}", "--workers", str(n),
                # The peers never close a keep-alive connection on their own.
                "--max-keepalive-requests", "0"],
               cpus=cpus, expect=BODY, version_cmd=["{m0serve}", "--version"]),
        Server(f"granian {tag}",
               ["{venv}/bin/granian", "--interface", "wsgi", "--host", "127.0.0.1",
                "--port", "{port}", "--workers", str(n), APP],
               cpus=cpus, env=env, expect=BODY, version_cmd=["{venv}/bin/granian", "--version"]),
        Server(f"granian bt1 {tag}",
               ["{venv}/bin/granian", "--interface", "wsgi", "--host", "127.0.0.1",
                "--port", "{port}", "--workers", str(n), "--blocking-threads", "1", APP],
               cpus=cpus, env=env, expect=BODY),
    ]
    if n == 1:
        out.append(Server(f"bjoern {tag}",
                          ["{venv}/bin/python", "{bench}/apps/bjoern_serve.py", APP,
                           "127.0.0.1", "{port}"],
                          cpus=cpus, env=env, expect=BODY,
                          version_cmd=["{venv}/bin/python", "-c",
                                       "import importlib.metadata as m; print('bjoern', m.version('bjoern'))"]))
    out += [
        Server(f"gunicorn {tag}",
               ["{venv}/bin/gunicorn", "-w", str(n), "-b", "127.0.0.1:{port}", APP],
               cpus=cpus, env=env, expect=BODY, version_cmd=["{venv}/bin/gunicorn", "--version"]),
        Server(f"uvicorn {tag}",
               ["{venv}/bin/uvicorn", "--interface", "wsgi", "--host", "127.0.0.1",
                "--port", "{port}", "--workers", str(n), "--no-access-log", APP],
               cpus=cpus, env=env, expect=BODY, version_cmd=["{venv}/bin/uvicorn", "--version"]),
    ]
    return out


def unpinned() -> list[Server]:
    # Same commands as the ×1 rows, with no taskset for the server or wrk.
    pinned = {s.name: s for s in servers(1)}
    out = []
    for name in ("m0serve ×1", "granian ×1"):
        s = pinned[name]
        out.append(dataclasses.replace(s, name=name.replace("×1", "unpinned ×1"), cpus=None,
                                       unpinned_load=True))
    return out


SERVERS = servers(1) + unpinned() + servers(2)
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "granian ×1"
ROUNDS = 3
DURATION = 10
WARMUP = 2


def verdict(summary) -> str:
    parts = []
    for n in (1, 2):
        names = [s.name for s in SERVERS if s.name.endswith(f"×{n}") and "unpinned" not in s.name]
        me = f"m0serve ×{n}"
        for conns in (ld.conns for ld in LOADS):
            m = summary[(me, conns)]
            lost = [p.split(" ×")[0] for p in names if p != me and not (
                m["rps"] > summary[(p, conns)]["rps"] and m["p99"] < summary[(p, conns)]["p99"])]
            best = max((p for p in names if p != me), key=lambda p: summary[(p, conns)]["rps"])
            txt = (f"×{n} c{conns} {'met' if not lost else '**not met**'} "
                   f"({fmt_ratio(m['rps'] / summary[(best, conns)]['rps'])} req/s of the best peer, "
                   f"{best.split(' ×')[0]}"
                   + (f"; behind or not lower p99 than: {', '.join(lost)}" if lost else "") + ")")
            if n == 1:
                g = m["rps"] / summary[("granian ×1", conns)]["rps"]
                txt += f", {fmt_ratio(g)} granian ({'met' if g >= 1.3 else '**not met**'} ≥ 1.30×)"
            parts.append(txt)
    for conns in (ld.conns for ld in LOADS):
        u = summary[("m0serve unpinned ×1", conns)]
        own = u["rps"] / summary[("m0serve ×1", conns)]["rps"]
        g = summary[("granian unpinned ×1", conns)]
        vs_g = u["rps"] / g["rps"]
        ok = own >= 0.95 and vs_g >= 1.3 and u["p99"] < g["p99"]
        parts.append(f"unpinned c{conns} {'met' if ok else '**not met**'} ({fmt_ratio(own)} its pinned "
                     f"req/s (≥ 0.95×), {fmt_ratio(vs_g)} granian unpinned (≥ 1.30×), p99 "
                     f"{fmt_ratio(u['p99'] / g['p99'])} granian's)")
    return "Target: " + "; ".join(parts) + ". Ratios within the spread column are ties."
