"""An app that imports a runtime known not to survive fork() (a stand-in
registered under grpc's name, so the test needs no such package)."""

import sys
import types

sys.modules.setdefault("grpc", types.ModuleType("grpc"))


def application(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", "3")])
    return [b"ok\n"]
