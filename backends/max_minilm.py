"""all-MiniLM-L6-v2 forward pass on Modular MAX (PyPI `max`, graph API, float32, CPU), over
the model's safetensors: the m0serve pyembed backend that releases the GIL.

    load(model_dir, max_batch=..., max_tokens=...) -> Backend
    Backend.forward(input_ids, attention_mask, token_type_ids) -> float32 [B, 384]

One graph with symbolic batch and sequence dims serves every shape. Its compiled form is
cached in M0_PYEMBED_CACHE (default ~/.cache/m0serve/max): the first load compiles for
minutes, later ones (every worker, every restart) load from the cache in seconds.
"""

import fcntl
import os
import sys
import time
from pathlib import Path

import numpy as np

from minilm_files import read_config, read_safetensors

CACHE_DIR = Path(os.environ.get("M0_PYEMBED_CACHE") or Path.home() / ".cache" / "m0serve" / "max")
# MAX's config key max.cache_dir (where compiled models go; by default
# ~/.cache/modular/.max_cache) comes from MODULAR_MAX_CACHE_DIR, read at each compile
# (checked: it applies even when max was imported first).
os.environ["MODULAR_MAX_CACHE_DIR"] = str(CACHE_DIR)


def _graph(cfg, w):
    """The BERT encoder and mean pooling as a MAX graph; returns (graph, weights registry)."""
    from max.dtype import DType
    from max.graph import DeviceRef, Dim, Graph, TensorType, Weight, ops

    cpu, f32 = DeviceRef.CPU(), DType.float32
    dim, heads = cfg["hidden_size"], cfg["num_attention_heads"]
    hd, eps = dim // heads, float(cfg["layer_norm_eps"])
    registry = {}

    def weight(name, array):
        registry[name] = np.ascontiguousarray(array, dtype=np.float32)
        return Weight(name, f32, registry[name].shape, cpu)

    def dense(x, *names):
        # torch's [out, in] transposed once to [in, out]; q|k|v fused into one matmul.
        wt = weight("+".join(names) + ".weight", np.concatenate([w[n + ".weight"] for n in names]).T)
        b = weight("+".join(names) + ".bias", np.concatenate([w[n + ".bias"] for n in names]))
        return ops.matmul(x, wt) + b

    def norm(x, prefix):
        return ops.layer_norm(x, weight(prefix + ".weight", w[prefix + ".weight"]),
                              weight(prefix + ".bias", w[prefix + ".bias"]), eps)

    def c(v):
        return ops.constant(v, f32, device=cpu)

    ids_t = TensorType(DType.int64, ["batch", "seq"], device=cpu)
    with Graph("minilm_mean", input_types=[ids_t, ids_t, ids_t]) as g:
        ids, mask, tt = (v.tensor for v in g.inputs)
        B, T = ids.shape
        e = "embeddings."
        pos = ops.slice_tensor(weight(e + "position_embeddings.weight", w[e + "position_embeddings.weight"]),
                               [(slice(0, ops.shape_to_tensor([T]).reshape(())), T), slice(None)])
        x = (ops.gather(weight(e + "word_embeddings.weight", w[e + "word_embeddings.weight"]), ids, axis=0)
             + pos
             + ops.gather(weight(e + "token_type_embeddings.weight", w[e + "token_type_embeddings.weight"]), tt, axis=0))
        x = norm(x, e + "LayerNorm")
        # Padding gets a large finite negative by selection, never -inf nor (1 - m) * f32::MIN
        # (0 * -inf is NaN); exp(-1e4) is exactly 0 in float32.
        is_pad = ops.equal(mask, ops.constant(0, DType.int64, device=cpu))
        bias = ops.where(is_pad, c(-1e4), c(0.0)).reshape((B, 1, 1, T))
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."
            a = p + "attention."
            qkv = dense(x, a + "self.query", a + "self.key", a + "self.value")
            qkv = ops.permute(qkv.reshape((B, T, 3, heads, hd)), [2, 0, 3, 1, 4])   # [3, B, H, T, hd]
            q, k, v = qkv[0], qkv[1], qkv[2]
            s = ops.matmul(q * c(1 / hd ** 0.5), ops.permute(k, [0, 1, 3, 2])) + bias
            ctx = ops.permute(ops.matmul(ops.softmax(s, axis=-1), v), [0, 2, 1, 3]).reshape((B, T, dim))
            x = norm(x + dense(ctx, a + "output.dense"), a + "output.LayerNorm")
            h = ops.gelu(dense(x, p + "intermediate.dense"), approximate="none")   # erf GELU
            x = norm(x + dense(h, p + "output.dense"), p + "output.LayerNorm")
        # Mean over the real tokens (sentence-transformers' Pooling, mean_tokens).
        m = ops.cast(mask, f32).reshape((B, T, 1))
        summed = ops.sum(x * m, axis=1)                        # [B, 1, dim]
        count = ops.max(ops.sum(m, axis=1), c(1e-9))           # [B, 1, 1]
        g.output((summed / count).reshape((B, dim)))
    return g, registry


class Backend:
    name = "max"
    releases_gil = True   # execute() runs the whole forward in MAX's runtime without the GIL

    def __init__(self, model_dir, max_tokens):
        try:
            from max.driver import CPU
            from max.engine import InferenceSession
        except ImportError as e:
            raise RuntimeError(f"MAX is not installed ({e}): pip install -r backends/requirements-max.txt") from e
        cfg = read_config(model_dir)
        if cfg.get("model_type") != "bert" or cfg.get("hidden_act") != "gelu":
            raise ValueError(f"{model_dir}: not a BERT model with exact gelu")
        if max_tokens > cfg["max_position_embeddings"]:
            raise ValueError(f"max_tokens {max_tokens} > max_position_embeddings {cfg['max_position_embeddings']}")
        self.dim = cfg["hidden_size"]
        # MAX uses every CPU this process may run on (it follows the affinity mask; its own
        # num_threads= crashed the process in 26.7.0, so it is not passed).
        self.threads = len(os.sched_getaffinity(0))
        w = {k.removeprefix("bert."): v for k, v in read_safetensors(model_dir).items()}
        graph, self._weights = _graph(cfg, w)   # kept: MAX may read the arrays in place
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        # One compile at a time: workers starting together on a cold cache would each compile
        # for minutes on the same cores; behind the lock, the first compiles and the others
        # then load its result from the cache (cached loads are serialized too: seconds).
        with open(CACHE_DIR / "m0serve-compile.lock", "w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            before = sum(1 for _ in CACHE_DIR.rglob("*"))
            print(f"max_minilm: compiling the MiniLM graph (cache dir {CACHE_DIR}; the first "
                  f"compile takes minutes, a cached one seconds)", file=sys.stderr, flush=True)
            t0 = time.perf_counter()
            self._model = InferenceSession(devices=[CPU()]).load(graph, weights_registry=self._weights)
            added = sum(1 for _ in CACHE_DIR.rglob("*")) - before
        print(f"max_minilm: compiled in {time.perf_counter() - t0:.1f} s "
              f"({'new cache entries: ' + str(added) if added else 'from the cache'})",
              file=sys.stderr, flush=True)

    def forward(self, input_ids, attention_mask, token_type_ids):
        out = self._model.execute(*(np.ascontiguousarray(a, dtype=np.int64)
                                    for a in (input_ids, attention_mask, token_type_ids)))
        return np.ascontiguousarray(out[0].to_numpy(), dtype=np.float32)


def load(model_dir, *, max_batch, max_tokens):
    """max_batch is not needed: the batch dim is symbolic."""
    return Backend(model_dir, max_tokens)
