"""A pyembed backend that does no work: row r is [its token count, 0, ...], dim floats. The
embed_native bench serves it beside the identity C backend of tests/c/embed_backend.c (the same
rows) to compare what one call through each costs: Python's (the GIL, numpy arrays in and out)
against the C header's (a packed buffer in, a float buffer out).
"""

import numpy as np


class Identity:
    name = "identity"
    releases_gil = False
    threads = 1

    def __init__(self, dim):
        self.dim = dim

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = np.zeros((input_ids.shape[0], self.dim), dtype=np.float32)
        out[:, 0] = attention_mask.sum(axis=1)
        return out


def load(model_dir, *, max_batch, max_tokens):
    import json
    from pathlib import Path
    config = json.loads((Path(model_dir) / "config.json").read_text())
    return Identity(config["hidden_size"])
