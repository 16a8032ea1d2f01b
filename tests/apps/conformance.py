"""PEP 3333 conformance app for the m0serve WSGI plugin (tests/wsgi_conformance.rs).

Served as `conformance:application` and, wrapped in wsgiref.validate, as
`conformance:validated`. One route group per paragraph of the contract:

  environ       /environ..., /input/..., /errors
  start_response /start/..., /headers/..., /write
  iterable      /body/..., /file-wrapper
  resilience    /raise, /pid, /stats, /osenv?NAME (the process environment)
  embedding     /tstate, /signals

Responses are plain text (`KEY=ascii(value)` lines) so the Rust tests need no
JSON parser. Every response has a Content-Type (wsgiref.validate insists).
`/canary` sends a 200 without a Content-Type: accepted by the server, refused
by wsgiref.validate, which proves the wrapper is engaged.
"""

import io
import os
import signal
import sys
import threading
import time
import wsgiref.validate

TEXT = [("Content-Type", "text/plain; charset=utf-8")]

# close() calls seen, by tag; read back with /stats.
_stats = {}
_stats_lock = threading.Lock()


def _count(tag):
    with _stats_lock:
        _stats[tag] = _stats.get(tag, 0) + 1


def _query(environ):
    out = {}
    for part in environ.get("QUERY_STRING", "").split("&"):
        if part:
            k, _, v = part.partition("=")
            out[k] = v
    return out


def _lines(pairs):
    return "".join(f"{k}={v}\n" for k, v in pairs).encode("utf-8")


def _text(start_response, body, status="200 OK", extra=()):
    start_response(status, TEXT + list(extra))
    return [body]


class Closing:
    """An iterable (not a list) with close(): counts the close call."""

    def __init__(self, tag, chunks, fail_after=None, delay=0.0, forever=False):
        self.tag = tag
        self.chunks = list(chunks)
        self.fail_after = fail_after
        self.delay = delay
        self.forever = forever

    def __iter__(self):
        n = 0
        while True:
            if self.forever:
                if n >= 2000:  # a broken test must not keep a thread forever
                    return
                chunk = b"x" * 1024
            elif n < len(self.chunks):
                chunk = self.chunks[n]
            else:
                return
            if self.fail_after is not None and n == self.fail_after:
                raise RuntimeError(f"conformance: {self.tag} fails after {n} chunks")
            if self.delay and n:
                time.sleep(self.delay)
            n += 1
            yield chunk

    def close(self):
        _count(self.tag)


# --- environ -----------------------------------------------------------------

def environ_dump(environ, start_response):
    pairs = []
    for k in sorted(environ):
        v = environ[k]
        if isinstance(v, str):
            pairs.append((k, ascii(v)))
    wsgi = environ
    pairs += [
        ("wsgi.version", ascii(wsgi["wsgi.version"])),
        ("wsgi.url_scheme", ascii(wsgi["wsgi.url_scheme"])),
        ("wsgi.multithread", ascii(wsgi["wsgi.multithread"])),
        ("wsgi.multiprocess", ascii(wsgi["wsgi.multiprocess"])),
        ("wsgi.run_once", ascii(wsgi["wsgi.run_once"])),
        ("wsgi.input.methods", ascii(all(hasattr(wsgi["wsgi.input"], m)
                                         for m in ("read", "readline", "readlines", "__iter__")))),
        ("wsgi.errors.methods", ascii(all(hasattr(wsgi["wsgi.errors"], m)
                                          for m in ("write", "writelines", "flush")))),
        ("wsgi.file_wrapper.callable", ascii(callable(wsgi.get("wsgi.file_wrapper")))),
        ("types.str", ascii(all(type(v) is str for k, v in environ.items() if "." not in k))),
        ("pid", os.getpid()),
        ("sys.executable", ascii(sys.executable)),
    ]
    return _text(start_response, _lines(pairs))


def input_route(environ, start_response, how):
    inp = environ["wsgi.input"]
    q = _query(environ)
    n = int(q.get("n", "4"))
    got = []
    if how == "read":  # read() without a size (refused by wsgiref.validate)
        got.append(inp.read())
        got.append(inp.read())
    elif how == "read-n":
        while True:
            b = inp.read(n)
            got.append(b)
            if not b:
                break
        got.append(inp.read(n))  # past the end: b'' again
    elif how == "readline":
        while True:
            b = inp.readline()
            got.append(b)
            if not b:
                break
    elif how == "readline-n":
        while True:
            b = inp.readline(n)
            got.append(b)
            if not b:
                break
    elif how == "readlines":
        got.append(inp.readlines())
        got.append(inp.readline())
    elif how == "iter":
        got.append(list(iter(inp)))
    elif how == "echo":
        length = int(environ.get("CONTENT_LENGTH") or 0)
        body = inp.read(length)
        start_response("200 OK", [("Content-Type", "application/octet-stream"),
                                  ("Content-Length", str(len(body)))])
        return [body]
    return _text(start_response, _lines([("got", ascii(got))]))


def errors_route(environ, start_response):
    token = _query(environ).get("token", "none")
    err = environ["wsgi.errors"]
    err.write(f"conformance wsgi.errors line {token}\n")
    err.writelines([f"conformance writelines {token} a\n", f"conformance writelines {token} b\n"])
    err.flush()
    return _text(start_response, b"logged\n")


def logging_route(environ, start_response):
    # As Flask's default handler does: a logging.StreamHandler on wsgi.errors.
    import logging
    token = _query(environ).get("token", "none")
    handler = logging.StreamHandler(environ["wsgi.errors"])
    logger = logging.getLogger(f"conformance.{token}")
    logger.setLevel(logging.DEBUG)
    logger.propagate = False
    logger.addHandler(handler)
    try:
        logger.debug("conformance logging debug %s", token)
        logger.info("conformance logging info %s", token)
        logger.warning("conformance logging warning %s", token)
        logger.error("conformance logging error %s", token)
        environ["wsgi.errors"].write(f"conformance direct write {token}\n")
    finally:
        logger.removeHandler(handler)
    return _text(start_response, b"logged\n")


def reason_route(environ, start_response):
    from urllib.parse import unquote
    status = unquote(_query(environ).get("status", "299 Totally Custom"))
    start_response(status, [("Content-Type", "text/plain")])
    return [b"reason\n"]


# --- start_response ------------------------------------------------------------

def headers_route(environ, start_response, kind):
    bad = {
        "cr": [("X-Bad", "a\rInjected: yes")],
        "lf": [("X-Bad", "a\nInjected: yes")],
        "crlf": [("X-Bad", "a\r\nInjected: yes")],
        "nul": [("X-Bad", "a\x00b")],
        "name-lf": [("X-Bad\nInjected", "yes")],
        "name-space": [("X Bad", "yes")],
        "not-latin1": [("X-Bad", "snow \u2603")],
    }
    if kind == "latin1":
        return _text(start_response, b"latin1\n", extra=[("X-Latin1", "caf\u00e9")])
    if kind == "two-cookies":
        return _text(start_response, b"cookies\n",
                     extra=[("Set-Cookie", "a=1; Path=/"), ("Set-Cookie", "b=2; Path=/")])
    return _text(start_response, b"should not be sent\n", extra=bad[kind])


def start_twice(environ, start_response):
    start_response("200 OK", TEXT)
    start_response("201 Created", TEXT)
    return [b"should not be sent\n"]


def exc_before_body(environ, start_response):
    start_response("200 OK", TEXT + [("X-First", "yes")])
    try:
        raise ValueError("conformance: replaced before the body")
    except ValueError:
        start_response("503 Service Unavailable", TEXT + [("X-Replaced", "yes")], sys.exc_info())
    return [b"replaced\n"]


def exc_after_body(environ, start_response):
    write = start_response("200 OK", TEXT)
    write(b"partial\n")
    try:
        raise ValueError("conformance: too late to replace")
    except ValueError:
        # Must re-raise: the head is already on the wire.
        start_response("500 Internal Server Error", TEXT, sys.exc_info())
    return [b"never\n"]


def write_route(environ, start_response):
    write = start_response("200 OK", TEXT)
    write(b"w1-")
    write(b"w2-")
    return Closing("write", [b"it1-", b"it2\n"])


# --- the iterable -------------------------------------------------------------

def body_route(environ, start_response, kind):
    tag = _query(environ).get("tag", kind)
    if kind == "one-item":
        return _text(start_response, b"one piece\n")
    if kind == "content-length":
        body = [b"sized ", b"by ", b"header\n"]
        start_response("200 OK", TEXT + [("Content-Length", str(sum(map(len, body))))])
        return Closing(tag, body)
    if kind == "list":
        start_response("200 OK", TEXT)
        return [b"several ", b"", b"pieces\n"]
    if kind == "stream":
        start_response("200 OK", TEXT)
        return Closing(tag, [b"first\n", b"second\n"], delay=0.6)
    if kind == "empty":
        start_response("204 No Content", [])
        return Closing(tag, [])
    if kind == "raise-after-head":
        start_response("200 OK", TEXT)
        return Closing(tag, [b"before the error\n", b"never\n"], fail_after=1)
    if kind == "raise-first":
        start_response("200 OK", TEXT)
        return Closing(tag, [b"never\n"], fail_after=0)
    if kind == "endless":
        start_response("200 OK", TEXT)
        return Closing(tag, [], delay=0.005, forever=True)
    if kind == "str":
        start_response("200 OK", TEXT)
        return "conformance: a str body is an application error\n"
    if kind == "not-bytes":
        start_response("200 OK", TEXT)
        return Closing(tag, ["a str chunk"])
    if kind == "no-start":
        return Closing(tag, [b"never\n"])
    raise KeyError(kind)


class TrackedBytesIO(io.BytesIO):
    def close(self):
        _count("file-wrapper")
        super().close()


def file_wrapper_route(environ, start_response):
    data = b"".join(bytes([i % 251]) for i in range(10000))
    start_response("200 OK", [("Content-Type", "application/octet-stream")])
    return environ["wsgi.file_wrapper"](TrackedBytesIO(data), 4096)


# --- resilience -----------------------------------------------------------------

def raise_route(environ, start_response):
    raise RuntimeError("conformance: raised before start_response, SECRET-TRACEBACK-TEXT")


def stats_route(environ, start_response):
    with _stats_lock:
        pairs = sorted(_stats.items())
    return _text(start_response, _lines(pairs))


_local = threading.local()  # per Python thread state


def tstate_route(environ, start_response):
    # A handler thread that keeps its thread state keeps its threading.local.
    _local.calls = getattr(_local, "calls", 0) + 1
    return _text(start_response, _lines([("thread", threading.get_ident()),
                                         ("calls", _local.calls)]))


def signals_route(environ, start_response):
    handler = signal.getsignal(signal.SIGINT)
    python_owned = handler is signal.default_int_handler
    return _text(start_response, _lines([("python_sigint_handler", ascii(python_owned))]))


def canary(environ, start_response):
    # No Content-Type on a 200: fine for the server (and PEP 3333), an
    # AssertionError under wsgiref.validate.
    start_response("200 OK", [("X-Canary", "yes")])
    return [b"canary: not validated\n"]


ROUTES = {
    "/environ": environ_dump,
    "/errors": errors_route,
    "/logging": logging_route,
    "/reason": reason_route,
    "/start/twice": start_twice,
    "/start/exc-before": exc_before_body,
    "/start/exc-after": exc_after_body,
    "/write": write_route,
    "/file-wrapper": file_wrapper_route,
    "/raise": raise_route,
    "/stats": stats_route,
    "/canary": canary,
    "/tstate": tstate_route,
    "/signals": signals_route,
    "/pid": lambda e, s: _text(s, f"{os.getpid()}\n".encode()),
    "/osenv": lambda e, s: _text(
        s, f"{e['QUERY_STRING']}={ascii(os.environ.get(e['QUERY_STRING']))}\n".encode()),
    "/": lambda e, s: _text(s, b"conformance\n"),
}


def application(environ, start_response):
    path = environ["PATH_INFO"]
    route = ROUTES.get(path)
    if route is not None:
        return route(environ, start_response)
    if path.startswith("/environ/"):
        return environ_dump(environ, start_response)
    for prefix, fn in (("/input/", input_route), ("/headers/", headers_route),
                       ("/body/", body_route)):
        if path.startswith(prefix):
            return fn(environ, start_response, path[len(prefix):])
    return _text(start_response, b"not found\n", status="404 Not Found")


validated = wsgiref.validate.validator(application)
