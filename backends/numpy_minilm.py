"""all-MiniLM-L6-v2 (BERT, 6 layers, 384 wide) forward pass in plain numpy, over the model's
safetensors: the m0serve pyembed backend that needs nothing but numpy.

    load(model_dir, max_batch=..., max_tokens=...) -> Backend
    Backend.forward(input_ids, attention_mask, token_type_ids) -> float32 [B, 384]

forward() returns the mean-pooled vectors (sentence-transformers' pooling), not normalized.
"""

import os
import sys
import threading

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

# The exact (erf) GELU, which numpy lacks, as gelu(x) = (x + |x| * erf(|x| / sqrt 2)) / 2, the
# erf by Abramowitz & Stegun 7.1.26: erf(z) = 1 - t * poly(t) * exp(-z^2), t = 1 / (1 + p z),
# absolute error under 1.5e-7, about float32's own rounding at these magnitudes (scipy would be
# a large dependency for one function). Checked: cosine >= 0.9999999 against
# sentence-transformers. The halving is folded into the second FFN layer's weights at load (a
# power of two: exact), 1/sqrt 2 into the constants, and every step writes into scratch buffers
# in place instead of allocating a new [tokens, 1536] array per step: at 32 sentences a call
# the first expression took a third of the forward pass. The form needs no select and no
# np.maximum (which alone took as long as the exp). The hidden layer is worked through in
# blocks of _ROWS rows, which bounds the scratch (32 inputs of 256 tokens would need 50 MB per
# buffer) and keeps the matrix products large.
_P = np.float32(0.3275911 * 0.7071067811865476)
_A = [np.float32(-a) for a in (0.254829592, -0.284496736, 1.421413741, -1.453152027, 1.061405429)]
_ROWS = 256


def _gelu2_(h, a, t, p):
    """h <- 2 * gelu(h) in place; a, t and p are scratch of h's shape."""
    np.abs(h, out=a)
    np.multiply(a, _P, out=t)
    t += 1
    np.reciprocal(t, out=t)
    np.multiply(t, _A[4], out=p)               # Horner over t, from the highest coefficient
    for c in (_A[3], _A[2], _A[1]):
        p += c
        p *= t
    p += _A[0]
    p *= t                                     # p = -t * poly(t)
    np.multiply(a, a, out=t)
    t *= np.float32(-0.5)
    np.exp(t, out=t)
    p *= t
    p += 1                                     # erf(|x| / sqrt 2)
    p *= a
    h += p


def _layer_norm_(x, w, b, eps, inv_n):
    """x <- LayerNorm(x) over its last axis, in place; inv_n is a [dim, 1] column of 1/dim (the
    mean as a matrix product: a third faster than a reduction over the rows)."""
    x -= x @ inv_n
    var = np.einsum("ij,ij->i", x, x)[:, None]
    var *= np.float32(1 / x.shape[-1])
    var += eps
    np.sqrt(var, out=var)
    np.reciprocal(var, out=var)
    x *= var
    x *= w
    x += b


def _softmax_(s):
    """s <- softmax(s) over its last axis, in place. The largest score of the whole array is
    taken off instead of each row's own (one reduction, not one per row of a short last axis:
    half the time); a row whose scores all lie far below it would lose its sum to underflow,
    and is then done again with its own maximum."""
    s -= s.max()
    np.exp(s, out=s)
    total = s.sum(-1, keepdims=True)
    if total.min() < 1e-30:
        return False
    np.reciprocal(total, out=total)
    s *= total
    return True


class _Workspace(threading.local):
    """Scratch arrays kept from one forward pass to the next, one set per thread (a WSGI
    server may run two forward passes at once). Allocated fresh, a forward's megabytes of
    scratch went back to the kernel at the end of every call and came back as page faults
    (zeroed pages) in the next: 4-5% of a batching worker's CPU."""

    def __init__(self):
        self.flat = {}

    def take(self, name, shape, zero=False):
        """An uninitialised (or zeroed) float32 array of `shape`, reusing the last one's memory
        when it is large enough."""
        size = int(np.prod(shape))
        flat = self.flat.get(name)
        if flat is None or flat.size < size:
            flat = self.flat[name] = np.empty(max(size, 1), np.float32)
        out = flat[:size].reshape(shape)
        if zero:
            out.fill(0)
        return out


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
        self.inv_n = np.full((self.dim, 1), 1 / self.dim, np.float32)
        self.threads = BLAS_THREADS
        self.ws = _Workspace()
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
        self.ln0 = f32(e + "LayerNorm.weight"), f32(e + "LayerNorm.bias"), self.eps, self.inv_n
        self.ffn_dim = cfg["intermediate_size"]
        # Attention's 1/sqrt(head size) goes into the query's weights and bias once, here,
        # instead of a pass over the scores in every call.
        scale = np.float32(1 / np.sqrt(self.dim // self.heads))
        self.layers = []
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            qkv_w, qkv_b = dense(a + "self.query", a + "self.key", a + "self.value")
            qkv_w[:, : self.dim] *= scale
            qkv_b[: self.dim] *= scale
            ffn2_w, ffn2_b = dense(p + "output.dense")
            ffn2_w *= np.float32(0.5)              # _gelu2_ gives twice the GELU
            self.layers.append(dict(
                qkv=(qkv_w, qkv_b),
                out=dense(a + "output.dense"),
                ln1=(f32(a + "output.LayerNorm.weight"), f32(a + "output.LayerNorm.bias"), self.eps,
                     self.inv_n),
                ffn1=dense(p + "intermediate.dense"),
                ffn2=(ffn2_w, ffn2_b),
                ln2=(f32(p + "output.LayerNorm.weight"), f32(p + "output.LayerNorm.bias"), self.eps,
                     self.inv_n),
            ))

    def forward(self, input_ids, attention_mask, token_type_ids):
        B, T = input_ids.shape
        H, D, dim = self.heads, self.dim // self.heads, self.dim
        # The dense layers see only the real tokens, packed as [tokens, dim]: padding a batch
        # to its longest input made them a quarter more work at 32 sentences a call.
        # Attention alone needs the [B, T] layout; it scatters into it and gathers back.
        real = attention_mask != 0
        lengths = real.sum(1)
        n = int(lengths.sum())
        where = np.nonzero(real)
        padded = n < B * T
        x = self.word[input_ids[where]].astype(np.float32, copy=False)
        x += self.pos[where[1]]
        x += self.type[token_type_ids[where]]
        _layer_norm_(x, *self.ln0)
        # Padding gets a large finite negative by selection: never -inf (an all-padded row,
        # or 0 * -inf, would give NaN). exp(-1e4) is exactly 0 in float32.
        bias = np.where(real, np.float32(0), np.float32(-1e4))[:, None, None, :]
        ws = self.ws
        packed = ws.take("packed", (n, 3 * dim))
        # Padded positions must hold finite values (their keys and values are masked by a
        # multiplication by zero), so the grid starts zeroed and only real rows are written.
        grid = ws.take("grid", (B, T, 3 * dim), zero=True) if padded else packed
        hidden = ws.take("hidden", (min(n, _ROWS), self.ffn_dim))
        scratch = ws.take("scratch", (3,) + hidden.shape)
        y = ws.take("y", x.shape)
        for L in self.layers:
            np.matmul(x, L["qkv"][0], out=packed)
            packed += L["qkv"][1]
            if padded:
                grid[where] = packed
            # [3, B, H, T, D]; 1/sqrt(D) is folded into the query weights at load.
            qkv = grid.reshape(B, T, 3, H, D).transpose(2, 0, 3, 1, 4)
            s = qkv[0] @ qkv[1].transpose(0, 1, 3, 2)     # [B, H, T, T]
            s += bias
            if not _softmax_(s):
                s = qkv[0] @ qkv[1].transpose(0, 1, 3, 2)
                s += bias
                s -= s.max(-1, keepdims=True)
                np.exp(s, out=s)
                s /= s.sum(-1, keepdims=True)
            ctx = (s @ qkv[2]).transpose(0, 2, 1, 3)[where].reshape(n, dim)
            np.matmul(ctx, L["out"][0], out=y)
            y += L["out"][1]
            x += y
            _layer_norm_(x, *L["ln1"])
            for r in range(0, n, _ROWS):
                rows = slice(r, min(r + _ROWS, n))
                h = hidden[: rows.stop - r]
                np.matmul(x[rows], L["ffn1"][0], out=h)
                h += L["ffn1"][1]
                _gelu2_(h, *scratch[:, : len(h)])
                np.matmul(h, L["ffn2"][0], out=y[rows])
            y += L["ffn2"][1]
            x += y
            _layer_norm_(x, *L["ln2"])
        # Mean over the real tokens, as sentence-transformers' Pooling (mean_tokens) does.
        # The packed rows are in sentence order, so each sentence's tokens are one run.
        out = np.zeros((B, dim), np.float32)
        some = lengths > 0
        starts = (np.cumsum(lengths) - lengths)[some]
        if starts.size:
            out[some] = np.add.reduceat(x, starts, axis=0)
        out /= np.maximum(lengths.astype(np.float32), np.float32(1e-9))[:, None]
        return out


def load(model_dir, *, max_batch, max_tokens):
    """max_batch is not needed here: numpy takes any shape."""
    return Backend(model_dir, max_tokens)
