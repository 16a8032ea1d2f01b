"""pool_sleep: the adaptive pool vs fixed sizes on a blocking-I/O view
(time.sleep 5 ms, no GIL). See _pool.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _pool  # noqa: E402

TITLE = "pool — adaptive vs fixed handler threads, blocking-I/O view (/sleep, time.sleep 5 ms)"
ABOUT = ("One WSGI worker on CPU 0, one worker unpinned (2 usable CPUs), and two workers unpinned "
         "sharing the 2 CPUs; the view sleeps 5 ms without the GIL.")
TARGET = ("adaptive >= 0.95x the best fixed size's req/s, p99 within 1.10x of it, in every group: "
          "one worker on CPU 0 at 8 and 64 connections, one worker unpinned and two workers at 8 and 32.")
NEEDS = _pool.NEEDS
SERVERS = _pool.servers("/sleep", b"slept\n")
LOADS = _pool.loads("/sleep")
ANCHOR, ROUNDS, DURATION, WARMUP = _pool.ANCHOR, _pool.ROUNDS, _pool.DURATION, _pool.WARMUP
verdict = _pool.verdict


def run(opts):
    return _pool.run_groups(TITLE, opts, "/sleep", b"slept\n", [8, 16, 32], [4, 8, 16])
