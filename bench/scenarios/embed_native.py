"""embed_native: native forward-pass backends behind include/m0embed_backend.h (#55).

Speed: a StaticEmbedding model served by the C backend backends/c/static_embedding.c
(`M0_EMBED_BACKEND=... m0serve --plugin embed MODEL --workers 1`), POST /embed with 32 sentences
of bench/embed/sentences.json per request, at 1 and 8 connections (wrk -t1 pinned to CPU 1,
bench/embed/embed.lua), against the same model in-process (bench/embed/static_inproc.py, one
thread pinned to CPU 0): SentenceTransformer.encode (torch) and the same computation in numpy.
The model: tests/data/static/make_static.py with all-MiniLM-L6-v2's tokenizer (30522 tokens,
WordPiece, its tokenizer.json's truncation at 128) and a seeded 30522 x 256 float32 table, made
into bench/out/embed/static-minilm; M0_EMBED_AUTO_TRUNCATE=1 so the server cuts as
sentence-transformers does.

Overhead: what one call through the header costs against one through pyembed's Python: the
identity backend of tests/c/embed_backend.c (-DDIM=384) and bench/embed/identity_backend.py
(both give a row per input with no model work), each over all-MiniLM-L6-v2's folder (the
plugin tokenizes, batches and writes JSON the same for both), one sentence per request, c1:
p50 and requests/s.

torch and sentence-transformers come from target/families-venv (the families' fixtures' venv:
python3.11 -m venv target/families-venv && target/families-venv/bin/pip install -r
tests/data/families/requirements.txt; about 6 GB with torch's CUDA wheels): without it the st
row is skipped with that reason and the numpy row still runs, from bench/.venv.

Each configuration is started, probed (POST /embed gives dim floats a sentence), warmed up and
measured; configurations and the in-process bars alternate per round (then reversed); a sample
that others disturbed by more than harness.NOISY % of a core is measured again.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import harness as h

sys.path.insert(0, str(Path(__file__).parent))
import _embed  # noqa: E402
from _embed import json_lines, spread  # noqa: E402

TITLE = "embed_native — a C backend (include/m0embed_backend.h): static embeddings, call overhead"
ABOUT = ("A StaticEmbedding model (MiniLM's tokenizer, a 30522 x 256 table, mean pooled) served "
         "by the C backend, 32 sentences per request, beside sentence-transformers and numpy "
         "in-process; and one call through the C header against one through pyembed's Python, "
         "both doing no model work.")
TARGET = ("#55: the static backend's sentences/s at 32 per request beside sentence-transformers "
          "in-process (reported, no bar set); the header's call overhead beside pyembed's (c1 p50).")
NEEDS = ["wrk", "venv", "pyembed", "m0serve"]

OUTDIR = _embed.OUTDIR
MODEL = OUTDIR / "static-minilm"
ST_VENV = h.ROOT / "target" / "families-venv"
PORT = h.BASE_PORT + 57
BATCH = 32
CONNS = [1, 8]
ROUNDS, DURATION, WARMUP = 3, 10, 2
RETRIED: dict[str, int] = {}


def build_c(src: str, out: str, *defines: str) -> Path:
    lib = OUTDIR / out
    r = subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-fvisibility=hidden", "-I",
                        str(h.ROOT / "include"), str(h.ROOT / src), *defines, "-o", str(lib)],
                       capture_output=True, text=True)
    if r.returncode != 0:
        raise h.BenchError(f"cc {src} failed:\n{r.stderr}")
    return lib


class Config(NamedTuple):
    key: str
    label: str
    server: h.Server
    batch: int
    conns: list[int]
    dim: int


def configs(minilm: Path) -> list[Config]:
    static = build_c("backends/c/static_embedding.c", "libstatic_embedding.so")
    identity = build_c("tests/c/embed_backend.c", "libidentity384.so", "-DDIM=384")
    common = ["--host", "127.0.0.1", "--port", "{port}", "--workers", "1",
              "--max-keepalive-requests", "0"]

    def m0(key, argv, env):
        return h.Server(f"m0serve {key}", ["{m0serve}", *argv, *common], cpus=None, env=env,
                        expect=None, start_timeout=60.0, version_cmd=["{m0serve}", "--version"])
    return [
        Config("static", "m0serve, C static backend", m0(
            "static", ["--plugin", "embed", str(MODEL)],
            {"M0_EMBED_BACKEND": str(static), "M0_EMBED_AUTO_TRUNCATE": "1"}), BATCH, CONNS, 256),
        Config("c-id", "m0serve, C identity backend", m0(
            "c-id", ["--plugin", "embed", str(minilm)], {"M0_EMBED_BACKEND": str(identity)}),
            1, [1], 384),
        Config("py-id", "m0serve, pyembed identity backend", m0(
            "py-id", ["--plugin", "pyembed", "--venv", str(h.VENV), "--app-dir",
                      str(h.BENCH / "embed"), "identity_backend"],
            {"M0_EMBED_MODEL_DIR": str(minilm), "M0_EMBED_BACKEND": None}), 1, [1], 384),
    ]


def probe(port: int, dim: int) -> str | None:
    try:
        status, body = _embed.http_post(port, "/embed", json.dumps({"inputs": ["a", "b c"]}).encode())
    except OSError as e:
        return f"POST /embed failed: {e}"
    if status != 200:
        return f"POST /embed answered {status} {body[:160]!r}"
    v = json.loads(body)
    if len(v) != 2 or any(len(r) != dim for r in v):
        return f"POST /embed did not give 2 x {dim} floats: {body[:120]!r}"
    return None


def run_m0serve(cfg: Config, bodies: dict[int, str], dur: float, warm: float) -> tuple[dict, str | None]:
    why = _embed.unavailable()
    if why:
        return {}, why
    try:
        run = h.start(cfg.server, PORT)
    except h.BenchError as e:
        return {}, "m0serve did not start: " + str(e).splitlines()[0]
    out = {}
    try:
        why = probe(PORT, cfg.dim)
        if why:
            return {}, why
        for c in cfg.conns:
            out[c] = _embed.measure_load(run, f"({cfg.key})", cfg.batch, c, bodies, dur, warm, RETRIED)
    finally:
        _embed.stop(run)
    return out, None


def run_inproc(modes: list[str], dur: float, warm: float) -> list[dict]:
    python = ST_VENV if "st" in modes else h.VENV
    argv = [str(python / "bin" / "python"), str(h.BENCH / "embed" / "static_inproc.py"),
            "--model-dir", str(MODEL), "--modes", ",".join(modes), "--duration", f"{dur:g}",
            "--warmup", f"{warm:g}"]
    r = subprocess.run(argv, capture_output=True, text=True, cwd=h.ROOT)
    if r.returncode != 0:
        raise h.BenchError(f"static_inproc.py failed:\n{r.stdout}{r.stderr}")
    rows = json_lines(r.stdout)
    for x in rows:
        h.log(f"  {x['config']}: {x['sentences_per_s']:,.0f} sentences/s p50 {x['p50_ms']:.2f} ms "
              f"other {x['other_pct']:.0f}%")
    return rows


def run(opts) -> h.Report:
    rounds = opts.rounds or (1 if opts.quick else ROUNDS)
    dur = opts.duration or (3 if opts.quick else DURATION)
    warm = 1 if opts.quick else WARMUP
    minilm = _embed.minilm_dir()
    notes, skipped = [], {}
    modes = ["st", "numpy"]
    if not (ST_VENV / "bin" / "python").exists():
        modes = ["numpy"]
        notes.append(f"**sentence-transformers row skipped**: {ST_VENV.relative_to(h.ROOT)} is missing "
                     "(see this scenario's docs for the command); the numpy row is the same computation.")
    maker = ST_VENV if "st" in modes else h.VENV
    r = subprocess.run([str(maker / "bin" / "python"), str(h.ROOT / "tests/data/static/make_static.py"),
                        "--tokenizer", str(minilm / "tokenizer.json"), "--dim", "256", "--out",
                        str(MODEL), "--no-reference"], capture_output=True, text=True, cwd=h.ROOT)
    if r.returncode != 0:
        raise h.BenchError(f"make_static.py failed (it needs torch: {ST_VENV}):\n{r.stdout}{r.stderr}")
    cfgs = configs(minilm)
    bodies = _embed.write_bodies(_embed.sentences(), [1, BATCH])

    inproc: dict[str, list[dict]] = {}
    m0: dict[str, dict[int, list[dict]]] = {c.key: {} for c in cfgs}
    for rnd in range(rounds):
        steps = ["inproc"] + [c.key for c in cfgs]
        for step in (reversed(steps) if rnd % 2 else steps):
            h.log(f"round {rnd + 1}/{rounds}: {step}")
            if step == "inproc":
                for x in run_inproc(modes, dur, warm):
                    inproc.setdefault(x["config"], []).append(x)
                continue
            if step in skipped:
                continue
            cfg = next(c for c in cfgs if c.key == step)
            got, why = run_m0serve(cfg, bodies, dur, warm)
            if why:
                skipped[step] = why
                h.log(f"skipping {step}: {why}")
            for c, x in got.items():
                m0[step].setdefault(c, []).append(x)

    def med(rs, key):
        return h.median([x[key] for x in rs])

    bar_key = f"st b{BATCH}" if "st" in modes else f"numpy b{BATCH}"
    bar = med(inproc[bar_key], "sentences_per_s")
    headers = ["row", "conns", "sentences/s", f"÷ {bar_key.split()[0]} in-process", "p50", "p99",
               "CPU", "wrk CPU", "spread", "other load"]
    rows = []
    for key, label in [(f"st b{BATCH}", "sentence-transformers in-process (torch, 1 thread)"),
                       (f"numpy b{BATCH}", "numpy in-process, the same computation")]:
        rs = inproc.get(key)
        if not rs:
            continue
        sps = med(rs, "sentences_per_s")
        rows.append([f"{label}, {BATCH} per call (CPU 0)", "-", f"{sps:,.0f}", h.fmt_ratio(sps / bar),
                     h.fmt_us(1e3 * med(rs, "p50_ms")), h.fmt_us(1e3 * med(rs, "p99_ms")),
                     f"{med(rs, 'cpu_pct'):.0f}%", "-", spread([x["sentences_per_s"] for x in rs]),
                     f"{max(x['other_pct'] for x in rs):.0f}%"])
    p50 = {}
    for cfg in cfgs:
        for c in cfg.conns:
            rs = m0[cfg.key].get(c)
            if not rs:
                continue
            sps = med(rs, "sentences_per_s")
            p50[cfg.key] = p50.get(cfg.key) or med(rs, "p50")
            rows.append([f"{cfg.label}, {cfg.batch} per request", str(c), f"{sps:,.0f}",
                         h.fmt_ratio(sps / bar) if cfg.batch == BATCH else "-",
                         h.fmt_us(med(rs, "p50")), h.fmt_us(med(rs, "p99")), f"{med(rs, 'cpu'):.0f}%",
                         f"{med(rs, 'wrk_cpu'):.0f}%", spread([x["sentences_per_s"] for x in rs]),
                         f"{max(x['other'] for x in rs):.0f}%"])
            errs = sum(x["errors"] for x in rs)
            if errs:
                notes.append(f"**{cfg.key} c{c}: {errs} wrk errors** over "
                             f"{sum(x['requests'] for x in rs):,} requests")
    if "c-id" in p50 and "py-id" in p50:
        notes.append(f"**Call overhead** (1 sentence per request, c1 p50): the C header's identity "
                     f"backend {h.fmt_us(p50['c-id'])} against pyembed's {h.fmt_us(p50['py-id'])} "
                     f"({h.fmt_ratio(p50['py-id'] / p50['c-id'])} as long through Python).")
    cos = [x.get("st_cosine") for x in inproc.get(f"numpy b{BATCH}", []) if x.get("st_cosine")]
    if cos:
        notes.append(f"numpy's vectors against sentence-transformers': worst cosine {min(cos):.7f}.")
    if RETRIED:
        notes.append(f"Re-measured because others used > {h.NOISY}% of a core: "
                     + ", ".join(f"{n} {k}×" for n, k in RETRIED.items()) + ".")
    for k, why in skipped.items():
        notes.insert(0, f"**{k} rows skipped**: {why}.")
    vers = subprocess.run([str(maker / "bin" / "python"), "-c",
                           "import importlib.metadata as m; print(', '.join(f'{p} {m.version(p)}' for p in "
                           f"{tuple(['tokenizers', 'numpy'] + (['torch', 'sentence-transformers'] if 'st' in modes else []))}))"],
                          capture_output=True, text=True).stdout.strip()
    setup = [
        f"{rounds} round(s) × {dur:g} s per configuration after a {warm:g} s warm-up; in-process, "
        "static, C identity, pyembed identity alternated (then reversed); medians over rounds.",
        f"Model: {MODEL.relative_to(h.ROOT)} (tests/data/static/make_static.py, all-MiniLM-L6-v2's "
        "tokenizer, 30522 x 256 float32, seed 55); the identity rows serve all-MiniLM-L6-v2's folder.",
        "m0serve: --workers 1 unpinned, POST /embed (bench/embed/embed.lua, wrk -t1 pinned to CPU 1, "
        "keep-alive); CPU = the server's process tree, wrk CPU = wrk's, % of one core.",
        "In-process: bench/embed/static_inproc.py pinned to CPU 0, the same 32-sentence calls back to "
        "back; p50/p99 per call.",
        f"Versions: {vers}; m0serve: {h.version_of(cfgs[0].server)}.",
    ]
    return h.Report(TITLE, headers, rows, setup, notes)
