"""Reads the embed plugin's packed weights cache (model.m0embed) as a Python
backend would: numpy arrays over one read-only shared mmap of the file, no
copy. `check MODEL_DIR CACHE` compares every tensor with model.safetensors
(panels unpacked back to [out, in]) and prints what it checked as JSON.

The layout (all little-endian): 56 fixed bytes (magic b"M0EMBED\\0",
u32 version, u32 table length, u64 data_start, u64 file length, u64 source
size, u64 source mtime ns, u64 checksum), the JSON table, zeros up to
data_start; each tensor at data_start + offset as float32.
"""

import json
import mmap
import struct
import sys

import numpy as np

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from tiny_bert import read_safetensors  # noqa: E402


def open_cache(path):
    """{name: ndarray} over the mapping, and the mapping."""
    with open(path, "rb") as f:
        mm = mmap.mmap(f.fileno(), 0, flags=mmap.MAP_SHARED, prot=mmap.PROT_READ)
    magic, version, table_len, data_start = struct.unpack_from("<8sIIQ", mm, 0)
    assert magic == b"M0EMBED\0" and version == 1, (magic, version)
    table = json.loads(mm[56 : 56 + table_len])
    out = {}
    for t in table["tensors"]:
        count = int(np.prod(t["shape"]))
        a = np.frombuffer(mm, dtype="<f4", count=count, offset=data_start + t["offset"])
        out[t["name"]] = (a.reshape(t["shape"]), t)
    return out, mm


def unpack_panels(a, columns):
    """[panels, in, 64] back to the [out, in] of safetensors."""
    panels, k, width = a.shape
    return a.transpose(0, 2, 1).reshape(panels * width, k)[:columns]


def check(model_dir, cache):
    st = read_safetensors(model_dir + "/model.safetensors")
    st = {k.removeprefix("bert."): v for k, v in st.items()}
    tensors, mm = open_cache(cache)
    checked = 0
    for name, (a, t) in tensors.items():
        if name.endswith(".qkv.weight") or name.endswith(".qkv.bias"):
            base, part = name.rsplit(".qkv.", 1)
            want = np.concatenate([st[f"{base}.{w}.{part}"] for w in ("query", "key", "value")])
        elif name == "embeddings.token_type_embeddings.0":
            want = st["embeddings.token_type_embeddings.weight"][0]
        else:
            want = st[name]
        got = unpack_panels(a, t["columns"]) if t["layout"] == "panels" else a
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert np.array_equal(got, want.astype(np.float32)), name
        if t["layout"] == "panels":
            padding = unpack_panels(a, a.shape[0] * a.shape[2])[t["columns"] :]
            assert not padding.any(), name
        checked += 1
    print(json.dumps({"checked": checked}))


if __name__ == "__main__":
    assert sys.argv[1] == "check"
    check(sys.argv[2], sys.argv[3])
