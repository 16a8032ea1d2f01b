"""Views for the handler-pool tests: whether threads run at once is decided
by the view, so each view makes that one thing the variable.

/release  hashlib over 64 KiB buffers: CPython drops the GIL for each update
/hold     hashlib over 1 KiB buffers: under HASHLIB_GIL_MINSIZE, the GIL stays
          (both answer "ITERATIONS START_NS END_NS RUNNABLE_NS")
/block-release  usleep(200 ms) through ctypes.CDLL: the GIL is dropped
/block-hold     usleep(200 ms) through ctypes.PyDLL: the GIL is kept
/seq      a 10 ms GIL-holding view that returns the order it was entered in
/hash     8 x sha256 over 64 KiB: about a millisecond, the GIL released
/hash-at  /hash, answering "START_NS END_NS THREAD" (when it ran, and where)
/hello    a hello world: short, the GIL held throughout
/sleep    time.sleep(5 ms): blocking I/O without the GIL
/sleep50  time.sleep(50 ms), counted while it sleeps
/asleep   how many /sleep50 calls of this worker are sleeping right now
/cpu      about 1 ms of pure Python
/thread   the name of the thread that made the call (m0-loop, m0-handler-N)
/wait     blocks (GIL released) until /open is requested, at most 30 s
/open     lets every /wait return
Each hashing view does a fixed amount of work (about 200 ms of CPU, calibrated
once per process on the first request), never work-until-a-deadline. The
/block-* views make the same comparison without computing, so idle CPUs are
not a second variable: the same libc call, made with and without the GIL.
"""

import ctypes
import hashlib
import itertools
import sys
import threading
import time

# Each hand-over of a contended GIL wakes a thread that then waits for a
# CPU, which other processes decide; a long switch interval makes those
# waits a small share of a call, so /hold's threads are seen to sleep while
# the other holds the GIL however busy the machine is.
sys.setswitchinterval(0.05)

BIG = b"r" * 65536
SMALL = b"h" * 1024
_iterations = {}
_order = itertools.count()
_gate = threading.Event()
_asleep = 0
_asleep_lock = threading.Lock()
# CDLL releases the GIL around each foreign call; PyDLL keeps it.
_usleep_released = ctypes.CDLL(None).usleep
_usleep_held = ctypes.PyDLL(None).usleep


def _calibrate(buf, target=0.2):
    # By this thread's CPU time, not the wall clock: on a busy machine the
    # wall clock would size the work by how much CPU others left us.
    n = 16
    while True:
        started = time.thread_time()
        for _ in range(n):
            hashlib.sha256(buf).digest()
        took = time.thread_time() - started
        if took > 0.05:
            return max(1, int(n * target / took))
        n *= 2


def _thread_clock():
    """(ns on a CPU, ns runnable but waiting for one) of this thread, from
    the kernel's schedstat: what contention from other processes cannot
    disguise as, or hide from, waiting for the GIL."""
    with open(f"/proc/self/task/{threading.get_native_id()}/schedstat", "rb") as f:
        ran, waited = f.read().split()[:2]
    return int(ran), int(waited)


def _hash(buf, n):
    for _ in range(n):
        hashlib.sha256(buf).digest()


def application(environ, start_response):
    global _asleep
    path = environ["PATH_INFO"]
    if path in ("/release", "/hold"):
        buf = BIG if path == "/release" else SMALL
        n = _iterations.get(path)
        if n is None:
            n = _iterations[path] = _calibrate(buf)
        t0, clock0 = time.monotonic_ns(), _thread_clock()
        _hash(buf, n)
        t1, clock1 = time.monotonic_ns(), _thread_clock()
        # When the view ran, and how long its thread was runnable (on a CPU
        # or waiting for one) meanwhile: a thread waiting for the GIL sleeps.
        runnable = (clock1[0] - clock0[0]) + (clock1[1] - clock0[1])
        body = f"{n} {t0} {t1} {runnable}\n".encode()
    elif path in ("/block-release", "/block-hold"):
        (_usleep_released if path == "/block-release" else _usleep_held)(200_000)
        body = b"blocked\n"
    elif path == "/hash":
        # A request-sized GIL-releasing view: 8 x sha256 over 64 KiB.
        for _ in range(8):
            hashlib.sha256(BIG).digest()
        body = b"hashed\n"
    elif path == "/hash-at":
        t0 = time.monotonic_ns()
        for _ in range(8):
            hashlib.sha256(BIG).digest()
        t1 = time.monotonic_ns()
        body = f"{t0} {t1} {threading.get_native_id()}\n".encode()
    elif path == "/hello":
        body = b"hello, world\n"
    elif path == "/sleep":
        # Blocking I/O stand-in: sleeps without the GIL.
        time.sleep(0.005)
        body = b"slept\n"
    elif path == "/sleep50":
        with _asleep_lock:
            _asleep += 1
        try:
            time.sleep(0.05)
        finally:
            with _asleep_lock:
                _asleep -= 1
        body = b"slept\n"
    elif path == "/asleep":
        with _asleep_lock:
            body = f"{_asleep}\n".encode()
    elif path == "/cpu":
        # About a millisecond of pure Python: holds the GIL throughout.
        total = 0
        for i in range(20000):
            total += i
        body = b"done\n"
    elif path == "/thread":
        with open(f"/proc/self/task/{threading.get_native_id()}/comm", "rb") as f:
            body = f.read()
    elif path == "/wait":
        environ["wsgi.errors"].write("waiting at the gate\n")
        environ["wsgi.errors"].flush()
        body = b"opened\n" if _gate.wait(30) else b"timed out\n"
    elif path == "/open":
        _gate.set()
        body = b"open\n"
    elif path == "/seq":
        seq = next(_order)
        # About 10 ms of pure Python, holding the GIL: long beside the time
        # a handler thread may be kept off its CPU by other processes
        # between taking a request and asking for the GIL, during which
        # later requests may go first.
        total = 0
        for i in range(200000):
            total += i
        body = f"{seq}\n".encode()
    else:
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"no such view\n"]
    start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
    return [body]
