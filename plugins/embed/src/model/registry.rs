//! The one place that decides what serves a folder: config.json's
//! `model_type` -> the architecture file (arch/) that reads it, or a
//! refusal naming the model_type and what is served. (The task is
//! sentence embeddings for every architecture today; classifiers and
//! rerankers will be chosen here too.)
//!
//! Models whose modeling code ships with the model (`trust_remote_code`:
//! nomic-bert, Alibaba's `new` GTE, jina-bert...) are refused naming their
//! architecture: their forward pass is not transformers', so no file here
//! can claim to match it, even when the model_type says `bert`.

use std::path::Path;

use serde_json::Value;

use super::arch::{Architecture, bert, distilbert, modernbert, mpnet, roberta};
use super::config::{field_str, read_json};
use super::error::ModelError;

/// The model_types served, in the order refusals list them.
pub const SUPPORTED: &[&str] = &[
    "bert",
    "roberta",
    "xlm-roberta",
    "camembert",
    "distilbert",
    "mpnet",
    "modernbert",
];

/// model_types known to need their own modeling code.
const REMOTE_CODE: &[&str] = &["nomic_bert", "new", "jina_bert", "gte", "bert_flash"];

fn supported() -> String {
    SUPPORTED.join(", ")
}

/// The architecture of the folder `dir`, from its config.json.
pub(crate) fn architecture(dir: &Path) -> Result<Box<dyn Architecture>, ModelError> {
    let file = dir.join("config.json");
    let v = read_json(&file)?;
    let model_type = field_str(&v, "model_type").unwrap_or("");
    if let Some(code) = remote_code(&v, model_type) {
        return Err(ModelError::new(
            &file,
            format!(
                "model_type \"{model_type}\" ({code}) needs trust_remote_code: its modeling \
                 code ships with the model, not with transformers; this server runs {}",
                supported()
            ),
            "use a model of a supported architecture",
        ));
    }
    let arch = match model_type {
        "bert" => boxed(bert::bert(&v, &file)?),
        "distilbert" => boxed(distilbert::distilbert(&v, &file)?),
        "mpnet" => boxed(mpnet::mpnet(&v, &file)?),
        "modernbert" => boxed(modernbert::modernbert(&v, &file)?),
        t => match roberta::MODEL_TYPES.iter().find(|&&r| r == t) {
            Some(&t) => boxed(roberta::roberta(&v, &file, t)?),
            None => {
                let what = if model_type.is_empty() {
                    "model_type is missing".to_string()
                } else {
                    format!("model_type is \"{model_type}\"")
                };
                return Err(ModelError::new(
                    &file,
                    format!("{what}; this server runs the model_types {}", supported()),
                    "use a sentence-transformers model of a supported architecture, such as \
                     all-MiniLM-L6-v2 (bert) or multilingual-e5-small (xlm-roberta)",
                ));
            }
        },
    };
    Ok(arch)
}

fn boxed(arch: impl Architecture + 'static) -> Box<dyn Architecture> {
    Box::new(arch)
}

/// Why config.json's model needs its own code, naming its architecture:
/// a model_type transformers does not have, or an `auto_map` that points
/// AutoModel at the model's own files.
fn remote_code(v: &Value, model_type: &str) -> Option<String> {
    let architecture = v
        .get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str);
    let auto_model = v
        .get("auto_map")
        .and_then(|m| m.get("AutoModel"))
        .and_then(Value::as_str);
    if !REMOTE_CODE.contains(&model_type) && auto_model.is_none() {
        return None;
    }
    Some(match (architecture, auto_model) {
        (_, Some(code)) => format!("AutoModel is {code}"),
        (Some(a), None) => format!("architecture {a}"),
        (None, None) => "custom architecture".to_string(),
    })
}
