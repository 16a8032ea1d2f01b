//! A static embedding model's folder (sentence-transformers'
//! `StaticEmbedding`, model2vec's kind): modules.json whose first module is
//! a StaticEmbedding, its `tokenizer.json` and `model.safetensors` (one
//! F32 table `embedding.weight`, [vocab, dim]) at the module's path, and
//! optionally a Normalize module. There is no encoder config.json: the
//! table is the model, mean pooled over the tokens, which are encoded
//! without special tokens (StaticEmbedding tokenizes with
//! `add_special_tokens=False`) and never truncated by sentence-transformers
//! (its max_seq_length is infinite): inputs are cut at the tokenizer's own
//! truncation when tokenizer.json has one, else at [`MAX_LEN`].
//!
//! The native encoder serves no such folder; a backend does (the C one of
//! `backends/c/static_embedding.c`), with this tokenizer and description.

use std::io::Read;
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::config::{Pooling, read_json};
use super::error::{FIX_REEXPORT, ModelError};
use super::{ModelInfo, Task, Tokenizer};

/// The longest input when tokenizer.json sets no truncation: the bound of
/// one forward pass's tokens, far past any sentence.
pub const MAX_LEN: usize = 8192;

/// The tensor names of the table: StaticEmbedding's, then model2vec's.
const TABLE_NAMES: [&str; 2] = ["embedding.weight", "embeddings"];

/// The StaticEmbedding module's folder, when `dir`'s modules.json starts
/// with one; `None` for any other folder (or one without modules.json).
pub fn static_module(dir: &Path) -> Option<PathBuf> {
    let modules = read_json(&dir.join("modules.json")).ok()?;
    let first = modules.as_array()?.first()?;
    let ty = first.get("type")?.as_str()?;
    if !ty.ends_with("StaticEmbedding") {
        return None;
    }
    let path = first.get("path").and_then(Value::as_str).unwrap_or("");
    Some(dir.join(path))
}

/// The folder's description and tokenizer (no special tokens), as
/// [`super::describe_folder`] gives them for an encoder.
pub(crate) fn describe(
    dir: &Path,
    module: &Path,
    name: Option<String>,
) -> Result<(ModelInfo, Tokenizer), ModelError> {
    let modules_file = dir.join("modules.json");
    let modules = read_json(&modules_file)?;
    let mut normalize = false;
    for (i, m) in modules.as_array().into_iter().flatten().enumerate().skip(1) {
        let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
        match ty.rsplit('.').next() {
            Some("Normalize") => normalize = true,
            _ => {
                return Err(ModelError::new(
                    &modules_file,
                    format!(
                        "module {i} is \"{ty}\"; after a StaticEmbedding only Normalize is \
                         supported"
                    ),
                    "use a StaticEmbedding model whose pipeline is StaticEmbedding and \
                     optionally Normalize",
                ));
            }
        }
    }
    let (vocab, dim) = table_shape(&module.join("model.safetensors"))?;
    let max_len = read_json(&module.join("tokenizer.json"))
        .ok()
        .and_then(|t| t.pointer("/truncation/max_length").and_then(Value::as_u64))
        .map_or(MAX_LEN, |n| n as usize);
    let tokenizer = Tokenizer::load_with(module, max_len, vocab, false)?;
    let folder = std::fs::canonicalize(dir)
        .ok()
        .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()));
    let info = ModelInfo {
        name: name.or(folder).unwrap_or_else(|| "model".into()),
        architecture: "static",
        task: Task::Embed,
        dim,
        layers: 0,
        hidden: dim,
        heads: 0,
        intermediate: 0,
        vocab,
        max_len,
        pooling: Pooling::Mean,
        normalize,
        weight_bytes: vocab * dim * 4,
        weights_file: None,
        weights_built: None,
        dtype: "float32",
        kernels: "",
        threads: 1,
    };
    Ok((info, tokenizer))
}

/// The [vocab, dim] of the F32 table in `file`, from its safetensors
/// header (the data is the backend's to read).
fn table_shape(file: &Path) -> Result<(usize, usize), ModelError> {
    let bad = |message: String| ModelError::new(file, message, FIX_REEXPORT);
    let mut f = std::fs::File::open(file).map_err(|e| {
        ModelError::new(
            file,
            format!("cannot be opened: {e}"),
            "put the StaticEmbedding's model.safetensors (SentenceTransformer.save writes it) \
             in the module's folder",
        )
    })?;
    let mut len = [0u8; 8];
    f.read_exact(&mut len)
        .map_err(|e| bad(format!("has no safetensors header: {e}")))?;
    let len = u64::from_le_bytes(len);
    if len > 100 << 20 {
        return Err(bad(format!("declares a {len}-byte header")));
    }
    let mut header = vec![0u8; len as usize];
    f.read_exact(&mut header)
        .map_err(|e| bad(format!("has a cut safetensors header: {e}")))?;
    let header: Value = serde_json::from_slice(&header)
        .map_err(|e| bad(format!("has a safetensors header that is not JSON: {e}")))?;
    let tensor = TABLE_NAMES
        .iter()
        .find_map(|n| header.get(*n))
        .ok_or_else(|| {
            bad(format!(
                "has no tensor {}: it is not a static embedding table",
                TABLE_NAMES.join(" or ")
            ))
        })?;
    let dtype = tensor.get("dtype").and_then(Value::as_str).unwrap_or("");
    let shape: Vec<u64> = tensor
        .get("shape")
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_u64).collect())
        .unwrap_or_default();
    match (dtype, shape.as_slice()) {
        ("F32", &[vocab, dim]) if vocab > 0 && dim > 0 => Ok((vocab as usize, dim as usize)),
        _ => Err(ModelError::new(
            file,
            format!("the table is {dtype} of shape {shape:?}, not F32 [vocab, dim]"),
            "save the model in float32 (SentenceTransformer.save of a StaticEmbedding)",
        )),
    }
}
