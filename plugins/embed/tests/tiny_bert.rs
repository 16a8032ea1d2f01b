//! Generality: a tiny random BERT written by tests/embed/tiny_bert.py (its
//! own vocabulary, tokenizer.json and hand-written safetensors) against the
//! script's numpy forward pass, for mean and CLS pooling, with and without
//! Normalize, with and without the `bert.` prefix, f32 and f16 weights.

use m0_embed::model::{LoadOptions, Model, Pooling, TokenizeError, TooLong};

use crate::common::{cosine, id_rows, max_abs_diff, rows, strings, tiny_bert};

struct Reference {
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
}

fn reference(dir: &std::path::Path) -> Reference {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    Reference {
        sentences: strings(&v["sentences"]),
        ids: id_rows(&v["ids"]),
        embeddings: rows(&v["embeddings"]),
    }
}

fn check(args: &[&str], pooling: Pooling, normalize: bool, tol: f32) {
    let dir = tiny_bert(args);
    let r = reference(dir.path());
    for threads in [1, 2, 3] {
        let model = Model::load(
            dir.path(),
            LoadOptions {
                threads,
                ..LoadOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let info = model.info();
        assert_eq!(info.pooling, pooling);
        assert_eq!(info.normalize, normalize);
        assert_eq!((info.dim, info.layers, info.heads), (32, 2, 4));
        assert_eq!((info.intermediate, info.max_len), (64, 64));
        assert_eq!(info.dtype, "float32");
        assert!(info.weight_bytes > 0);
        let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
        let enc = model.tokenize(&texts, true).unwrap();
        for (i, e) in enc.iter().enumerate() {
            assert_eq!(e.ids(), r.ids[i].as_slice(), "ids of {:?}", r.sentences[i]);
            assert_eq!(e.tokens(), r.ids[i].len());
        }
        // Without truncation the long sentence is refused, with its index.
        let long = r
            .ids
            .iter()
            .position(|i| i.len() == 64)
            .expect("a truncated one");
        match model.tokenize(&texts, false) {
            Err(TokenizeError::TooLong(TooLong { index, tokens, max })) => {
                assert_eq!((index, max), (long, 64));
                assert!(tokens > 64);
            }
            other => panic!("expected TooLong, got {other:?}"),
        }
        let batch = model.embed(&enc, info.normalize);
        assert_eq!(batch.len(), r.sentences.len() * 32);
        for (i, want) in r.embeddings.iter().enumerate() {
            let one = model.embed(std::slice::from_ref(&enc[i]), info.normalize);
            for (what, got) in [
                ("alone", &one[..]),
                ("in the batch", &batch[i * 32..(i + 1) * 32]),
            ] {
                let c = cosine(got, want);
                let d = max_abs_diff(got, want);
                assert!(
                    c >= 0.9999 && d < tol,
                    "{args:?} threads {threads}: sentence {i} {what}: cosine {c}, max diff {d}"
                );
            }
        }
        if normalize {
            for row in batch.chunks(32) {
                let n: f32 = row.iter().map(|x| x * x).sum::<f32>().sqrt();
                assert!((n - 1.0).abs() < 1e-5, "norm {n}");
            }
        }
        assert!(model.embed(&[], true).is_empty());
    }
}

#[test]
fn tiny_mean_pooling_normalized() {
    check(
        &["--pooling", "mean", "--normalize"],
        Pooling::Mean,
        true,
        1e-5,
    );
}

#[test]
fn tiny_mean_pooling_not_normalized_bert_prefix() {
    check(
        &["--pooling", "mean", "--prefix", "bert.", "--seed", "1"],
        Pooling::Mean,
        false,
        1e-4,
    );
}

#[test]
fn tiny_cls_pooling_normalized_bert_prefix() {
    check(
        &[
            "--pooling",
            "cls",
            "--normalize",
            "--prefix",
            "bert.",
            "--seed",
            "2",
        ],
        Pooling::Cls,
        true,
        1e-5,
    );
}

#[test]
fn tiny_cls_pooling_not_normalized_f16_weights() {
    check(
        &["--pooling", "cls", "--f16", "--seed", "3"],
        Pooling::Cls,
        false,
        1e-4,
    );
}
