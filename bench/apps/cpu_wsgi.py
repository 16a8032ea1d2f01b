"""A WSGI view that holds the GIL for about 1 ms of pure Python (bench/scenarios/accept_share.py).

LOOPS is fixed so that every run does the same work; the scenario measures
the resulting service time (`service_time()`) on the bench machine and
reports it, rather than re-calibrating. Override with CPU_WSGI_LOOPS.
"""

import os

LOOPS = int(os.environ.get("CPU_WSGI_LOOPS", "0")) or 20_000
BODY = b"done\n"
HEADERS = [("Content-Type", "text/plain"), ("Content-Length", str(len(BODY)))]


def work(n: int = LOOPS) -> int:
    """Pure-Python integer loop: never releases the GIL."""
    acc = 0
    for i in range(n):
        acc = (acc + i * i) % 1_000_003
    return acc


def app(environ, start_response):
    work()
    if environ.get("PATH_INFO") == "/pid":
        # Which worker answered: the accept-sharing bursts count it.
        body = f"{os.getpid()}\n".encode()
        start_response("200 OK", [("Content-Type", "text/plain"), ("Content-Length", str(len(body)))])
        return [body]
    start_response("200 OK", HEADERS)
    return [BODY]


def service_time(reps: int = 300) -> float:
    """Median seconds per call of work(), after a short warm-up."""
    import statistics
    import time
    for _ in range(20):
        work()
    ts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        work()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


if __name__ == "__main__":
    print(f"{LOOPS} loops: {service_time() * 1e3:.3f} ms per call")
