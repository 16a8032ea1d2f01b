"""A tiny random BERT sentence-transformers folder, and a numpy forward pass.

    python tiny_bert.py make OUT_DIR [--pooling mean|cls] [--normalize]
                        [--prefix bert.] [--f16] [--seed N]
        writes OUT_DIR as sentence-transformers would (config.json,
        model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json,
        sentence_bert_config.json) for a 2-layer, hidden-32 BERT with its own
        WordPiece vocabulary, plus OUT_DIR/reference.json: sentences made of
        that vocabulary, their token ids and their embeddings from the numpy
        forward pass below.

    python tiny_bert.py forward MODEL_DIR IDS_JSON OUT_JSON
        embeds the token id lists in IDS_JSON (a JSON list of lists) with the
        folder's own weights, pooling and normalisation; writes
        {"embeddings": [[...]]} to OUT_JSON.

numpy only; the safetensors file is written and read by hand (8-byte
little-endian header length, JSON header, raw little-endian data). The
forward pass runs in float64, so it is a reference for an f32 one.
"""

import argparse
import json
import math
import os
import struct
import sys

import numpy as np

SPECIAL = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = (
    "the a cat dog sat on mat ran fast slow red blue green big small house tree "
    "river stone bird sings sky under over and or not very quite old new"
).split()
PUNCT = [".", ",", "!", "?"]
MAX_POSITION = 80
MAX_SEQ_LENGTH = 64


def vocab():
    return SPECIAL + WORDS + PUNCT


def sentences():
    rng = np.random.default_rng(7)
    out = [
        "the cat sat on the mat .",
        "The Dog RAN fast !",
        "",
        "bird",
        "a very old stone house under the blue sky , and a small tree .",
    ]
    for n in (3, 9, 17, 30):
        out.append(" ".join(rng.choice(WORDS, size=n)))
    # Past max_seq_length: truncated, and long enough for the long-sequence
    # attention path.
    out.append(" ".join(rng.choice(WORDS + PUNCT, size=75)))
    return out


def tokenize(sentence, ids_of, max_len):
    """What WordPiece gives for text made of whole vocabulary words and
    punctuation separated by spaces (lower-cased by the normalizer)."""
    body = [ids_of[w] for w in sentence.lower().split()]
    body = body[: max_len - 2]
    return [ids_of["[CLS]"]] + body + [ids_of["[SEP]"]]


def write_safetensors(path, tensors, f16):
    header = {"__metadata__": {"format": "pt"}}
    blobs = []
    off = 0
    for name, arr in tensors.items():
        dt = np.dtype("<f2") if f16 else np.dtype("<f4")
        raw = np.ascontiguousarray(arr, dtype=dt).tobytes()
        header[name] = {
            "dtype": "F16" if f16 else "F32",
            "shape": list(arr.shape),
            "data_offsets": [off, off + len(raw)],
        }
        blobs.append(raw)
        off += len(raw)
    # An I64 tensor as transformers saves (position_ids), never read.
    pos = np.arange(MAX_POSITION, dtype="<i8").reshape(1, -1).tobytes()
    header["embeddings.position_ids"] = {
        "dtype": "I64",
        "shape": [1, MAX_POSITION],
        "data_offsets": [off, off + len(pos)],
    }
    blobs.append(pos)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(h)))
        f.write(h)
        for b in blobs:
            f.write(b)


def tokenizer_json(v):
    special = [
        {
            "id": i,
            "content": t,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": True,
        }
        for i, t in enumerate(SPECIAL)
    ]
    ids = {t: i for i, t in enumerate(v)}

    def tok(t, type_id):
        return {"SpecialToken": {"id": t, "type_id": type_id}}

    return {
        "version": "1.0",
        # As all-MiniLM-L6-v2 ships it: fixed padding and a truncation the
        # model must override.
        "truncation": {
            "direction": "Right",
            "max_length": 16,
            "strategy": "LongestFirst",
            "stride": 0,
        },
        "padding": {
            "strategy": {"Fixed": 16},
            "direction": "Right",
            "pad_to_multiple_of": None,
            "pad_id": 0,
            "pad_type_id": 0,
            "pad_token": "[PAD]",
        },
        "added_tokens": special,
        "normalizer": {
            "type": "BertNormalizer",
            "clean_text": True,
            "handle_chinese_chars": True,
            "strip_accents": None,
            "lowercase": True,
        },
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [
                tok("[CLS]", 0),
                {"Sequence": {"id": "A", "type_id": 0}},
                tok("[SEP]", 0),
            ],
            "pair": [
                tok("[CLS]", 0),
                {"Sequence": {"id": "A", "type_id": 0}},
                tok("[SEP]", 0),
                {"Sequence": {"id": "B", "type_id": 1}},
                tok("[SEP]", 1),
            ],
            "special_tokens": {
                t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")
            },
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {
            "type": "WordPiece",
            "unk_token": "[UNK]",
            "continuing_subword_prefix": "##",
            "max_input_chars_per_word": 100,
            "vocab": ids,
        },
    }


def make(args):
    out = args.out
    os.makedirs(os.path.join(out, "1_Pooling"), exist_ok=True)
    rng = np.random.default_rng(args.seed)
    v = vocab()
    hidden, layers, heads, inter = 32, 2, 4, 64
    config = {
        "_name_or_path": "tiny-random-bert",
        "architectures": ["BertModel"],
        "hidden_act": "gelu",
        "hidden_size": hidden,
        "intermediate_size": inter,
        "layer_norm_eps": 1e-12,
        "max_position_embeddings": MAX_POSITION,
        "model_type": "bert",
        "num_attention_heads": heads,
        "num_hidden_layers": layers,
        "pad_token_id": 0,
        "position_embedding_type": "absolute",
        "type_vocab_size": 2,
        "vocab_size": len(v) + 3,
    }

    def rand(*shape, s=0.3):
        return rng.normal(0.0, s, size=shape)

    t = {}
    t["embeddings.word_embeddings.weight"] = rand(config["vocab_size"], hidden, s=1.0)
    t["embeddings.position_embeddings.weight"] = rand(MAX_POSITION, hidden, s=0.5)
    t["embeddings.token_type_embeddings.weight"] = rand(2, hidden, s=0.5)
    t["embeddings.LayerNorm.weight"] = 1.0 + rand(hidden, s=0.1)
    t["embeddings.LayerNorm.bias"] = rand(hidden, s=0.1)
    for i in range(layers):
        p = f"encoder.layer.{i}."
        for name in ("query", "key", "value"):
            t[p + f"attention.self.{name}.weight"] = rand(hidden, hidden)
            t[p + f"attention.self.{name}.bias"] = rand(hidden, s=0.1)
        t[p + "attention.output.dense.weight"] = rand(hidden, hidden)
        t[p + "attention.output.dense.bias"] = rand(hidden, s=0.1)
        t[p + "attention.output.LayerNorm.weight"] = 1.0 + rand(hidden, s=0.1)
        t[p + "attention.output.LayerNorm.bias"] = rand(hidden, s=0.1)
        t[p + "intermediate.dense.weight"] = rand(inter, hidden)
        t[p + "intermediate.dense.bias"] = rand(inter, s=0.1)
        t[p + "output.dense.weight"] = rand(hidden, inter, s=0.2)
        t[p + "output.dense.bias"] = rand(hidden, s=0.1)
        t[p + "output.LayerNorm.weight"] = 1.0 + rand(hidden, s=0.1)
        t[p + "output.LayerNorm.bias"] = rand(hidden, s=0.1)
    t["pooler.dense.weight"] = rand(hidden, hidden)
    t["pooler.dense.bias"] = rand(hidden)
    t = {args.prefix + k: w for k, w in t.items()}
    write_safetensors(os.path.join(out, "model.safetensors"), t, args.f16)

    with open(os.path.join(out, "config.json"), "w") as f:
        json.dump(config, f, indent=2)
    with open(os.path.join(out, "tokenizer.json"), "w") as f:
        json.dump(tokenizer_json(v), f)
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if args.normalize:
        modules.append(
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"}
        )
    with open(os.path.join(out, "modules.json"), "w") as f:
        json.dump(modules, f, indent=2)
    with open(os.path.join(out, "1_Pooling", "config.json"), "w") as f:
        json.dump(
            {
                "word_embedding_dimension": hidden,
                "pooling_mode_cls_token": args.pooling == "cls",
                "pooling_mode_mean_tokens": args.pooling == "mean",
                "pooling_mode_max_tokens": False,
                "pooling_mode_mean_sqrt_len_tokens": False,
            },
            f,
            indent=2,
        )
    with open(os.path.join(out, "sentence_bert_config.json"), "w") as f:
        json.dump({"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False}, f)

    ids_of = {w: i for i, w in enumerate(v)}
    sents = sentences()
    ids = [tokenize(s, ids_of, MAX_SEQ_LENGTH) for s in sents]
    emb = forward(out, ids)
    with open(os.path.join(out, "reference.json"), "w") as f:
        json.dump(
            {
                "model": "tiny-random-bert",
                "sentences": sents,
                "ids": ids,
                "tokens": [len(i) for i in ids],
                "embeddings": emb.tolist(),
            },
            f,
        )


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    base = 8 + n
    out = {}
    for name, e in header.items():
        if name == "__metadata__":
            continue
        s, t = e["data_offsets"]
        raw = data[base + s : base + t]
        if e["dtype"] == "F32":
            a = np.frombuffer(raw, dtype="<f4")
        elif e["dtype"] == "F16":
            a = np.frombuffer(raw, dtype="<f2")
        elif e["dtype"] == "BF16":
            a = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16).view(np.float32)
        else:
            continue
        out[name] = a.astype(np.float64).reshape(e["shape"])
    return out


_erf = np.frompyfunc(math.erf, 1, 1)


def gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)).astype(np.float64))


def layer_norm(x, g, b, eps):
    mu = x.mean(-1, keepdims=True)
    var = ((x - mu) ** 2).mean(-1, keepdims=True)
    return (x - mu) / np.sqrt(var + eps) * g + b


def forward(folder, ids_list):
    with open(os.path.join(folder, "config.json")) as f:
        cfg = json.load(f)
    with open(os.path.join(folder, "modules.json")) as f:
        modules = json.load(f)
    pool_dir = next(m["path"] for m in modules if m["type"].endswith("Pooling"))
    normalize = any(m["type"].endswith("Normalize") for m in modules)
    with open(os.path.join(folder, pool_dir, "config.json")) as f:
        pcfg = json.load(f)
    w = read_safetensors(os.path.join(folder, "model.safetensors"))
    if "bert.embeddings.word_embeddings.weight" in w:
        w = {k[len("bert.") :]: a for k, a in w.items() if k.startswith("bert.")}
    h = cfg["hidden_size"]
    heads = cfg["num_attention_heads"]
    dh = h // heads
    eps = cfg.get("layer_norm_eps", 1e-12)
    out = []
    for ids in ids_list:
        ids = np.asarray(ids, dtype=np.int64)
        n = len(ids)
        x = (
            w["embeddings.word_embeddings.weight"][ids]
            + w["embeddings.position_embeddings.weight"][:n]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        x = layer_norm(x, w["embeddings.LayerNorm.weight"], w["embeddings.LayerNorm.bias"], eps)
        for i in range(cfg["num_hidden_layers"]):
            p = f"encoder.layer.{i}."

            def dense(name, inp):
                return inp @ w[p + name + ".weight"].T + w[p + name + ".bias"]

            q = dense("attention.self.query", x).reshape(n, heads, dh).transpose(1, 0, 2)
            k = dense("attention.self.key", x).reshape(n, heads, dh).transpose(1, 0, 2)
            v = dense("attention.self.value", x).reshape(n, heads, dh).transpose(1, 0, 2)
            s = q @ k.transpose(0, 2, 1) / math.sqrt(dh)
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(1, 0, 2).reshape(n, h)
            a = dense("attention.output.dense", ctx)
            x = layer_norm(
                x + a,
                w[p + "attention.output.LayerNorm.weight"],
                w[p + "attention.output.LayerNorm.bias"],
                eps,
            )
            f = gelu(dense("intermediate.dense", x))
            f = dense("output.dense", f)
            x = layer_norm(
                x + f, w[p + "output.LayerNorm.weight"], w[p + "output.LayerNorm.bias"], eps
            )
        if pcfg.get("pooling_mode_cls_token"):
            e = x[0]
        elif pcfg.get("pooling_mode_mean_tokens"):
            e = x.mean(0)
        else:
            sys.exit("tiny_bert.py: only mean and cls pooling are implemented")
        if normalize:
            e = e / max(np.linalg.norm(e), 1e-12)
        out.append(e)
    return np.stack(out)


def main():
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("out")
    m.add_argument("--pooling", choices=["mean", "cls"], default="mean")
    m.add_argument("--normalize", action="store_true")
    m.add_argument("--prefix", default="")
    m.add_argument("--f16", action="store_true")
    m.add_argument("--seed", type=int, default=0)
    fw = sub.add_parser("forward")
    fw.add_argument("model_dir")
    fw.add_argument("ids_json")
    fw.add_argument("out_json")
    args = ap.parse_args()
    if args.cmd == "make":
        make(args)
    else:
        with open(args.ids_json) as f:
            ids = json.load(f)
        emb = forward(args.model_dir, ids)
        with open(args.out_json, "w") as f:
            json.dump({"embeddings": emb.tolist()}, f)


if __name__ == "__main__":
    main()
