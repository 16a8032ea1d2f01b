#!/usr/bin/env python3
"""Make the tiny task fixtures of issue #52: cross-encoders (rerankers and classifiers, the
`*ForSequenceClassification` of each family) and a SPLADE model (BertForMaskedLM as a
sentence-transformers SparseEncoder), one folder each under tests/data/tasks/<name>/, with
reference.json: what sentence-transformers' CrossEncoder / SparseEncoder return for it, float32.

The Rust tests never run this: the folders are checked in and they need no torch. Run it once,
in the throwaway venv of tests/data/families (same pins):

    python3.11 -m venv target/families-venv
    target/families-venv/bin/pip install -r tests/data/families/requirements.txt
    target/families-venv/bin/python tests/data/tasks/make_tasks.py          # make all
    target/families-venv/bin/python tests/data/tasks/make_tasks.py verify   # check them

`make [NAME...]` (the default) rewrites the folders, then runs `verify` in a fresh process:
it loads each folder back as a user would (CrossEncoder(path) / SparseEncoder(path)) and
checks the scores, and that the raw tokenizer.json (what the Rust side reads) gives the
reference's ids.

Every tokenizer is a checked-in tiny one of tests/data/families/<family>/ (BERT's is the
distilbert folder's WordPiece vocabulary handed to BertTokenizer, which types a pair's second
text 1); every weight is redrawn from a fixed seed, as make_families.py does, heads included.

The cross-encoders are saved as transformers' save_pretrained writes them (config.json,
model.safetensors, tokenizer files, no modules.json): the layout of the Hub's rerankers
(cross-encoder/ms-marco-*, BAAI/bge-reranker-*). The SPLADE folder has the module files of
sentence-transformers 5 (modules.json: MLMTransformer, SpladePooling; 1_SpladePooling/config.json;
sentence_bert_config.json), as naver/splade-* and opensearch's models have them on the Hub.
max_seq_length is 40 everywhere: tokenizer_config.json's model_max_length for the
cross-encoders (what CrossEncoder reads), sentence_bert_config.json's for SPLADE.

reference.json, cross-encoders:
    model, generated_by, model_type, architecture, task ("reranker" | "classifier"),
    labels (id2label in id order), max_length, classifier_pooling (modernbert),
    pairs [[query, text]], tokens [ids per pair, after longest-first truncation],
    second [index of the first token of type 1 per pair; len(ids) when the tokenizer types
    every token 0], logits [[one float per label] per pair] (CrossEncoder.predict with
    activation_fn Identity, batch_size 1),
    singles [text], single_tokens [ids], single_logits [[...]] (one text, as TEI's /predict
    takes a string: the tokenizer's single-text encoding through the same model).
reference.json, splade:
    model, generated_by, model_type, max_length, pooling_strategy, activation_function, vocab,
    sentences, tokens [ids per sentence], vectors [[[index, value], ...] per sentence, nonzero
    only, ascending index] (SparseEncoder.encode, batch_size 1).
Floats are the shortest decimals of the float32s.
"""

import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

HERE = Path(__file__).resolve().parent
FAMILIES = HERE.parent / "families"
MAX_LENGTH = 40
HIDDEN = 32
INTERMEDIATE = 64
LIBS = ["sentence-transformers", "transformers", "torch", "tokenizers", "safetensors", "numpy"]

PARAGRAPH = (
    "The lighthouse keeper climbed the spiral staircase every evening, lit the great lamp, "
    "and wrote in a worn logbook the weather, the ships that passed, and anything unusual "
    "he noticed on the dark water below the rocks."
)

# (query, text): short and long, both orders of longest-first truncation, odd text.
PAIRS = [
    ["How do I reset my password?", "Click the link in the email and choose a new one."],
    ["How do I reset my password?", "The quick brown fox jumps over the lazy dog."],
    ["lighthouse", PARAGRAPH],                                   # the text is cut
    [PARAGRAPH, "Who lit the lamp?"],                            # the query is cut
    [PARAGRAPH, " ".join([PARAGRAPH] * 2)],                      # both are cut
    ["Où est la gare?", "Le gardien du phare allumait la grande lampe chaque soir."],
    ["Москва", "Москва — столица России, и зимой там очень холодно."],
    ["我喜欢读书", "東京は日本の首都です。"],
    ["I love pizza 🍕", "Ελληνικά και עברית are not in the corpus."],
    ["", "Hello"],
    ["a", ""],
    ["Grüße aus München", "Straße, Übung und Äpfel."],
]

SINGLES = [
    "Hello",
    "",
    "WARNING: DO NOT TOUCH THE HOT SURFACE.",
    "Café crème brûlée à la française, s'il vous plaît.",
    PARAGRAPH,
    "I love pizza 🍕🔥 and coffee ☕!",
]

SENTENCES = [
    "",
    "Hello",
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "Order #12345 shipped on 2024-03-15 for $19.99 (qty: 3).",
    "Grüße aus München: Straße, Übung und Äpfel.",
    "Москва — столица России, и зимой там очень холодно.",
    "I love pizza 🍕🔥 and coffee ☕!",
    PARAGRAPH,                                                   # past MAX_LENGTH: cut
]

# name -> (architecture, tokenizer family, labels, seed, extra config)
TASKS = {
    "bert_reranker": ("BertForSequenceClassification", "bert", ["LABEL_0"], 52001, {}),
    "bert_classifier": ("BertForSequenceClassification", "bert",
                        ["negative", "neutral", "positive"], 52002, {}),
    "xlm_roberta_reranker": ("XLMRobertaForSequenceClassification", "xlm_roberta", ["LABEL_0"],
                             52003, {}),
    "distilbert_classifier": ("DistilBertForSequenceClassification", "distilbert",
                              ["not_entailment", "entailment"], 52004, {}),
    "modernbert_reranker": ("ModernBertForSequenceClassification", "modernbert", ["LABEL_0"],
                            52005, {"classifier_pooling": "mean"}),
    "mpnet_reranker": ("MPNetForSequenceClassification", "mpnet", ["LABEL_0"], 52006, {}),
    "splade": ("BertForMaskedLM", "bert", None, 52007, {}),
}


def f32(x) -> float:
    """The shortest decimal that reads back as this float32, as a Python float."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def generated_by():
    return ("tests/data/tasks/make_tasks.py with "
            + ", ".join(f"{n}=={md.version(n)}" for n in LIBS)
            + f", Python {platform.python_version()}, device cpu")


# ---------------------------------------------------------------- building


def tokenizer_for(family):
    """The family's checked-in tiny tokenizer; BERT's is the distilbert folder's vocabulary
    in BertTokenizer (token types 0 and 1 for a pair)."""
    from transformers import AutoTokenizer, BertTokenizer

    if family == "bert":
        model = json.loads((FAMILIES / "distilbert" / "tokenizer.json").read_text())["model"]
        tok = BertTokenizer(vocab=model["vocab"])
    else:
        tok = AutoTokenizer.from_pretrained(str(FAMILIES / family))
    tok.model_max_length = MAX_LENGTH
    return tok


def make_config(name, tokenizer):
    """The family's config as make_families.py makes it, with the task's labels."""
    sys.path.insert(0, str(FAMILIES))
    import make_families
    from transformers import AutoConfig

    arch, family, labels, _, extra = TASKS[name]
    if family == "bert":
        config = AutoConfig.for_model(
            "bert", vocab_size=len(tokenizer), hidden_size=HIDDEN, num_hidden_layers=2,
            num_attention_heads=4, intermediate_size=INTERMEDIATE, hidden_act="gelu",
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            max_position_embeddings=MAX_LENGTH, type_vocab_size=2, layer_norm_eps=1e-12,
            pad_token_id=tokenizer.pad_token_id,
        )
    else:
        config = make_families.make_config(family, tokenizer)
    config.architectures = [arch]
    if labels is not None:
        config.num_labels = len(labels)
        config.id2label = dict(enumerate(labels))
        config.label2id = {label: i for i, label in enumerate(labels)}
    for k, v in extra.items():
        setattr(config, k, v)
    if hasattr(config, "classifier_dropout"):
        config.classifier_dropout = 0.0
    return config


def make_model(name, tokenizer):
    import torch
    import transformers

    arch, family, _, seed, _ = TASKS[name]
    torch.manual_seed(seed)
    config = make_config(name, tokenizer)
    kwargs = {"attn_implementation": "eager"} if family == "modernbert" else {}
    auto = transformers.AutoModelForMaskedLM if arch.endswith("ForMaskedLM") else \
        transformers.AutoModelForSequenceClassification
    model = auto.from_config(config, dtype=torch.float32, **kwargs)
    assert type(model).__name__ == arch, type(model)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
                if "relative_attention_bias" in pname:
                    p.mul_(10.0)
            elif pname == "cls.predictions.bias":
                # Most logits negative, so that SPLADE's vectors are sparse.
                p.copy_(torch.randn(p.shape, generator=g) * 0.5 - 3.0)
            elif pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:                       # LayerNorm gains
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    model.eval()
    return model


def splade_module_files(out, vocab):
    """sentence-transformers 5's SparseEncoder files, as on the Hub."""
    def dump(rel, obj):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(json.dumps(obj, indent=2) + "\n")

    dump("modules.json", [
        {"idx": 0, "name": "0", "path": "",
         "type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
        {"idx": 1, "name": "1", "path": "1_SpladePooling",
         "type": "sentence_transformers.sparse_encoder.models.SpladePooling"},
    ])
    dump("sentence_bert_config.json", {"max_seq_length": MAX_LENGTH, "do_lower_case": False})
    dump("1_SpladePooling/config.json", {"pooling_strategy": "max", "activation_function": "relu",
                                         "word_embedding_dimension": vocab})
    dump("config_sentence_transformers.json", {
        "model_type": "SparseEncoder",
        "__version__": {"sentence_transformers": "5.1.0", "transformers": md.version("transformers"),
                        "pytorch": md.version("torch")},
        "prompts": {"query": "", "document": ""}, "default_prompt_name": None,
        "similarity_fn_name": "dot",
    })


def build_folder(name):
    _, family, labels, _, _ = TASKS[name]
    out = HERE / name
    tokenizer = tokenizer_for(family)
    model = make_model(name, tokenizer)
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    model.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    if labels is None:
        splade_module_files(out, model.config.vocab_size)
    return out


# ---------------------------------------------------------------- reference


def pair_encodings(ce, pairs):
    """The ids and the first type-1 token of each pair as CrossEncoder tokenizes it (one pair
    at a time: no padding). Not tokenizer(q, t): transformers drops an empty text_pair, where
    CrossEncoder (and the `tokenizers` library) keep it as an empty second text."""
    ids, second = [], []
    for pair in pairs:
        f = ce.preprocess([pair])
        ids.append(f["input_ids"][0].tolist())
        types = f["token_type_ids"][0].tolist() if "token_type_ids" in f else [0] * len(ids[-1])
        second.append(next((i for i, t in enumerate(types) if t != 0), len(types)))
    return ids, second


def write_cross_encoder_reference(name, out):
    import torch
    from sentence_transformers import CrossEncoder
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    arch, family, labels, _, extra = TASKS[name]
    kwargs = {"model_kwargs": {"attn_implementation": "eager"}} if family == "modernbert" else {}
    ce = CrossEncoder(str(out), device="cpu", activation_fn=torch.nn.Identity(), **kwargs)
    assert ce.max_seq_length == MAX_LENGTH, ce.max_seq_length
    tok = AutoTokenizer.from_pretrained(str(out))
    ids, second = pair_encodings(ce, PAIRS)
    assert max(len(i) for i in ids) == MAX_LENGTH
    full = [len(tok(q, t)["input_ids"]) for q, t in PAIRS]
    assert sum(n > MAX_LENGTH for n in full) >= 3, full
    logits = ce.predict(PAIRS, batch_size=1, convert_to_numpy=True)
    logits = np.asarray(logits, dtype=np.float32).reshape(len(PAIRS), len(labels))
    batched = np.asarray(ce.predict(PAIRS, batch_size=8, convert_to_numpy=True),
                         dtype=np.float32).reshape(len(PAIRS), len(labels))
    assert np.abs(batched - logits).max() < 1e-5

    hf = AutoModelForSequenceClassification.from_pretrained(str(out), **kwargs.get("model_kwargs", {}))
    hf.eval()
    singles_ids, single_logits = [], []
    with torch.no_grad():
        for q, t in PAIRS[:2]:        # the plain model agrees with CrossEncoder
            e = tok(q, t, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            assert np.allclose(hf(**e).logits[0].numpy(), logits[PAIRS.index([q, t])], atol=1e-6)
        for s in SINGLES:
            e = tok(s, truncation=True, max_length=MAX_LENGTH, return_tensors="pt")
            singles_ids.append(e["input_ids"][0].tolist())
            single_logits.append(hf(**e).logits[0].numpy().astype(np.float32))
    assert np.ptp(logits[:, 0]) > 0.1, logits        # the scores differ between pairs

    data = {
        "model": f"tiny random {arch} (tests/data/tasks/{name}/)",
        "generated_by": generated_by(),
        "model_type": hf.config.model_type,
        "architecture": arch,
        "task": "reranker" if len(labels) == 1 else "classifier",
        "labels": labels,
        "max_length": MAX_LENGTH,
        "pairs": PAIRS,
        "tokens": ids,
        "second": second,
        "logits": [[f32(x) for x in row] for row in logits],
        "singles": SINGLES,
        "single_tokens": singles_ids,
        "single_logits": [[f32(x) for x in row] for row in single_logits],
    }
    if "classifier_pooling" in extra:
        data["classifier_pooling"] = extra["classifier_pooling"]
    write_json(out, data)
    print(f"{name}: pair lengths {[len(i) for i in ids]} (untruncated {full}), second {second}",
          file=sys.stderr)


def write_splade_reference(name, out):
    from sentence_transformers import SparseEncoder

    model = SparseEncoder(str(out), device="cpu")
    assert model.max_seq_length == MAX_LENGTH, model.max_seq_length
    feats = [model.preprocess([s]) for s in SENTENCES]
    ids = [f["input_ids"][0].tolist() for f in feats]
    assert max(len(i) for i in ids) == MAX_LENGTH
    emb = model.encode(SENTENCES, batch_size=1, convert_to_tensor=True, convert_to_sparse_tensor=False)
    dense = emb.to_dense().numpy() if emb.is_sparse else emb.numpy()
    dense = dense.astype(np.float32)
    vectors = [[[int(j), f32(row[j])] for j in np.nonzero(row)[0]] for row in dense]
    nnz = [len(v) for v in vectors]
    assert 0 < min(nnz[1:]) and max(nnz) < dense.shape[1] // 2, nnz       # sparse, not empty
    pooling = model[1]
    data = {
        "model": f"tiny random BertForMaskedLM as a SparseEncoder (tests/data/tasks/{name}/)",
        "generated_by": generated_by(),
        "model_type": "bert",
        "max_length": MAX_LENGTH,
        "pooling_strategy": pooling.pooling_strategy,
        "activation_function": pooling.activation_function,
        "vocab": int(dense.shape[1]),
        "sentences": SENTENCES,
        "tokens": ids,
        "vectors": vectors,
    }
    write_json(out, data)
    print(f"{name}: lengths {[len(i) for i in ids]}, nonzero {nnz} of {dense.shape[1]}",
          file=sys.stderr)


def write_json(out, data):
    with open(out / "reference.json", "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


# ---------------------------------------------------------------- verify


def verify(name):
    """Load the folder as a user would and check it against reference.json."""
    import torch
    from sentence_transformers import CrossEncoder, SparseEncoder
    from tokenizers import Tokenizer

    out = HERE / name
    ref = json.loads((out / "reference.json").read_text())
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    raw.no_padding()
    raw.enable_truncation(ref["max_length"])          # longest_first, as CrossEncoder
    if "pairs" in ref:
        ce = CrossEncoder(str(out), device="cpu", activation_fn=torch.nn.Identity())
        got = np.asarray(ce.predict(ref["pairs"], batch_size=4, convert_to_numpy=True), dtype=np.float32)
        d = float(np.abs(got.reshape(len(ref["pairs"]), -1) - np.array(ref["logits"], np.float32)).max())
        assert d < 1e-5, d
        typed = "token_type_ids" in ce.preprocess([ref["pairs"][0]])
        for (q, t), ids, second in zip(ref["pairs"], ref["tokens"], ref["second"]):
            e = raw.encode(q, t)
            assert e.ids == ids, (name, q, t, e.ids, ids)
            # tokenizer.json types a pair's second text 1 in every WordPiece family; only the
            # models that read token types (BERT's) are given them.
            if typed:
                assert next((i for i, x in enumerate(e.type_ids) if x != 0), len(ids)) == second
        for s, ids in zip(ref["singles"], ref["single_tokens"]):
            assert raw.encode(s).ids == ids, (name, s)
    else:
        model = SparseEncoder(str(out), device="cpu")
        emb = model.encode(ref["sentences"], batch_size=4, convert_to_tensor=True,
                           convert_to_sparse_tensor=False)
        dense = emb.to_dense().numpy() if emb.is_sparse else emb.numpy()
        d = 0.0
        for row, vec in zip(dense, ref["vectors"]):
            want = np.zeros_like(row)
            for j, v in vec:
                want[j] = v
            d = max(d, float(np.abs(row - want).max()))
        assert d < 1e-5, d
        for s, ids in zip(ref["sentences"], ref["tokens"]):
            assert raw.encode(s).ids == ids, (name, s)
    kb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1024
    print(f"{name}: ok, padded batch max |diff| {d:.2e}, ids match tokenizer.json; {kb:.0f} KiB")


def main(argv):
    cmd = argv[0] if argv and argv[0] in ("make", "verify") else "make"
    names = [a for a in argv if a not in ("make", "verify")] or list(TASKS)
    if cmd == "make":
        import torch
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        for name in names:
            out = build_folder(name)
            if TASKS[name][2] is None:
                write_splade_reference(name, out)
            else:
                write_cross_encoder_reference(name, out)
        subprocess.run([sys.executable, __file__, "verify", *names], check=True)
    else:
        for name in names:
            verify(name)


if __name__ == "__main__":
    main(sys.argv[1:])
