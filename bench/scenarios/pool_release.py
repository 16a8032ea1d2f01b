"""pool_release: the adaptive pool vs fixed sizes on a view that releases the GIL
(8 x sha256 over 64 KiB per request). See _pool.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _pool  # noqa: E402

TITLE = "pool — adaptive vs fixed handler threads, GIL-releasing view (/hash, 8 x sha256 over 64 KiB)"
ABOUT = ("One WSGI worker on CPU 0, one worker unpinned (2 usable CPUs), and two workers unpinned "
         "sharing the 2 CPUs; the view releases the GIL inside each hashlib call.")
TARGET = ("adaptive >= 0.95x the best fixed size's req/s, p99 within 1.10x of it, in every group: "
          "one worker on CPU 0 at 8 and 64 connections, one worker unpinned and two workers at 8 and 32.")
NEEDS = _pool.NEEDS
SERVERS = _pool.servers("/hash", b"hashed\n")
LOADS = _pool.loads("/hash")
ANCHOR, ROUNDS, DURATION, WARMUP = _pool.ANCHOR, _pool.ROUNDS, _pool.DURATION, _pool.WARMUP
verdict = _pool.verdict


def run(opts):
    return _pool.run_groups(TITLE, opts, "/hash", b"hashed\n", [1, 2, 4], [1, 2, 3])
