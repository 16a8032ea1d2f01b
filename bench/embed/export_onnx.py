#!/usr/bin/env python3
"""Build an fp32 ONNX graph of all-MiniLM-L6-v2 from the package's model.safetensors, without
torch, and check it against tests/data/minilm_reference.json.

    bench/.venv/bin/python bench/embed/export_onnx.py [--out PATH] [--no-check]

The graph is written node by node with onnx.helper; the weights are the safetensors tensors
(read as numpy arrays) stored as initializers. No PyPI package ships an fp32 ONNX of this
model, hence this file. Default output: bench/out/embed/all-MiniLM-L6-v2.onnx (ignored by git,
about 90 MB). Opset 17 (LayerNormalization), standard ONNX ops only.

Inputs:  input_ids, attention_mask, token_type_ids: int64 [batch, seq]
Outputs: sentence_embedding  float32 [batch, 384]  mean-pooled, then L2-normalized: what
                             sentence-transformers' encode() returns for this model
         mean_pooled         float32 [batch, 384]  the same before normalizing (TEI's
                             normalize=false); ask ORT for the output you need
Pooling and normalization are inside the graph, so one session.run turns token ids into the
final vectors.

The graph, per BERT layer (H = 384, 12 heads of 32):
    q, k, v = x W^T + b (weights stored transposed, [in, out], so MatMul needs no Transpose)
    scores  = q k^T / sqrt(32) + bias,  bias = Where(attention_mask == 0, -1e4, 0)
    x       = LayerNorm(x + Softmax(scores) v W_o^T + b_o)
    x       = LayerNorm(x + GELU(x W_i^T + b_i) W_2^T + b_2)      GELU with erf, as in BERT
The attention bias is a large finite negative chosen by selection: never -inf and never
(1 - mask) * f32::MIN, which turn into NaN (0 * -inf) as soon as anything rounds them (f16,
bf16, or a fused kernel that adds before it masks). exp(-1e4) is 0 in f32, so padded keys get
exactly no weight, and a padded batch gives the same vectors as one sentence at a time.
Mean pooling divides by max(real tokens, 1e-9), and the normalization by max(|v|, 1e-12), as
sentence-transformers does.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import minilm  # noqa: E402

OPSET = 17
MASK_NEG = -1.0e4
LN_EPS = 1e-12         # config.json layer_norm_eps


def load_weights(mdir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    w = load_file(str(mdir / "model.safetensors"))
    # Some exports prefix every name with "bert."; this one does not.
    return {k.removeprefix("bert."): v for k, v in w.items()}


class Graph:
    """A little builder: every node gets a unique output name."""

    def __init__(self):
        self.nodes, self.inits, self.n = [], [], 0

    def const(self, name: str, value) -> str:
        arr = np.asarray(value)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, **attrs) -> str:
        self.n += 1
        out = name or f"{op_type.lower()}_{self.n}"
        self.nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{self.n}_{op_type}", **attrs))
        return out


def f32(a) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32)


def linear(g: Graph, w: dict[str, np.ndarray], x: str, prefix: str) -> str:
    wt = g.const(prefix + ".weight_t", f32(w[prefix + ".weight"].T))   # [in, out]
    b = g.const(prefix + ".bias", f32(w[prefix + ".bias"]))
    return g.op("Add", [g.op("MatMul", [x, wt]), b])


def layer_norm(g: Graph, w: dict[str, np.ndarray], x: str, prefix: str, eps: float) -> str:
    s = g.const(prefix + ".weight", f32(w[prefix + ".weight"]))
    b = g.const(prefix + ".bias", f32(w[prefix + ".bias"]))
    return g.op("LayerNormalization", [x, s, b], axis=-1, epsilon=eps)


def layer_constants(g: Graph, hidden: int, heads: int) -> None:
    """The constants post_norm_layer() reads, once per graph."""
    hd = hidden // heads
    g.const("scale", np.array(1.0 / math.sqrt(hd), dtype=np.float32))
    g.const("sqrt1_2", np.array(1.0 / math.sqrt(2.0), dtype=np.float32))
    g.const("one_f", np.array(1.0, dtype=np.float32))
    g.const("half_f", np.array(0.5, dtype=np.float32))
    g.const("shape_heads", np.array([0, 0, heads, hd], dtype=np.int64))   # 0: keep that dim
    g.const("shape_hidden", np.array([0, 0, hidden], dtype=np.int64))


def post_norm_layer(g: Graph, w: dict[str, np.ndarray], x: str, bias: str, names: dict[str, str],
                    eps: float) -> str:
    """One post-norm encoder layer, BERT's and MPNet's:
        x = LayerNorm(x + Softmax(q k^T / sqrt(d) + bias) v W_o^T + b_o)
        x = LayerNorm(x + GELU(x W_i^T + b_i) W_2^T + b_2)      GELU with erf
    `bias` is added to every head's scores (the padding mask; MPNet's relative bias too);
    `names` maps q, k, v, o, attention_norm, intermediate, output and output_norm to the
    weights' prefixes."""
    def heads(name: str, perm: list[int]) -> str:
        return g.op("Transpose", [g.op("Reshape", [linear(g, w, x, names[name]), "shape_heads"])],
                    perm=perm)
    q = heads("q", [0, 2, 1, 3])                                          # [b, h, s, d]
    k = heads("k", [0, 2, 3, 1])                                          # [b, h, d, s]
    v = heads("v", [0, 2, 1, 3])                                          # [b, h, s, d]
    scores = g.op("Add", [g.op("Mul", [g.op("MatMul", [q, k]), "scale"]), bias])
    probs = g.op("Softmax", [scores], axis=-1)
    ctx = g.op("Reshape", [g.op("Transpose", [g.op("MatMul", [probs, v])], perm=[0, 2, 1, 3]),
                           "shape_hidden"])                               # [b, s, H]
    x = layer_norm(g, w, g.op("Add", [linear(g, w, ctx, names["o"]), x]), names["attention_norm"], eps)
    h = linear(g, w, x, names["intermediate"])
    gelu = g.op("Mul", [g.op("Mul", [h, "half_f"]),
                        g.op("Add", [g.op("Erf", [g.op("Mul", [h, "sqrt1_2"])]), "one_f"])])
    return layer_norm(g, w, g.op("Add", [linear(g, w, gelu, names["output"]), x]), names["output_norm"], eps)


def encoder(g: Graph, w: dict[str, np.ndarray]) -> str:
    """The BERT encoder from input_ids, attention_mask and token_type_ids: the name of its last
    hidden state [batch, seq, H]. The heads (mean pooling here, a cross-encoder's pooler and
    classifier in export_reranker_onnx.py) are added after it."""
    # Shared constants.
    layer_constants(g, minilm.HIDDEN, minilm.HEADS)
    g.const("zero_i64", np.array(0, dtype=np.int64))
    g.const("zero_f", np.array(0.0, dtype=np.float32))
    g.const("mask_neg", np.array(MASK_NEG, dtype=np.float32))
    g.const("axes_0", np.array([0], dtype=np.int64))
    g.const("axes_12", np.array([1, 2], dtype=np.int64))
    g.const("starts_0", np.array([0], dtype=np.int64))
    g.const("seq_start", np.array([1], dtype=np.int64))
    g.const("seq_end", np.array([2], dtype=np.int64))

    # Embeddings: word + position (0..seq-1) + token type, then LayerNorm.
    word = g.op("Gather", [g.const("word_embeddings", f32(w["embeddings.word_embeddings.weight"])),
                           "input_ids"], axis=0)
    seq = g.op("Slice", [g.op("Shape", ["input_ids"]), "seq_start", "seq_end", "axes_0"])   # [1]
    pos = g.op("Slice", [g.const("position_embeddings", f32(w["embeddings.position_embeddings.weight"])),
                         "starts_0", seq, "axes_0"])                                       # [seq, H]
    tt = g.op("Gather", [g.const("token_type_embeddings", f32(w["embeddings.token_type_embeddings.weight"])),
                         "token_type_ids"], axis=0)
    x = layer_norm(g, w, g.op("Add", [g.op("Add", [word, pos]), tt]), "embeddings.LayerNorm", LN_EPS)

    # Attention bias [batch, 1, 1, seq]: selected, not computed from the mask.
    pad = g.op("Equal", ["attention_mask", "zero_i64"])
    bias = g.op("Unsqueeze", [g.op("Where", [pad, "mask_neg", "zero_f"]), "axes_12"])

    for i in range(minilm.LAYERS):
        p = f"encoder.layer.{i}"
        x = post_norm_layer(g, w, x, bias, {
            "q": p + ".attention.self.query", "k": p + ".attention.self.key",
            "v": p + ".attention.self.value", "o": p + ".attention.output.dense",
            "attention_norm": p + ".attention.output.LayerNorm",
            "intermediate": p + ".intermediate.dense", "output": p + ".output.dense",
            "output_norm": p + ".output.LayerNorm"}, LN_EPS)
    return x


def finish(g: Graph, name: str, outs: list,
           inputs: tuple[str, ...] = ("input_ids", "attention_mask", "token_type_ids")) -> onnx.ModelProto:
    """The model of g's nodes, with `inputs` as its int64 [batch, seq] inputs (the BERT
    encoder's three by default), checked."""
    ints = [helper.make_tensor_value_info(n, TensorProto.INT64, ["batch", "seq"]) for n in inputs]
    graph = helper.make_graph(g.nodes, name, ints, outs, g.inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="m0serve " + Path(sys.argv[0]).name)
    model.ir_version = 8          # opset 17's IR: loads in any ONNX Runtime from 1.12 on
    onnx.checker.check_model(model, full_check=True)
    return model


def mean_pooling(g: Graph, x: str) -> None:
    """The outputs mean_pooled (the mean of x over the real tokens) and sentence_embedding
    (that, L2-normalized), as sentence-transformers computes them."""
    g.const("axes_1", np.array([1], dtype=np.int64))
    g.const("axes_m1", np.array([-1], dtype=np.int64))
    g.const("pool_eps", np.array(1e-9, dtype=np.float32))
    g.const("norm_eps", np.array(1e-12, dtype=np.float32))
    maskf = g.op("Unsqueeze", [g.op("Cast", ["attention_mask"], to=TensorProto.FLOAT), "axes_m1"])
    summed = g.op("ReduceSum", [g.op("Mul", [x, maskf]), "axes_1"], keepdims=0)        # [b, H]
    count = g.op("Max", [g.op("ReduceSum", [maskf, "axes_1"], keepdims=0), "pool_eps"])  # [b, 1]
    mean = g.op("Div", [summed, count], name="mean_pooled")
    norm = g.op("Max", [g.op("Sqrt", [g.op("ReduceSum", [g.op("Mul", [mean, mean]), "axes_m1"],
                                           keepdims=1)]), "norm_eps"])
    g.op("Div", [mean, norm], name="sentence_embedding")


def build(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    H = minilm.HIDDEN
    g = Graph()
    x = encoder(g, w)
    mean_pooling(g, x)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", H])
            for n in ("sentence_embedding", "mean_pooled")]
    return finish(g, "all-MiniLM-L6-v2", outs)


def check(path: Path, mdir: Path) -> dict:
    """Compare the ONNX graph with the sentence-transformers reference: every sentence alone
    (batch 1), then all of them in one padded batch. Returns the worst cosines."""
    import onnxruntime as ort
    ref = json.loads(minilm.REFERENCE.read_text())
    sents = ref["sentences"]
    tok = minilm.tokenizer(mdir)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    def run(batch):
        ids, mask, tt = minilm.encode_batch(tok, batch)
        e, m = sess.run(["sentence_embedding", "mean_pooled"],
                        {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})
        return e, m, mask.sum(axis=1).tolist()

    want_e = np.array(ref["embeddings"], dtype=np.float32)
    want_u = np.array(ref["unnormalized"], dtype=np.float32)
    result = {}
    singles = [run([s]) for s in sents]
    e1 = np.concatenate([r[0] for r in singles])
    u1 = np.concatenate([r[1] for r in singles])
    tokens = [r[2][0] for r in singles]
    eb, ub, tokens_b = run(sents)
    for tag, e, u, tk in (("batch 1", e1, u1, tokens), (f"batch {len(sents)} padded", eb, ub, tokens_b)):
        if tk != ref["tokens"]:
            raise SystemExit(f"{tag}: token counts {tk} differ from the reference {ref['tokens']}")
        if not (np.isfinite(e).all() and np.isfinite(u).all()):
            raise SystemExit(f"{tag}: non-finite outputs")
        ce = [cos(a, b) for a, b in zip(e, want_e)]
        cu = [cos(a, b) for a, b in zip(u, want_u)]
        result[tag] = {
            "min_cosine": min(ce), "worst": sents[int(np.argmin(ce))][:40],
            "min_cosine_unnormalized": min(cu),
            "max_abs_diff": float(np.abs(e - want_e).max()),
            "max_rel_norm_diff_unnormalized": float(np.max(np.abs(
                np.linalg.norm(u, axis=1) / np.linalg.norm(want_u, axis=1) - 1))),
        }
    result["batch 1 vs padded batch, max abs diff"] = float(np.abs(e1 - eb).max())
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=minilm.DEFAULT_ONNX)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the reference")
    ap.add_argument("--force", action="store_true", help="rebuild even if --out is newer than this script")
    args = ap.parse_args()
    mdir = minilm.model_dir()
    src = mdir / "model.safetensors"
    me = Path(__file__)
    fresh = (args.out.exists() and args.out.stat().st_mtime >= max(src.stat().st_mtime, me.stat().st_mtime))
    if args.force or not fresh:
        model = build(load_weights(mdir))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(model, str(args.out))
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {len(model.graph.node)} nodes, "
              f"opset {OPSET}) from {src}", file=sys.stderr)
    if args.no_check:
        return 0
    res = check(args.out, mdir)
    print(json.dumps(res, indent=1, ensure_ascii=False))
    worst = min(min(r["min_cosine"], r["min_cosine_unnormalized"]) for r in res.values() if isinstance(r, dict))
    ok = worst >= 0.9999
    print(f"check against {minilm.REFERENCE.relative_to(minilm.ROOT)}: worst cosine {worst:.7f} "
          f"({'ok' if ok else 'FAILED'}: needs >= 0.9999)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
