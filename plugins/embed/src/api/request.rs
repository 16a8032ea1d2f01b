//! Request bodies of TEI's `/embed` and OpenAI's `/v1/embeddings`, parsed
//! and checked into one [`EmbedCall`].
//!
//! The body is parsed into a `serde_json::Value` and each field is checked
//! by hand, so each mistake gets a message naming the field, what was sent
//! and what is accepted. Parsing never panics (serde_json bounds nesting at
//! 128 levels, so no input can overflow the stack).
//!
//! Decisions, for both routes:
//! - Unknown fields are ignored, as TEI ignores them.
//! - `null` in an optional field means "not given" (older huggingface_hub
//!   releases send every parameter of `feature_extraction`, `None`s as
//!   `null`).
//! - Token-id inputs (`[1, 2, 3]` or `[[1, 2], [3]]`), which TEI and OpenAI
//!   accept, are refused: TEI 422 / OpenAI 400, with code
//!   `token_ids_unsupported`. The plugin would have to trust ids it cannot
//!   check against the tokenizer's vocabulary; send the text instead.
//! - TEI's `inputs` as pairs (`[["a", "b"]]`, for cross-encoders) are
//!   refused the same way: this is an embedding model.
//! - An empty string is "empty input" (400), like an empty list.

use super::error::{ApiError, Flavor};
use serde_json::{Map, Value};

/// The server's limits, as configured, that parsing checks against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most inputs in one request (TEI's `--max-client-batch-size`,
    /// default 32).
    pub max_client_batch_size: usize,
    /// Largest body accepted, in bytes (TEI's `--payload-limit`, default
    /// 2 000 000).
    pub payload_limit: usize,
    /// Whether inputs over the model's limit are cut rather than refused
    /// when a request does not say (TEI's `--auto-truncate`, default off).
    pub auto_truncate: bool,
    /// The model's embedding width, the most `dimensions` may ask for.
    pub dim: usize,
}

impl Default for Limits {
    /// TEI's defaults, with all-MiniLM-L6-v2's width.
    fn default() -> Self {
        Limits {
            max_client_batch_size: 32,
            payload_limit: 2_000_000,
            auto_truncate: false,
            dim: 384,
        }
    }
}

/// How `/v1/embeddings` returns each vector.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Encoding {
    /// A JSON array of numbers.
    Float,
    /// A base64 string (standard alphabet, padded) of the little-endian
    /// f32 bytes.
    Base64,
}

/// Which end of an over-long input truncation cuts (TEI's
/// `truncation_direction`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TruncationDirection {
    /// Keep the start, drop the end (the default).
    Right,
    /// Keep the end, drop the start.
    Left,
}

/// One embedding request, from either API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedCall {
    /// The texts to embed, in order; at least one, none empty, at most
    /// [`Limits::max_client_batch_size`].
    pub inputs: Vec<String>,
    /// L2-normalize each vector (TEI default true; always true on OpenAI's
    /// route, as in TEI).
    pub normalize: bool,
    /// Cut inputs over the model's limit instead of refusing them with
    /// [`ApiError::too_long`].
    pub truncate: bool,
    /// Which end to cut when truncating.
    pub truncation_direction: TruncationDirection,
    /// How to return vectors (TEI's route: always `Float`).
    pub encoding: Encoding,
    /// OpenAI's `model`, to echo back; `None` on TEI's route or when not
    /// sent.
    pub model: Option<String>,
    /// Which API the request came in on.
    pub flavor: Flavor,
    /// OpenAI's `dimensions`: keep this many leading components (then
    /// renormalize), `1..=Limits::dim`. See [`super::shrink_rows`].
    pub dimensions: Option<usize>,
}

/// Parses the body of `POST /embed` (or `POST /`):
/// `{"inputs": str | [str], "normalize"?: bool, "truncate"?: bool,
/// "truncation_direction"?: "Right" | "Left", "prompt_name"?: null}`.
///
/// `truncate` defaults to [`Limits::auto_truncate`], `normalize` to true.
/// `prompt_name` must be absent or null: this server applies no prompts
/// (422 otherwise; TEI answers 413 when the model has no prompts).
pub fn parse_tei(body: &[u8], limits: &Limits) -> Result<EmbedCall, ApiError> {
    let flavor = Flavor::Tei;
    let mut obj = parse_object(body, limits, flavor)?;
    let inputs = take_inputs(obj.remove("inputs"), "inputs", limits, flavor)?;
    let normalize = opt_bool(obj.get("normalize"), "normalize", flavor)?.unwrap_or(true);
    let truncate =
        opt_bool(obj.get("truncate"), "truncate", flavor)?.unwrap_or(limits.auto_truncate);
    let truncation_direction = match obj.get("truncation_direction") {
        None | Some(Value::Null) => TruncationDirection::Right,
        Some(Value::String(s)) if s == "Right" || s == "right" => TruncationDirection::Right,
        Some(Value::String(s)) if s == "Left" || s == "left" => TruncationDirection::Left,
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "truncation_direction",
                format!(
                    "`truncation_direction` must be \"Right\" or \"Left\", got {}",
                    describe(v)
                ),
            ));
        }
    };
    match obj.get("prompt_name") {
        None | Some(Value::Null) => {}
        Some(Value::String(s)) => {
            return Err(ApiError::invalid(
                flavor,
                "prompt_name",
                format!(
                    "`prompt_name` {:?} is not supported: this server applies no prompts; \
                     prepend the prompt text to each input instead and drop `prompt_name`",
                    truncate_for_message(s)
                ),
            )
            .with_code("prompt_unsupported"));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "prompt_name",
                format!(
                    "`prompt_name` must be a string or null, got {}",
                    describe(v)
                ),
            ));
        }
    }
    Ok(EmbedCall {
        inputs,
        normalize,
        truncate,
        truncation_direction,
        encoding: Encoding::Float,
        model: None,
        flavor,
        dimensions: None,
    })
}

/// Parses the body of `POST /v1/embeddings`:
/// `{"input": str | [str], "model"?: str, "encoding_format"?: "float" |
/// "base64", "dimensions"?: int, "user"?: str}`.
///
/// `encoding_format` defaults to `float` (as OpenAI's API and TEI do;
/// openai-python always sends `base64` unless told otherwise). Truncation
/// follows [`Limits::auto_truncate`], as TEI's OpenAI route does.
pub fn parse_openai(body: &[u8], limits: &Limits) -> Result<EmbedCall, ApiError> {
    let flavor = Flavor::OpenAi;
    let mut obj = parse_object(body, limits, flavor)?;
    let inputs = take_inputs(obj.remove("input"), "input", limits, flavor)?;
    let model = match obj.remove("model") {
        None | Some(Value::Null) => None,
        Some(Value::String(s)) => Some(s),
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "model",
                format!("`model` must be a string, got {}", describe(&v)),
            ));
        }
    };
    let encoding = match obj.get("encoding_format") {
        None | Some(Value::Null) => Encoding::Float,
        Some(Value::String(s)) if s == "float" => Encoding::Float,
        Some(Value::String(s)) if s == "base64" => Encoding::Base64,
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "encoding_format",
                format!(
                    "`encoding_format` must be \"float\" or \"base64\", got {}",
                    describe(v)
                ),
            ));
        }
    };
    let dimensions = match obj.get("dimensions") {
        None | Some(Value::Null) => None,
        Some(Value::Number(n)) => match n.as_u64() {
            Some(d) if d >= 1 && d <= limits.dim as u64 => Some(d as usize),
            _ => {
                return Err(ApiError::invalid(
                    flavor,
                    "dimensions",
                    format!(
                        "`dimensions` must be an integer from 1 to {} (this model's width), \
                         got {n}",
                        limits.dim
                    ),
                ));
            }
        },
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "dimensions",
                format!(
                    "`dimensions` must be an integer from 1 to {}, got {}",
                    limits.dim,
                    describe(v)
                ),
            ));
        }
    };
    match obj.get("user") {
        None | Some(Value::Null) | Some(Value::String(_)) => {}
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "user",
                format!("`user` must be a string, got {}", describe(v)),
            ));
        }
    }
    Ok(EmbedCall {
        inputs,
        normalize: true,
        truncate: limits.auto_truncate,
        truncation_direction: TruncationDirection::Right,
        encoding,
        model,
        flavor,
        dimensions,
    })
}

fn parse_object(
    body: &[u8],
    limits: &Limits,
    flavor: Flavor,
) -> Result<Map<String, Value>, ApiError> {
    if body.len() > limits.payload_limit {
        return Err(ApiError::payload_too_large(
            flavor,
            body.len(),
            limits.payload_limit,
        ));
    }
    let value: Value = match serde_json::from_slice(body) {
        Ok(v) => v,
        Err(e) => return Err(ApiError::malformed(flavor, &e.to_string())),
    };
    match value {
        Value::Object(obj) => Ok(obj),
        v => {
            let field = match flavor {
                Flavor::Tei => "inputs",
                Flavor::OpenAi => "input",
            };
            Err(ApiError::invalid(
                flavor,
                field,
                format!(
                    "the request body must be a JSON object with an `{field}` field, got {}",
                    describe(&v)
                ),
            ))
        }
    }
}

fn take_inputs(
    value: Option<Value>,
    field: &'static str,
    limits: &Limits,
    flavor: Flavor,
) -> Result<Vec<String>, ApiError> {
    let shape = "a string or a list of strings";
    let inputs = match value {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("missing field `{field}`: send {shape} to embed"),
            ));
        }
        Some(Value::String(s)) => vec![s],
        Some(Value::Array(items)) => {
            if items.len() > limits.max_client_batch_size {
                return Err(ApiError::too_many(
                    flavor,
                    items.len(),
                    limits.max_client_batch_size,
                ));
            }
            let mut inputs = Vec::with_capacity(items.len());
            for (i, item) in items.into_iter().enumerate() {
                match item {
                    Value::String(s) => inputs.push(s),
                    Value::Number(_) => return Err(token_ids(flavor, field)),
                    Value::Array(inner)
                        if !inner.is_empty() && inner.iter().all(Value::is_number) =>
                    {
                        return Err(token_ids(flavor, field));
                    }
                    Value::Array(inner)
                        if flavor == Flavor::Tei
                            && !inner.is_empty()
                            && inner.iter().all(Value::is_string) =>
                    {
                        return Err(ApiError::invalid(
                            flavor,
                            field,
                            format!(
                                "`{field}` item {i} is a list of strings: text pairs are for \
                                 rerankers and classifiers, this server embeds single texts; \
                                 send {shape}"
                            ),
                        )
                        .with_code("pairs_unsupported"));
                    }
                    v => {
                        return Err(ApiError::invalid(
                            flavor,
                            field,
                            format!(
                                "`{field}` item {i} must be a string, got {}; send {shape}",
                                describe(&v)
                            ),
                        ));
                    }
                }
            }
            inputs
        }
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("`{field}` must be {shape}, got {}", describe(&v)),
            ));
        }
    };
    if inputs.is_empty() || inputs.iter().any(String::is_empty) {
        return Err(ApiError::empty_input(flavor));
    }
    Ok(inputs)
}

fn token_ids(flavor: Flavor, field: &'static str) -> ApiError {
    ApiError::invalid(
        flavor,
        field,
        format!(
            "`{field}` holds token ids: this server embeds text only; send the text itself, \
             as a string or a list of strings"
        ),
    )
    .with_code("token_ids_unsupported")
}

fn opt_bool(
    v: Option<&Value>,
    field: &'static str,
    flavor: Flavor,
) -> Result<Option<bool>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(ApiError::invalid(
            flavor,
            field,
            format!("`{field}` must be true, false or null, got {}", describe(v)),
        )),
    }
}

/// A short description of a JSON value for error messages.
fn describe(v: &Value) -> String {
    match v {
        Value::Null => "null".into(),
        Value::Bool(b) => format!("the boolean {b}"),
        Value::Number(n) => format!("the number {n}"),
        Value::String(s) => format!("the string {:?}", truncate_for_message(s)),
        Value::Array(a) => format!("a list of {} items", a.len()),
        Value::Object(_) => "an object".into(),
    }
}

/// At most 40 characters of `s`, for quoting user data in messages.
fn truncate_for_message(s: &str) -> &str {
    match s.char_indices().nth(40) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits::default()
    }

    fn tei(body: &str) -> Result<EmbedCall, ApiError> {
        parse_tei(body.as_bytes(), &limits())
    }

    fn oai(body: &str) -> Result<EmbedCall, ApiError> {
        parse_openai(body.as_bytes(), &limits())
    }

    #[test]
    fn tei_single_string_and_list() {
        let c = tei(r#"{"inputs": "hello"}"#).unwrap();
        assert_eq!(c.inputs, ["hello"]);
        assert!(c.normalize);
        assert!(!c.truncate, "TEI's --auto-truncate defaults to off");
        assert_eq!(c.truncation_direction, TruncationDirection::Right);
        assert_eq!(c.flavor, Flavor::Tei);
        assert_eq!(c.encoding, Encoding::Float);
        let c = tei(r#"{"inputs": ["a", "b"], "normalize": false, "truncate": true}"#).unwrap();
        assert_eq!(c.inputs, ["a", "b"]);
        assert!(!c.normalize);
        assert!(c.truncate);
    }

    #[test]
    fn tei_truncate_defaults_to_auto_truncate() {
        let l = Limits {
            auto_truncate: true,
            ..limits()
        };
        assert!(parse_tei(br#"{"inputs": "x"}"#, &l).unwrap().truncate);
        assert!(
            parse_tei(br#"{"inputs": "x", "truncate": null}"#, &l)
                .unwrap()
                .truncate
        );
        assert!(
            !parse_tei(br#"{"inputs": "x", "truncate": false}"#, &l)
                .unwrap()
                .truncate
        );
    }

    #[test]
    fn tei_accepts_huggingface_hub_payload_with_nulls() {
        // What huggingface_hub's feature_extraction sends when the caller
        // sets nothing (older releases keep the None parameters as null).
        let c = tei(
            r#"{"inputs": "Today is a sunny day", "normalize": null, "prompt_name": null,
                "truncate": null, "truncation_direction": null}"#,
        )
        .unwrap();
        assert_eq!(c.inputs, ["Today is a sunny day"]);
        assert!(c.normalize);
        assert!(!c.truncate);
        let c = tei(
            r#"{"inputs": "x", "normalize": true, "truncate": true, "truncation_direction": "Left"}"#,
        )
        .unwrap();
        assert_eq!(c.truncation_direction, TruncationDirection::Left);
        let c = tei(r#"{"inputs": "x", "truncation_direction": "right"}"#).unwrap();
        assert_eq!(c.truncation_direction, TruncationDirection::Right);
    }

    #[test]
    fn unknown_fields_are_ignored() {
        assert!(tei(r#"{"inputs": "x", "parameters": {"a": 1}, "options": null}"#).is_ok());
        assert!(oai(r#"{"input": "x", "extra": [1, 2], "model": "m"}"#).is_ok());
    }

    #[test]
    fn tei_prompt_name_is_refused_with_fix() {
        let e = tei(r#"{"inputs": "x", "prompt_name": "query"}"#).unwrap_err();
        assert_eq!(e.status, 422);
        assert_eq!(e.kind, "Validation");
        assert!(e.message.contains("prompt_name"));
        assert!(e.message.contains("prepend"));
    }

    #[test]
    fn tei_bad_field_types() {
        for (body, field) in [
            (r#"{"inputs": "x", "normalize": "yes"}"#, "normalize"),
            (r#"{"inputs": "x", "truncate": 1}"#, "truncate"),
            (
                r#"{"inputs": "x", "truncation_direction": "up"}"#,
                "truncation_direction",
            ),
            (r#"{"inputs": "x", "prompt_name": 3}"#, "prompt_name"),
            (r#"{"inputs": 5}"#, "inputs"),
            (r#"{"inputs": {"a": "b"}}"#, "inputs"),
            (r#"{"inputs": ["a", null]}"#, "inputs"),
            (r#"{"inputs": ["a", true]}"#, "inputs"),
        ] {
            let e = tei(body).unwrap_err();
            assert_eq!(e.status, 422, "{body}");
            assert_eq!(e.kind, "Validation", "{body}");
            assert_eq!(e.param, Some(field), "{body}");
            assert!(
                e.message.contains(&format!("`{field}`")),
                "{body}: {}",
                e.message
            );
        }
    }

    #[test]
    fn missing_or_null_inputs() {
        for body in [r#"{}"#, r#"{"inputs": null}"#, r#"{"input": "x"}"#] {
            let e = tei(body).unwrap_err();
            assert_eq!(e.status, 422);
            assert!(e.message.contains("missing field `inputs`"));
        }
        let e = oai(r#"{"inputs": "x"}"#).unwrap_err();
        assert_eq!(e.status, 400);
        assert!(e.message.contains("missing field `input`"));
    }

    #[test]
    fn body_not_an_object() {
        let e = tei(r#"["a"]"#).unwrap_err();
        assert_eq!(e.status, 422);
        assert!(e.message.contains("JSON object"));
        let e = oai(r#""a""#).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.kind, "invalid_request_error");
    }

    #[test]
    fn malformed_json_is_400_json_error() {
        for body in [
            &b""[..],
            b"{",
            b"{\"inputs\": }",
            b"\xff\xfe",
            b"{\"inputs\": \"a\"} x",
        ] {
            let e = parse_tei(body, &limits()).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.code, Some("invalid_json"));
            assert!(e.message.contains("not valid JSON"));
            let v: Value = serde_json::from_slice(&e.body()).unwrap();
            assert!(v["error"].is_string());
            let e = parse_openai(body, &limits()).unwrap_err();
            assert_eq!(e.status, 400);
            let v: Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v["error"]["code"], "invalid_json");
        }
    }

    #[test]
    fn empty_inputs() {
        for body in [
            r#"{"inputs": []}"#,
            r#"{"inputs": ""}"#,
            r#"{"inputs": ["a", ""]}"#,
        ] {
            let e = tei(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.kind, "Empty");
            assert!(e.message.contains("`inputs` is empty"));
        }
        for body in [r#"{"input": []}"#, r#"{"input": ""}"#] {
            let e = oai(body).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.code, Some("empty_input"));
            assert_eq!(e.param, Some("input"));
        }
    }

    #[test]
    fn too_many_inputs() {
        let many = format!("[{}]", vec!["\"a\""; 33].join(","));
        let e = tei(&format!(r#"{{"inputs": {many}}}"#)).unwrap_err();
        assert_eq!(e.status, 413);
        assert_eq!(e.kind, "Validation");
        assert!(e.message.contains("33") && e.message.contains("32"));
        let e = oai(&format!(r#"{{"input": {many}}}"#)).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code, Some("too_many_inputs"));
        let exactly = format!("[{}]", vec!["\"a\""; 32].join(","));
        assert_eq!(
            tei(&format!(r#"{{"inputs": {exactly}}}"#))
                .unwrap()
                .inputs
                .len(),
            32
        );
    }

    #[test]
    fn payload_over_limit_is_413() {
        let l = Limits {
            payload_limit: 20,
            ..limits()
        };
        let body = br#"{"inputs": "a long enough text"}"#;
        let e = parse_tei(body, &l).unwrap_err();
        assert_eq!(e.status, 413);
        assert!(e.message.contains(&body.len().to_string()));
        assert!(e.message.contains("20 bytes"));
        let e = parse_openai(body, &l).unwrap_err();
        assert_eq!(e.status, 413);
    }

    #[test]
    fn token_ids_are_refused() {
        for body in [r#"{"inputs": [1, 2, 3]}"#, r#"{"inputs": [[1, 2], [3]]}"#] {
            let e = tei(body).unwrap_err();
            assert_eq!(e.status, 422);
            assert_eq!(e.code, Some("token_ids_unsupported"));
            assert!(e.message.contains("token ids"));
        }
        for body in [r#"{"input": [1, 2, 3]}"#, r#"{"input": [[1, 2], [3]]}"#] {
            let e = oai(body).unwrap_err();
            assert_eq!(e.status, 400);
            assert_eq!(e.code, Some("token_ids_unsupported"));
        }
    }

    #[test]
    fn tei_pairs_are_refused() {
        let e = tei(r#"{"inputs": [["a", "b"]]}"#).unwrap_err();
        assert_eq!(e.status, 422);
        assert_eq!(e.code, Some("pairs_unsupported"));
    }

    #[test]
    fn unicode_inputs_survive() {
        let c = tei(r#"{"inputs": ["日本語", "emoji 🦀", "\u00e9\ud83e\udd80", "nul \u0000"]}"#)
            .unwrap();
        assert_eq!(c.inputs, ["日本語", "emoji 🦀", "é🦀", "nul \0"]);
        // A lone surrogate escape is not valid JSON text for a Rust String.
        let e = tei(r#"{"inputs": "\ud800"}"#).unwrap_err();
        assert_eq!(e.status, 400);
    }

    #[test]
    fn big_inputs_within_limit() {
        let text = "word ".repeat(300_000);
        let body = format!(r#"{{"inputs": ["{text}", "x"]}}"#);
        assert!(body.len() < 2_000_000);
        let c = tei(&body).unwrap();
        assert_eq!(c.inputs[0].len(), text.len());
        let big = "a".repeat(2_000_001);
        let e = tei(&format!(r#"{{"inputs": "{big}"}}"#)).unwrap_err();
        assert_eq!(e.status, 413);
    }

    #[test]
    fn openai_defaults_and_fields() {
        let c = oai(r#"{"input": "hello", "model": "text-embedding-3-small"}"#).unwrap();
        assert_eq!(c.inputs, ["hello"]);
        assert_eq!(c.model.as_deref(), Some("text-embedding-3-small"));
        assert_eq!(c.encoding, Encoding::Float);
        assert!(c.normalize);
        assert!(!c.truncate);
        assert_eq!(c.dimensions, None);
        assert_eq!(c.flavor, Flavor::OpenAi);
        // What openai-python sends by default.
        let c = oai(r#"{"input": ["a", "b"], "model": "m", "encoding_format": "base64"}"#).unwrap();
        assert_eq!(c.encoding, Encoding::Base64);
        assert_eq!(c.inputs, ["a", "b"]);
        let c = oai(
            r#"{"input": "x", "model": null, "encoding_format": null, "dimensions": null, "user": null}"#,
        )
        .unwrap();
        assert_eq!(c.model, None);
        let c = oai(r#"{"input": "x", "dimensions": 128, "user": "u-1"}"#).unwrap();
        assert_eq!(c.dimensions, Some(128));
    }

    #[test]
    fn openai_bad_fields() {
        for (body, param) in [
            (
                r#"{"input": "x", "encoding_format": "binary"}"#,
                "encoding_format",
            ),
            (r#"{"input": "x", "dimensions": 0}"#, "dimensions"),
            (r#"{"input": "x", "dimensions": 385}"#, "dimensions"),
            (r#"{"input": "x", "dimensions": -3}"#, "dimensions"),
            (r#"{"input": "x", "dimensions": 1.5}"#, "dimensions"),
            (r#"{"input": "x", "dimensions": "64"}"#, "dimensions"),
            (r#"{"input": "x", "model": 4}"#, "model"),
            (r#"{"input": "x", "user": {}}"#, "user"),
            (r#"{"input": 3}"#, "input"),
        ] {
            let e = oai(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}");
            assert_eq!(e.kind, "invalid_request_error");
            assert_eq!(e.param, Some(param), "{body}");
            let v: Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v["error"]["param"], param);
            assert!(e.message.contains(&format!("`{param}`")), "{}", e.message);
        }
        let e = oai(r#"{"input": "x", "dimensions": 999}"#).unwrap_err();
        assert!(e.message.contains("1 to 384"));
    }

    #[test]
    fn long_user_strings_are_cut_in_messages() {
        let long = "z".repeat(10_000);
        let e = tei(&format!(
            r#"{{"inputs": "x", "truncation_direction": "{long}"}}"#
        ))
        .unwrap_err();
        assert!(e.message.len() < 200, "{}", e.message.len());
    }

    /// Random, truncated and mutated bodies: parsing returns, never panics.
    #[test]
    fn fuzz_never_panics() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        let seeds: [&[u8]; 5] = [
            br#"{"inputs": ["a", "b"], "normalize": true, "truncate": null}"#,
            br#"{"input": ["x"], "model": "m", "encoding_format": "base64", "dimensions": 8}"#,
            br#"{"inputs": [[1, 2], [3]], "truncation_direction": "Left"}"#,
            "{\"inputs\": \"日本 🦀 \\u00e9\"}".as_bytes(),
            b"[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[",
        ];
        let l = limits();
        let alphabet = b"{}[]\",:0123456789.-eE truefalsnul\\u\xff\x00";
        for seed in seeds {
            for cut in 0..=seed.len() {
                let _ = parse_tei(&seed[..cut], &l);
                let _ = parse_openai(&seed[..cut], &l);
            }
            for _ in 0..400 {
                let mut b = seed.to_vec();
                for _ in 0..(next() % 4 + 1) {
                    let i = (next() as usize) % b.len();
                    b[i] = alphabet[(next() as usize) % alphabet.len()];
                }
                let _ = parse_tei(&b, &l);
                let _ = parse_openai(&b, &l);
            }
        }
        for _ in 0..2000 {
            let n = (next() % 64) as usize;
            let b: Vec<u8> = (0..n)
                .map(|_| alphabet[(next() as usize) % alphabet.len()])
                .collect();
            let _ = parse_tei(&b, &l);
            let _ = parse_openai(&b, &l);
        }
        // Deep nesting is refused, not a stack overflow.
        let deep = format!(
            "{{\"inputs\": {}{}}}",
            "[".repeat(100_000),
            "]".repeat(100_000)
        );
        assert_eq!(tei(&deep).unwrap_err().status, 400);
    }
}
