"""Run a WSGI app under bjoern: python bjoern_serve.py MODULE:ATTR HOST PORT.

bjoern has no command line of its own; one process, no workers.
"""

import importlib
import sys

import bjoern

mod, _, attr = sys.argv[1].partition(":")
app = getattr(importlib.import_module(mod), attr or "app")
bjoern.run(app, sys.argv[2], int(sys.argv[3]))
