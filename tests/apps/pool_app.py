"""Views for the handler-pool tests: whether threads run at once is decided
by the view, so each view makes that one thing the variable.

/release  usleep(200 ms) through ctypes.CDLL: the GIL is dropped for the call
/hold     usleep(200 ms) through ctypes.PyDLL: the GIL is held for the call
/seq      a short GIL-holding view that returns the order it was entered in
/hash     8 x sha256 over 64 KiB: about a millisecond, the GIL released
/sleep    time.sleep(5 ms): blocking I/O without the GIL
/cpu      about 1 ms of pure Python
/release and /hold block rather than compute, so whether two of them overlap
depends on the GIL alone and not on how many CPUs are idle: on a busy CI
machine, CPU-bound views measured the neighbours as much as the pool. The
same libc call, made with and without the GIL, is the one variable.
"""

import ctypes
import hashlib
import itertools
import time

BIG = b"r" * 65536
_order = itertools.count()
# CDLL releases the GIL around each foreign call; PyDLL keeps it.
_usleep_released = ctypes.CDLL(None).usleep
_usleep_held = ctypes.PyDLL(None).usleep
BLOCK_US = 200_000


def application(environ, start_response):
    path = environ["PATH_INFO"]
    if path in ("/release", "/hold"):
        (_usleep_released if path == "/release" else _usleep_held)(BLOCK_US)
        body = b"blocked\n"
    elif path == "/hash":
        # A request-sized GIL-releasing view: 8 x sha256 over 64 KiB.
        for _ in range(8):
            hashlib.sha256(BIG).digest()
        body = b"hashed\n"
    elif path == "/sleep":
        # Blocking I/O stand-in: sleeps without the GIL.
        time.sleep(0.005)
        body = b"slept\n"
    elif path == "/cpu":
        # About a millisecond of pure Python: holds the GIL throughout.
        total = 0
        for i in range(20000):
            total += i
        body = b"done\n"
    elif path == "/seq":
        seq = next(_order)
        # About a millisecond of pure Python: holds the GIL.
        total = 0
        for i in range(20000):
            total += i
        body = f"{seq}\n".encode()
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such view\n"]
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
