"""The minimal WSGI hello app every server in bench/scenarios/wsgi.py serves.

GET anything -> 200, "hello, world\\n" with Content-Length (13 bytes), the
same body as the hello_c plugin and the nginx peer in scenarios/hello.py.
"""

BODY = b"hello, world\n"
HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))]


def app(environ, start_response):
    start_response("200 OK", HEADERS)
    return [BODY]
