"""Part 3 of accept_share: where each connection lands when clients come and go.

Two rows per server (two WSGI workers on the GIL-holding view, sharing on and
`--no-accept-share`):

- back-to-back bursts: BURSTS rounds, each opening 32 keep-alive connections
  together, one `GET /pid` on each, every answer read, then all 32 closed and
  the next round opened at once (a benchmark's warm-up then its run, or a load
  balancer recycling its pool). The first round is the seed's figure (a single
  burst of 32 over two workers); the later rounds are the case a sibling's
  count still holding the previous round's closed connections once split
  24/8 and 28/4. Latency is from a request's send to its answer's last byte,
  over every request of the later rounds.
- churn: wrk, 16 clients, `Connection: close` (one accept per request); the
  per-worker split is what each worker logged at its drain ("drained: N
  connection(s) accepted").

A round's split is busiest/other (connections per worker); with the view's
~1 ms per request, a 24/8 split makes the last answer of a round wait 24 ms
instead of 16.
"""

import re
import selectors
import socket
import statistics
import time

import harness as h

BURSTS = 20
CONNS = 32
CHURN_CONNS = 16


def _read_answers(socks: list[socket.socket], sent: list[float], timeout: float = 30.0):
    """Each socket's (pid, seconds from send to the answer's last byte)."""
    sel = selectors.DefaultSelector()
    bufs = {s.fileno(): bytearray() for s in socks}
    index = {s.fileno(): i for i, s in enumerate(socks)}
    done: dict[int, tuple[str, float]] = {}
    for s in socks:
        sel.register(s, selectors.EVENT_READ)
    deadline = time.monotonic() + timeout
    while len(done) < len(socks):
        if time.monotonic() > deadline:
            raise h.BenchError(f"bursts: {len(socks) - len(done)} answer(s) missing after {timeout:.0f} s")
        for key, _ in sel.select(1.0):
            fd = key.fd
            chunk = key.fileobj.recv(4096)
            if not chunk:
                raise h.BenchError("bursts: the server closed a connection before answering")
            buf = bufs[fd]
            buf += chunk
            head_end = buf.find(b"\r\n\r\n")
            if head_end < 0:
                continue
            m = re.search(rb"(?i)content-length:\s*(\d+)", buf[:head_end])
            length = int(m.group(1)) if m else 0
            if len(buf) >= head_end + 4 + length:
                i = index[fd]
                body = bytes(buf[head_end + 4:head_end + 4 + length]).strip().decode()
                done[i] = (body, time.perf_counter() - sent[i])
                sel.unregister(key.fileobj)
    sel.close()
    return [done[i] for i in range(len(socks))]


def burst_rounds(port: int, rounds: int = BURSTS, n: int = CONNS):
    """Per round: (split largest first, latencies in seconds)."""
    out = []
    request = b"GET /pid HTTP/1.1\r\nHost: bench\r\n\r\n"
    for _ in range(rounds):
        socks = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
        sent = []
        for s in socks:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sent.append(time.perf_counter())
            s.sendall(request)
        answers = _read_answers(socks, sent)
        for s in socks:
            s.close()
        counts: dict[str, int] = {}
        for pid, _ in answers:
            counts[pid] = counts.get(pid, 0) + 1
        split = sorted(counts.values(), reverse=True) + [0]
        out.append((split[:2], [t for _, t in answers]))
    return out


def _split(s: list[int]) -> str:
    return f"{s[0]}/{s[1]}"


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def drained_split(logpath, offset: int) -> list[int]:
    """Connections each worker logged at its drain, from `offset` of the log on."""
    with open(logpath, "rb") as f:
        f.seek(offset)
        text = f.read().decode(errors="replace")
    counts = [int(m) for m in re.findall(r"drained: (\d+) connection\(s\) accepted", text)]
    return sorted(counts, reverse=True) + [0] * (2 - len(counts))


def run(servers: list[h.Server], anchor: str, opts, rounds: int, duration: float):
    """Both rows for every server, alternating servers over `rounds` samples."""
    bursts = BURSTS if not opts.quick else 5
    samples: dict[str, list] = {s.name: [] for s in servers}
    churn: dict[str, list] = {s.name: [] for s in servers}
    port = h.BASE_PORT + 50
    for rnd in range(rounds):
        for s in servers if rnd % 2 == 0 else list(reversed(servers)):
            h.log(f"bursts round {rnd + 1}/{rounds}: {s.name}")
            run_ = h.start(s, port)
            try:
                samples[s.name].append(burst_rounds(port, bursts))
            finally:
                h.stop(run_)
                h.wait_port_free(port)
            offset = run_.logpath.stat().st_size
            run_ = h.start(s, port)
            try:
                load = h.Load(conns=CHURN_CONNS, headers=("Connection: close",), path="/")
                h.wrk(port, load, 1)
                r = h.measure(run_, load, duration)
            finally:
                h.stop(run_)
                h.wait_port_free(port)
            r["split"] = drained_split(run_.logpath, offset)
            churn[s.name].append(r)
            h.log(f"  bursts later splits {[_split(x[0]) for x in samples[s.name][-1][1:]]}; "
                  f"churn {r['rps']:.0f} req/s split {_split(r['split'])}")

    headers = ["server", "load", "split, busiest/other", "worst split", "p50", "p99",
               "p99 ÷ anchor", "req/s", "server CPU"]
    rows, summary = [], {}
    for s in servers:
        later = [rd for sample in samples[s.name] for rd in sample[1:]]
        lat = [t for _, ts in later for t in ts]
        busiest = [sp[0] for sp, _ in later]
        cs = churn[s.name]
        summary[s.name] = {
            "bursts_p99": _pct(lat, 0.99), "bursts_p50": _pct(lat, 0.50),
            "bursts_worst": max(busiest), "bursts_median": statistics.median(busiest),
            "first": [sample[0][0] for sample in samples[s.name]],
            "churn_p99": h.median([r["p99"] for r in cs]),
            "churn_p50": h.median([r["p50"] for r in cs]),
            "churn_rps": h.median([r["rps"] for r in cs]),
            "churn_cpu": h.median([r["cpu"] for r in cs]),
            "churn_splits": [r["split"] for r in cs],
        }
    a = summary[anchor]
    for s in servers:
        m = summary[s.name]
        name = s.name + (" (anchor)" if s.name == anchor else "")
        med = m["bursts_median"]
        rows.append([name, f"{bursts} bursts of {CONNS}, back to back",
                     "first " + ", ".join(_split(f) for f in m["first"])
                     + f"; later median {med:g}/{CONNS - med:g}",
                     f"{m['bursts_worst']}/{CONNS - m['bursts_worst']}",
                     h.fmt_us(1e6 * m["bursts_p50"]), h.fmt_us(1e6 * m["bursts_p99"]),
                     h.fmt_ratio(m["bursts_p99"] / a["bursts_p99"]), "-", "-"])
        worst = max(m["churn_splits"], key=lambda sp: sp[0] / max(1, sum(sp)))
        rows.append([name, f"churn: {CHURN_CONNS} clients, Connection: close",
                     ", ".join(_split(sp) for sp in m["churn_splits"]), _split(worst),
                     h.fmt_us(m["churn_p50"]), h.fmt_us(m["churn_p99"]),
                     h.fmt_ratio(m["churn_p99"] / a["churn_p99"]), h.fmt_rps(m["churn_rps"]),
                     f"{m['churn_cpu']:.0f}%"])
    return headers, rows, summary, bursts
