//! `GET /info`: TEI's `Info` object.
//!
//! Fields, in TEI's order (`router/src/lib.rs`, `struct Info`): `model_id`,
//! `model_sha`, `model_dtype`, `model_type` (`{"embedding": {"pooling":
//! ...}}`), `max_concurrent_requests`, `max_input_length`,
//! `max_batch_tokens`, `max_batch_requests`, `max_client_batch_size`,
//! `auto_truncate`, `tokenization_workers`, `version`, `sha`,
//! `docker_label`; newer TEI adds `served_model_name`, written here too.
//! Some fields are this server's own, after TEI's: `max_openai_inputs`, the
//! per-request input limit of `/v1/embeddings`; `payload_limit`, the
//! largest body; `prompts`, the names `prompt_name` takes;
//! `default_prompt_name`; and `max_concurrent_inputs`, the inputs one
//! worker holds in flight before it answers 429 (TEI's clients ignore
//! fields they do not know).

use super::json::{write_str, write_usize};
use super::route::ModelKind;

/// What `/info` reports. Every field is a fact about this server; the
/// `Option`s are written as `null` when unknown.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InfoFields<'a> {
    /// The model's name or folder, as loaded.
    pub model_id: &'a str,
    /// The model's revision (a Hub commit), if known.
    pub model_sha: Option<&'a str>,
    /// The weights' dtype as run, TEI's spelling: `float32`, `float16`.
    pub model_dtype: &'a str,
    /// The pooling, TEI's spelling: `mean`, `cls`, ... (an embedding
    /// model's; a sparse model's is `splade`, as TEI reports it).
    pub pooling: &'a str,
    /// What the model is served for: `model_type`'s key, and this
    /// server's own `task` field (`embedding`, `reranker`, `classifier`,
    /// `sparse`), since TEI reports a SPLADE model as an embedding one.
    pub kind: ModelKind,
    /// A cross-encoder's labels, in id order (`id2label`, `label2id`).
    pub labels: &'a [String],
    /// The embedding width. Not one of TEI's fields (TEI has none for it);
    /// not written, kept so the plugin has one place for the model's facts.
    pub dim: usize,
    /// Requests in flight at once before new ones are refused.
    pub max_concurrent_requests: usize,
    /// The model's token limit per input.
    pub max_input_length: usize,
    /// Most tokens in one forward batch: the budget batches are filled
    /// against (a larger request may still run, alone).
    pub max_batch_tokens: usize,
    /// Most requests in one forward batch, if capped (each request holds
    /// up to `max_client_batch_size` inputs).
    pub max_batch_requests: Option<usize>,
    /// Most inputs in one client request on TEI's routes.
    pub max_client_batch_size: usize,
    /// Most inputs in one `/v1/embeddings` request.
    pub max_openai_inputs: usize,
    /// Most inputs in flight in one worker before a request is refused
    /// with 429.
    pub max_concurrent_inputs: usize,
    /// Whether over-long inputs are cut when a request does not say.
    pub auto_truncate: bool,
    /// Threads that tokenize.
    pub tokenization_workers: usize,
    /// This plugin's version.
    pub version: &'a str,
    /// The git commit this plugin was built from, if known.
    pub sha: Option<&'a str>,
    /// A container image label, if any.
    pub docker_label: Option<&'a str>,
    /// The name the OpenAI route answers with when a request names no
    /// model, if different from `model_id`.
    pub served_model_name: Option<&'a str>,
    /// Largest request body accepted, in bytes
    /// ([`crate::settings::ENV_PAYLOAD_LIMIT`]).
    pub payload_limit: usize,
    /// The model's prompts, by name (`prompt_name` takes these).
    pub prompt_names: &'a [&'a str],
    /// The prompt applied when a request names none, if set by name.
    pub default_prompt_name: Option<&'a str>,
}

/// Writes TEI's `Info` JSON for `info`, appending to `out`.
pub fn write_info(info: &InfoFields<'_>, out: &mut Vec<u8>) {
    out.extend_from_slice(b"{\"model_id\":");
    write_str(info.model_id, out);
    out.extend_from_slice(b",\"model_sha\":");
    opt_str(info.model_sha, out);
    out.extend_from_slice(b",\"model_dtype\":");
    write_str(info.model_dtype, out);
    out.extend_from_slice(b",\"model_type\":");
    write_model_type(info, out);
    out.extend_from_slice(b",\"max_concurrent_requests\":");
    write_usize(info.max_concurrent_requests, out);
    out.extend_from_slice(b",\"max_input_length\":");
    write_usize(info.max_input_length, out);
    out.extend_from_slice(b",\"max_batch_tokens\":");
    write_usize(info.max_batch_tokens, out);
    out.extend_from_slice(b",\"max_batch_requests\":");
    match info.max_batch_requests {
        Some(n) => write_usize(n, out),
        None => out.extend_from_slice(b"null"),
    }
    out.extend_from_slice(b",\"max_client_batch_size\":");
    write_usize(info.max_client_batch_size, out);
    out.extend_from_slice(b",\"auto_truncate\":");
    out.extend_from_slice(if info.auto_truncate {
        b"true"
    } else {
        b"false"
    });
    out.extend_from_slice(b",\"tokenization_workers\":");
    write_usize(info.tokenization_workers, out);
    out.extend_from_slice(b",\"version\":");
    write_str(info.version, out);
    out.extend_from_slice(b",\"sha\":");
    opt_str(info.sha, out);
    out.extend_from_slice(b",\"docker_label\":");
    opt_str(info.docker_label, out);
    out.extend_from_slice(b",\"served_model_name\":");
    opt_str(info.served_model_name, out);
    out.extend_from_slice(b",\"max_openai_inputs\":");
    write_usize(info.max_openai_inputs, out);
    out.extend_from_slice(b",\"payload_limit\":");
    write_usize(info.payload_limit, out);
    out.extend_from_slice(b",\"prompts\":[");
    for (i, name) in info.prompt_names.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(name, out);
    }
    out.extend_from_slice(b"],\"default_prompt_name\":");
    opt_str(info.default_prompt_name, out);
    out.extend_from_slice(b",\"max_concurrent_inputs\":");
    write_usize(info.max_concurrent_inputs, out);
    out.extend_from_slice(b",\"task\":");
    write_str(info.kind.name(), out);
    out.push(b'}');
}

/// TEI's `ModelType`: `{"embedding": {"pooling"}}` (SPLADE's pooling
/// `splade`), or `{"reranker" | "classifier": {"id2label": {"0": label},
/// "label2id": {label: 0}}}`.
fn write_model_type(info: &InfoFields<'_>, out: &mut Vec<u8>) {
    let key = match info.kind {
        ModelKind::Embedding | ModelKind::Sparse => {
            out.extend_from_slice(b"{\"embedding\":{\"pooling\":");
            write_str(info.pooling, out);
            out.extend_from_slice(b"}}");
            return;
        }
        ModelKind::Reranker => "reranker",
        ModelKind::Classifier => "classifier",
    };
    out.push(b'{');
    write_str(key, out);
    out.extend_from_slice(b":{\"id2label\":{");
    for (i, label) in info.labels.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(&i.to_string(), out);
        out.push(b':');
        write_str(label, out);
    }
    out.extend_from_slice(b"},\"label2id\":{");
    for (i, label) in info.labels.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(label, out);
        out.push(b':');
        write_usize(i, out);
    }
    out.extend_from_slice(b"}}}");
}

fn opt_str(v: Option<&str>, out: &mut Vec<u8>) {
    match v {
        Some(s) => write_str(s, out),
        None => out.extend_from_slice(b"null"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn sample() -> InfoFields<'static> {
        InfoFields {
            model_id: "sentence-transformers/all-MiniLM-L6-v2",
            model_sha: None,
            model_dtype: "float32",
            pooling: "mean",
            kind: ModelKind::Embedding,
            labels: &[],
            dim: 384,
            max_concurrent_requests: 512,
            max_input_length: 256,
            max_batch_tokens: 16384,
            max_batch_requests: None,
            max_client_batch_size: 32,
            max_openai_inputs: 2048,
            max_concurrent_inputs: 3072,
            auto_truncate: false,
            tokenization_workers: 2,
            version: env!("CARGO_PKG_VERSION"),
            sha: Some("abc123"),
            docker_label: None,
            served_model_name: None,
            payload_limit: 2_000_000,
            prompt_names: &[],
            default_prompt_name: None,
        }
    }

    #[test]
    fn info_has_every_tei_field_with_types() {
        let mut out = Vec::new();
        write_info(&sample(), &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        let obj = v.as_object().unwrap();
        let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
        for k in [
            "model_id",
            "model_sha",
            "model_dtype",
            "model_type",
            "max_concurrent_requests",
            "max_input_length",
            "max_batch_tokens",
            "max_batch_requests",
            "max_client_batch_size",
            "auto_truncate",
            "tokenization_workers",
            "version",
            "sha",
            "docker_label",
            "served_model_name",
            "max_openai_inputs",
            "payload_limit",
            "prompts",
            "default_prompt_name",
            "max_concurrent_inputs",
            "task",
        ] {
            assert!(keys.contains(&k), "missing {k}");
        }
        assert_eq!(obj.len(), 21);
        assert_eq!(v["task"], "embedding");
        assert_eq!(v["payload_limit"], 2_000_000);
        assert_eq!(v["prompts"], serde_json::json!([]));
        assert_eq!(v["max_openai_inputs"], 2048);
        assert_eq!(v["max_concurrent_inputs"], 3072);
        assert_eq!(v["model_type"]["embedding"]["pooling"], "mean");
        assert_eq!(v["model_sha"], Value::Null);
        assert_eq!(v["max_batch_requests"], Value::Null);
        assert_eq!(v["max_input_length"], 256);
        assert_eq!(v["auto_truncate"], false);
        assert_eq!(v["sha"], "abc123");
    }

    #[test]
    fn info_escapes_strings_and_writes_some() {
        let mut i = sample();
        i.model_id = "/models/\"odd\" name";
        i.max_batch_requests = Some(8);
        i.served_model_name = Some("mini");
        let mut out = Vec::new();
        write_info(&i, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model_id"], "/models/\"odd\" name");
        assert_eq!(v["max_batch_requests"], 8);
        assert_eq!(v["served_model_name"], "mini");
    }

    #[test]
    fn cross_encoders_report_their_labels_as_tei_does() {
        let labels = ["neg".to_string(), "pos".into()];
        let mut i = sample();
        i.kind = ModelKind::Classifier;
        i.labels = &labels;
        let mut out = Vec::new();
        write_info(&i, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v["model_type"],
            serde_json::json!({"classifier": {"id2label": {"0": "neg", "1": "pos"},
                                              "label2id": {"neg": 0, "pos": 1}}})
        );
        assert_eq!(v["task"], "classifier");
        i.kind = ModelKind::Sparse;
        i.pooling = "splade";
        out.clear();
        write_info(&i, &mut out);
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["model_type"]["embedding"]["pooling"], "splade");
        assert_eq!(v["task"], "sparse");
    }
}
