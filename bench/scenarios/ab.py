"""ab: this build against another m0serve binary, hello_c and WSGI hello, alternated.

For a change meant to leave speed where it was (a refactor): the release
binary of this checkout and the one M0_BENCH_BASELINE names (build the
other commit in a worktree: `git worktree add ../before REV && cd ../before
&& cargo build --release`, then M0_BENCH_BASELINE=../before/target/release/m0serve).
Each binary serves with its own plugins (found beside it).

Rows, each for both binaries: hello_c and the WSGI hello
(bench/apps/hello_wsgi.py), one worker pinned to CPU 0 with wrk on CPU 1,
and the same unpinned, as a user starts them (no taskset for either).
Keep-alive, 8 and 64 connections; neither closes a connection on its own.
The verdict gives after/before for each pair; the anchor column is only
the first row's.
"""

import os
from pathlib import Path

from harness import BENCH, M0SERVE, BenchError, Load, Server, fmt_ratio

TITLE = "ab — this build against a baseline m0serve binary (hello_c, WSGI hello)"
ABOUT = ("The same servers from two builds, alternated in one run: whether a change moved the "
         "request path's speed.")
TARGET = "after/before within the spread: a refactor leaves req/s and p99 where they were."
NEEDS = ["wrk", "m0serve"]

BODY = b"hello, world\n"
ENV = {"PYTHONPATH": str(BENCH / "apps")}


def baseline() -> Path:
    path = os.environ.get("M0_BENCH_BASELINE")
    if not path or not Path(path).is_file():
        raise BenchError("ab needs M0_BENCH_BASELINE: the m0serve binary to compare this build "
                         "against (for example ../before/target/release/m0serve)")
    return Path(path).resolve()


def row(build: str, binary: str, what: str, pinned: bool) -> Server:
    if what == "hello_c":
        app = ["--plugin", "hello_c"]
    else:
        app = ["--plugin", "wsgi", "--app-dir", "{bench}/apps", "hello_wsgi:app"]
    where = "" if pinned else " unpinned"
    return Server(f"{build} {what}{where}",
                  [binary, *app, "--host", "127.0.0.1", "--port", "{port}", "--workers", "1",
                   "--max-keepalive-requests", "0"],
                  cpus="0" if pinned else None, unpinned_load=not pinned,
                  env=ENV if what == "wsgi" else {}, expect=BODY,
                  version_cmd=[binary, "--version"])


def servers() -> list[Server]:
    try:
        before = str(baseline())
    except BenchError:
        before = "M0_BENCH_BASELINE"   # `bench/run --list` must not need it
    out = []
    for what in ("hello_c", "wsgi"):
        for pinned in (True, False):
            out.append(row("before", before, what, pinned))
            out.append(row("after", str(M0SERVE), what, pinned))
    return out


SERVERS = servers()
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "before hello_c"
ROUNDS = 3
DURATION = 6
WARMUP = 2


def verdict(summary) -> str:
    baseline()
    parts = []
    for s in SERVERS:
        if not s.name.startswith("after "):
            continue
        pair = s.name.removeprefix("after ")
        for conns in (ld.conns for ld in LOADS):
            a, b = summary[(s.name, conns)], summary[(f"before {pair}", conns)]
            parts.append(f"{pair} c{conns}: {fmt_ratio(a['rps'] / b['rps'])} req/s, "
                         f"{fmt_ratio(a['p99'] / b['p99'])} p99")
    return "After/before: " + "; ".join(parts) + ". Ratios within the spread column are ties."
