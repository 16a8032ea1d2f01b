#!/usr/bin/env python3
"""The int8 anchor's graph: ONNX Runtime's dynamic quantization of export_onnx.py's fp32 graph
of all-MiniLM-L6-v2, and its accuracy against tests/data/minilm_reference.json.

    bench/.venv/bin/python bench/embed/quantize_onnx.py [--f32 PATH] [--out PATH]

onnxruntime.quantization.quantize_dynamic with its defaults (int8 weights, per tensor; uint8
activations quantized at run time, each MatMul then an integer product): what a user who
quantizes an exported graph gets. Made once into bench/out/embed (ignored by git), again when
the fp32 graph or this script is newer. Prints export_onnx.check()'s result (each sentence
alone, then all of them in one padded batch, cosines to sentence-transformers' fp32 vectors)
as JSON on stdout, a line on stderr; the cosines are measured, not checked against a bar: how
far int8 is from fp32 is what the anchor shows.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import export_onnx  # noqa: E402
import minilm  # noqa: E402

DEFAULT_INT8 = minilm.DEFAULT_ONNX.with_name("all-MiniLM-L6-v2.int8.onnx")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--f32", type=Path, default=minilm.DEFAULT_ONNX, help="export_onnx.py's graph")
    ap.add_argument("--out", type=Path, default=DEFAULT_INT8)
    args = ap.parse_args()
    if not args.f32.exists():
        raise SystemExit(f"{args.f32} is missing: run export_onnx.py first")
    me = Path(__file__)
    fresh = args.out.exists() and args.out.stat().st_mtime >= max(args.f32.stat().st_mtime,
                                                                    me.stat().st_mtime)
    if not fresh:
        from onnxruntime.quantization import QuantType, quantize_dynamic
        quantize_dynamic(str(args.f32), str(args.out), weight_type=QuantType.QInt8)
        print(f"wrote {args.out} ({args.out.stat().st_size / 1e6:.1f} MB) from {args.f32}",
              file=sys.stderr)
    res = export_onnx.check(args.out, minilm.model_dir())
    print(json.dumps(res, indent=1, ensure_ascii=False))
    worst = min(r["min_cosine"] for r in res.values() if isinstance(r, dict))
    print(f"int8 against {minilm.REFERENCE.relative_to(minilm.ROOT)}: worst cosine {worst:.7f}",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
