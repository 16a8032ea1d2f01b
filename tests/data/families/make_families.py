#!/usr/bin/env python3
"""Make the tiny encoder-family fixtures of issue #51: one sentence-transformers folder per
family (tests/data/families/<name>/) with a randomly initialised tiny model, its own small
tokenizer, and reference.json, the outputs sentence-transformers gives for it in float32.

The Rust tests never run this: the folders are checked in and they need no torch. Run it once,
in a throwaway venv (torch comes from PyPI, about 3 GB with its CUDA wheels; 2-3 minutes here):

    python3.11 -m venv target/families-venv
    target/families-venv/bin/pip install -r tests/data/families/requirements.txt
    target/families-venv/bin/python tests/data/families/make_families.py          # make all
    target/families-venv/bin/python tests/data/families/make_families.py verify   # check them

`make [--retrain] [NAME...]` (the default) rewrites the folders (keeping the checked-in
vocabularies unless --retrain: see checked_in_model); `verify [NAME...]` loads each folder back
with SentenceTransformer(path) and AutoTokenizer in this process (run it as its own process,
after make) and checks encode() and the token ids against reference.json, and that the raw
tokenizer.json (what the Rust side reads, with the `tokenizers` library) gives the same ids.

Everything is deterministic: the tokenizers are trained on CORPUS below (the `tokenizers`
trainers, single-threaded), the weights drawn from torch with a fixed seed per family.

How each folder is made:
  1. train a small vocabulary with the `tokenizers` library, the family's kind of model
     (Unigram, byte-level BPE or WordPiece) with its special tokens at the family's ids;
  2. hand the vocabulary (and merges) to the family's own transformers tokenizer class
     (XLMRobertaTokenizer, RobertaTokenizer, CamembertTokenizer, DistilBertTokenizer,
     MPNetTokenizer; ModernBERT has none of its own and ships a PreTrainedTokenizerFast), so
     the normalizer, pre-tokenizer and post-processor are the ones transformers builds for
     the family. (transformers 5 rebuilds these classes from the vocabulary in tokenizer.json
     and only keeps the file's post-processor, so a tokenizer.json whose pre-tokenizer
     differed from the class's would tokenize differently in Python and in Rust);
  3. build the model from a config with AutoModel.from_config, then redraw every parameter
     (weights N(0, 0.15), LayerNorm gains 1 + N(0, 0.1), biases N(0, 0.1)) so that a
     misread tensor (a LayerNorm bias, a position table) shows in the vectors;
  4. wrap them in sentence_transformers modules (Transformer, Pooling, optional Normalize),
     SentenceTransformer.save() the folder (transformers' save_pretrained writes config.json,
     model.safetensors in float32 and the tokenizer files);
  5. load the folder back with SentenceTransformer(path) and write reference.json from it.

reference.json has the keys of tests/data/minilm_reference.json (model, package, generated_by,
max_seq_length, sentences, tokens, embeddings, unnormalized) plus:
    model_type   config.json's model_type
    pooling      "mean" or "cls"
    normalize    whether the folder's modules.json has a Normalize module
    ids          the token ids per sentence as sentence-transformers tokenizes them (after
                 truncation to max_seq_length, special tokens included)
    attn_implementation   what transformers ran the attention with
    layout       "classic" (the module files of sentence-transformers 2.x-5.x, as on the Hub)
                 or "st6" (what sentence-transformers 6 writes; see build_folder)
    (modernbert also: local_attention, layer_types)
`embeddings` is always encode(normalize_embeddings=True), `unnormalized` the pooled vector
before any Normalize module, each sentence alone (batch_size=1, so no padding).
"""

import importlib.metadata as md
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("RAYON_NUM_THREADS", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import numpy as np

HERE = Path(__file__).resolve().parent
MAX_SEQ_LENGTH = 40
HIDDEN = 32
INTERMEDIATE = 64

# What the tokenizers are trained on: a little of several languages and scripts.
CORPUS = """
The lighthouse keeper climbed the spiral staircase every evening and lit the great lamp.
He wrote in a worn logbook the weather, the ships that passed, and anything unusual.
A quick brown fox jumps over the lazy dog while the small bird sings in the old tree.
How do I reset my password? Click the link in the email and choose a new one.
Order 12345 shipped on 2024-03-15 for $19.99, quantity 3, to the house by the river.
The server answers embedding requests over sockets, alone or in concurrent batches.
Sentence embeddings map text to vectors; similar sentences have similar vectors.
Le gardien du phare montait l'escalier chaque soir et allumait la grande lampe.
Café crème, brûlée à la française, s'il vous plaît. Où est la gare? Très bien, merci.
Les phrases longues sont coupées à la longueur maximale du modèle.
Der Leuchtturmwärter stieg jeden Abend die Wendeltreppe hinauf.
Grüße aus München: Straße, Übung und Äpfel. Schöne Grüße und bis bald!
El guardián del faro subía la escalera cada noche. ¿Dónde está la estación?
Москва — столица России, и зимой там очень холодно. Привет, как дела?
Смотритель маяка каждый вечер поднимался по винтовой лестнице.
我喜欢在周末读书和喝茶。今天天气很好。
東京は日本の首都です。灯台守は毎晩らせん階段を上った。
오늘 날씨가 정말 좋네요. 감사합니다.
I love pizza 🍕 and coffee ☕! Emoji 🙂 are tokens too 🔥.
naïve résumé coöperate façade, déjà vu, piñata, jalapeño.
""".strip().splitlines()

# A paragraph for the long cases: longer than MAX_SEQ_LENGTH in every family's tokenizer.
PARAGRAPH = (
    "The lighthouse keeper climbed the spiral staircase every evening, lit the great lamp, "
    "and wrote in a worn logbook the weather, the ships that passed, and anything unusual "
    "he noticed on the dark water below the rocks."
)

SENTENCES = [
    "",                                                     # specials only
    "Hello",
    "a",
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "WARNING: DO NOT TOUCH THE HOT SURFACE.",
    "Order #12345 shipped on 2024-03-15 for $19.99 (qty: 3).",
    "Café crème brûlée à la française, s'il vous plaît.",    # accents
    "naïve résumé coöperate façade",
    "Grüße aus München: Straße, Übung und Äpfel.",           # German
    "Le gardien du phare allumait la grande lampe chaque soir.",  # French
    "Москва — столица России, и зимой там очень холодно.",  # Cyrillic
    "我喜欢在周末读书和喝茶。",                                # Chinese
    "東京は日本の首都です。",                                  # Japanese
    "I love pizza 🍕🔥 and coffee ☕!",                      # emoji
    "Ελληνικά και עברית are not in the corpus.",            # scripts the vocab lacks
    "   ",                                                  # whitespace only
    "The server answers embedding requests over sockets, alone or in concurrent batches.",
    PARAGRAPH,                                              # past MAX_SEQ_LENGTH: cut
    " ".join([PARAGRAPH] * 3),                              # far past it
    "Der Leuchtturmwärter stieg jeden Abend die Wendeltreppe hinauf, und Смотритель маяка "
    "каждый вечер поднимался по винтовой лестнице; 灯台守は毎晩らせん階段を上った。",
]

# name -> how it is made. pooling / normalize vary so that the plugin's reading of
# 1_Pooling/config.json and modules.json is exercised.
FAMILIES = {
    "xlm_roberta": dict(model_type="xlm-roberta", pooling="mean", normalize=True, seed=51001,
                        layout="classic"),
    "roberta": dict(model_type="roberta", pooling="cls", normalize=True, seed=51002,
                   layout="classic"),
    "camembert": dict(model_type="camembert", pooling="mean", normalize=True, seed=51003,
                   layout="classic"),
    "distilbert": dict(model_type="distilbert", pooling="mean", normalize=False, seed=51004,
                   layout="classic"),
    "mpnet": dict(model_type="mpnet", pooling="mean", normalize=True, seed=51005,
                   layout="classic"),
    "modernbert": dict(model_type="modernbert", pooling="mean", normalize=True, seed=51006,
                       layout="st6"),
}

MODERNBERT_LOCAL_ATTENTION = 8       # transformers: |i - j| <= 8 // 2 in the sliding layers
MODERNBERT_LAYERS = 4
MODERNBERT_GLOBAL_EVERY = 3          # layers 0 and 3 global, 1 and 2 sliding
MODERNBERT_ATTN = "eager"

RETRAIN = False
LIBS = ["sentence-transformers", "transformers", "torch", "tokenizers", "safetensors", "numpy"]


def f32(x) -> float:
    """The shortest decimal that reads back as this float32, as a Python float."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


# ---------------------------------------------------------------- tokenizers


def _train(tok, trainer):
    tok.train_from_iterator(CORPUS * 3, trainer=trainer)
    return json.loads(tok.to_str())["model"]


def train_unigram(specials, vocab_size=500):
    """A SentencePiece-style Unigram vocabulary ([(piece, score)]), specials first, pre-tokenized
    as XLMRobertaTokenizer / CamembertTokenizer do (WhitespaceSplit, Metaspace always)."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")]
    )
    trainer = trainers.UnigramTrainer(
        vocab_size=vocab_size, special_tokens=specials, unk_token="<unk>", show_progress=False,
        max_piece_length=8,
    )
    model = _train(tok, trainer)
    vocab = [(p, float(s)) for p, s in model["vocab"]]
    assert [p for p, _ in vocab[: len(specials)]] == specials, vocab[:8]
    return vocab


def train_bytelevel_bpe(specials, vocab_size=500):
    """A byte-level BPE vocabulary (dict, merges), specials first, pre-tokenized as RoBERTa's."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    model = _train(tok, trainer)
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]]
    return dict(model["vocab"]), merges


def train_wordpiece(vocab_size=450):
    """A lower-cased BERT WordPiece vocabulary: the trained pieces, specials left out (the
    caller places them)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, trainers

    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=["[UNK]"], show_progress=False,
        continuing_subword_prefix="##",
    )
    model = _train(tok, trainer)
    pieces = sorted(model["vocab"], key=model["vocab"].get)
    return [p for p in pieces if p != "[UNK]"]


def bert_prefix():
    """BERT's first ids: [PAD] 0, [unused0..98] 1..99, [UNK] 100, [CLS] 101, [SEP] 102,
    [MASK] 103 (so the special ids are BERT's, not 0..4)."""
    return ["[PAD]"] + [f"[unused{i}]" for i in range(99)] + ["[UNK]", "[CLS]", "[SEP]", "[MASK]"]


def checked_in_model(name):
    """The tokenizer.json "model" of the checked-in folder, unless --retrain: the WordPiece and
    Unigram trainers of tokenizers 0.23 are not run-to-run deterministic (their alphabets of
    "##x" pieces and seed pieces come out of Rust HashMaps, whose order is random per
    process), so a rerun keeps the vocabulary it made the first time and only the byte-level
    BPE (deterministic) is trained again. Everything after the vocabulary is deterministic."""
    path = HERE / name / "tokenizer.json"
    if RETRAIN or not path.exists():
        return None
    return json.loads(path.read_text(encoding="utf-8"))["model"]


def make_tokenizer(name):
    from tokenizers import AddedToken
    from transformers import (CamembertTokenizer, DistilBertTokenizer, MPNetTokenizer,
                              PreTrainedTokenizerFast, RobertaTokenizer, XLMRobertaTokenizer)

    if name == "xlm_roberta":
        # XLM-R: <s> 0, <pad> 1, </s> 2, <unk> 3, ..., <mask> last.
        m = checked_in_model(name)
        vocab = ([(p, float(s)) for p, s in m["vocab"]] if m else
                 train_unigram(["<s>", "<pad>", "</s>", "<unk>"]) + [("<mask>", 0.0)])
        return XLMRobertaTokenizer(vocab=vocab)
    if name == "camembert":
        # camembert-base: <s>NOTUSED 0, <pad> 1, </s>NOTUSED 2, <unk> 3, <unk>NOTUSED 4,
        # <s> 5, </s> 6, ..., <mask> last.
        specials = ["<s>NOTUSED", "<pad>", "</s>NOTUSED", "<unk>", "<unk>NOTUSED", "<s>", "</s>"]
        m = checked_in_model(name)
        vocab = [(p, float(s)) for p, s in m["vocab"]] if m else train_unigram(specials) + [("<mask>", 0.0)]
        vocab[4] = ("<unk>NOTUSED", -100.0)
        return CamembertTokenizer(vocab=vocab)
    if name == "roberta":
        # RoBERTa: <s> 0, <pad> 1, </s> 2, <unk> 3, ..., <mask> last.
        vocab, merges = train_bytelevel_bpe(["<s>", "<pad>", "</s>", "<unk>"])
        vocab["<mask>"] = len(vocab)
        return RobertaTokenizer(vocab=vocab, merges=merges)
    if name == "distilbert":
        m = checked_in_model(name)
        vocab = m["vocab"] if m else {p: i for i, p in enumerate(bert_prefix() + train_wordpiece())}
        return DistilBertTokenizer(vocab=vocab)
    if name == "mpnet":
        # all-mpnet-base-v2: <s> 0, <pad> 1, </s> 2, <unk> 3, then BERT's vocabulary shifted
        # by 4 ([PAD] 4, [UNK] 104, ...), <mask> last; [UNK] is the unknown token.
        m = checked_in_model(name)
        vocab = m["vocab"] if m else {
            p: i for i, p in enumerate(["<s>", "<pad>", "</s>", "<unk>"] + bert_prefix() + train_wordpiece() + ["<mask>"])
        }
        return MPNetTokenizer(vocab=vocab)
    if name == "modernbert":
        # ModernBERT (OLMo's byte-level BPE): <|endoftext|>-style specials first, then
        # [UNK] [CLS] [SEP] [PAD] [MASK] added at the end, "[CLS] $A [SEP]".
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors

        vocab, merges = train_bytelevel_bpe(["|||IP_ADDRESS|||", "<|padding|>", "<|endoftext|>"])
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="",
                                   end_of_word_suffix="", fuse_unk=False, byte_fallback=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True)
        tok.decoder = decoders.ByteLevel(add_prefix_space=True, trim_offsets=True, use_regex=True)
        tok.add_special_tokens(["|||IP_ADDRESS|||", "<|padding|>", "<|endoftext|>"])
        tok.add_special_tokens(["[UNK]", "[CLS]", "[SEP]", "[PAD]"])
        tok.add_special_tokens([AddedToken("[MASK]", lstrip=True, special=True, normalized=False)])
        cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS]:0 $A:0 [SEP]:0",
            pair="[CLS]:0 $A:0 [SEP]:0 $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls), ("[SEP]", sep)],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok, unk_token="[UNK]", cls_token="[CLS]", sep_token="[SEP]",
            pad_token="[PAD]", mask_token="[MASK]", model_input_names=["input_ids", "attention_mask"],
            clean_up_tokenization_spaces=True,
        )
    raise KeyError(name)


# ---------------------------------------------------------------- models


def make_config(name, tokenizer):
    from transformers import AutoConfig

    vocab = len(tokenizer)
    common = dict(vocab_size=vocab, pad_token_id=tokenizer.pad_token_id)
    roberta_like = dict(
        hidden_size=HIDDEN, num_hidden_layers=2, num_attention_heads=4, intermediate_size=INTERMEDIATE,
        hidden_act="gelu", hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
        # positions start at pad_token_id + 1 (transformers' create_position_ids_from_input_ids)
        max_position_embeddings=MAX_SEQ_LENGTH + tokenizer.pad_token_id + 1,
        type_vocab_size=1, layer_norm_eps=1e-5,
        bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id, **common,
    )
    if name in ("xlm_roberta", "roberta", "camembert"):
        return AutoConfig.for_model(FAMILIES[name]["model_type"], **roberta_like)
    if name == "mpnet":
        cfg = dict(roberta_like)
        cfg.pop("type_vocab_size")
        cfg["relative_attention_num_buckets"] = 32
        cfg["num_hidden_layers"] = 3
        return AutoConfig.for_model("mpnet", **cfg)
    if name == "distilbert":
        return AutoConfig.for_model(
            "distilbert", dim=HIDDEN, n_layers=3, n_heads=2, hidden_dim=INTERMEDIATE, activation="gelu",
            max_position_embeddings=MAX_SEQ_LENGTH, sinusoidal_pos_embds=False, dropout=0.0,
            attention_dropout=0.0, **common,
        )
    if name == "modernbert":
        return AutoConfig.for_model(
            "modernbert", hidden_size=HIDDEN, num_hidden_layers=MODERNBERT_LAYERS, num_attention_heads=4,
            intermediate_size=INTERMEDIATE, hidden_activation="gelu", max_position_embeddings=64,
            global_attn_every_n_layers=MODERNBERT_GLOBAL_EVERY, local_attention=MODERNBERT_LOCAL_ATTENTION,
            global_rope_theta=160000.0, local_rope_theta=10000.0, norm_eps=1e-5, norm_bias=False,
            attention_bias=False, mlp_bias=False, embedding_dropout=0.0, attention_dropout=0.0,
            mlp_dropout=0.0, classifier_pooling="mean",
            cls_token_id=tokenizer.cls_token_id, sep_token_id=tokenizer.sep_token_id,
            bos_token_id=tokenizer.cls_token_id, eos_token_id=tokenizer.sep_token_id,
            # ModernBERT's embedding table is padded past the tokenizer (50368 rows for 50285
            # tokens): rows to a multiple of 64 here too.
            vocab_size=-(-len(tokenizer) // 64) * 64, pad_token_id=tokenizer.pad_token_id,
        )
    raise KeyError(name)


def make_model(name, tokenizer, seed):
    import torch
    from transformers import AutoModel

    torch.manual_seed(seed)
    config = make_config(name, tokenizer)
    kwargs = {"attn_implementation": MODERNBERT_ATTN} if name == "modernbert" else {}
    model = AutoModel.from_config(config, dtype=torch.float32, **kwargs)
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for pname, p in sorted(model.named_parameters()):
            if p.dim() >= 2:
                p.copy_(torch.randn(p.shape, generator=g) * 0.15)
                if "relative_attention_bias" in pname:
                    p.mul_(10.0)        # ~N(0, 1.5): the bias must matter
            elif pname.endswith("bias"):
                p.copy_(torch.randn(p.shape, generator=g) * 0.1)
            else:                       # LayerNorm gains
                p.copy_(1.0 + torch.randn(p.shape, generator=g) * 0.1)
    model.eval()
    return model


def classic_module_files(out, spec, hidden):
    """modules.json, sentence_bert_config.json, 1_Pooling/config.json (and 2_Normalize) as
    sentence-transformers 2.x-5.x write them: the layout of nearly every model on the Hub
    (all-MiniLM-L6-v2, all-mpnet-base-v2, ...). sentence-transformers 6 still reads it."""
    modules = [
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
    ]
    if spec["normalize"]:
        modules.append({"idx": 2, "name": "2", "path": "2_Normalize",
                        "type": "sentence_transformers.models.Normalize"})
    pooling = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": spec["pooling"] == "cls",
        "pooling_mode_mean_tokens": spec["pooling"] == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
        "pooling_mode_weightedmean_tokens": False,
        "pooling_mode_lasttoken": False,
        "include_prompt": True,
    }
    st_config = {
        "__version__": {"sentence_transformers": "5.1.0", "transformers": md.version("transformers"),
                        "pytorch": md.version("torch")},
        "prompts": {}, "default_prompt_name": None, "similarity_fn_name": "cosine",
    }

    def dump(rel, obj):
        (out / rel).parent.mkdir(parents=True, exist_ok=True)
        (out / rel).write_text(json.dumps(obj, indent=2) + "\n")

    dump("modules.json", modules)
    dump("sentence_bert_config.json", {"max_seq_length": MAX_SEQ_LENGTH, "do_lower_case": False})
    dump("1_Pooling/config.json", pooling)
    dump("config_sentence_transformers.json", st_config)


def build_folder(name):
    """Writes tests/data/families/NAME/. Two layouts:
    classic  (every family but modernbert) transformers' save_pretrained writes config.json,
             model.safetensors and the tokenizer (model_max_length 512, as the real models'
             tokenizers say), and the sentence-transformers files are the 2.x-5.x layout
             (classic_module_files): max_seq_length 40 comes from sentence_bert_config.json;
    st6      (modernbert) SentenceTransformer.save() of sentence-transformers 6 writes all of
             it, in its own layout: modules.json names sentence_transformers.base.modules...,
             1_Pooling/config.json says {"embedding_dimension", "pooling_mode": "mean"},
             sentence_bert_config.json has no max_seq_length: it is tokenizer_config.json's
             model_max_length (40), and 2_Normalize/config.json exists.
    """
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Normalize, Pooling, Transformer

    spec = FAMILIES[name]
    out = HERE / name
    tokenizer = make_tokenizer(name)
    model = make_model(name, tokenizer, spec["seed"])
    if out.exists():
        shutil.rmtree(out)
    if spec["layout"] == "classic":
        out.mkdir(parents=True)
        model.save_pretrained(str(out))
        tokenizer.model_max_length = 512
        tokenizer.save_pretrained(str(out))
        classic_module_files(out, spec, HIDDEN)
        return out
    with tempfile.TemporaryDirectory() as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
        kwargs = {"attn_implementation": MODERNBERT_ATTN} if name == "modernbert" else {}
        t = Transformer(tmp, max_seq_length=MAX_SEQ_LENGTH, model_kwargs=kwargs)
        modules = [t, Pooling(HIDDEN, pooling_mode=spec["pooling"])]
        if spec["normalize"]:
            modules.append(Normalize())
        st = SentenceTransformer(modules=modules, device="cpu")
        st.save(str(out), create_model_card=False)
    return out


# ---------------------------------------------------------------- reference


def load(out, name):
    from sentence_transformers import SentenceTransformer

    kwargs = {"model_kwargs": {"attn_implementation": MODERNBERT_ATTN}} if name == "modernbert" else {}
    return SentenceTransformer(str(out), device="cpu", **kwargs)


def sliding_window_reach(config):
    """How far a token sees in transformers' sliding layers: read off the mask it builds
    (|i - j| <= local_attention // 2, i.e. a window of local_attention + 1 tokens)."""
    import torch
    from transformers.masking_utils import create_bidirectional_sliding_window_mask

    n = 3 * config.local_attention
    mask = create_bidirectional_sliding_window_mask(
        config=config, inputs_embeds=torch.zeros(1, n, config.hidden_size),
        attention_mask=torch.ones(1, n, dtype=torch.long))[0, 0]
    allowed = mask if mask.dtype == torch.bool else mask == 0
    reach = {int(j) - i for i in range(n) for j in allowed[i].nonzero().flatten() if j >= i}
    assert all(bool(allowed[i, j]) == (abs(i - j) <= max(reach)) for i in range(n) for j in range(n))
    return max(reach)


def write_reference(name, out):
    from sentence_transformers import SentenceTransformer

    spec = FAMILIES[name]
    model = load(out, name)
    assert model.max_seq_length == MAX_SEQ_LENGTH, model.max_seq_length
    hf = model[0].auto_model
    attn = hf.config._attn_implementation
    prep = getattr(model, "preprocess", None) or model.tokenize
    ids = [prep([s])["input_ids"][0].tolist() for s in SENTENCES]
    tokens = [int(prep([s])["attention_mask"].sum()) for s in SENTENCES]
    assert tokens == [len(i) for i in ids]
    full = [len(model.tokenizer(s)["input_ids"]) for s in SENTENCES]
    assert sum(n > MAX_SEQ_LENGTH for n in full) >= 2 and max(tokens) == MAX_SEQ_LENGTH, (full, tokens)

    norm = model.encode(SENTENCES, batch_size=1, normalize_embeddings=True, convert_to_numpy=True)
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    raw = pooled.encode(SENTENCES, batch_size=1, normalize_embeddings=False, convert_to_numpy=True)
    assert norm.shape == raw.shape == (len(SENTENCES), HIDDEN) and norm.dtype == raw.dtype == np.float32
    norms = np.linalg.norm(raw, axis=1)
    assert np.allclose(raw / norms[:, None], norm, atol=1e-6)
    has_norm = type(model[len(model) - 1]).__name__ == "Normalize"
    assert has_norm == spec["normalize"], [type(m) for m in model]
    if not has_norm:                                # encode() itself returns the pooled vector
        plain = model.encode(SENTENCES, batch_size=1, convert_to_numpy=True)
        assert np.array_equal(plain, raw)
    # The vectors are not all alike (a model that ignored its input would pass a cosine test).
    cos = norm @ norm.T
    assert cos[np.triu_indices(len(SENTENCES), 1)].min() < 0.9, cos

    cfg = json.loads((out / "config.json").read_text())
    data = {
        "model": f"tiny random {cfg['model_type']} (tests/data/families/{name}/)",
        "package": "none: the folder beside this file",
        "generated_by": "tests/data/families/make_families.py with "
                        + ", ".join(f"{n}=={md.version(n)}" for n in LIBS)
                        + f", Python {platform.python_version()}, device cpu",
        "model_type": cfg["model_type"],
        "pooling": spec["pooling"],
        "normalize": has_norm,
        "attn_implementation": attn,
        "layout": spec["layout"],
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "tokens": tokens,
        "ids": ids,
        "embeddings": [[f32(x) for x in row] for row in norm],
        "unnormalized": [[f32(x) for x in row] for row in raw],
    }
    if name == "modernbert":
        data["local_attention"] = hf.config.local_attention
        data["layer_types"] = list(hf.config.layer_types)
        data["sliding_window_max_distance"] = sliding_window_reach(hf.config)
        assert data["sliding_window_max_distance"] == MODERNBERT_LOCAL_ATTENTION // 2
        assert sum(n > MODERNBERT_LOCAL_ATTENTION // 2 + 1 for n in tokens) >= 8, tokens
    path = out / "reference.json"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"{name}: wrote {path.relative_to(HERE.parent.parent.parent)} tokens {tokens} "
          f"(untruncated {full}), attn {attn}", file=sys.stderr)


# ---------------------------------------------------------------- verify


def verify(name):
    """Load the folder as a user would and check it against reference.json."""
    from sentence_transformers import SentenceTransformer
    from tokenizers import Tokenizer
    from transformers import AutoTokenizer

    out = HERE / name
    ref = json.loads((out / "reference.json").read_text())
    model = SentenceTransformer(str(out), device="cpu")        # default attention (sdpa)
    assert model.max_seq_length == ref["max_seq_length"], model.max_seq_length
    assert model[1].pooling_mode == ref["pooling"], model[1]
    assert (type(model[len(model) - 1]).__name__ == "Normalize") == ref["normalize"], model
    got = model.encode(ref["sentences"], batch_size=1, normalize_embeddings=True, convert_to_numpy=True)
    d = float(np.abs(got - np.array(ref["embeddings"], dtype=np.float32)).max())
    # Padded batches too: what a server's mixed batch sees.
    batched = model.encode(ref["sentences"], batch_size=8, normalize_embeddings=True, convert_to_numpy=True)
    db = float(np.abs(batched - np.array(ref["embeddings"], dtype=np.float32)).max())
    assert d < 2e-6 and db < 1e-5, (d, db)

    auto = AutoTokenizer.from_pretrained(str(out))
    raw = Tokenizer.from_file(str(out / "tokenizer.json"))
    raw.no_padding()
    raw.enable_truncation(ref["max_seq_length"])
    for s, ids in zip(ref["sentences"], ref["ids"]):
        a = auto(s, truncation=True, max_length=ref["max_seq_length"])["input_ids"]
        r = raw.encode(s).ids
        assert a == ids == r, (name, s, a, ids, r)
    kb = sum(p.stat().st_size for p in out.rglob("*") if p.is_file()) / 1024
    print(f"{name}: ok, encode max |diff| {d:.2e} (batch_size=1), {db:.2e} (batch_size=8), "
          f"ids match AutoTokenizer ({type(auto).__name__}) and tokenizer.json; {kb:.0f} KiB")


def main(argv):
    global RETRAIN
    RETRAIN = "--retrain" in argv
    argv = [a for a in argv if a != "--retrain"]
    cmd = argv[0] if argv and argv[0] in ("make", "verify") else "make"
    names = [a for a in argv if a not in ("make", "verify")] or list(FAMILIES)
    if cmd == "make":
        import torch
        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True)
        for name in names:
            write_reference(name, build_folder(name))
        # verify in a fresh process
        subprocess.run([sys.executable, __file__, "verify", *names], check=True)
    else:
        for name in names:
            verify(name)


if __name__ == "__main__":
    main(sys.argv[1:])
