//! The folder's sentence-transformers files: `modules.json` (the
//! pipeline), the pooling module's `config.json`, `sentence_bert_config.json`
//! (max_seq_length) and, where that has none, `tokenizer_config.json`
//! (model_max_length); and the helpers that read JSON fields with a
//! refusal naming the file. config.json (the encoder) is the
//! architecture's to read: registry.rs and arch/.
//!
//! Both layouts met in the wild are read: sentence-transformers 2.x-5.x's
//! (`pooling_mode_*_token(s)` booleans, max_seq_length in
//! sentence_bert_config.json) and 6.x's (`"pooling_mode": "mean"`, modules
//! typed `sentence_transformers.base.modules...`, max_seq_length left to
//! the tokenizer's model_max_length).

use super::error::{FIX_REEXPORT, ModelError};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How token vectors become one sentence vector (the pooling module's
/// `config.json`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pooling {
    /// The mean of all token vectors (`pooling_mode_mean_tokens`).
    Mean,
    /// The first token's vector, `[CLS]` (`pooling_mode_cls_token`).
    Cls,
    /// The element-wise maximum over tokens (`pooling_mode_max_tokens`).
    Max,
    /// The sum of token vectors divided by sqrt(token count)
    /// (`pooling_mode_mean_sqrt_len_tokens`).
    MeanSqrtLen,
    /// The last token's vector (`pooling_mode_lasttoken`).
    LastToken,
}

impl Pooling {
    /// The name sentence-transformers gives the mode (`mean`, `cls`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            Pooling::Mean => "mean",
            Pooling::Cls => "cls",
            Pooling::Max => "max",
            Pooling::MeanSqrtLen => "mean_sqrt_len_tokens",
            Pooling::LastToken => "lasttoken",
        }
    }
}

/// What the sentence-transformers files say.
#[derive(Debug, Clone)]
pub(crate) struct PipelineConfig {
    pub pooling: Pooling,
    pub pooling_dim: Option<usize>,
    pub pooling_file: PathBuf,
    pub normalize: bool,
    pub max_seq_length: Option<usize>,
}

pub(crate) fn read_json(path: &Path) -> Result<Value, ModelError> {
    let text = match std::fs::read_to_string(path) {
        Ok(t) => t,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(ModelError::new(
                path,
                "file is missing",
                "point MODEL_DIR at a sentence-transformers folder (config.json, \
                 model.safetensors, tokenizer.json, modules.json, 1_Pooling/config.json, \
                 sentence_bert_config.json)",
            ));
        }
        Err(e) => {
            return Err(ModelError::new(
                path,
                format!("cannot be read: {e}"),
                "make the file readable by the server's user",
            ));
        }
    };
    serde_json::from_str(&text).map_err(|e| {
        ModelError::new(
            path,
            format!("is not valid JSON: {e}"),
            "restore the file from the model's original folder",
        )
    })
}

pub(crate) fn field_usize(v: &Value, key: &str, file: &Path) -> Result<usize, ModelError> {
    match v.get(key) {
        Some(x) => x
            .as_u64()
            .filter(|&n| n > 0 && n <= 1 << 24)
            .map(|n| n as usize)
            .ok_or_else(|| {
                ModelError::new(
                    file,
                    format!("\"{key}\" is {x}, not a positive integer of sane size"),
                    FIX_REEXPORT,
                )
            }),
        None => Err(ModelError::new(
            file,
            format!("\"{key}\" is missing"),
            FIX_REEXPORT,
        )),
    }
}

/// config.json's `key`, a small positive float (a norm's epsilon), or
/// `default` when absent.
pub(crate) fn field_eps(
    v: &Value,
    key: &str,
    default: f32,
    file: &Path,
) -> Result<f32, ModelError> {
    match v.get(key) {
        None => Ok(default),
        Some(x) => match x.as_f64() {
            Some(e) if e > 0.0 && e < 1.0 => Ok(e as f32),
            _ => Err(ModelError::new(
                file,
                format!("{key} is {x}, not a small positive number"),
                FIX_REEXPORT,
            )),
        },
    }
}

/// config.json's `key` as a string, if it is one.
pub(crate) fn field_str<'a>(v: &'a Value, key: &str) -> Option<&'a str> {
    v.get(key).and_then(Value::as_str)
}

fn flag(v: &Value, key: &str) -> bool {
    v.get(key).and_then(Value::as_bool).unwrap_or(false)
}

pub(crate) fn pipeline_config(dir: &Path) -> Result<PipelineConfig, ModelError> {
    let file = dir.join("modules.json");
    let v = read_json(&file)?;
    let Some(modules) = v.as_array() else {
        return Err(ModelError::new(
            &file,
            "is not a JSON array of modules",
            FIX_REEXPORT,
        ));
    };
    let mut pooling_path = None;
    let mut normalize = false;
    for (i, m) in modules.iter().enumerate() {
        let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
        let kind = ty.rsplit('.').next().unwrap_or("");
        let path = m.get("path").and_then(Value::as_str).unwrap_or("");
        match kind {
            "Transformer" if i == 0 && path.is_empty() => {}
            "Transformer" if i == 0 => {
                return Err(ModelError::new(
                    &file,
                    format!(
                        "the Transformer module lives in \"{path}\"; only one at the \
                         folder's root is supported"
                    ),
                    FIX_REEXPORT,
                ));
            }
            "Pooling" if pooling_path.is_none() => pooling_path = Some(path.to_owned()),
            "Normalize" => normalize = true,
            _ => {
                return Err(ModelError::new(
                    &file,
                    format!(
                        "module {i} is \"{ty}\"; only Transformer (first), Pooling and \
                         Normalize are supported"
                    ),
                    "use a model whose pipeline is Transformer, Pooling and optionally Normalize",
                ));
            }
        }
    }
    if modules
        .first()
        .and_then(|m| m.get("type"))
        .and_then(Value::as_str)
        .is_none_or(|t| !t.ends_with("Transformer"))
    {
        return Err(ModelError::new(
            &file,
            "the first module is not a Transformer",
            FIX_REEXPORT,
        ));
    }
    let Some(pooling_path) = pooling_path else {
        return Err(ModelError::new(
            &file,
            "has no Pooling module",
            "add the Pooling module sentence-transformers saved with the model",
        ));
    };
    if pooling_path.is_empty()
        || Path::new(&pooling_path)
            .components()
            .any(|c| !matches!(c, std::path::Component::Normal(_)))
    {
        return Err(ModelError::new(
            &file,
            format!(
                "the Pooling module's path \"{pooling_path}\" is not a folder inside MODEL_DIR"
            ),
            FIX_REEXPORT,
        ));
    }
    let pooling_file = dir.join(&pooling_path).join("config.json");
    let p = read_json(&pooling_file)?;
    let modes = [
        ("pooling_mode_mean_tokens", Pooling::Mean),
        ("pooling_mode_cls_token", Pooling::Cls),
        ("pooling_mode_max_tokens", Pooling::Max),
        ("pooling_mode_mean_sqrt_len_tokens", Pooling::MeanSqrtLen),
        ("pooling_mode_lasttoken", Pooling::LastToken),
    ];
    let mut on: Vec<Pooling> = modes
        .iter()
        .filter(|(k, _)| flag(&p, k))
        .map(|&(_, m)| m)
        .collect();
    // sentence-transformers 6: one "pooling_mode" string (or a list of
    // them, concatenated) in place of the booleans.
    let named: Vec<&str> = match p.get("pooling_mode") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::String(m)) => vec![m.as_str()],
        Some(Value::Array(a)) => a.iter().filter_map(Value::as_str).collect(),
        Some(other) => {
            return Err(ModelError::new(
                &pooling_file,
                format!("pooling_mode is {other}, not a mode's name"),
                FIX_REEXPORT,
            ));
        }
    };
    let mut weighted = flag(&p, "pooling_mode_weightedmean_tokens");
    for m in named {
        let mode = match m {
            "mean" | "mean_tokens" => Pooling::Mean,
            "cls" | "cls_token" => Pooling::Cls,
            "max" | "max_tokens" => Pooling::Max,
            "mean_sqrt_len_tokens" | "mean_sqrt_len" => Pooling::MeanSqrtLen,
            "lasttoken" | "last_token" | "last" => Pooling::LastToken,
            "weightedmean" | "weightedmean_tokens" | "weighted_mean" => {
                weighted = true;
                continue;
            }
            other => {
                return Err(ModelError::new(
                    &pooling_file,
                    format!("pooling_mode \"{other}\" is not one this server knows"),
                    "use a model with mean, cls, max or lasttoken pooling",
                ));
            }
        };
        if !on.contains(&mode) {
            on.push(mode);
        }
    }
    if weighted {
        return Err(ModelError::new(
            &pooling_file,
            "weighted-mean pooling is not supported",
            "use a model with mean, cls, max or lasttoken pooling",
        ));
    }
    let pooling = match on.as_slice() {
        [one] => *one,
        [] => {
            return Err(ModelError::new(
                &pooling_file,
                "no pooling_mode_* is true and no pooling_mode is named",
                "set exactly one pooling mode, as sentence-transformers saved it",
            ));
        }
        _ => {
            return Err(ModelError::new(
                &pooling_file,
                "more than one pooling_mode_* is true (concatenated poolings)",
                "use a model with exactly one pooling mode",
            ));
        }
    };
    // "embedding_dimension" in sentence-transformers 6.
    let dim_key = ["word_embedding_dimension", "embedding_dimension"]
        .into_iter()
        .find(|k| p.get(*k).is_some_and(|v| !v.is_null()));
    let pooling_dim = match dim_key {
        None => None,
        Some(k) => Some(field_usize(&p, k, &pooling_file)?),
    };
    let max_seq_length = max_seq_length(dir)?;
    Ok(PipelineConfig {
        pooling,
        pooling_dim,
        pooling_file,
        normalize,
        max_seq_length,
    })
}

/// The pipeline of a task model without a Pooling module (a cross-encoder,
/// SPLADE, whose heads pool for themselves): `pooling` as the head pools,
/// no Normalize, max_seq_length as [`pipeline_config`] reads it.
pub(crate) fn task_pipeline(dir: &Path, pooling: Pooling) -> Result<PipelineConfig, ModelError> {
    Ok(PipelineConfig {
        pooling,
        pooling_dim: None,
        pooling_file: dir.join("config.json"),
        normalize: false,
        max_seq_length: max_seq_length(dir)?,
    })
}

/// sentence_bert_config.json's max_seq_length, else (as
/// sentence-transformers, and CrossEncoder, which reads only the
/// tokenizer's) tokenizer_config.json's model_max_length when it is a real
/// bound, not transformers' "unbounded" 1e30; the position table caps
/// either after.
fn max_seq_length(dir: &Path) -> Result<Option<usize>, ModelError> {
    let sbert = dir.join("sentence_bert_config.json");
    let max_seq_length = if sbert.exists() {
        let s = read_json(&sbert)?;
        match s.get("max_seq_length") {
            None | Some(Value::Null) => None,
            Some(_) => Some(field_usize(&s, "max_seq_length", &sbert)?),
        }
    } else {
        None
    };
    match max_seq_length {
        Some(n) => Ok(Some(n)),
        None => model_max_length(dir),
    }
}

/// tokenizer_config.json's model_max_length, when the file exists and it
/// is a bound of sane size.
fn model_max_length(dir: &Path) -> Result<Option<usize>, ModelError> {
    let file = dir.join("tokenizer_config.json");
    if !file.exists() {
        return Ok(None);
    }
    let t = read_json(&file)?;
    Ok(t.get("model_max_length")
        .and_then(Value::as_u64)
        .filter(|&n| n > 0 && n <= 1 << 24)
        .map(|n| n as usize))
}
