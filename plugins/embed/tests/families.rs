//! Encoder families beyond BERT (issue #51): the tiny folders of
//! tests/data/families (random models made once with transformers, their
//! own tokenizers, reference.json from sentence-transformers in float32)
//! loaded as they are, every reference sentence embedded alone and all of
//! them in one batch, normalized and not, on 1 and 2 threads, against the
//! reference (cosine >= 0.9999 and a small max abs difference), token ids
//! as the reference's; sentence-transformers 6's folder layout read as the
//! classic one; unsupported and trust_remote_code model_types refused
//! naming themselves and what is served.

use std::path::{Path, PathBuf};

use m0_embed::model::{LoadOptions, Model, ModelError, Pooling, SUPPORTED_MODEL_TYPES};

use crate::common::{TempDir, copy_dir, cosine, id_rows, max_abs_diff, rows, strings, venv};

struct Reference {
    model_type: String,
    pooling: Pooling,
    normalize: bool,
    sentences: Vec<String>,
    ids: Vec<Vec<u32>>,
    embeddings: Vec<Vec<f32>>,
    unnormalized: Vec<Vec<f32>>,
}

fn folder(family: &str) -> PathBuf {
    venv::repo().join("tests/data/families").join(family)
}

fn reference(dir: &Path) -> Reference {
    let path = dir.join("reference.json");
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    Reference {
        model_type: v["model_type"].as_str().unwrap().to_owned(),
        pooling: match v["pooling"].as_str().unwrap() {
            "mean" => Pooling::Mean,
            "cls" => Pooling::Cls,
            other => panic!("pooling {other}"),
        },
        normalize: v["normalize"].as_bool().unwrap(),
        sentences: strings(&v["sentences"]),
        ids: id_rows(&v["ids"]),
        embeddings: rows(&v["embeddings"]),
        unnormalized: rows(&v["unnormalized"]),
    }
}

/// Loads `dir` with its packed cache in `cache` (never beside the
/// checked-in weights).
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

/// The worst cosine and largest difference seen, for the report.
struct Worst {
    cosine: f64,
    diff: f32,
}

impl Worst {
    fn check(&mut self, got: &[f32], want: &[f32], what: &str) {
        let c = cosine(got, want);
        let d = max_abs_diff(got, want);
        let scale = want.iter().fold(0f32, |m, x| m.max(x.abs()));
        assert!(
            c >= 0.9999 && d <= 2e-5 * scale.max(1.0),
            "{what}: cosine {c}, max diff {d}"
        );
        self.cosine = self.cosine.min(c);
        self.diff = self.diff.max(d);
    }
}

/// Every reference sentence of `dir`, alone and in one batch, normalized
/// and not, on 1 and 2 threads.
fn matches_reference(family: &str, dir: &Path) {
    let r = reference(dir);
    let cache = TempDir::new("families-cache");
    let mut worst = Worst {
        cosine: 1.0,
        diff: 0.0,
    };
    for threads in [1, 2] {
        let m = load(dir, cache.path(), threads).unwrap_or_else(|e| panic!("{family}: {e}"));
        let info = m.info();
        assert_eq!(info.architecture, r.model_type, "{family}");
        assert_eq!(
            (info.dim, info.hidden, info.max_len),
            (32, 32, 40),
            "{family}"
        );
        assert_eq!(info.pooling, r.pooling, "{family}");
        assert_eq!(info.normalize, r.normalize, "{family}");
        if threads > 1 {
            assert_eq!(info.weights_built, None, "{family}: the cache is reused");
        }
        let texts: Vec<&str> = r.sentences.iter().map(String::as_str).collect();
        let enc = m.tokenize(&texts, true).unwrap();
        for (i, e) in enc.iter().enumerate() {
            assert_eq!(
                e.ids(),
                r.ids[i].as_slice(),
                "{family}: ids of {:?}",
                r.sentences[i]
            );
        }
        let dim = info.dim;
        let batch = m.embed(&enc, true);
        let raw = m.embed(&enc, false);
        for (i, e) in enc.iter().enumerate() {
            let what = format!("{family} threads {threads} sentence {i}");
            let one = m.embed(std::slice::from_ref(e), true);
            worst.check(&one, &r.embeddings[i], &format!("{what} alone"));
            let one = m.embed(std::slice::from_ref(e), false);
            worst.check(&one, &r.unnormalized[i], &format!("{what} alone, raw"));
            let row = i * dim..(i + 1) * dim;
            worst.check(
                &batch[row.clone()],
                &r.embeddings[i],
                &format!("{what} in the batch"),
            );
            worst.check(
                &raw[row],
                &r.unnormalized[i],
                &format!("{what} in the batch, raw"),
            );
        }
        if r.pooling == Pooling::Cls {
            // CLS pooling skips the last layer's work on the other tokens:
            // what it gives is still the whole pass's first token state.
            let states = m.token_states(&enc);
            let mut row = 0;
            for (i, e) in enc.iter().enumerate() {
                let first = &states[row * dim..(row + 1) * dim];
                let got = &raw[i * dim..(i + 1) * dim];
                let d = max_abs_diff(got, first);
                assert!(
                    d <= 1e-5,
                    "{family} threads {threads} sentence {i}: CLS pooling {d} off the whole pass"
                );
                row += e.tokens().min(info.max_len);
            }
        }
    }
    eprintln!(
        "{family}: {} sentences, worst cosine 1 - {:.1e}, max abs diff {:e}",
        r.sentences.len(),
        1.0 - worst.cosine,
        worst.diff
    );
}

#[test]
fn xlm_roberta_matches_sentence_transformers() {
    matches_reference("xlm_roberta", &folder("xlm_roberta"));
}

#[test]
fn roberta_matches_sentence_transformers() {
    matches_reference("roberta", &folder("roberta"));
}

#[test]
fn camembert_matches_sentence_transformers() {
    matches_reference("camembert", &folder("camembert"));
}

#[test]
fn distilbert_matches_sentence_transformers() {
    matches_reference("distilbert", &folder("distilbert"));
}

#[test]
fn mpnet_matches_sentence_transformers() {
    matches_reference("mpnet", &folder("mpnet"));
}

#[test]
fn modernbert_matches_sentence_transformers() {
    matches_reference("modernbert", &folder("modernbert"));
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// A classic folder rewritten as sentence-transformers 6.3 saves one
/// (modules typed `sentence_transformers.base.modules...`, `"pooling_mode":
/// "cls"`, no max_seq_length: tokenizer_config.json's model_max_length
/// says 40, a 2_Normalize folder) serves the same vectors.
#[test]
fn the_sentence_transformers_6_layout_reads_as_the_classic_one() {
    for family in ["roberta", "distilbert"] {
        let dir = TempDir::new("st6");
        copy_dir(&folder(family), dir.path());
        let d = dir.path();
        let r = reference(d);
        let mut modules = serde_json::json!([
            {"idx": 0, "name": "0", "path": "",
             "type": "sentence_transformers.base.modules.transformer.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling",
             "type": "sentence_transformers.sentence_transformer.modules.pooling.Pooling"},
        ]);
        if r.normalize {
            modules.as_array_mut().unwrap().push(serde_json::json!(
                {"idx": 2, "name": "2", "path": "2_Normalize",
                 "type": "sentence_transformers.base.modules.normalize.Normalize"}
            ));
            std::fs::create_dir_all(d.join("2_Normalize")).unwrap();
            std::fs::write(d.join("2_Normalize/config.json"), "{}").unwrap();
        }
        std::fs::write(d.join("modules.json"), modules.to_string()).unwrap();
        std::fs::write(
            d.join("1_Pooling/config.json"),
            serde_json::json!({
                "embedding_dimension": 32,
                "pooling_mode": if r.pooling == Pooling::Cls { "cls" } else { "mean" },
                "include_prompt": true,
            })
            .to_string(),
        )
        .unwrap();
        std::fs::write(
            d.join("sentence_bert_config.json"),
            r#"{"transformer_task": "feature-extraction", "module_output_name": "token_embeddings"}"#,
        )
        .unwrap();
        edit_json(&d.join("tokenizer_config.json"), |v| {
            v["model_max_length"] = 40.into()
        });
        matches_reference(&format!("{family} (st6)"), d);
    }
}

/// A copy of the xlm_roberta folder whose config.json `edit` changes must
/// be refused naming config.json and saying each of `says`.
fn refused(edit: impl FnOnce(&mut serde_json::Value), says: &[&str]) -> ModelError {
    let dir = TempDir::new("families-bad");
    copy_dir(&folder("xlm_roberta"), dir.path());
    edit_json(&dir.path().join("config.json"), edit);
    let cache = TempDir::new("families-bad-cache");
    let e = load(dir.path(), cache.path(), 1).expect_err("an unsupported folder loaded");
    assert_eq!(e.file, dir.path().join("config.json"), "{e}");
    for s in says {
        assert!(e.message.contains(s), "{e} does not say {s}");
    }
    assert!(!e.fix.is_empty(), "{e}");
    e
}

#[test]
fn unsupported_and_remote_code_model_types_are_refused_naming_them_and_the_supported_ones() {
    let mut every: Vec<&str> = SUPPORTED_MODEL_TYPES.to_vec();
    for t in [
        "bert",
        "roberta",
        "xlm-roberta",
        "camembert",
        "distilbert",
        "mpnet",
        "modernbert",
    ] {
        assert!(every.contains(&t), "{t} is served");
    }
    every.push("model_type is \"t5\"");
    refused(|v| v["model_type"] = "t5".into(), &every);
    let mut remote: Vec<&str> = SUPPORTED_MODEL_TYPES.to_vec();
    remote.extend(["\"nomic_bert\"", "trust_remote_code"]);
    refused(
        |v| {
            v["model_type"] = "nomic_bert".into();
            v["architectures"] = serde_json::json!(["NomicBertModel"]);
        },
        &remote,
    );
    let e = refused(
        |v| {
            v["model_type"] = "new".into();
            v["auto_map"] =
                serde_json::json!({"AutoModel": "Alibaba-NLP/new-impl--modeling.NewModel"});
        },
        &["\"new\"", "trust_remote_code", "modeling.NewModel"],
    );
    assert!(e.message.contains("xlm-roberta"), "{e}");
    // A known model_type with custom code in auto_map is not run as ours.
    refused(
        |v| {
            v["auto_map"] = serde_json::json!({"AutoModel": "custom.modeling.XLMRobertaFlash"});
        },
        &["trust_remote_code", "XLMRobertaFlash"],
    );
    let e = refused(
        |v| {
            v.as_object_mut().unwrap().remove("model_type");
        },
        &["model_type is missing"],
    );
    assert!(e.message.contains("distilbert"), "{e}");
}

/// RoBERTa's positions start past padding's: a folder whose position
/// table is two rows short of max_seq_length + 2 cannot take 40 tokens.
#[test]
fn roberta_takes_max_position_embeddings_less_two_tokens() {
    let dir = TempDir::new("families-pos");
    copy_dir(&folder("xlm_roberta"), dir.path());
    let cache = TempDir::new("families-pos-cache");
    let m = load(dir.path(), cache.path(), 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.info().max_len, 40);
    // Without sentence_bert_config.json's 40 and the tokenizer's 512: the
    // table's 42 rows, less the two of padding.
    std::fs::remove_file(dir.path().join("sentence_bert_config.json")).unwrap();
    edit_json(&dir.path().join("tokenizer_config.json"), |v| {
        v.as_object_mut().unwrap().remove("model_max_length");
    });
    let m = load(dir.path(), cache.path(), 1).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(m.info().max_len, 40);
}
