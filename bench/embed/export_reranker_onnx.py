#!/usr/bin/env python3
"""Build an fp32 ONNX graph of the MiniLM stand-in reranker (tests/data/minilm_reranker: MiniLM's
encoder and pooler, a seeded one-logit classifier) from its assembled model.safetensors, without
torch, and check it against tests/data/minilm_reranker_reference.json.

    bench/.venv/bin/python bench/embed/export_reranker_onnx.py --model-dir DIR [--out PATH]

DIR is the folder tests/data/make_minilm_reranker.py assembles (bench/scenarios/embed_rerank.py
assembles it into bench/out/embed/minilm-reranker). The encoder is export_onnx.py's, node for
node (BERT's token types 0/1 through its token_type_embeddings Gather); after it, the heads of
BertForSequenceClassification:
    pooled = tanh(first token's hidden state W_p^T + b_p)       BertPooler
    logits = pooled W_c^T + b_c                                 classifier, [batch, 1]
No sigmoid: the output is the raw logit, what the reference holds (CrossEncoder with Identity).

Inputs: input_ids, attention_mask, token_type_ids int64 [batch, seq]; output: logits float32
[batch, 1]. Default output: bench/out/embed/minilm-reranker.onnx (ignored by git, about 90 MB).

The check, every time: each reference pair alone (batch 1) and all of them in one batch padded
to the longest, tokenized by rerank_tokenizer() (the tokenizer.json, truncation longest first at
512, pad to the longest): ids equal to the reference's, logits within 1e-4 of it.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from onnx import TensorProto, helper

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_onnx as ex  # noqa: E402
import minilm  # noqa: E402

REFERENCE = minilm.ROOT / "tests" / "data" / "minilm_reranker_reference.json"
DEFAULT_ONNX = minilm.DEFAULT_ONNX.parent / "minilm-reranker.onnx"
MAX_LENGTH = 512       # tokenizer_config.json's model_max_length, which CrossEncoder cuts at
TOLERANCE = 1e-4


def rerank_tokenizer(mdir: Path):
    """tokenizer.json as CrossEncoder uses it for pairs: its fixed 128 padding and truncation
    replaced by longest-first truncation at 512 and padding to the longest of the batch."""
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(str(mdir / "tokenizer.json"))
    tok.enable_truncation(max_length=MAX_LENGTH, strategy="longest_first")
    tok.enable_padding(pad_id=0, pad_type_id=0, pad_token="[PAD]")
    return tok


def build(w: dict[str, np.ndarray]):
    g = ex.Graph()
    x = ex.encoder(g, w)
    # The first token ([CLS]) of each row: Gather index 0 on the sequence axis.
    first = g.op("Gather", [x, "zero_i64"], axis=1)                           # [b, H]
    pooled = g.op("Tanh", [ex.linear(g, w, first, "pooler.dense")])
    g.op("Identity", [ex.linear(g, w, pooled, "classifier")], name="logits")   # [b, 1]
    outs = [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 1])]
    return ex.finish(g, "minilm-reranker", outs)


def check(path: Path, mdir: Path) -> dict:
    import onnxruntime as ort
    ref = json.loads(REFERENCE.read_text(encoding="utf-8"))
    assert ref["max_length"] == MAX_LENGTH, ref["max_length"]
    pairs = [tuple(p) for p in ref["pairs"]]
    want = np.array([l[0] for l in ref["logits"]], dtype=np.float32)
    tok = rerank_tokenizer(mdir)
    so = ort.SessionOptions()
    so.intra_op_num_threads = 2
    sess = ort.InferenceSession(str(path), so, providers=["CPUExecutionProvider"])

    def run(batch):
        ids, mask, tt = minilm.encode_batch(tok, batch)
        out = sess.run(["logits"], {"input_ids": ids, "attention_mask": mask, "token_type_ids": tt})
        return out[0][:, 0], [row[m == 1].tolist() for row, m in zip(ids, mask)]

    singles = [run([p]) for p in pairs]
    one = np.array([s[0][0] for s in singles], dtype=np.float32)
    padded, ids_b = run(pairs)
    res = {}
    for tag, got, ids in (("batch 1", one, [s[1][0] for s in singles]),
                          (f"batch {len(pairs)} padded", padded, ids_b)):
        bad = [i for i, (a, b) in enumerate(zip(ids, ref["tokens"])) if a != b]
        if bad:
            raise SystemExit(f"{tag}: ids of pairs {bad} differ from the reference's")
        res[tag] = float(np.abs(got - want).max())
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model-dir", type=Path, required=True, help="the assembled reranker folder")
    ap.add_argument("--out", type=Path, default=DEFAULT_ONNX)
    args = ap.parse_args()
    src = args.model_dir / "model.safetensors"
    mtime = max(src.stat().st_mtime, Path(__file__).stat().st_mtime, Path(ex.__file__).stat().st_mtime)
    if not (args.out.exists() and args.out.stat().st_mtime >= mtime):
        model = build(ex.load_weights(args.model_dir))
        args.out.parent.mkdir(parents=True, exist_ok=True)
        ex.onnx.save_model(model, str(args.out))
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB, {len(model.graph.node)} nodes) "
              f"from {src}", file=sys.stderr)
    res = check(args.out, args.model_dir)
    print(json.dumps(res))
    worst = max(res.values())
    ok = worst <= TOLERANCE
    print(f"check against {REFERENCE.relative_to(minilm.ROOT)}: ids equal, worst logit difference "
          f"{worst:.2e} ({'ok' if ok else 'FAILED'}: needs <= {TOLERANCE:g})", file=sys.stderr)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
