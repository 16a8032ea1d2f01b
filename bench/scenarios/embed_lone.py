"""embed_lone: one client at a time on all-MiniLM-L6-v2, the default server (a lone request's
pass split over the worker's CPUs, plugins/embed/src/model/team.rs) beside one thread a pass,
and ONNX Runtime in-process at 1 and 2 threads (#54: "a lone request on every core").

The embed scenario's machinery (embed.py: the same sentences, bodies, ORT anchor and table),
cut to 1 connection and three servers: (a) the default, (s) M0_EMBED_THREADS=1 (one thread a
pass, what a lone request had before the thread team), (b) M0_EMBED_THREADS=2. ORT f32 is the
only in-process anchor (embed.py runs int8 and torch bf16 too). Alternated per round, then
reversed; medians over rounds.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("embed_lone_base", Path(__file__).with_name("embed.py"))
E = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(E)

TITLE = "embed_lone — a lone request on every core: all-MiniLM-L6-v2 at 1 connection vs ONNX Runtime"
ABOUT = ("One client at a time (1 and 32 sentences a request) on the default server, whose lone "
         "pass splits over the worker's CPUs, beside one compute thread a pass and ONNX Runtime "
         "in-process with 1 and 2 threads.")
TARGET = ("#54: in f32, one request alone (1 sentence): p50 at most 1.0x ONNX Runtime's batch-1 p50 "
          "with 2 threads.")
NEEDS = E.NEEDS

LOADS = [(b, 1) for b in E.BATCHES]
E.TITLE = TITLE
E.CONNS = [1]
E.ANCHORS = ("ort",)
E.LATENCY_GOAL = 1.0
E.CONFIGS = [
    E.Config("a", "m0serve (a) default: --workers 1", E.m0_server("a", 1, None, None), LOADS),
    E.Config("s", "m0serve (s) --workers 1, M0_EMBED_THREADS=1 (one thread a pass)",
             E.m0_server("s", 1, 1, None), LOADS),
    E.Config("b", "m0serve (b) --workers 1, M0_EMBED_THREADS=2", E.m0_server("b", 1, 2, None), LOADS),
]
E.SERVER = E.CONFIGS[0].server


def run(opts):
    return E.run(opts)
