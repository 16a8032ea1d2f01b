"""selftest: checks the harness itself, without m0serve.

nginx against a tiny keep-alive stand-in written with Python's http.server,
both pinned to CPU 0. Expect the stand-in at a few percent of nginx.
"""

import sys

from harness import Load, Server, nginx

TITLE = "selftest — harness check: Python http.server stand-in vs nginx"
ABOUT = "Harness check only (no m0serve): the numbers say nothing about the project."
NEEDS = ["wrk", "nginx"]

BODY = b"hello, world\n"
STANDIN = r'''
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    wbufsize = -1                    # one write per response, flushed by the server
    disable_nagle_algorithm = True
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", "13")
        self.end_headers()
        self.wfile.write(b"hello, world\n")
    def log_message(self, *a):
        pass
ThreadingHTTPServer.request_queue_size = 1024
ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
'''

SERVERS = [
    Server("python stand-in", [sys.executable, "-c", STANDIN, "{port}"], cpus="0", expect=BODY),
    nginx("nginx", '        location = / { return 200 "hello, world\\n"; }', cpus="0", expect=BODY),
]
LOADS = [Load(conns=8), Load(conns=64)]
ANCHOR = "nginx"
ROUNDS = 2
DURATION = 5
