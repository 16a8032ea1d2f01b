"""The benchmark harness behind bench/run.

A scenario (bench/scenarios/NAME.py) declares what to compare; this module
installs the peers, builds the project, checks that the box is idle, starts
each server, drives it with wrk, measures the server's CPU, alternates the
servers in rounds and writes a markdown table (stdout and bench/RESULTS.md).

Two kinds of scenario:

* declarative (throughput): the module sets SERVERS (list of Server), LOADS
  (list of Load) and ANCHOR (a server name); `throughput()` runs it.
* custom: the module defines `run(opts) -> Report` and uses the helpers here
  (start/stop/wait_port/http_get/median...) to measure whatever it needs.

Both may set NEEDS (what to install/build), TITLE, ABOUT and TARGET.
Python 3.11 stdlib only.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import fcntl
import hashlib
import json
import os
import platform
import re
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

BENCH = Path(__file__).resolve().parent
ROOT = BENCH.parent
OUT = BENCH / "out"            # logs, nginx prefixes, scratch (git-ignored)
VENV = BENCH / ".venv"         # pinned Python peers (git-ignored)
RESULTS = BENCH / "RESULTS.md"
TARGET_DIR = Path(os.environ.get("CARGO_TARGET_DIR", ROOT / "target"))
M0SERVE = TARGET_DIR / "release" / "m0serve"

CLK_TCK = os.sysconf("SC_CLK_TCK")
NCPU = os.cpu_count() or 1

# apt packages each need pulls in; the venv is its own need.
APT = {
    "wrk": ["wrk"],
    "nginx": ["nginx-light"],
    "venv": ["libev-dev", "build-essential"],   # bjoern compiles against libev
}
VENV_MAX = BENCH / ".venv-max"  # MAX, only if its pins conflict with bench/.venv's (git-ignored)
# Needs that add packages to bench/.venv: requirements files, and whether pip may resolve
# their dependencies. "embed": ONNX Runtime and the MiniLM model files (see bench/embed/);
# "pyembed": the numpy backend's pins (backends/requirements-numpy.txt), which the pyembed
# plugin and the WSGI app backends/wsgi_numpy.py on every peer import from bench/.venv;
# "max": Modular's MAX (backends/requirements-max.txt, numpy's pins included), into
# bench/.venv unless a pin of its conflicts with what bench/.venv holds or pins, then into
# bench/.venv-max (see extra_venv()); "flask": Flask for bench/apps/hello_flask.py;
# "openapi": schemathesis (tests/requirements-openapi.txt), into bench/.venv-openapi on a
# conflict.
# Installed in this order.
VENV_EXTRAS = {
    "embed": [(BENCH / "embed" / "requirements.txt", True),
              (BENCH / "embed" / "requirements-nodeps.txt", False)],
    "pyembed": [(ROOT / "backends" / "requirements-numpy.txt", True),
                (BENCH / "embed" / "requirements-nodeps.txt", False)],
    "max": [(ROOT / "backends" / "requirements-max.txt", True),
            (BENCH / "embed" / "requirements-nodeps.txt", False)],
    "flask": [(BENCH / "apps" / "requirements-flask.txt", True)],
    # schemathesis and openapi-spec-validator as tests/openapi.rs pins them, and the model.
    "openapi": [(ROOT / "tests" / "requirements-openapi.txt", True),
                (BENCH / "embed" / "requirements-nodeps.txt", False)],
}
# Needs that may move to a venv of their own when their pins conflict with bench/.venv's.
OWN_VENV = {"max": VENV_MAX, "openapi": BENCH / ".venv-openapi"}


def log(msg: str) -> None:
    print(f"[bench] {msg}", file=sys.stderr, flush=True)


class BenchError(Exception):
    pass


# ---------------------------------------------------------------- declarations

@dataclasses.dataclass
class Server:
    """One server configuration to benchmark.

    cmd: argv; "{port}", "{out}" (this server's scratch dir), "{root}",
    "{bench}", "{venv}" and "{m0serve}" are substituted.
    cpus: taskset CPU list ("0") or None for unpinned.
    prepare: optional callable(Server, port, outdir) run before each start
    (e.g. to write a config file).
    """
    name: str
    cmd: list[str]
    cpus: str | None = "0"
    env: dict[str, str | None] = dataclasses.field(default_factory=dict)   # None: unset it
    expect: bytes | None = None          # body that GET `path` must return
    path: str = "/"
    version_cmd: list[str] | None = None
    prepare: object = None
    start_timeout: float = 15.0
    # wrk without taskset too, whatever the Load says: with cpus=None, how a
    # user runs a server and its client on one machine.
    unpinned_load: bool = False


@dataclasses.dataclass
class Load:
    """One wrk load: `wrk -t{threads} -c{conns} -d{duration}s --latency`."""
    conns: int
    threads: int = 1
    cpus: str | None = "1"               # taskset for wrk
    path: str = "/"
    headers: tuple[str, ...] = ()
    script: str | None = None            # wrk lua script (e.g. POST bodies)


@dataclasses.dataclass
class Report:
    """What a scenario produced: a table plus context, rendered to markdown."""
    title: str
    headers: list[str]
    rows: list[list[str]]
    setup: list[str] = dataclasses.field(default_factory=list)   # bullet lines
    notes: list[str] = dataclasses.field(default_factory=list)   # bullet lines

    def table(self) -> str:
        lines = ["| " + " | ".join(self.headers) + " |",
                 "|" + "|".join("---" if i == 0 else "---:" for i in range(len(self.headers))) + "|"]
        lines += ["| " + " | ".join(r) + " |" for r in self.rows]
        return "\n".join(lines)

    def markdown(self, level: int = 2) -> str:
        parts = [f"{'#' * level} {self.title}", ""]
        parts += [f"- {s}" for s in self.setup]
        parts += ["", self.table(), ""]
        parts += [f"- {n}" for n in self.notes]
        return "\n".join(parts).rstrip() + "\n"


# ---------------------------------------------------------------- setup

def _sh(cmd: list[str], logfile: Path | None = None, **kw) -> subprocess.CompletedProcess:
    if logfile:
        with open(logfile, "ab") as f:
            f.write(f"\n$ {shlex.join(cmd)}\n".encode())
            f.flush()
            return subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, **kw)
    return subprocess.run(cmd, capture_output=True, **kw)


def _tail(path: Path, n: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-n:])
    except OSError:
        return ""


def _apt_installed(pkg: str) -> bool:
    r = _sh(["dpkg-query", "-W", "-f=${Status}", pkg])
    return r.returncode == 0 and b"install ok installed" in r.stdout


def install(needs: set[str]) -> None:
    """Install what `needs` asks for, skipping what is already there."""
    OUT.mkdir(parents=True, exist_ok=True)
    logf = OUT / "install.log"
    pkgs = sorted({p for n in needs for p in APT.get(n, [])})
    missing = [p for p in pkgs if not _apt_installed(p)]
    if missing:
        log(f"apt-get install {' '.join(missing)} (log: {logf})")
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        r = _sh(["apt-get", "install", "-y", "--no-install-recommends", *missing], logf, env=env)
        if r.returncode != 0:       # stale package lists: update once, retry
            _sh(["apt-get", "update"], logf, env=env)
            r = _sh(["apt-get", "install", "-y", "--no-install-recommends", *missing], logf, env=env)
        if r.returncode != 0:
            raise BenchError(f"apt-get install failed:\n{_tail(logf)}")
    if "venv" in needs or needs & set(VENV_EXTRAS):
        _install_venv(logf)
    for need in [n for n in VENV_EXTRAS if n in needs]:
        _install_extra(need, logf)


def _make_venv(venv: Path, logf: Path) -> None:
    py = shutil.which("python3.11") or shutil.which("python3") or sys.executable
    if not (venv / "bin" / "python").exists():
        log(f"creating {venv} with {py}")
        r = _sh([py, "-m", "venv", str(venv)], logf)
        if r.returncode != 0:
            raise BenchError(f"venv creation failed:\n{_tail(logf)}")


def _install_venv(logf: Path) -> None:
    req = BENCH / "requirements.txt"
    stamp = VENV / ".requirements.sha256"
    want = hashlib.sha256(req.read_bytes()).hexdigest()
    if stamp.exists() and stamp.read_text().strip() == want:
        return
    _make_venv(VENV, logf)
    log(f"pip install -r {req.relative_to(ROOT)} (log: {logf})")
    r = _sh([str(VENV / "bin" / "pip"), "install", "--disable-pip-version-check", "-q",
             "-r", str(req)], logf)
    if r.returncode != 0:
        raise BenchError(f"pip install failed:\n{_tail(logf)}")
    stamp.write_text(want + "\n")


def _req_files(req: Path) -> list[Path]:
    """req and the files it includes with -r (recursively), in order."""
    out = [req]
    for line in req.read_text().splitlines():
        m = re.match(r"\s*(?:-r|--requirement)[\s=]+(\S+)", line)
        if m:
            out += _req_files((req.parent / m.group(1)).resolve())
    return out


def _canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(req: Path) -> dict[str, str]:
    """The `name==version` lines of a requirements file and of what it includes, by
    normalized name."""
    out = {}
    for f in _req_files(req):
        for line in f.read_text().splitlines():
            m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([^\s;#]+)", line)
            if m:
                out[_canon(m.group(1))] = m.group(2)
    return out


def _stamp_of(files: list[tuple[Path, bool]]) -> str:
    return hashlib.sha256(b"".join(p.read_bytes() for f, _ in files for p in _req_files(f))).hexdigest()


def _venv_pins(venv: Path, installed: bool = True, but: str = "") -> dict[str, tuple[str, str]]:
    """What bench/.venv pins, {name: (version, file)}: requirements.txt and every extra whose
    stamp there is current (i.e. installed from these very files); with installed=False,
    every extra that may go there (not `but`, not one with a venv of its own), installed or
    not yet: a scenario may add it later."""
    out = {}
    reqs = [BENCH / "requirements.txt"]
    for need, files in VENV_EXTRAS.items():
        stamp = venv / f".{need}-requirements.sha256"
        if installed:
            if stamp.exists() and stamp.read_text().strip() == _stamp_of(files):
                reqs += [f for f, _ in files]
        elif need != but and need not in OWN_VENV:
            reqs += [f for f, _ in files]
    for req in reqs:
        for name, ver in pins(req).items():
            out.setdefault(name, (ver, str(req.relative_to(ROOT))))
    return out


def _installed(venv: Path) -> dict[str, str]:
    """{normalized name: version} of what venv's site-packages holds."""
    out = {}
    for d in venv.glob("lib/python*/site-packages/*.dist-info"):
        name, _, ver = d.name[:-len(".dist-info")].partition("-")
        out[_canon(name)] = ver
    return out


def _conflicts(need: str, logf: Path) -> list[str]:
    """Why the need's pins cannot go into bench/.venv beside what is there: a pin of its that
    differs from one of bench/.venv's own, or from a version installed there; then what pip
    would change there to install it (pip install --dry-run --report). [] if none."""
    theirs = _venv_pins(VENV, installed=False, but=need)
    have = _installed(VENV)
    out = []
    for req, _ in VENV_EXTRAS[need]:
        for name, ver in pins(req).items():
            if name in theirs and theirs[name][0] != ver:
                out.append(f"{name}=={ver} ({req.relative_to(ROOT)}) vs =={theirs[name][0]} ({theirs[name][1]})")
            elif name in have and have[name] != ver:
                out.append(f"{name}=={ver} ({req.relative_to(ROOT)}) vs {have[name]} installed")
    if out:
        return out
    report = OUT / f"pip-dry-run-{need}.json"
    for req, deps in VENV_EXTRAS[need]:
        if not deps:
            continue
        r = _sh([str(VENV / "bin" / "pip"), "install", "--disable-pip-version-check", "-q", "--dry-run",
                 "--report", str(report), "-r", str(req)], logf)
        if r.returncode != 0:
            return [f"pip could not resolve {req.relative_to(ROOT)} in {VENV.relative_to(ROOT)} "
                    f"(see {logf.relative_to(ROOT)})"]
        for item in json.loads(report.read_text()).get("install", []):
            md = item.get("metadata", {})
            name, ver = _canon(md.get("name", "?")), md.get("version", "?")
            if name in have and have[name] != ver:
                out.append(f"pip would change {name} {have[name]} -> {ver}"
                           + (f" (pinned =={theirs[name][0]} by {theirs[name][1]})" if name in theirs else ""))
    return out


def extra_venv(need: str) -> Path:
    """Where the need's packages are (or go): bench/.venv, or the need's own venv (OWN_VENV)
    when that one is installed from the current files, i.e. their pins conflicted."""
    own = OWN_VENV.get(need)
    if own is not None:
        stamp = own / f".{need}-requirements.sha256"
        if stamp.exists() and stamp.read_text().strip() == _stamp_of(VENV_EXTRAS[need]):
            return own
    return VENV


def _install_extra(need: str, logf: Path) -> None:
    """pip install a need's requirement files into bench/.venv, again only when they change.
    A need with a venv of its own in OWN_VENV goes there instead when its pins conflict with
    bench/.venv's (_conflicts()); the choice is made again whenever its files change."""
    files = VENV_EXTRAS[need]
    want = _stamp_of(files)
    venv = VENV
    if need in OWN_VENV:
        for v in (VENV, OWN_VENV[need]):
            stamp = v / f".{need}-requirements.sha256"
            if stamp.exists() and stamp.read_text().strip() == want:
                return
        why = _conflicts(need, logf)
        if why:
            venv = OWN_VENV[need]
            log(f"{need}: pins conflict with {VENV.relative_to(ROOT)} ({'; '.join(why)}): "
                f"installing into {venv.relative_to(ROOT)}")
            _make_venv(venv, logf)
    stamp = venv / f".{need}-requirements.sha256"
    if stamp.exists() and stamp.read_text().strip() == want:
        return
    for req, deps in files:
        log(f"pip install {'' if deps else '--no-deps '}-r {req.relative_to(ROOT)} into "
            f"{venv.relative_to(ROOT)} (log: {logf})")
        r = _sh([str(venv / "bin" / "pip"), "install", "--disable-pip-version-check", "-q",
                 *([] if deps else ["--no-deps"]), "-r", str(req)], logf)
        if r.returncode != 0:
            raise BenchError(f"pip install failed:\n{_tail(logf)}")
    # Every pin of every file installed in this venv must still hold.
    have = _installed(venv)
    wanted = {**_venv_pins(venv), **{n: (v, str(f.relative_to(ROOT))) for f, _ in files
                                     for n, v in pins(f).items()}} if venv == VENV else \
        {n: (v, str(f.relative_to(ROOT))) for f, _ in files for n, v in pins(f).items()}
    broken = [f"{n}=={v} ({f}) but {have.get(n, 'none')} installed"
              for n, (v, f) in wanted.items() if have.get(n) != v]
    if broken:
        raise BenchError(f"after installing {need} into {venv.relative_to(ROOT)}, pins no longer "
                         f"hold: {'; '.join(broken)}")
    stamp.write_text(want + "\n")


def build() -> None:
    """cargo build --release --workspace: the binary and every plugin (hello_c by build.rs,
    the Rust ones as their packages' cdylibs) land in target/release."""
    logf = OUT / "build.log"
    logf.write_text("")
    log(f"cargo build --release --workspace (log: {logf})")
    r = _sh(["cargo", "build", "--release", "--workspace"], logf, cwd=ROOT)
    if r.returncode != 0:
        raise BenchError(f"cargo build --release failed:\n{_tail(logf)}")
    if not M0SERVE.exists():
        raise BenchError(f"build succeeded but {M0SERVE} does not exist")


# ---------------------------------------------------------------- /proc sampling

def _read_stat(pid: int) -> tuple[int, int, int] | None:
    """(ppid, utime+stime+cutime+cstime, utime+stime) in ticks, or None if gone."""
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return None
    f = data[data.rfind(b")") + 2:].split()
    own = int(f[11]) + int(f[12])
    return int(f[1]), own + int(f[13]) + int(f[14]), own


def _all_procs() -> dict[int, tuple[int, int, int]]:
    procs = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            s = _read_stat(int(d))
            if s:
                procs[int(d)] = s
    return procs


def tree_ticks(root: int) -> dict[int, int]:
    """CPU ticks of root and all its descendants, per pid.

    cutime/cstime are included, so a descendant that was reaped between two
    samples moves into its parent's count and is neither lost nor doubled."""
    procs = _all_procs()
    kids: dict[int, list[int]] = {}
    for pid, (ppid, *_) in procs.items():
        kids.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        p = todo.pop()
        if p in procs:
            out[p] = procs[p][1]
            todo += kids.get(p, [])
    return out


def tree_pids(root: int) -> list[int]:
    return sorted(tree_ticks(root))


def tree_ctxsw(root: int) -> dict[int, int]:
    """Context switches (voluntary + involuntary) of every thread in root's tree, per tid.
    A thread that exits takes its count with it: compare two samples per tid."""
    out = {}
    for pid in tree_pids(root):
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError):
                    st = Path(f"/proc/{pid}/task/{tid}/status").read_text()
                    out[int(tid)] = sum(int(x) for x in re.findall(r"ctxt_switches:\s*(\d+)", st))
    return out


def _cpu_times() -> list[tuple[int, int]]:
    """(busy, total) ticks for the whole machine, then each CPU."""
    out = []
    for line in Path("/proc/stat").read_text().splitlines():
        if not line.startswith("cpu"):
            break
        v = [int(x) for x in line.split()[1:9]]   # user..steal
        total = sum(v)
        out.append((total - v[3] - v[4], total))  # minus idle, iowait
    return out


def idle_check(seconds: float = 3.0, exclude: int | None = None) -> tuple[bool, str]:
    """Sample the machine; returns (idle?, a one-line description). exclude: a process whose
    tree does not count (a server that burns CPU while it waits, as MAX's runtime threads
    do): then idle means that everything else used under 10 % of one core in all."""
    ea = sum(tree_ticks(exclude).values()) if exclude else 0
    a, pa, t0 = _cpu_times(), {p: s[2] for p, s in _all_procs().items()}, time.monotonic()
    time.sleep(seconds)
    b, pb, dt = _cpu_times(), _all_procs(), time.monotonic() - t0
    mine = set(tree_pids(exclude)) if exclude else set()
    eb = sum(tree_ticks(exclude).values()) if exclude else 0
    per = [100.0 * (b[i][0] - a[i][0]) / max(1, b[i][1] - a[i][1]) for i in range(1, len(a))]
    hogs = []
    for pid, (_, _, t) in pb.items():
        pct = 100.0 * (t - pa.get(pid, t)) / CLK_TCK / dt
        if pct >= 5 and pid != os.getpid() and pid not in mine:
            hogs.append((pct, pid))
    hogs.sort(reverse=True)
    names = []
    for pct, pid in hogs[:3]:
        with contextlib.suppress(OSError):
            names.append(f"{Path(f'/proc/{pid}/comm').read_text().strip()}({pid}) {pct:.0f}%")
    load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
    if exclude:
        server = 100.0 * (eb - ea) / CLK_TCK / dt
        others = max(0.0, sum(per) - server)
        idle = others < 10.0
        extra = f"; {others:.0f}% of a core besides the server's {server:.0f}%"
    else:
        idle, extra = max(per) < 10.0, ""
    desc = (f"{'idle' if idle else 'BUSY'}: CPU busy " + ", ".join(f"cpu{i} {p:.0f}%" for i, p in enumerate(per))
            + extra + f" over {seconds:.0f} s; loadavg {load}" + (f"; top: {', '.join(names)}" if names else ""))
    return idle, desc


def wait_idle(max_wait: float, exclude: int | None = None) -> str:
    """Wait up to max_wait seconds for the machine to go idle (exclude: see idle_check());
    describe it."""
    deadline = time.monotonic() + max_wait
    while True:
        idle, desc = idle_check(exclude=exclude)
        if idle or time.monotonic() >= deadline:
            (log if idle else lambda m: log("WARNING: " + m))(desc)
            return desc
        log(f"waiting for idle ({desc})")
        time.sleep(5)


def machine() -> str:
    model = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    mem = 0
    with contextlib.suppress(OSError):
        mem = int(Path("/proc/meminfo").read_text().split()[1]) // (1024 * 1024)
    return f"{model}, {NCPU} CPUs, {mem} GiB, Linux {platform.release()}"


def commit() -> str:
    r = _sh(["git", "-C", str(ROOT), "describe", "--always", "--dirty", "--abbrev=10"])
    return r.stdout.decode().strip() or "?"


# ---------------------------------------------------------------- servers

@dataclasses.dataclass
class Running:
    server: Server
    port: int
    proc: subprocess.Popen
    logpath: Path

    @property
    def pid(self) -> int:
        return self.proc.pid


def _subst(s: str, port: int, outdir: Path) -> str:
    return s.format(port=port, out=outdir, root=ROOT, bench=BENCH, venv=VENV, m0serve=M0SERVE)


def server_dir(server: Server) -> Path:
    d = OUT / re.sub(r"[^A-Za-z0-9_.-]+", "-", server.name)
    d.mkdir(parents=True, exist_ok=True)
    return d


def start(server: Server, port: int) -> Running:
    """Start server on port (pinned with taskset), wait until it answers."""
    outdir = server_dir(server)
    if server.prepare:
        server.prepare(server, port, outdir)
    argv = [_subst(a, port, outdir) for a in server.cmd]
    if server.cpus is not None:
        argv = ["taskset", "-c", server.cpus, *argv]   # taskset execs: same pid
    logpath = outdir / "server.log"
    with open(logpath, "ab") as f:
        f.write(f"\n$ {shlex.join(argv)}\n".encode())
        # A process group of its own (killpg stops the whole tree), but not a session of
        # its own: with the kernel's autogroup on, a new session is a new scheduling group,
        # and wrk, left in ours, then got a CPU it shares with a busy server only at group
        # slices. Measured: 30 of 32 wrk sockets held answers wrk had not read, the
        # requests reached a pinned MAX worker one at a time, and it did 259-312
        # sentences/s at c32 instead of 589.
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, process_group=0,
                                env=server_env(server))
    run = Running(server, port, proc, logpath)
    try:
        wait_port(port, server.start_timeout, proc)
        if server.expect is not None:
            status, body = http_get(port, server.path)
            if status != 200 or body != server.expect:
                raise BenchError(f"{server.name}: GET {server.path} gave {status} {body[:80]!r}, "
                                 f"expected 200 {server.expect!r}")
    except BenchError as e:
        stop(run)
        raise BenchError(f"{server.name}: {e}\n--- tail of {logpath} ---\n{_tail(logpath)}") from None
    except BaseException:
        stop(run)
        raise
    return run


def server_env(server: Server) -> dict[str, str]:
    """Ours with the server's variables on top; a variable it maps to None is unset."""
    env = {**os.environ, **server.env}
    return {k: v for k, v in env.items() if v is not None}


def stop(run: Running, timeout: float = 10.0) -> None:
    """SIGTERM the server, then SIGKILL its process group if it lingers."""
    if run.proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(run.pid, signal.SIGTERM)
        try:
            run.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            log(f"{run.server.name} ignored SIGTERM for {timeout:.0f} s; SIGKILL")
    # Whatever is left of its session (workers of a dead supervisor).
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(run.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        run.proc.wait(5)


def wait_port(port: int, timeout: float, proc: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise BenchError(f"server exited with {proc.returncode} before listening on {port}")
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.2):
            return
        time.sleep(0.02)
    raise BenchError(f"nothing listening on 127.0.0.1:{port} after {timeout:.0f} s")


def wait_port_free(port: int, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
        except OSError:
            return
        time.sleep(0.05)
    raise BenchError(f"port {port} still answers {timeout:.0f} s after the server was stopped")


def http_get(port: int, path: str = "/", timeout: float = 2.0) -> tuple[int, bytes]:
    """One HTTP/1.1 GET; returns (status, body). Raises OSError on failure."""
    status, _, body = http_get_raw(port, path, timeout)
    return status, body


def http_get_raw(port: int, path: str = "/", timeout: float = 2.0) -> tuple[int, bytes, bytes]:
    """(status, head, body) of one GET with Connection: close."""
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, body = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if m and len(body) >= int(m.group(1)):
                    break
    head, _, body = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"not an HTTP response: {data[:60]!r}")
    return int(parts[1]), head, body


def version_of(server: Server) -> str:
    if not server.version_cmd:
        return ""
    try:
        r = subprocess.run([_subst(a, 0, OUT) for a in server.version_cmd], capture_output=True,
                           timeout=10, cwd=ROOT)
    except (OSError, subprocess.TimeoutExpired):
        return "?"
    text = (r.stdout + r.stderr).decode(errors="replace").strip().splitlines()
    return text[0] if text else "?"


NGINX_CONF = """\
# written by bench/harness.py for one benchmark run; prefix {out}
worker_processes 1;
daemon off;
master_process on;
pid {out}/nginx.pid;
error_log {out}/error.log warn;
events {{ worker_connections 10240; }}
http {{
    access_log off;
    keepalive_requests 1000000000;
    keepalive_timeout 75s;
    client_body_temp_path {out}/tmp;
    proxy_temp_path {out}/tmp;
    fastcgi_temp_path {out}/tmp;
    uwsgi_temp_path {out}/tmp;
    scgi_temp_path {out}/tmp;
    server {{
        listen 127.0.0.1:{port};
{server}
    }}
}}
"""


def nginx(name: str, server_block: str, cpus: str | None = "0", **kw) -> Server:
    """An nginx peer: one worker process, private prefix and config under
    bench/out/NAME, no access log, keep-alive limit out of the way.
    server_block: directives inside `server {}` (e.g. a location)."""
    def prepare(srv: Server, port: int, outdir: Path) -> None:
        (outdir / "tmp").mkdir(exist_ok=True)
        (outdir / "nginx.conf").write_text(NGINX_CONF.format(out=outdir, port=port, server=server_block))
    return Server(name, ["/usr/sbin/nginx", "-p", "{out}", "-c", "{out}/nginx.conf", "-e", "{out}/error.log"],
                  cpus=cpus, prepare=prepare, version_cmd=["/usr/sbin/nginx", "-v"], **kw)


# ---------------------------------------------------------------- wrk

_UNITS = {"us": 1.0, "ms": 1e3, "s": 1e6, "m": 60e6, "h": 3600e6}


def _us(text: str) -> float:
    m = re.fullmatch(r"([\d.]+)(us|ms|s|m|h)", text)
    if not m:
        raise BenchError(f"cannot parse wrk duration {text!r}")
    return float(m.group(1)) * _UNITS[m.group(2)]


def parse_wrk(out: str) -> dict:
    """req/s, p50/p99 (µs), requests and errors from `wrk --latency` output."""
    r = {}
    m = re.search(r"Requests/sec:\s*([\d.]+)", out)
    if not m:
        raise BenchError(f"no Requests/sec in wrk output:\n{out}")
    r["rps"] = float(m.group(1))
    for pct in ("50", "99"):
        m = re.search(rf"^\s*{pct}(?:\.0+)?%\s+(\S+)", out, re.M)
        if not m:
            raise BenchError(f"no {pct}% latency in wrk output (forgot --latency?):\n{out}")
        r[f"p{pct}"] = _us(m.group(1))
    m = re.search(r"(\d+) requests in", out)
    r["requests"] = int(m.group(1)) if m else 0
    errs, detail = 0, {}
    m = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    if m:
        errs += sum(int(x) for x in m.groups())
        detail.update(zip(("connect", "read", "write", "timeout"), map(int, m.groups())))
    m = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    if m:
        errs += int(m.group(1))
        detail["non-2xx/3xx"] = int(m.group(1))
    r["errors"] = errs
    r["error_detail"] = detail
    return r


def wrk(port: int, load: Load, seconds: float) -> tuple[str, float]:
    """Run wrk once; returns (output, CPU seconds wrk used)."""
    argv = ["wrk", f"-t{load.threads}", f"-c{load.conns}", f"-d{seconds:g}s", "--latency"]
    for h in load.headers:
        argv += ["-H", h]
    if load.script:
        argv += ["-s", str(BENCH / load.script)]
    argv.append(f"http://127.0.0.1:{port}{load.path}")
    if load.cpus is not None:
        argv = ["taskset", "-c", load.cpus, *argv]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    r = subprocess.run(argv, capture_output=True, text=True, timeout=seconds + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != 0:
        raise BenchError(f"{shlex.join(argv)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    cpu = (after.ru_utime + after.ru_stime) - (before.ru_utime + before.ru_stime)
    return r.stdout, cpu


def measure(run: Running, load: Load, seconds: float) -> dict:
    """One measured wrk run against a running server, with CPU accounting.

    cpu: the server's process tree, % of one core.
    other: CPU the rest of the machine used meanwhile (not server, not wrk),
    % of one core: the noise this sample saw."""
    c0 = tree_ctxsw(run.pid)
    m0, s0, t0 = _cpu_times()[0][0], tree_ticks(run.pid), time.monotonic()
    out, wrk_cpu = wrk(run.port, load, seconds)
    m1, s1, wall = _cpu_times()[0][0], tree_ticks(run.pid), time.monotonic() - t0
    c1 = tree_ctxsw(run.pid)
    server_ticks = sum(t - s0.get(p, 0) for p, t in s1.items())
    r = parse_wrk(out)
    r["cpu"] = 100.0 * server_ticks / CLK_TCK / wall
    r["wrk_cpu"] = 100.0 * wrk_cpu / wall
    r["cs_per_req"] = sum(n - c0.get(t, 0) for t, n in c1.items()) / max(1, r["requests"])
    r["threads"] = len(c1)
    r["other"] = max(0.0, 100.0 * ((m1 - m0 - server_ticks) / CLK_TCK - wrk_cpu) / wall)
    r["raw"] = out
    return r


# ---------------------------------------------------------------- formatting

def fmt_rps(x: float) -> str:
    return f"{x:,.0f}"


def fmt_us(x: float) -> str:
    if x >= 10_000:
        return f"{x / 1000:,.1f} ms"
    if x >= 1000:
        return f"{x / 1000:.2f} ms"
    return f"{x:.0f} µs"


def fmt_ratio(x: float) -> str:
    return f"{x:.2f}×"


def median(xs):
    return statistics.median(xs)


# ---------------------------------------------------------------- throughput scenarios

BASE_PORT = 18000
NOISY = 10           # % of a core used by others during a sample: measure it again
NOISY_RETRIES = 2


def throughput(mod, opts) -> Report:
    """Run a declarative scenario: SERVERS × LOADS, alternated in rounds.

    Each round starts every server in turn (order A,B then B,A, so a drift in
    the machine hits both alike), warms it up and measures every load, then
    stops it. Medians over rounds are reported with the ratio to ANCHOR."""
    servers: list[Server] = mod.SERVERS
    loads: list[Load] = mod.LOADS
    anchor = mod.ANCHOR
    rounds = opts.rounds or (1 if opts.quick else getattr(mod, "ROUNDS", 3))
    dur = opts.duration or (3 if opts.quick else getattr(mod, "DURATION", 10))
    warm = 1 if opts.quick else getattr(mod, "WARMUP", 2)
    if anchor not in [s.name for s in servers]:
        raise BenchError(f"ANCHOR {anchor!r} is not one of SERVERS")

    ports = {s.name: BASE_PORT + i for i, s in enumerate(servers)}
    results: dict[tuple[str, int], list[dict]] = {}
    heads: dict[str, int] = {}
    retried: dict[str, int] = {}
    pinned: dict[str, str] = {}
    for rnd in range(rounds):
        order = servers if rnd % 2 == 0 else list(reversed(servers))
        for s in order:
            log(f"round {rnd + 1}/{rounds}: {s.name}")
            run = start(s, ports[s.name])
            try:
                if s.name not in heads:
                    _, head, body = http_get_raw(run.port, s.path)
                    heads[s.name] = len(head) + 4 + len(body)
                    pinned[s.name] = _affinity(run.pid)
                for ld in loads:
                    if s.unpinned_load:
                        ld = dataclasses.replace(ld, cpus=None)
                    wrk(run.port, ld, warm)                        # warm-up, discarded
                    r = measure(run, ld, dur)
                    for _ in range(NOISY_RETRIES):
                        if r["other"] <= NOISY:
                            break
                        log(f"  c{ld.conns}: other load {r['other']:.0f}% > {NOISY}%: "
                            "waiting for idle and measuring again")
                        retried[s.name] = retried.get(s.name, 0) + 1
                        wait_idle(60)
                        wrk(run.port, ld, warm)
                        r = measure(run, ld, dur)
                    results.setdefault((s.name, ld.conns), []).append(r)
                    with open(server_dir(s) / "wrk.log", "a") as f:       # for inspection
                        f.write(f"\n# round {rnd + 1} c{ld.conns}\n{r['raw']}")
                    log(f"  c{ld.conns}: {fmt_rps(r['rps'])} req/s p50 {fmt_us(r['p50'])} "
                        f"p99 {fmt_us(r['p99'])} cpu {r['cpu']:.0f}% other {r['other']:.0f}%")
                    if run.proc.poll() is not None:
                        raise BenchError(f"{s.name} died during the run; see {run.logpath}")
            finally:
                stop(run)
                wait_port_free(run.port)

    headers = ["server", "conns", "req/s", "req/s ÷ anchor", "p50", "p99", "p99 ÷ anchor",
               "server CPU", "CPU µs/req", "ctx sw/req", "wrk CPU", "spread", "other load"]
    rows, notes, summary = [], [], {}
    for ld in loads:
        a = results[(anchor, ld.conns)]
        a_rps, a_p99 = median([r["rps"] for r in a]), median([r["p99"] for r in a])
        for s in servers:
            rs = results[(s.name, ld.conns)]
            rps = median([r["rps"] for r in rs])
            p99 = median([r["p99"] for r in rs])
            cpu = median([r["cpu"] for r in rs])
            per_req = median([1e4 * r["cpu"] / r["rps"] for r in rs])   # % of a core → µs/req
            # The per-round figures too, in round order, for verdicts that pair the
            # servers round by round (neighbours in the A,B / B,A order see the same box).
            summary[(s.name, ld.conns)] = {"rps": rps, "p99": p99, "rps_ratio": rps / a_rps,
                                           "p99_ratio": p99 / a_p99, "cpu_per_req": per_req,
                                           "rounds": [(r["rps"], r["p99"]) for r in rs]}
            spread = (max(r["rps"] for r in rs) - min(r["rps"] for r in rs)) / rps
            wrk_cpu = median([r["wrk_cpu"] for r in rs])
            if wrk_cpu >= 90 * ld.threads:
                notes.append(f"{s.name} c{ld.conns}: wrk used {wrk_cpu:.0f}% of its CPU, so the client "
                             "may be the limit: read that req/s as a floor for the server.")
            rows.append([s.name + (" (anchor)" if s.name == anchor else ""), str(ld.conns),
                         fmt_rps(rps), fmt_ratio(rps / a_rps),
                         fmt_us(median([r["p50"] for r in rs])), fmt_us(p99), fmt_ratio(p99 / a_p99),
                         f"{cpu:.0f}%", f"{per_req:.2f}",
                         f"{median([r['cs_per_req'] for r in rs]):.2f}", f"{wrk_cpu:.0f}%",
                         f"±{100 * spread / 2:.1f}%",
                         f"{max(r['other'] for r in rs):.0f}%"])
            errs = sum(r["errors"] for r in rs)
            if errs:
                kinds: dict[str, int] = {}
                for r in rs:
                    for k, v in r.get("error_detail", {}).items():
                        kinds[k] = kinds.get(k, 0) + v
                notes.append(f"**{s.name} c{ld.conns}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests ("
                             + ", ".join(f"{k} {v}" for k, v in kinds.items() if v) + ")")

    ver = [f"{s.name}: {version_of(s) or '-'}" for s in servers if s.version_cmd]
    wrk_ver = re.findall(r"wrk \S+?/([\d.]+)", _sh(["wrk", "-v"]).stdout.decode(errors="replace"))
    setup = [
        f"{rounds} round(s) × {dur:g} s per load after a {warm:g} s warm-up; servers alternated "
        f"(A,B then B,A); medians over rounds. wrk `-t{loads[0].threads}` pinned to CPU "
        f"{loads[0].cpus}, keep-alive"
        + ("; unpinned (no taskset) against " + ", ".join(s.name for s in servers if s.unpinned_load)
           if any(s.unpinned_load for s in servers) else "") + ".",
        "Pinning: " + "; ".join(f"{n} {c}" for n, c in pinned.items()) + ". Threads in the "
        "server's process tree: " + ", ".join(
            f"{s.name} {results[(s.name, loads[0].conns)][0]['threads']}" for s in servers) + ".",
        "Response size (head+body, bytes): " + ", ".join(f"{n} {b}" for n, b in heads.items()) + ".",
        "Versions: " + "; ".join(ver + [f"wrk {wrk_ver[0] if wrk_ver else '?'}"]) + ".",
        "server CPU = utime+stime of the server's process tree during the run, % of one core "
        "(wrk CPU likewise for wrk); CPU µs/req = server CPU time per request, which still compares "
        "servers when wrk is the limit; ctx sw/req = voluntary + involuntary context switches of "
        "the server's threads per request (threads that exit mid-run are not counted); "
        "spread = (max−min)/2 of req/s over rounds, relative to the median; other load = most CPU "
        "(% of one core) used by anything but server and wrk during one run (noise).",
    ]
    if retried:
        notes.append("Re-measured because others used > "
                     f"{NOISY}% of a core: " + ", ".join(f"{n} {k}×" for n, k in retried.items()) + ".")
    verdict = getattr(mod, "verdict", None)
    if verdict:
        notes.insert(0, verdict(summary))
    return Report(getattr(mod, "TITLE", mod.__name__), headers, rows, setup, notes)


def _affinity(pid: int) -> str:
    out = set()
    for p in tree_pids(pid):
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("Cpus_allowed_list:"):
                    out.add(line.split(":", 1)[1].strip())
    return "CPUs " + "/".join(sorted(out)) if out else "?"


# ---------------------------------------------------------------- results file

def record(name: str, text: str) -> None:
    """Replace (or append) this scenario's section in RESULTS.md."""
    begin, end = f"<!-- bench:{name} -->", f"<!-- /bench:{name} -->"
    block = f"{begin}\n{text.rstrip()}\n{end}\n"
    old = RESULTS.read_text() if RESULTS.exists() else (
        "# Benchmark results\n\nLatest run of each scenario, written by `bench/run SCENARIO` "
        "(see README.md). Quote medians and ratios, not single runs.\n\n")
    pat = re.compile(re.escape(begin) + r".*?" + re.escape(end) + r"\n?", re.S)
    new = pat.sub(lambda _: block, old) if pat.search(old) else old.rstrip("\n") + "\n\n" + block
    RESULTS.write_text(new)


@contextlib.contextmanager
def bench_lock():
    """One harness run at a time on this machine (they would disturb each other)."""
    OUT.mkdir(parents=True, exist_ok=True)
    with open(OUT / ".lock", "w") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            log("another bench/run holds bench/out/.lock; waiting")
            fcntl.flock(f, fcntl.LOCK_EX)
        yield


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
