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
//!   accept, are refused by default with 422 and code
//!   `token_ids_unsupported` on both routes: ids from another tokenizer
//!   (LangChain sends OpenAI's tiktoken ids by default) would embed as
//!   nonsense with a 200. With [`Limits::accept_token_ids`] they are taken
//!   as ids of this model's vocabulary, sent as the tokenizer gives them
//!   (`[CLS]` and `[SEP]` included); an id outside it is a 422 naming it.
//!   A list mixing texts and ids is refused, as OpenAI refuses it.
//! - TEI's `inputs` as pairs (`[["a", "b"]]`, for cross-encoders) are
//!   refused the same way: this is an embedding model.
//! - An empty string is "empty input" (400), like an empty list.

use super::error::{ApiError, Flavor};
use crate::settings;
use serde_json::{Map, Value};

/// The server's limits, as configured, that parsing checks against.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Limits {
    /// Most inputs in one request on TEI's routes (TEI's
    /// `--max-client-batch-size`, default 32).
    pub max_client_batch_size: usize,
    /// Most inputs in one `/v1/embeddings` request (OpenAI's limit, 2048,
    /// by default): OpenAI's clients send up to 1000 at once (LangChain's
    /// `chunk_size`) and would fail on TEI's 32.
    pub max_openai_inputs: usize,
    /// Most documents in one Cohere rerank request (Cohere's 1000 by
    /// default): its clients send every document a retriever found.
    pub max_cohere_documents: usize,
    /// Take token-id inputs as ids of this model's vocabulary, instead of
    /// refusing them (default off).
    pub accept_token_ids: bool,
    /// Ids in the model's vocabulary (config.json's `vocab_size`): token
    /// ids must be below it.
    pub vocab: usize,
    /// Largest body accepted, in bytes (TEI's `--payload-limit`; 2 000 000
    /// here, TEI's default, but the plugin's default makes room for
    /// [`Limits::max_openai_inputs`] whole-window inputs:
    /// [`settings::default_payload_limit`]).
    pub payload_limit: usize,
    /// Whether inputs over the model's limit are cut rather than refused
    /// when a request does not say (TEI's `--auto-truncate`, default off).
    pub auto_truncate: bool,
    /// The model's embedding width, the most `dimensions` may ask for.
    pub dim: usize,
    /// The names `prompt_name` takes (the model's prompts), for the
    /// OpenAPI document; the plugin resolves them.
    pub prompt_names: Vec<String>,
}

impl Default for Limits {
    /// TEI's defaults, with all-MiniLM-L6-v2's width.
    fn default() -> Self {
        Limits {
            max_client_batch_size: settings::DEFAULT_MAX_CLIENT_BATCH_SIZE,
            max_openai_inputs: settings::DEFAULT_MAX_OPENAI_INPUTS,
            max_cohere_documents: settings::DEFAULT_MAX_COHERE_DOCUMENTS,
            accept_token_ids: settings::DEFAULT_ACCEPT_TOKEN_IDS,
            vocab: 30522,
            payload_limit: settings::TEI_PAYLOAD_LIMIT,
            auto_truncate: settings::DEFAULT_AUTO_TRUNCATE,
            dim: 384,
            prompt_names: Vec::new(),
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

/// What a request asks to embed, in order: at least one input, none
/// empty, at most the route's limit ([`Limits::max_client_batch_size`] on
/// TEI's, [`Limits::max_openai_inputs`] on OpenAI's).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inputs {
    /// Texts, for the model's tokenizer.
    Texts(Vec<String>),
    /// Token-id sequences, each id below [`Limits::vocab`] (only with
    /// [`Limits::accept_token_ids`]); not yet checked against the model's
    /// length limit.
    Ids(Vec<Vec<u32>>),
}

impl Inputs {
    /// How many inputs.
    pub fn len(&self) -> usize {
        match self {
            Inputs::Texts(t) => t.len(),
            Inputs::Ids(i) => i.len(),
        }
    }

    /// Never true of a parsed request.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One embedding request, from either API.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EmbedCall {
    /// The inputs to embed.
    pub inputs: Inputs,
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
    /// `dimensions` (both routes): keep this many leading components
    /// (then renormalize when normalizing), `1..=Limits::dim`. See
    /// [`super::shrink_rows`].
    pub dimensions: Option<usize>,
    /// TEI's `prompt_name`: which of the model's prompts to prepend to
    /// every input; `None` for the server's default prompt, if any.
    pub prompt_name: Option<String>,
}

/// Parses the body of `POST /embed` (or `POST /`):
/// `{"inputs": str | [str] | [int] | [[int]], "normalize"?: bool, "truncate"?: bool,
/// "truncation_direction"?: "Right" | "Left", "prompt_name"?: str, "dimensions"?: int}`.
///
/// `truncate` defaults to [`Limits::auto_truncate`], `normalize` to true.
/// `prompt_name` is kept for the plugin to resolve against the model's
/// prompts (an unknown name is refused there, naming the known ones).
pub fn parse_tei(body: &[u8], limits: &Limits) -> Result<EmbedCall, ApiError> {
    let flavor = Flavor::Tei;
    let mut obj = parse_object(body, limits, flavor)?;
    let inputs = take_inputs(obj.remove("inputs"), "inputs", limits, flavor)?;
    let normalize = opt_bool(obj.get("normalize"), "normalize", flavor)?.unwrap_or(true);
    let truncate =
        opt_bool(obj.get("truncate"), "truncate", flavor)?.unwrap_or(limits.auto_truncate);
    let truncation_direction = truncation_direction(obj.get("truncation_direction"), flavor)?;
    let prompt_name = prompt_name(obj.get("prompt_name"), flavor)?;
    let dimensions = dimensions(obj.get("dimensions"), limits, flavor)?;
    Ok(EmbedCall {
        inputs,
        normalize,
        truncate,
        truncation_direction,
        encoding: Encoding::Float,
        model: None,
        flavor,
        dimensions,
        prompt_name,
    })
}

/// TEI's `truncation_direction`: `"Right"` (the default) or `"Left"`
/// (lower case taken too).
pub(crate) fn truncation_direction(
    v: Option<&Value>,
    flavor: Flavor,
) -> Result<TruncationDirection, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(TruncationDirection::Right),
        Some(Value::String(s)) if s == "Right" || s == "right" => Ok(TruncationDirection::Right),
        Some(Value::String(s)) if s == "Left" || s == "left" => Ok(TruncationDirection::Left),
        Some(v) => Err(ApiError::invalid(
            flavor,
            "truncation_direction",
            format!(
                "`truncation_direction` must be \"Right\" or \"Left\", got {}",
                describe(v)
            ),
        )),
    }
}

/// TEI's `prompt_name`: a string, or absent/null.
pub(crate) fn prompt_name(v: Option<&Value>, flavor: Flavor) -> Result<Option<String>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(v) => Err(ApiError::invalid(
            flavor,
            "prompt_name",
            format!(
                "`prompt_name` must be a string or null, got {}",
                describe(v)
            ),
        )),
    }
}

/// `dimensions`: a whole number from 1 to the model's width, or
/// absent/null.
fn dimensions(
    v: Option<&Value>,
    limits: &Limits,
    flavor: Flavor,
) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) => match whole(n) {
            Some(d) if d >= 1 && d <= limits.dim as u64 => Ok(Some(d as usize)),
            _ => Err(ApiError::invalid(
                flavor,
                "dimensions",
                format!(
                    "`dimensions` must be an integer from 1 to {} (this model's width), \
                     got {n}",
                    limits.dim
                ),
            )),
        },
        Some(v) => Err(ApiError::invalid(
            flavor,
            "dimensions",
            format!(
                "`dimensions` must be an integer from 1 to {}, got {}",
                limits.dim,
                describe(v)
            ),
        )),
    }
}

/// Parses the body of `POST /v1/embeddings`:
/// `{"input": str | [str] | [int] | [[int]], "model"?: str, "encoding_format"?: "float" |
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
    let dimensions = dimensions(obj.get("dimensions"), limits, flavor)?;
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
        prompt_name: None,
    })
}

pub(super) fn parse_object(
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
                Flavor::Cohere => "documents",
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

pub(super) fn take_inputs(
    value: Option<Value>,
    field: &'static str,
    limits: &Limits,
    flavor: Flavor,
) -> Result<Inputs, ApiError> {
    let shape = "a string or a list of strings";
    let max = match flavor {
        Flavor::Tei | Flavor::Cohere => limits.max_client_batch_size,
        Flavor::OpenAi => limits.max_openai_inputs,
    };
    let items = match value {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("missing field `{field}`: send {shape} to embed"),
            ));
        }
        Some(Value::String(s)) if s.is_empty() => return Err(ApiError::empty_input(flavor)),
        Some(Value::String(s)) => return Ok(Inputs::Texts(vec![s])),
        Some(Value::Array(items)) => items,
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("`{field}` must be {shape}, got {}", describe(&v)),
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::empty_input(flavor));
    }
    // One list of numbers is one token-id sequence, however long.
    if items.iter().all(Value::is_number) {
        return Ok(Inputs::Ids(vec![token_ids(&items, 0, limits, flavor)?]));
    }
    let id_lists: Option<Vec<&Vec<Value>>> = items
        .iter()
        .map(|v| v.as_array().filter(|a| a.iter().all(Value::is_number)))
        .collect();
    if let Some(lists) = id_lists {
        // Refused for being ids before being too many: that is the fix the
        // client needs first.
        if !limits.accept_token_ids {
            return Err(ApiError::token_ids(flavor));
        }
        if lists.len() > max {
            return Err(ApiError::too_many(flavor, lists.len(), max));
        }
        let mut seqs = Vec::with_capacity(lists.len());
        for (i, ids) in lists.into_iter().enumerate() {
            if ids.is_empty() {
                return Err(ApiError::empty_input(flavor));
            }
            seqs.push(token_ids(ids, i, limits, flavor)?);
        }
        return Ok(Inputs::Ids(seqs));
    }
    if items.len() > max {
        return Err(ApiError::too_many(flavor, items.len(), max));
    }
    let mut inputs = Vec::with_capacity(items.len());
    for (i, item) in items.into_iter().enumerate() {
        match item {
            Value::String(s) if s.is_empty() => return Err(ApiError::empty_input(flavor)),
            Value::String(s) => inputs.push(s),
            Value::Number(_) => return Err(mixed(flavor, field, i)),
            Value::Array(inner) if !inner.is_empty() && inner.iter().all(Value::is_number) => {
                return Err(mixed(flavor, field, i));
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
    Ok(Inputs::Texts(inputs))
}

/// A non-negative whole number, written as an integer (`64`) or with a
/// fraction of zero (`64.0`): JSON Schema's `integer`, which the OpenAPI
/// document promises, includes both, and so does OpenAI's API.
pub(super) fn whole(n: &serde_json::Number) -> Option<u64> {
    n.as_u64().or_else(|| {
        let f = n.as_f64()?;
        // Below 2^53 every whole f64 is exact, and far above any limit.
        (f.fract() == 0.0 && (0.0..9_007_199_254_740_992.0).contains(&f)).then_some(f as u64)
    })
}

/// A list that holds both texts and token ids: neither API takes it.
fn mixed(flavor: Flavor, field: &'static str, i: usize) -> ApiError {
    ApiError::invalid(
        flavor,
        field,
        format!(
            "`{field}` item {i} is token ids among texts: send a list of strings, or (where \
             this server accepts ids) a list of token-id lists, not both"
        ),
    )
}

/// Input `index`'s ids (`ids`: numbers, at least one), refused unless the
/// server accepts ids, and then each checked against the vocabulary.
fn token_ids(
    ids: &[Value],
    index: usize,
    limits: &Limits,
    flavor: Flavor,
) -> Result<Vec<u32>, ApiError> {
    if !limits.accept_token_ids {
        return Err(ApiError::token_ids(flavor));
    }
    let mut out = Vec::with_capacity(ids.len());
    for (position, id) in ids.iter().enumerate() {
        // Negative, fractional and huge numbers are outside it too; the
        // message quotes the id as it was sent.
        match id.as_number().and_then(whole) {
            Some(v) if v < limits.vocab as u64 => out.push(v as u32),
            _ => {
                return Err(ApiError::token_id_out_of_vocabulary(
                    flavor,
                    index,
                    position,
                    &id.to_string(),
                    limits.vocab,
                ));
            }
        }
    }
    Ok(out)
}

pub(super) fn opt_bool(
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
pub(super) fn describe(v: &Value) -> String {
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

    /// The texts of a call that holds texts.
    fn texts(c: &EmbedCall) -> Vec<&str> {
        match &c.inputs {
            Inputs::Texts(t) => t.iter().map(String::as_str).collect(),
            Inputs::Ids(ids) => panic!("token ids, not texts: {ids:?}"),
        }
    }

    /// Limits that accept token ids, with a vocabulary of 100.
    fn ids_ok() -> Limits {
        Limits {
            accept_token_ids: true,
            vocab: 100,
            ..limits()
        }
    }

    #[test]
    fn tei_single_string_and_list() {
        let c = tei(r#"{"inputs": "hello"}"#).unwrap();
        assert_eq!(texts(&c), ["hello"]);
        assert!(c.normalize);
        assert!(!c.truncate, "TEI's --auto-truncate defaults to off");
        assert_eq!(c.truncation_direction, TruncationDirection::Right);
        assert_eq!(c.flavor, Flavor::Tei);
        assert_eq!(c.encoding, Encoding::Float);
        let c = tei(r#"{"inputs": ["a", "b"], "normalize": false, "truncate": true}"#).unwrap();
        assert_eq!(texts(&c), ["a", "b"]);
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
        assert_eq!(texts(&c), ["Today is a sunny day"]);
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
    fn tei_prompt_name_and_dimensions_are_taken() {
        let c = tei(r#"{"inputs": "x", "prompt_name": "query", "dimensions": 128}"#).unwrap();
        assert_eq!(c.prompt_name.as_deref(), Some("query"));
        assert_eq!(c.dimensions, Some(128));
        for d in ["0", "385", "1.5", "\"8\""] {
            let e = tei(&format!(r#"{{"inputs": "x", "dimensions": {d}}}"#)).unwrap_err();
            assert_eq!((e.status, e.param), (422, Some("dimensions")), "{d}");
            assert!(e.message.contains("1 to 384"), "{}", e.message);
        }
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
    fn openai_takes_openais_2048_inputs_and_tei_keeps_32() {
        let list = |n: usize| format!("[{}]", vec!["\"a\""; n].join(","));
        // LangChain's default chunk of 1000, and OpenAI's most.
        for n in [33, 1000, 2048] {
            let c = oai(&format!(r#"{{"input": {}}}"#, list(n))).unwrap();
            assert_eq!(c.inputs.len(), n);
        }
        let e = oai(&format!(r#"{{"input": {}}}"#, list(2049))).unwrap_err();
        assert_eq!(e.status, 400);
        assert_eq!(e.code, Some("too_many_inputs"));
        assert!(e.message.contains("2049") && e.message.contains("2048"));
        assert!(
            e.message.contains(settings::ENV_MAX_OPENAI_INPUTS),
            "{}",
            e.message
        );
        let e = tei(&format!(r#"{{"inputs": {}}}"#, list(1000))).unwrap_err();
        assert_eq!(e.status, 413);
        assert!(e.message.contains(settings::ENV_MAX_CLIENT_BATCH_SIZE));
        // The setting moves the OpenAI limit alone, either way.
        let l = Limits {
            max_openai_inputs: 10,
            ..limits()
        };
        let e = parse_openai(format!(r#"{{"input": {}}}"#, list(11)).as_bytes(), &l).unwrap_err();
        assert_eq!(e.code, Some("too_many_inputs"));
        assert!(parse_openai(format!(r#"{{"input": {}}}"#, list(10)).as_bytes(), &l).is_ok());
        assert!(parse_tei(format!(r#"{{"inputs": {}}}"#, list(32)).as_bytes(), &l).is_ok());
        let l = Limits {
            max_openai_inputs: 5000,
            accept_token_ids: true,
            ..limits()
        };
        let body = format!(r#"{{"input": {}}}"#, list(5000));
        assert_eq!(
            parse_openai(body.as_bytes(), &l).unwrap().inputs.len(),
            5000
        );
        let ids = format!("[{}]", vec!["[1, 2]"; 5001].join(","));
        let e = parse_openai(format!(r#"{{"input": {ids}}}"#).as_bytes(), &l).unwrap_err();
        assert_eq!(e.code, Some("too_many_inputs"));
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
    fn token_ids_are_refused_with_422_by_default() {
        for body in [r#"{"inputs": [1, 2, 3]}"#, r#"{"inputs": [[1, 2], [3]]}"#] {
            let e = tei(body).unwrap_err();
            assert_eq!(e.status, 422);
            assert_eq!(e.kind, "Validation");
            assert_eq!(e.code, Some("token_ids_unsupported"));
            assert!(e.message.contains("token ids"));
        }
        for body in [
            r#"{"input": [1, 2, 3]}"#,
            r#"{"input": [[1, 2], [3]]}"#,
            r#"{"input": [[1, 2], []]}"#,
            // What LangChain sends by default: tiktoken ids, some past
            // this model's vocabulary.
            r#"{"input": [[9906, 1917, 100257]], "model": "text-embedding-ada-002"}"#,
        ] {
            let e = oai(body).unwrap_err();
            assert_eq!(e.status, 422, "{body}");
            assert_eq!(e.kind, "invalid_request_error");
            assert_eq!(e.code, Some("token_ids_unsupported"));
            assert_eq!(e.param, Some("input"));
            assert!(e.message.contains("tokenizes text itself"), "{}", e.message);
            assert!(e.message.contains("check_embedding_ctx_length=False"));
        }
        // Many id lists: refused for being ids, the fix that comes first.
        let many = format!("[{}]", vec!["[1]"; 3000].join(","));
        let e = oai(&format!(r#"{{"input": {many}}}"#)).unwrap_err();
        assert_eq!(e.code, Some("token_ids_unsupported"));
    }

    #[test]
    fn token_ids_are_taken_when_accepted() {
        let l = ids_ok();
        let c = parse_openai(br#"{"input": [[1, 5, 2], [1, 99, 7, 2]]}"#, &l).unwrap();
        assert_eq!(
            c.inputs,
            Inputs::Ids(vec![vec![1, 5, 2], vec![1, 99, 7, 2]])
        );
        assert_eq!(c.inputs.len(), 2);
        // A flat list is one sequence, however long: not 3000 inputs.
        let long = format!("[{}]", vec!["7"; 3000].join(","));
        let c = parse_openai(format!(r#"{{"input": {long}}}"#).as_bytes(), &l).unwrap();
        assert_eq!(c.inputs, Inputs::Ids(vec![vec![7; 3000]]));
        let c = parse_tei(br#"{"inputs": [3, 4]}"#, &l).unwrap();
        assert_eq!(c.inputs, Inputs::Ids(vec![vec![3, 4]]));
        // Whole numbers written with a zero fraction are ids too.
        let c = parse_openai(br#"{"input": [[1.0, 5e0, 2]]}"#, &l).unwrap();
        assert_eq!(c.inputs, Inputs::Ids(vec![vec![1, 5, 2]]));
        // Texts are still texts.
        let c = parse_openai(br#"{"input": ["a", "b"]}"#, &l).unwrap();
        assert_eq!(c.inputs, Inputs::Texts(vec!["a".into(), "b".into()]));
    }

    #[test]
    fn an_id_outside_the_vocabulary_is_422_naming_the_first() {
        let l = ids_ok();
        for (body, id, item, position) in [
            (r#"{"input": [[1, 2], [3, 100, 200]]}"#, "100", 1, 1),
            (r#"{"input": [5, -1, 300]}"#, "-1", 0, 1),
            (r#"{"input": [[1.5]]}"#, "1.5", 0, 0),
            (
                r#"{"input": [[18446744073709551616]]}"#,
                "1.8446744073709552e+19",
                0,
                0,
            ),
        ] {
            let e = parse_openai(body.as_bytes(), &l).unwrap_err();
            assert_eq!(e.status, 422, "{body}");
            assert_eq!(e.code, Some("token_id_out_of_vocabulary"), "{body}");
            assert!(
                e.message.contains(&format!("token id {id} "))
                    && e.message.contains(&format!("item {item} "))
                    && e.message.contains(&format!("position {position},"))
                    && e.message.contains("0 to 99"),
                "{body}: {}",
                e.message
            );
            let v: Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v["error"]["param"], "input");
        }
        let e = parse_tei(br#"{"inputs": [[1, 100]]}"#, &l).unwrap_err();
        assert_eq!((e.status, e.kind), (422, "Validation"));
    }

    #[test]
    fn ids_empty_or_mixed_with_texts_are_refused() {
        let l = ids_ok();
        let e = parse_openai(br#"{"input": [[1, 2], []]}"#, &l).unwrap_err();
        assert_eq!(e.code, Some("empty_input"));
        for body in [
            &br#"{"input": ["a", [1, 2]]}"#[..],
            br#"{"input": ["a", 3]}"#,
            br#"{"input": [[1, 2], "a"]}"#,
        ] {
            for limits in [&l, &limits()] {
                let e = parse_openai(body, limits).unwrap_err();
                assert_eq!(e.status, 400, "{}", String::from_utf8_lossy(body));
                assert!(e.message.contains("token ids among texts"), "{}", e.message);
            }
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
        assert_eq!(texts(&c), ["日本語", "emoji 🦀", "é🦀", "nul \0"]);
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
        assert_eq!(texts(&c)[0].len(), text.len());
        let big = "a".repeat(2_000_001);
        let e = tei(&format!(r#"{{"inputs": "{big}"}}"#)).unwrap_err();
        assert_eq!(e.status, 413);
    }

    #[test]
    fn openai_defaults_and_fields() {
        let c = oai(r#"{"input": "hello", "model": "text-embedding-3-small"}"#).unwrap();
        assert_eq!(texts(&c), ["hello"]);
        assert_eq!(c.model.as_deref(), Some("text-embedding-3-small"));
        assert_eq!(c.encoding, Encoding::Float);
        assert!(c.normalize);
        assert!(!c.truncate);
        assert_eq!(c.dimensions, None);
        assert_eq!(c.flavor, Flavor::OpenAi);
        // What openai-python sends by default.
        let c = oai(r#"{"input": ["a", "b"], "model": "m", "encoding_format": "base64"}"#).unwrap();
        assert_eq!(c.encoding, Encoding::Base64);
        assert_eq!(texts(&c), ["a", "b"]);
        let c = oai(
            r#"{"input": "x", "model": null, "encoding_format": null, "dimensions": null, "user": null}"#,
        )
        .unwrap();
        assert_eq!(c.model, None);
        let c = oai(r#"{"input": "x", "dimensions": 128, "user": "u-1"}"#).unwrap();
        assert_eq!(c.dimensions, Some(128));
        // JSON Schema's integer, as the OpenAPI document says: a whole
        // number with a zero fraction is one (schemathesis sent 1.0).
        for (body, want) in [
            (r#"{"input": "x", "dimensions": 1.0}"#, 1),
            (r#"{"input": "x", "dimensions": 52.0}"#, 52),
            (r#"{"input": "x", "dimensions": 3.84e2}"#, 384),
        ] {
            assert_eq!(oai(body).unwrap().dimensions, Some(want), "{body}");
        }
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
