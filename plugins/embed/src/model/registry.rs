//! The one place that decides what serves a folder: config.json's
//! `model_type` -> the architecture file (arch/) that reads it, and its
//! `architectures` (with modules.json) -> the task and the head (heads/),
//! or a refusal naming the model_type or architecture and what is served:
//!
//! - `*ForSequenceClassification` -> a cross-encoder ([`Task::Classify`]:
//!   the family's classifier head, BERT's pairs typed 0 and 1), unless
//!   modules.json pools it as a sentence-transformers bi-encoder (as
//!   SentenceTransformer would load it: an embedder);
//! - `*ForMaskedLM` with a SpladePooling module -> SPLADE ([`Task::Sparse`],
//!   BERT's MLM head); with a Pooling module, an embedder as before; with
//!   neither, refused;
//! - anything else -> sentence embeddings ([`Task::Embed`]).
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
use super::heads::{Head, classifier, splade};
use super::task::Task;

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

/// What serves a folder: the encoder, the head after it, the task.
pub(crate) struct Chosen {
    pub arch: Box<dyn Architecture>,
    pub head: Option<Head>,
    pub task: Task,
}

/// What the folder is, before its weights.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Embed,
    Classify,
    Sparse,
}

/// The kind of model config.json's first architecture and modules.json
/// (when there is one) make of the folder.
fn kind(architecture: &str, modules: Option<&Value>, file: &Path) -> Result<Kind, ModelError> {
    let types = || {
        modules
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|m| m.get("type").and_then(Value::as_str))
    };
    let pools = types().any(|t| t.ends_with(".Pooling"));
    let splade = modules.and_then(splade::splade_pooling).is_some();
    if architecture.ends_with("ForSequenceClassification") && !pools {
        return Ok(Kind::Classify);
    }
    if architecture.ends_with("ForMaskedLM") {
        return match (splade, pools) {
            (true, _) => Ok(Kind::Sparse),
            (false, true) => Ok(Kind::Embed),
            (false, false) => Err(ModelError::new(
                file,
                format!(
                    "architecture {architecture} is a masked-LM without SpladePooling in \
                     modules.json: served are embedders (modules.json with Pooling), \
                     cross-encoders (*ForSequenceClassification) and SPLADE (*ForMaskedLM \
                     with SpladePooling)"
                ),
                "use the model's sentence-transformers folder (SparseEncoder.save writes \
                 modules.json with SpladePooling)",
            )),
        };
    }
    if splade {
        let what = if architecture.is_empty() {
            "no architectures".to_string()
        } else {
            format!("architecture {architecture}")
        };
        return Err(ModelError::new(
            file,
            format!(
                "modules.json has SpladePooling, but config.json names {what}, not a *ForMaskedLM"
            ),
            "use the SPLADE model's own config.json (BertForMaskedLM)",
        ));
    }
    Ok(Kind::Embed)
}

/// The encoder, head and task of the folder `dir`, from its config.json
/// and modules.json.
pub(crate) fn choose(dir: &Path) -> Result<Chosen, ModelError> {
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
    let architecture = first_architecture(&v).unwrap_or("");
    let modules_file = dir.join("modules.json");
    let modules = if modules_file.is_file() {
        Some(read_json(&modules_file)?)
    } else {
        None
    };
    let kind = kind(architecture, modules.as_ref(), &file)?;
    let arch = match model_type {
        "bert" => {
            let mut b = bert::bert(&v, &file)?;
            b.pair_types = kind == Kind::Classify;
            boxed(b)
        }
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
    let (head, task) = match kind {
        Kind::Embed => (None, Task::Embed),
        Kind::Classify => {
            let spec = classifier::spec(model_type, architecture, &v, &file)?;
            let labels = spec.labels.clone();
            (Some(Head::Classifier(spec)), Task::Classify { labels })
        }
        Kind::Sparse => {
            if model_type != "bert" {
                return Err(ModelError::new(
                    &file,
                    format!(
                        "architecture {architecture} (model_type \"{model_type}\") as SPLADE: \
                         the sparse head is served for BertForMaskedLM only"
                    ),
                    "use a BERT SPLADE model (naver/splade-*, or a SparseEncoder on BERT)",
                ));
            }
            let dims = arch.dims();
            let modules = modules.unwrap_or(Value::Null);
            let spec = splade::spec(dir, &modules, &v, &file, dims.hidden, dims.vocab)?;
            (Some(Head::Splade(spec)), Task::Sparse)
        }
    };
    Ok(Chosen { arch, head, task })
}

/// config.json's first `architectures` entry.
fn first_architecture(v: &Value) -> Option<&str> {
    v.get("architectures")
        .and_then(Value::as_array)
        .and_then(|a| a.first())
        .and_then(Value::as_str)
}

fn boxed(arch: impl Architecture + 'static) -> Box<dyn Architecture> {
    Box::new(arch)
}

/// Why config.json's model needs its own code, naming its architecture:
/// a model_type transformers does not have, or an `auto_map` that points
/// AutoModel at the model's own files.
fn remote_code(v: &Value, model_type: &str) -> Option<String> {
    let architecture = first_architecture(v);
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_task_comes_from_the_architecture_and_modules() {
        let f = Path::new("config.json");
        let pooled = json!([{"type": "sentence_transformers.models.Transformer"},
                            {"type": "sentence_transformers.models.Pooling", "path": "1_Pooling"}]);
        let splade = json!([{"type": "sentence_transformers.sparse_encoder.models.MLMTransformer"},
                            {"type": "sentence_transformers.sparse_encoder.models.SpladePooling",
                             "path": "1_SpladePooling"}]);
        let seq = "XLMRobertaForSequenceClassification";
        assert_eq!(kind(seq, None, f).unwrap(), Kind::Classify);
        assert_eq!(kind(seq, Some(&pooled), f).unwrap(), Kind::Embed);
        assert_eq!(
            kind("BertForMaskedLM", Some(&splade), f).unwrap(),
            Kind::Sparse
        );
        assert_eq!(
            kind("BertForMaskedLM", Some(&pooled), f).unwrap(),
            Kind::Embed
        );
        assert_eq!(kind("BertModel", Some(&pooled), f).unwrap(), Kind::Embed);
        assert_eq!(kind("", None, f).unwrap(), Kind::Embed);
        let e = kind("BertForMaskedLM", None, f).unwrap_err();
        assert!(
            e.message.contains("BertForMaskedLM") && e.message.contains("SpladePooling"),
            "{e}"
        );
        let e = kind("BertModel", Some(&splade), f).unwrap_err();
        assert!(
            e.message
                .contains("architecture BertModel, not a *ForMaskedLM"),
            "{e}"
        );
    }
}
