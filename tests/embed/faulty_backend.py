"""A pyembed backend for the tests: the numpy backend of backends/, except
that a batch holding the word "explode" raises in forward, and one holding
"shapeshift" gets float64 rows back. The plugin must answer those requests
500 and go on serving.
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "backends"))

import numpy_minilm  # noqa: E402


class Faulty:
    def __init__(self, inner, vocab):
        self.inner = inner
        self.name = "faulty"
        self.dim = inner.dim
        self.releases_gil = inner.releases_gil
        self.threads = inner.threads
        self.explode = vocab["explode"]
        self.shapeshift = vocab["shape"]

    def forward(self, input_ids, attention_mask, token_type_ids):
        if (input_ids == self.explode).any():
            raise RuntimeError("EXPLODE-MARKER: this batch asked for it")
        out = self.inner.forward(input_ids, attention_mask, token_type_ids)
        if (input_ids == self.shapeshift).any():
            return out.astype("float64")
        return out


def load(model_dir, *, max_batch, max_tokens):
    tokenizer = json.loads((Path(model_dir) / "tokenizer.json").read_text())
    inner = numpy_minilm.load(model_dir, max_batch=max_batch, max_tokens=max_tokens)
    return Faulty(inner, tokenizer["model"]["vocab"])
