"""pool_cpu: the adaptive pool vs fixed sizes on a GIL-holding view (~1 ms of
pure Python). See _pool.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _pool  # noqa: E402

TITLE = "pool — adaptive vs fixed handler threads, GIL-holding view (/cpu, ~1 ms pure Python)"
ABOUT = ("One WSGI worker on CPU 0, one worker unpinned (2 usable CPUs), and two workers unpinned "
         "sharing the 2 CPUs; the view holds the GIL for its whole run.")
TARGET = ("adaptive >= 0.95x the best fixed size's req/s, p99 within 1.10x of it, in every group: "
          "one worker on CPU 0 at 8 and 64 connections, one worker unpinned and two workers at 8 and 32.")
NEEDS = _pool.NEEDS
SERVERS = _pool.servers("/cpu", b"done\n")
LOADS = _pool.loads("/cpu")
ANCHOR, ROUNDS, DURATION, WARMUP = _pool.ANCHOR, _pool.ROUNDS, _pool.DURATION, _pool.WARMUP
verdict = _pool.verdict


def run(opts):
    return _pool.run_groups(TITLE, opts, "/cpu", b"done\n", [1, 2, 4], [1, 2, 3])
