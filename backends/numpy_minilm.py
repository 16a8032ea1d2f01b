"""all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide) forward pass in plain numpy, over the model's
safetensors: the m0serve pyembed backend that needs nothing but numpy.

    load(model_dir, max_batch=..., max_tokens=...) -> Backend
    Backend.forward(input_ids, attention_mask, token_type_ids) -> float32 [B, 384]

forward() returns the mean-pooled vectors (sentence-transformers' pooling), not normalized.
"""

import os
import sys

# One BLAS thread per worker unless M0_PYEMBED_BLAS_THREADS says otherwise. OpenBLAS reads
# these only when it is loaded, i.e. when numpy is first imported, so they are set before
# the import below. Why one: with two OpenBLAS threads on a shared 2-core box, latency was
# measured up to 50x worse when another process took a core (OpenBLAS's threads busy-wait
# for each other, so one descheduled thread stalls every call); more worker processes
# scale better than more BLAS threads per worker.
BLAS_THREADS = int(os.environ.get("M0_PYEMBED_BLAS_THREADS") or 1)
_numpy_was_loaded = "numpy" in sys.modules
for _var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = str(BLAS_THREADS)

import numpy as np  # noqa: E402

from minilm_files import read_config, read_safetensors  # noqa: E402


def _set_loaded_openblas_threads(n):
    """For a numpy imported before this module (the variables came too late): call the
    loaded OpenBLAS's own setter, found in /proc/self/maps, as threadpoolctl would."""
    import ctypes
    libs = {line.split()[-1] for line in open("/proc/self/maps") if "openblas" in line.lower()}
    for path in libs:
        lib = ctypes.CDLL(path)
        for sym in ("scipy_openblas_set_num_threads64_", "openblas_set_num_threads64_",
                    "openblas_set_num_threads"):
            if hasattr(lib, sym):
                getattr(lib, sym)(ctypes.c_int(n))
                return True
    return False


if _numpy_was_loaded and not _set_loaded_openblas_threads(BLAS_THREADS):
    print(f"numpy_minilm: numpy was imported first and its BLAS is not OpenBLAS: the BLAS "
          f"thread count {BLAS_THREADS} may not apply (import this module first)", file=sys.stderr)

# erf for the exact GELU, which numpy lacks: Abramowitz & Stegun 7.1.26, absolute error
# under 1.5e-7, about float32's own rounding at these magnitudes (scipy would be a large
# dependency for one function). Checked: cosine >= 0.9999999 against sentence-transformers.
_P = np.float32(0.3275911)
_A = [np.float32(a) for a in (1.061405429, -1.453152027, 1.421413741, -0.284496736, 0.254829592)]


def _erf(x):
    ax = np.abs(x)
    t = 1 / (1 + _P * ax)
    poly = _A[0]
    for a in _A[1:]:
        poly = poly * t + a
    return np.copysign(1 - poly * t * np.exp(-ax * ax), x)


def _gelu(x):
    return x * (0.5 + 0.5 * _erf(x * np.float32(0.7071067811865476)))


def _layer_norm(x, w, b, eps):
    mean = x.mean(-1, keepdims=True)
    x = x - mean
    var = (x * x).mean(-1, keepdims=True)
    return x / np.sqrt(var + eps) * w + b


class Backend:
    name = "numpy"
    releases_gil = False   # numpy drops the GIL in each BLAS call, but a forward is hundreds
                           # of short calls: two Python threads measured 0.93x of one

    def __init__(self, model_dir, max_tokens):
        cfg = read_config(model_dir)
        if cfg.get("model_type") != "bert" or cfg.get("position_embedding_type", "absolute") != "absolute":
            raise ValueError(f"{model_dir}: not an absolute-position BERT model: {cfg.get('model_type')}")
        if cfg.get("hidden_act") != "gelu":
            raise ValueError(f"hidden_act {cfg.get('hidden_act')!r}: only exact (erf) gelu is implemented")
        if max_tokens > cfg["max_position_embeddings"]:
            raise ValueError(f"max_tokens {max_tokens} > the model's max_position_embeddings "
                             f"{cfg['max_position_embeddings']}")
        self.dim = cfg["hidden_size"]
        self.heads = cfg["num_attention_heads"]
        self.eps = np.float32(cfg["layer_norm_eps"])
        self.threads = BLAS_THREADS
        w = read_safetensors(model_dir)
        w = {k.removeprefix("bert."): v for k, v in w.items()}

        def f32(name):
            return np.ascontiguousarray(w[name], dtype=np.float32)

        def dense(*names):
            # torch stores Linear weights as [out, in]: transposed once to a contiguous
            # [in, out] so each call is a plain x @ W; q|k|v fused into one matmul (fewer,
            # larger BLAS calls).
            return (np.ascontiguousarray(np.concatenate([w[n + ".weight"] for n in names]).T),
                    np.concatenate([w[n + ".bias"] for n in names]).astype(np.float32))

        e = "embeddings."
        self.word = w[e + "word_embeddings.weight"]      # mapped: only looked up, never copied
        self.pos, self.type = f32(e + "position_embeddings.weight"), f32(e + "token_type_embeddings.weight")
        self.ln0 = f32(e + "LayerNorm.weight"), f32(e + "LayerNorm.bias")
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            self.layers.append(dict(
                qkv=dense(a + "self.query", a + "self.key", a + "self.value"),
                out=dense(a + "output.dense"),
                ln1=(f32(a + "output.LayerNorm.weight"), f32(a + "output.LayerNorm.bias")),
                ffn1=dense(p + "intermediate.dense"),
                ffn2=dense(p + "output.dense"),
                ln2=(f32(p + "output.LayerNorm.weight"), f32(p + "output.LayerNorm.bias")),
            ))

    def forward(self, input_ids, attention_mask, token_type_ids):
        B, T = input_ids.shape
        H, D = self.heads, self.dim // self.heads
        x = self.word[input_ids] + self.pos[:T] + self.type[token_type_ids]
        x = _layer_norm(x.reshape(B * T, self.dim), *self.ln0, self.eps)
        # Padding gets a large finite negative by selection: never -inf (an all-padded row,
        # or 0 * -inf, would give NaN). exp(-1e4) is exactly 0 in float32.
        bias = np.where(attention_mask == 0, np.float32(-1e4), np.float32(0))[:, None, None, :]
        scale = np.float32(1 / np.sqrt(D))
        for L in self.layers:
            qkv = (x @ L["qkv"][0] + L["qkv"][1]).reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
            s = (qkv[0] * scale) @ qkv[1].transpose(0, 1, 3, 2) + bias      # [B, H, T, T]
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ qkv[2]).transpose(0, 2, 1, 3).reshape(B * T, self.dim)
            x = _layer_norm(x + ctx @ L["out"][0] + L["out"][1], *L["ln1"], self.eps)
            h = _gelu(x @ L["ffn1"][0] + L["ffn1"][1])
            x = _layer_norm(x + h @ L["ffn2"][0] + L["ffn2"][1], *L["ln2"], self.eps)
        # Mean over the real tokens, as sentence-transformers' Pooling (mean_tokens) does.
        m = attention_mask.astype(np.float32)[:, :, None]
        summed = (x.reshape(B, T, self.dim) * m).sum(1)
        return np.ascontiguousarray(summed / np.maximum(m.sum(1), np.float32(1e-9)), dtype=np.float32)


def load(model_dir, *, max_batch, max_tokens):
    """max_batch is not needed here: numpy takes any shape."""
    return Backend(model_dir, max_tokens)
