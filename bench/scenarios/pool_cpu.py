"""pool_cpu: the adaptive pool vs fixed sizes on a GIL-holding view (~1 ms of
pure Python). See _pool.py."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import _pool  # noqa: E402

TITLE = "pool — adaptive vs fixed handler threads, GIL-holding view (/cpu, ~1 ms pure Python)"
ABOUT = "One WSGI worker on CPU 0; the view holds the GIL for its whole run."
TARGET = "adaptive >= 0.95x the best fixed size's req/s, p99 within 1.10x of it, at 8 and 64 connections."
NEEDS = _pool.NEEDS
SERVERS = _pool.servers("/cpu", b"done\n")
LOADS = _pool.loads("/cpu")
ANCHOR, ROUNDS, DURATION, WARMUP = _pool.ANCHOR, _pool.ROUNDS, _pool.DURATION, _pool.WARMUP
verdict = _pool.verdict
