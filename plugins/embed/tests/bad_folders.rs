//! Folders the model refuses: each error names the file at fault.

use std::path::Path;

use m0_embed::model::{LoadOptions, Model, ModelError};

use crate::common::{TempDir, copy_dir, tiny_bert};

fn load(dir: &Path) -> Result<Model, ModelError> {
    Model::load(dir, LoadOptions::default())
}

/// A copy of a good tiny folder, changed by `edit`, must fail naming `file`
/// (relative to the folder) with a message containing `says`.
fn refused(good: &Path, file: &str, says: &str, edit: impl FnOnce(&Path)) {
    let dir = TempDir::new("bad");
    copy_dir(good, dir.path());
    edit(dir.path());
    let e = load(dir.path()).expect_err(&format!("a folder with a bad {file} loaded"));
    assert_eq!(e.file, dir.path().join(file), "{e}");
    assert!(e.message.contains(says), "{e}");
    assert!(!e.fix.is_empty(), "{e}");
    assert!(e.to_string().contains(file), "{e}");
}

fn edit_json(path: &Path, f: impl FnOnce(&mut serde_json::Value)) {
    let mut v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(path, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

#[test]
fn missing_files_are_named() {
    let good = tiny_bert(&["--normalize"]);
    load(good.path()).expect("the good folder loads");
    for file in [
        "config.json",
        "model.safetensors",
        "tokenizer.json",
        "modules.json",
        "1_Pooling/config.json",
    ] {
        refused(good.path(), file, "missing", |d| {
            std::fs::remove_file(d.join(file)).unwrap()
        });
    }
    let e = load(&good.path().join("nowhere")).unwrap_err();
    assert_eq!(e.file, good.path().join("nowhere"));
}

#[test]
fn other_architectures_are_refused() {
    let good = tiny_bert(&[]);
    refused(good.path(), "config.json", "model_type is \"gpt2\"", |d| {
        edit_json(&d.join("config.json"), |v| v["model_type"] = "gpt2".into())
    });
    refused(good.path(), "config.json", "model_type", |d| {
        edit_json(&d.join("config.json"), |v| {
            v.as_object_mut().unwrap().remove("model_type");
        })
    });
    refused(good.path(), "config.json", "hidden_act", |d| {
        edit_json(&d.join("config.json"), |v| v["hidden_act"] = "swish".into())
    });
    refused(good.path(), "config.json", "position_embedding_type", |d| {
        edit_json(&d.join("config.json"), |v| {
            v["position_embedding_type"] = "relative_key".into()
        })
    });
    refused(good.path(), "modules.json", "Dense", |d| {
        edit_json(&d.join("modules.json"), |v| {
            v.as_array_mut().unwrap().insert(
                2,
                serde_json::json!({"idx": 2, "name": "2", "path": "2_Dense",
                    "type": "sentence_transformers.models.Dense"}),
            )
        })
    });
    refused(good.path(), "1_Pooling/config.json", "more than one", |d| {
        edit_json(&d.join("1_Pooling/config.json"), |v| {
            v["pooling_mode_cls_token"] = true.into()
        })
    });
}

#[test]
fn shapes_that_disagree_with_config_are_refused() {
    let good = tiny_bert(&["--prefix", "bert."]);
    refused(
        good.path(),
        "model.safetensors",
        "bert.embeddings.token_type_embeddings.weight has shape [2, 32], config.json implies [2, 64]",
        |d| edit_json(&d.join("config.json"), |v| v["hidden_size"] = 64.into()),
    );
    refused(
        good.path(),
        "model.safetensors",
        "intermediate.dense.weight has shape",
        |d| {
            edit_json(&d.join("config.json"), |v| {
                v["intermediate_size"] = 96.into()
            })
        },
    );
    refused(good.path(), "model.safetensors", "encoder.layer.2", |d| {
        edit_json(&d.join("config.json"), |v| {
            v["num_hidden_layers"] = 3.into()
        })
    });
    refused(good.path(), "config.json", "not a multiple", |d| {
        edit_json(&d.join("config.json"), |v| {
            v["num_attention_heads"] = 5.into()
        })
    });
    refused(
        good.path(),
        "1_Pooling/config.json",
        "word_embedding_dimension",
        |d| {
            edit_json(&d.join("1_Pooling/config.json"), |v| {
                v["word_embedding_dimension"] = 384.into()
            })
        },
    );
    refused(good.path(), "tokenizer.json", "vocab_size", |d| {
        edit_json(&d.join("config.json"), |v| v["vocab_size"] = 10.into())
    });
}

#[test]
fn damaged_files_are_refused() {
    let good = tiny_bert(&[]);
    refused(good.path(), "model.safetensors", "runs past", |d| {
        let p = d.join("model.safetensors");
        let data = std::fs::read(&p).unwrap();
        std::fs::write(&p, &data[..100]).unwrap();
    });
    refused(good.path(), "model.safetensors", "do not fit", |d| {
        let p = d.join("model.safetensors");
        let data = std::fs::read(&p).unwrap();
        std::fs::write(&p, &data[..data.len() - 4]).unwrap();
    });
    refused(good.path(), "config.json", "not valid JSON", |d| {
        std::fs::write(d.join("config.json"), "{ not json").unwrap()
    });
    refused(good.path(), "tokenizer.json", "tokenizer", |d| {
        std::fs::write(d.join("tokenizer.json"), "{}").unwrap()
    });
}
