//! Cross-encoders and SPLADE (issue #52): the tiny folders of
//! tests/data/tasks (random models made once with transformers, the
//! families' tokenizers, reference.json from sentence-transformers'
//! CrossEncoder and SparseEncoder in float32) loaded as they are. Every
//! pair's logits alone and in one packed batch (pairs of every length,
//! truncated ones included, mixed with single texts for classifiers), and
//! every sentence's sparse vector alone and in one batch, on 1 and 2
//! threads, against the reference; token ids (and BERT's token type
//! boundary) as the reference's; the folders' task, labels and refusals.

use std::path::{Path, PathBuf};

use m0_embed::model::{Encoded, LoadOptions, Model, ModelError, Task, TokenizeError};

use crate::common::{TempDir, copy_dir, id_rows, rows, strings, venv};

fn folder(name: &str) -> PathBuf {
    venv::repo().join("tests/data/tasks").join(name)
}

fn read(dir: &Path) -> serde_json::Value {
    let path = dir.join("reference.json");
    serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap()
}

fn load(dir: &Path, cache: &Path, threads: usize) -> Result<Model, ModelError> {
    Model::load(
        dir,
        LoadOptions {
            threads,
            cache_dir: Some(cache.to_path_buf()),
            ..LoadOptions::default()
        },
    )
}

/// The largest difference seen, for the report; each value within 1e-4
/// of the reference, relative to its size (absolute below 1).
#[derive(Default)]
struct Worst(f32);

impl Worst {
    fn check(&mut self, got: &[f32], want: &[f32], what: &str) {
        assert_eq!(got.len(), want.len(), "{what}: lengths");
        for (g, w) in got.iter().zip(want) {
            let d = (g - w).abs();
            assert!(
                d <= 1e-4 * w.abs().max(1.0),
                "{what}: {got:?} vs the reference {want:?}"
            );
            self.0 = self.0.max(d);
        }
    }
}

fn pairs(v: &serde_json::Value) -> Vec<(String, String)> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p[0].as_str().unwrap().to_owned(),
                p[1].as_str().unwrap().to_owned(),
            )
        })
        .collect()
}

/// Every pair and single text of a cross-encoder folder, alone and in
/// batches, on 1 and 2 threads.
fn cross_encoder_matches_reference(name: &str) {
    let dir = folder(name);
    let r = read(&dir);
    let labels = strings(&r["labels"]);
    let pairs = pairs(&r["pairs"]);
    let tokens = id_rows(&r["tokens"]);
    let second: Vec<usize> = r["second"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as usize)
        .collect();
    let logits = rows(&r["logits"]);
    let singles = strings(&r["singles"]);
    let single_tokens = id_rows(&r["single_tokens"]);
    let single_logits = rows(&r["single_logits"]);
    let n = labels.len();
    let cache = TempDir::new("tasks-cache");
    let mut worst = Worst::default();
    for threads in [1, 2] {
        let m = load(&dir, cache.path(), threads).unwrap_or_else(|e| panic!("{name}: {e}"));
        let info = m.info();
        assert_eq!(
            info.task,
            Task::Classify {
                labels: labels.clone()
            },
            "{name}"
        );
        assert_eq!(info.task.kind(), r["task"].as_str().unwrap(), "{name}");
        assert_eq!(info.architecture, r["model_type"].as_str().unwrap());
        assert_eq!(info.max_len, r["max_length"].as_u64().unwrap() as usize);
        let refs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (&a[..], &b[..])).collect();
        let enc = m.tokenizer().tokenize_pairs(&refs, true).unwrap();
        for (i, e) in enc.iter().enumerate() {
            assert_eq!(e.ids(), tokens[i].as_slice(), "{name}: ids of pair {i}");
            // Only BERT reads token types; the other families' tokenizers
            // may type the second text 1 all the same (WordPiece's).
            if info.architecture == "bert" {
                assert_eq!(e.second(), second[i], "{name}: type 1 of pair {i}");
            }
        }
        let single_refs: Vec<&str> = singles.iter().map(String::as_str).collect();
        let single_enc = m.tokenize(&single_refs, true).unwrap();
        for (i, e) in single_enc.iter().enumerate() {
            assert_eq!(e.ids(), single_tokens[i].as_slice(), "{name}: ids of {i}");
        }
        let what = |i: usize, how: &str| format!("{name} threads {threads}: pair {i} {how}");
        for (i, e) in enc.iter().enumerate() {
            let one = m.classify(std::slice::from_ref(e));
            worst.check(&one, &logits[i], &what(i, "alone"));
        }
        let batch = m.classify(&enc);
        for i in 0..enc.len() {
            worst.check(
                &batch[i * n..(i + 1) * n],
                &logits[i],
                &what(i, "in the batch"),
            );
        }
        for (i, e) in single_enc.iter().enumerate() {
            let one = m.classify(std::slice::from_ref(e));
            worst.check(&one, &single_logits[i], &format!("{name}: single {i}"));
        }
        // Pairs and single texts in one pass, interleaved.
        let mut mixed: Vec<Encoded> = Vec::new();
        let mut want: Vec<&[f32]> = Vec::new();
        for i in 0..enc.len().max(single_enc.len()) {
            if let Some(e) = enc.get(i) {
                mixed.push(e.clone());
                want.push(&logits[i]);
            }
            if let Some(e) = single_enc.get(i) {
                mixed.push(e.clone());
                want.push(&single_logits[i]);
            }
        }
        let got = m.classify(&mixed);
        assert_eq!(got.len(), mixed.len() * n);
        for (i, w) in want.iter().enumerate() {
            worst.check(&got[i * n..(i + 1) * n], w, &format!("{name}: mixed {i}"));
        }
        assert!(m.classify(&[]).is_empty());
    }
    eprintln!(
        "{name}: {} pairs, {} singles, {n} labels: max abs diff {:e}",
        pairs.len(),
        singles.len(),
        worst.0
    );
}

#[test]
fn bert_reranker_matches_cross_encoder() {
    cross_encoder_matches_reference("bert_reranker");
}

#[test]
fn bert_classifier_matches_cross_encoder() {
    cross_encoder_matches_reference("bert_classifier");
}

#[test]
fn xlm_roberta_reranker_matches_cross_encoder() {
    cross_encoder_matches_reference("xlm_roberta_reranker");
}

#[test]
fn distilbert_classifier_matches_cross_encoder() {
    cross_encoder_matches_reference("distilbert_classifier");
}

#[test]
fn modernbert_reranker_matches_cross_encoder() {
    cross_encoder_matches_reference("modernbert_reranker");
}

#[test]
fn mpnet_reranker_matches_cross_encoder() {
    cross_encoder_matches_reference("mpnet_reranker");
}

/// Without truncation an over-long pair is refused, naming it; with it,
/// the pair is cut to max_len, longest text first.
#[test]
fn over_long_pairs_are_refused_or_cut_longest_first() {
    let dir = folder("bert_reranker");
    let r = read(&dir);
    let pairs = pairs(&r["pairs"]);
    let cache = TempDir::new("tasks-cache");
    let m = load(&dir, cache.path(), 1).unwrap();
    let refs: Vec<(&str, &str)> = pairs.iter().map(|(a, b)| (&a[..], &b[..])).collect();
    let long = refs
        .iter()
        .position(|(a, b)| m.tokenizer().tokenize_pairs(&[(a, b)], false).is_err())
        .expect("a pair past max_len");
    match m.tokenizer().tokenize_pairs(&refs, false) {
        Err(TokenizeError::TooLong(t)) => {
            assert_eq!((t.index, t.max), (long, 40));
            assert!(t.tokens > 40);
        }
        other => panic!("{other:?}"),
    }
    let cut = m.tokenizer().tokenize_pairs(&refs, true).unwrap();
    assert!(cut.iter().all(|e| e.tokens() <= 40));
    assert_eq!(cut[long].tokens(), 40);
}

/// A sparse vector against the reference's: the same indices (save
/// values under 1e-5, which rounding may put on either side of zero),
/// values within 1e-4 relative.
fn check_sparse(got: &[(u32, f32)], want: &[(u32, f32)], worst: &mut Worst, what: &str) {
    assert!(
        got.windows(2).all(|w| w[0].0 < w[1].0),
        "{what}: indices ascend"
    );
    assert!(got.iter().all(|&(_, v)| v > 0.0), "{what}: nonzero only");
    let find = |v: &[(u32, f32)], j: u32| v.iter().find(|e| e.0 == j).map_or(0.0, |e| e.1);
    for &(j, w) in want {
        let g = find(got, j);
        assert!(g > 0.0 || w < 1e-5, "{what}: index {j} missing ({w})");
        worst.check(&[g], &[w], &format!("{what}: index {j}"));
    }
    for &(j, g) in got {
        if want.iter().all(|e| e.0 != j) {
            assert!(g < 1e-5, "{what}: index {j} ({g}) not in the reference");
        }
    }
}

#[test]
fn splade_matches_sparse_encoder() {
    let dir = folder("splade");
    let r = read(&dir);
    let sentences = strings(&r["sentences"]);
    let tokens = id_rows(&r["tokens"]);
    let vectors: Vec<Vec<(u32, f32)>> = r["vectors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| {
            v.as_array()
                .unwrap()
                .iter()
                .map(|e| (e[0].as_u64().unwrap() as u32, e[1].as_f64().unwrap() as f32))
                .collect()
        })
        .collect();
    let cache = TempDir::new("tasks-cache");
    let mut worst = Worst::default();
    for threads in [1, 2] {
        let m = load(&dir, cache.path(), threads).unwrap();
        assert_eq!(m.info().task, Task::Sparse);
        assert_eq!(m.info().task.kind(), "sparse");
        assert_eq!(m.info().vocab, r["vocab"].as_u64().unwrap() as usize);
        let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
        let enc = m.tokenize(&texts, true).unwrap();
        for (i, e) in enc.iter().enumerate() {
            assert_eq!(e.ids(), tokens[i].as_slice(), "ids of {:?}", sentences[i]);
        }
        let batch = m.sparse(&enc);
        assert_eq!(batch.len(), enc.len());
        for (i, e) in enc.iter().enumerate() {
            let what = format!("threads {threads} sentence {i}");
            let one = m.sparse(std::slice::from_ref(e));
            check_sparse(&one[0], &vectors[i], &mut worst, &format!("{what} alone"));
            check_sparse(
                &batch[i],
                &vectors[i],
                &mut worst,
                &format!("{what} in the batch"),
            );
        }
        assert!(m.sparse(&[]).is_empty());
    }
    eprintln!(
        "splade: {} sentences, {} entries, max abs diff {:e}",
        sentences.len(),
        vectors.iter().map(Vec::len).sum::<usize>(),
        worst.0
    );
}

/// Embedders stay embedders: the families' folders, and a cross-encoder
/// folder that modules.json pools (as SentenceTransformer loads it).
#[test]
fn embedders_keep_their_task() {
    let cache = TempDir::new("tasks-cache");
    let m = load(
        &venv::repo().join("tests/data/families/xlm_roberta"),
        cache.path(),
        1,
    )
    .unwrap();
    assert_eq!(m.info().task, Task::Embed);
    let dir = TempDir::new("pooled-classifier");
    copy_dir(&folder("bert_reranker"), dir.path());
    let modules = serde_json::json!([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}
    ]);
    std::fs::write(dir.path().join("modules.json"), modules.to_string()).unwrap();
    std::fs::create_dir_all(dir.path().join("1_Pooling")).unwrap();
    std::fs::write(
        dir.path().join("1_Pooling/config.json"),
        r#"{"word_embedding_dimension": 32, "pooling_mode_mean_tokens": true}"#,
    )
    .unwrap();
    let m = load(dir.path(), cache.path(), 1).unwrap();
    assert_eq!(m.info().task, Task::Embed);
    assert_eq!(
        m.embed(&m.tokenize(&["hello"], true).unwrap(), true).len(),
        32
    );
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// What cannot be served is refused at load, naming the file, the
/// architecture or field, and what is served.
#[test]
fn unservable_task_models_are_refused() {
    let cache = TempDir::new("tasks-cache");
    let refused = |name: &str, edit: &dyn Fn(&Path), words: &[&str]| {
        let dir = TempDir::new("refused");
        copy_dir(&folder(name), dir.path());
        edit(dir.path());
        let e = load(dir.path(), cache.path(), 1).expect_err(name);
        let text = e.to_string();
        for w in words {
            assert!(text.contains(w), "{name}: {w:?} not in {text}");
        }
    };
    refused(
        "bert_classifier",
        &|d| {
            edit_json(&d.join("config.json"), |v| {
                v["problem_type"] = "multi_label_classification".into()
            })
        },
        &["config.json", "multi_label_classification", "softmax"],
    );
    refused(
        "splade",
        &|d| {
            edit_json(&d.join("1_SpladePooling/config.json"), |v| {
                v["pooling_strategy"] = "mean".into()
            })
        },
        &[
            "1_SpladePooling/config.json",
            "\"mean\"",
            "\"max\" and \"sum\"",
        ],
    );
    refused(
        "splade",
        &|d| std::fs::remove_file(d.join("modules.json")).unwrap(),
        &["BertForMaskedLM", "SpladePooling"],
    );
    refused(
        "splade",
        &|d| {
            edit_json(&d.join("1_SpladePooling/config.json"), |v| {
                v["word_embedding_dimension"] = 7.into()
            })
        },
        &["word_embedding_dimension is 7", "vocab_size"],
    );
    refused(
        "bert_reranker",
        &|d| std::fs::remove_file(d.join("model.safetensors")).unwrap(),
        &["model.safetensors"],
    );
}
