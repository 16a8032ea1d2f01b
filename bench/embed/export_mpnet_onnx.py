#!/usr/bin/env python3
"""Build an fp32 ONNX graph of all-mpnet-base-v2 from its model.safetensors, without torch, and
check it against tests/data/mpnet_reference.json: the ONNX Runtime anchor of the
embed_families scenario, made as export_onnx.py makes MiniLM's.

    bench/.venv/bin/python bench/embed/export_mpnet_onnx.py [--out PATH] [--no-check]

The model folder is target/all-mpnet-base-v2 (bench/embed/mpnet.py says how to assemble it);
default output bench/out/embed/all-mpnet-base-v2.onnx (ignored by git, about 450 MB). Opset
17, standard ops only, export_onnx.py's Graph builder.

Inputs:  input_ids, attention_mask: int64 [batch, seq]   (MPNet has no token types)
Outputs: sentence_embedding  float32 [batch, 768]  mean-pooled, then L2-normalized
         mean_pooled         float32 [batch, 768]  before normalizing

What MPNet does differently from BERT (transformers' modeling_mpnet, which the reference
ran):
- positions: cumsum of (input_ids != 1) over the sequence, times that mask, plus 1: real
  tokens take rows 2..len+1 of the position table, padding row 1;
- a relative position bias: bias[h, i, j] = relative_attention_bias[bucket(j - i), h]
  (T5-style buckets, 32, max distance 128), the same for every layer, added to the scaled
  scores before the padding mask. It depends on i and j alone, so it is built here once
  for 384 x 384 positions (max_seq_length) and sliced to the batch's length in the graph;
- the projections are attention.attn.{q,k,v,o}; LayerNorm eps 1e-5.
The padding mask is export_onnx.py's: -1e4 selected where attention_mask is 0.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import mpnet  # noqa: E402
from export_onnx import (MASK_NEG, OPSET, Graph, f32, finish, layer_constants, layer_norm,  # noqa: E402
                         mean_pooling, post_norm_layer)


def load_weights(mdir: Path) -> dict[str, np.ndarray]:
    from safetensors.numpy import load_file
    w = load_file(str(mdir / "model.safetensors"))
    return {k.removeprefix("mpnet."): v for k, v in w.items()}


def relative_bias(table: np.ndarray) -> np.ndarray:
    """[1, heads, L, L] for L = max_seq_length: table[bucket(j - i), h]."""
    pos = np.arange(mpnet.MAX_SEQ, dtype=np.int64)
    buckets = mpnet.bucket(pos[None, :] - pos[:, None])              # [L, L]
    return np.ascontiguousarray(table[buckets].transpose(2, 0, 1)[None], dtype=np.float32)


def build(w: dict[str, np.ndarray]) -> onnx.ModelProto:
    g = Graph()
    layer_constants(g, mpnet.HIDDEN, mpnet.HEADS)
    g.const("zero_i64", np.array(0, dtype=np.int64))
    g.const("pad_i64", np.array(mpnet.PAD_ID, dtype=np.int64))
    g.const("zero_f", np.array(0.0, dtype=np.float32))
    g.const("mask_neg", np.array(MASK_NEG, dtype=np.float32))
    g.const("axis_1", np.array(1, dtype=np.int64))
    g.const("axes_0", np.array([0], dtype=np.int64))
    g.const("axes_12", np.array([1, 2], dtype=np.int64))
    g.const("axes_23", np.array([2, 3], dtype=np.int64))
    g.const("starts_00", np.array([0, 0], dtype=np.int64))
    g.const("seq_start", np.array([1], dtype=np.int64))
    g.const("seq_end", np.array([2], dtype=np.int64))

    # Embeddings: word + position (counted over the real tokens from padding_idx + 1).
    word = g.op("Gather", [g.const("word_embeddings", f32(w["embeddings.word_embeddings.weight"])),
                           "input_ids"], axis=0)
    real = g.op("Cast", [g.op("Not", [g.op("Equal", ["input_ids", "pad_i64"])])], to=TensorProto.INT64)
    positions = g.op("Add", [g.op("Mul", [g.op("CumSum", [real, "axis_1"]), real]), "pad_i64"])
    pos = g.op("Gather", [g.const("position_embeddings", f32(w["embeddings.position_embeddings.weight"])),
                          positions], axis=0)
    x = layer_norm(g, w, g.op("Add", [word, pos]), "embeddings.LayerNorm", mpnet.LN_EPS)

    # Relative bias [1, h, seq, seq] sliced from the 384 x 384 table, plus the padding mask
    # [batch, 1, 1, seq]: one addend for every layer's scores.
    seq = g.op("Slice", [g.op("Shape", ["input_ids"]), "seq_start", "seq_end", "axes_0"])   # [1]
    seq2 = g.op("Concat", [seq, seq], axis=0)
    rel = g.op("Slice", [g.const("relative_bias", relative_bias(w["encoder.relative_attention_bias.weight"])),
                         "starts_00", seq2, "axes_23"])
    pad = g.op("Equal", ["attention_mask", "zero_i64"])
    mask = g.op("Unsqueeze", [g.op("Where", [pad, "mask_neg", "zero_f"]), "axes_12"])
    bias = g.op("Add", [rel, mask])                                  # [batch, h, seq, seq]

    for i in range(mpnet.LAYERS):
        p = f"encoder.layer.{i}"
        x = post_norm_layer(g, w, x, bias, {
            "q": p + ".attention.attn.q", "k": p + ".attention.attn.k",
            "v": p + ".attention.attn.v", "o": p + ".attention.attn.o",
            "attention_norm": p + ".attention.LayerNorm",
            "intermediate": p + ".intermediate.dense", "output": p + ".output.dense",
            "output_norm": p + ".output.LayerNorm"}, mpnet.LN_EPS)

    mean_pooling(g, x)
    outs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, ["batch", mpnet.HIDDEN])
            for n in ("sentence_embedding", "mean_pooled")]
    # Over 2 GB the model would need external data, and the checker a path: 450 MB here.
    return finish(g, mpnet.NAME, outs, inputs=("input_ids", "attention_mask"))


def check(path: Path, mdir: Path) -> dict:
    """The graph against the sentence-transformers reference: every sentence alone (batch 1),
    then all in one padded batch. Returns the worst cosines."""
    import onnxruntime as ort
    ref = json.loads(mpnet.REFERENCE.read_text())
    sents = ref["sentences"]
    tok = mpnet.tokenizer(mdir)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def cos(a, b):
        return float(np.dot(a, b) / (np.linalg.norm(a) * np.linalg.norm(b)))

    def run(batch):
        ids, mask = mpnet.encode_batch(tok, batch)
        e, m = sess.run(["sentence_embedding", "mean_pooled"], {"input_ids": ids, "attention_mask": mask})
        return e, m, mask.sum(axis=1).tolist()

    want_e = np.array(ref["embeddings"], dtype=np.float32)
    want_u = np.array(ref["unnormalized"], dtype=np.float32)
    singles = [run([s]) for s in sents]
    result = {}
    for tag, (e, u, tk) in (("batch 1", (np.concatenate([r[0] for r in singles]),
                                         np.concatenate([r[1] for r in singles]),
                                         [r[2][0] for r in singles])),
                            (f"batch {len(sents)} padded", run(sents))):
        if tk != ref["tokens"]:
            raise SystemExit(f"{tag}: token counts {tk} differ from the reference {ref['tokens']}")
        ce = [cos(a, b) for a, b in zip(e, want_e)]
        cu = [cos(a, b) for a, b in zip(u, want_u)]
        result[tag] = {"min_cosine": min(ce), "min_cosine_unnormalized": min(cu),
                       "max_abs_diff": float(np.abs(e - want_e).max())}
    return result


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=mpnet.DEFAULT_ONNX)
    ap.add_argument("--no-check", action="store_true", help="skip the comparison with the reference")
    ap.add_argument("--force", action="store_true", help="rebuild even if --out is newer than this script")
    args = ap.parse_args()
    mdir = mpnet.model_dir()
    src = mdir / "model.safetensors"
    newest = max(src.stat().st_mtime, Path(__file__).stat().st_mtime, Path(mpnet.__file__).stat().st_mtime)
    if args.force or not (args.out.exists() and args.out.stat().st_mtime >= newest):
        model = build(load_weights(mdir))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        onnx.save_model(model, str(args.out))
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {len(model.graph.node)} nodes, "
              f"opset {OPSET}) from {src}", file=sys.stderr)
    if args.no_check:
        return 0
    res = check(args.out, mdir)
    print(json.dumps(res, indent=1))
    worst = min(min(r["min_cosine"], r["min_cosine_unnormalized"]) for r in res.values())
    ok = worst >= 0.9999
    print(f"check against {mpnet.REFERENCE.relative_to(mpnet.ROOT)}: worst cosine {worst:.7f} "
          f"({'ok' if ok else 'FAILED'}: needs >= 0.9999)", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
