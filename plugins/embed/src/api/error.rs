//! Error replies in the two shapes clients expect.
//!
//! On TEI's routes an error is `{"error": "...", "error_type": "..."}` where
//! `error_type` is one of TEI's `ErrorType` names (`Unhealthy`, `Backend`,
//! `Overloaded`, `Validation`, `Tokenizer`, `Empty`), serialized as TEI does
//! (the variant name, capitalized). The statuses follow TEI's router
//! (`router/src/http/server.rs`, `impl From<&ErrorType> for StatusCode`):
//!
//! | error_type | status |
//! |------------|--------|
//! | Unhealthy  | 503    |
//! | Backend    | 424    |
//! | Overloaded | 429    |
//! | Tokenizer  | 422    |
//! | Validation | 413    |
//! | Empty      | 400    |
//!
//! Where TEI answers in plain text (axum's JSON rejection: 400 for a syntax
//! error, 422 for a wrong type or missing field) this module answers with the
//! same status and a JSON body (`error_type` `Validation`).
//!
//! On `/v1/embeddings` an error is OpenAI's
//! `{"error": {"message", "type", "param", "code"}}`. Client mistakes are 400
//! `invalid_request_error` (openai-python raises `BadRequestError` and does
//! not retry), a body over the limit is 413, overload is 429 and
//! unavailability 503 (both retried by openai-python), failures of the model
//! are 500 `server_error`.

use super::json::write_str;
use crate::settings::{
    ENV_ACCEPT_TOKEN_IDS, ENV_AUTO_TRUNCATE, ENV_MAX_CLIENT_BATCH_SIZE, ENV_MAX_COHERE_DOCUMENTS,
    ENV_MAX_OPENAI_INPUTS, ENV_PAYLOAD_LIMIT,
};

/// Which API a request came in on, and so which error shape it gets back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavor {
    /// text-embeddings-inference: `/embed`, `/`, `/health`, `/info`.
    Tei,
    /// OpenAI: `/v1/embeddings`.
    OpenAi,
    /// Cohere: `/v1/rerank` and `/v2/rerank`; `{"message": ...}` with
    /// OpenAI's statuses (Cohere's API answers a bad request 400, overload
    /// 429, its own failures 500).
    Cohere,
}

/// An error reply: status, shape and text, ready to render with
/// [`ApiError::body`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ApiError {
    /// HTTP status code.
    pub status: u16,
    /// Which body shape [`ApiError::body`] writes.
    pub flavor: Flavor,
    /// TEI's `error_type`, or OpenAI's `type`.
    pub kind: &'static str,
    /// Human-readable: the problem and how to fix it.
    pub message: String,
    /// OpenAI's `param`: the request field at fault, if one is.
    pub param: Option<&'static str>,
    /// OpenAI's `code`: a stable machine-readable name for the condition.
    pub code: Option<&'static str>,
    /// For 405: the value of the `Allow` header the reply must carry.
    pub allow: Option<&'static str>,
}

// TEI's ErrorType names, as TEI serializes them.
pub(crate) const UNHEALTHY: &str = "Unhealthy";
pub(crate) const BACKEND: &str = "Backend";
pub(crate) const OVERLOADED: &str = "Overloaded";
pub(crate) const VALIDATION: &str = "Validation";
pub(crate) const TOKENIZER: &str = "Tokenizer";
pub(crate) const EMPTY: &str = "Empty";

// OpenAI's error types.
pub(crate) const INVALID_REQUEST: &str = "invalid_request_error";
pub(crate) const SERVER_ERROR: &str = "server_error";
pub(crate) const RATE_LIMIT: &str = "rate_limit_error";

impl ApiError {
    fn new(status: u16, flavor: Flavor, kind: &'static str, message: String) -> Self {
        ApiError {
            status,
            flavor,
            kind,
            message,
            param: None,
            code: None,
            allow: None,
        }
    }

    pub(crate) fn with_param(mut self, param: &'static str) -> Self {
        self.param = Some(param);
        self
    }

    pub(crate) fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A client mistake in the request's content: TEI 422 `Validation` (as
    /// axum's rejection of a wrong type is 422), OpenAI 400.
    pub(crate) fn invalid(flavor: Flavor, param: &'static str, message: String) -> Self {
        match flavor {
            Flavor::Tei => ApiError::new(422, flavor, VALIDATION, message).with_param(param),
            Flavor::OpenAi | Flavor::Cohere => ApiError::new(400, flavor, INVALID_REQUEST, message)
                .with_param(param)
                .with_code("invalid_value"),
        }
    }

    /// The body is not JSON (or not UTF-8): 400 on both routes.
    pub(crate) fn malformed(flavor: Flavor, why: &str) -> Self {
        let message = format!(
            "the request body is not valid JSON ({why}); send a JSON object such as {}",
            example(flavor)
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(400, flavor, kind, message).with_code("invalid_json")
    }

    /// No input to embed: an empty list or an empty string. TEI 400 `Empty`
    /// (TEI itself answers 413 `Validation` for an empty string), OpenAI 400.
    pub fn empty_input(flavor: Flavor) -> Self {
        let field = input_field(flavor);
        ApiError::empty_field(
            flavor,
            field,
            format!(
                "`{field}` is empty: send a non-empty string or a non-empty list of non-empty \
                 strings"
            ),
        )
    }

    /// `field` holds nothing to compute (`message` says what it takes):
    /// [`ApiError::empty_input`]'s statuses, for the routes whose inputs go
    /// by another name (`texts`, `documents`, `sentences`).
    pub(crate) fn empty_field(flavor: Flavor, field: &'static str, message: String) -> Self {
        match flavor {
            Flavor::Tei => ApiError::new(400, flavor, EMPTY, message).with_param(field),
            Flavor::OpenAi | Flavor::Cohere => ApiError::new(400, flavor, INVALID_REQUEST, message)
                .with_param(field)
                .with_code("empty_input"),
        }
    }

    /// More inputs in one request than `max`. TEI 413 `Validation`, OpenAI
    /// 400. Each route has its own limit, so the message names the setting
    /// of the route the request came in on.
    pub fn too_many(flavor: Flavor, n: usize, max: usize) -> Self {
        ApiError::too_many_in(flavor, input_field(flavor), n, max)
    }

    /// [`ApiError::too_many`] for a list of another name (`texts`,
    /// `documents`), naming the route's own limit.
    pub(crate) fn too_many_in(flavor: Flavor, field: &'static str, n: usize, max: usize) -> Self {
        let setting = match flavor {
            Flavor::Tei => ENV_MAX_CLIENT_BATCH_SIZE,
            Flavor::Cohere => ENV_MAX_COHERE_DOCUMENTS,
            Flavor::OpenAi => ENV_MAX_OPENAI_INPUTS,
        };
        let message = format!(
            "batch size {n} > maximum allowed batch size {max}: send at most {max} items in \
             `{field}` per request, or raise the server's limit ({setting})"
        );
        match flavor {
            Flavor::Tei => ApiError::new(413, flavor, VALIDATION, message).with_param(field),
            Flavor::OpenAi | Flavor::Cohere => ApiError::new(400, flavor, INVALID_REQUEST, message)
                .with_param(field)
                .with_code("too_many_inputs"),
        }
    }

    /// Token ids sent where this server takes text (the default). 422 on
    /// both routes: the request is well-formed, but the ids are another
    /// tokenizer's as often as not (LangChain's `OpenAIEmbeddings` sends
    /// OpenAI's tiktoken ids unless told otherwise), and embedding them as
    /// this model's vocabulary would answer 200 with meaningless vectors.
    pub fn token_ids(flavor: Flavor) -> Self {
        let field = input_field(flavor);
        let how = match flavor {
            Flavor::Tei | Flavor::Cohere => String::new(),
            Flavor::OpenAi => " (LangChain's OpenAIEmbeddings sends token ids unless it is made \
                 with check_embedding_ctx_length=False)"
                .to_string(),
        };
        let message = format!(
            "`{field}` holds token ids: this server tokenizes text itself, with its model's own \
             tokenizer, and ids made by another tokenizer would embed as nonsense; send the \
             text itself, as a string or a list of strings{how}; a client that tokenizes with \
             this model's tokenizer may send ids when the server is started with \
             {ENV_ACCEPT_TOKEN_IDS}=1"
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(422, flavor, kind, message)
            .with_param(field)
            .with_code("token_ids_unsupported")
    }

    /// Token id `id`, at `position` of input `index`, is not in the model's
    /// vocabulary of `vocab` ids. 422 on both routes.
    pub fn token_id_out_of_vocabulary(
        flavor: Flavor,
        index: usize,
        position: usize,
        id: &str,
        vocab: usize,
    ) -> Self {
        let field = input_field(flavor);
        let message = format!(
            "`{field}` item {index} has token id {id} at position {position}, outside this \
             model's vocabulary (ids 0 to {}): send ids made by this model's own tokenizer, or \
             send the text",
            vocab.saturating_sub(1)
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(422, flavor, kind, message)
            .with_param(field)
            .with_code("token_id_out_of_vocabulary")
    }

    /// Input `index` has `tokens` tokens, over the model's `max`, and
    /// truncation is off. TEI 413 `Validation`, OpenAI 400
    /// `context_length_exceeded`.
    pub fn too_long(flavor: Flavor, index: usize, tokens: usize, max: usize) -> Self {
        ApiError::too_long_in(flavor, input_field(flavor), index, tokens, max)
    }

    /// [`ApiError::too_long`] for item `index` of a list of another name
    /// (`texts`, `sentences`); a pair counts the query's tokens too.
    pub(crate) fn too_long_in(
        flavor: Flavor,
        field: &'static str,
        index: usize,
        tokens: usize,
        max: usize,
    ) -> Self {
        let fix = match flavor {
            Flavor::Tei => {
                "send \"truncate\": true to cut it to the limit, shorten it, or start \
                            the server with auto-truncation"
            }
            Flavor::OpenAi | Flavor::Cohere => {
                "shorten it, or start the server with auto-truncation"
            }
        };
        let message = format!(
            "`{field}` item {index} has {tokens} tokens, more than the model's maximum of \
             {max} tokens: {fix} ({ENV_AUTO_TRUNCATE}=1)"
        );
        match flavor {
            Flavor::Tei => ApiError::new(413, flavor, VALIDATION, message).with_param(field),
            Flavor::OpenAi | Flavor::Cohere => ApiError::new(400, flavor, INVALID_REQUEST, message)
                .with_param(field)
                .with_code("context_length_exceeded"),
        }
    }

    /// The body is `len` bytes, over the `limit`. 413 on both routes.
    pub fn payload_too_large(flavor: Flavor, len: usize, limit: usize) -> Self {
        let message = format!(
            "the request body is {len} bytes, over the limit of {limit} bytes: split the inputs \
             over several requests, or raise the limit ({ENV_PAYLOAD_LIMIT})"
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(413, flavor, kind, message).with_code("payload_too_large")
    }

    /// The tokenizer failed on an input. TEI 422 `Tokenizer`, OpenAI 400.
    pub fn tokenizer(flavor: Flavor, why: &str) -> Self {
        let message = format!("tokenization failed: {why}");
        match flavor {
            Flavor::Tei => ApiError::new(422, flavor, TOKENIZER, message),
            Flavor::OpenAi | Flavor::Cohere => ApiError::new(400, flavor, INVALID_REQUEST, message)
                .with_param("input")
                .with_code("tokenizer_error"),
        }
    }

    /// `prompt_name` names no prompt of the model's. 422 on both routes,
    /// naming the ones there are.
    pub fn unknown_prompt(flavor: Flavor, name: &str, known: &[&str]) -> Self {
        let shown: String = name.chars().take(40).collect();
        let message = if known.is_empty() {
            format!(
                "`prompt_name` {shown:?} is not a prompt of this model: it has none \
                 (config_sentence_transformers.json has no \"prompts\"); prepend the prompt \
                 text to each input instead and drop `prompt_name`"
            )
        } else {
            format!(
                "`prompt_name` {shown:?} is not a prompt of this model: send one of {}",
                known
                    .iter()
                    .map(|k| format!("{k:?}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            )
        };
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(422, flavor, kind, message)
            .with_param("prompt_name")
            .with_code("unknown_prompt")
    }

    /// This route is not served by this backend. 501, saying why.
    pub fn not_implemented(flavor: Flavor, why: &str) -> Self {
        let kind = match flavor {
            Flavor::Tei => BACKEND,
            Flavor::OpenAi | Flavor::Cohere => SERVER_ERROR,
        };
        ApiError::new(501, flavor, kind, why.to_string()).with_code("not_implemented")
    }

    /// The model cannot answer this route (`/rerank` on an embedder,
    /// `/embed` on a reranker): 424, as TEI answers it (`Backend`, TEI's
    /// "model is not a ... model"), in each route's shape. `needs` is what
    /// the route takes ("a re-ranker"), `kind` and `serves` what this
    /// model is and the routes it answers.
    pub fn wrong_model(flavor: Flavor, needs: &str, kind: &str, serves: &str) -> Self {
        let message = format!(
            "model is not {needs} model: this server's model is a{} {kind} model, which \
             answers {serves}; send this request to a server of {needs} model",
            an(kind)
        );
        let kind = match flavor {
            Flavor::Tei => BACKEND,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(424, flavor, kind, message).with_code("wrong_model_type")
    }

    /// [`ApiError::wrong_model`] on a server of several models: names the
    /// model the request reached (`name`) and the served models that
    /// answer the route (`answering`), by their `/models/NAME/` paths.
    pub fn wrong_served_model(
        flavor: Flavor,
        needs: &str,
        name: &str,
        kind: &str,
        serves: &str,
        answering: &[&str],
    ) -> Self {
        let fix = match answering {
            [] => format!("this server serves no {needs} model"),
            names => format!(
                "send it to {needs} model's path: {}",
                names
                    .iter()
                    .map(|n| format!("/models/{n}/..."))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        };
        let mut e = ApiError::wrong_model(flavor, needs, kind, serves);
        e.message = format!(
            "model is not {needs} model: the model `{name}` is a{} {kind} model, which answers \
             {serves}; {fix}",
            an(kind)
        );
        e
    }

    /// No served model goes by `name`: 404 in the route's shape (OpenAI's
    /// `model_not_found`), listing the served names.
    pub fn unknown_model(flavor: Flavor, name: &str, served: &[&str]) -> Self {
        let message = format!(
            "the model `{name}` does not exist: this server serves {}; send one of them as \
             `model` (OpenAI, Cohere) or in the path (/models/NAME/...)",
            served.join(", ")
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(404, flavor, kind, message)
            .with_param("model")
            .with_code("model_not_found")
    }

    /// The request's `model` names a model of another kind than the route
    /// needs (`/v1/rerank` naming an embedder): 400, naming the model, its
    /// kind, and the models that would answer.
    pub fn model_of_wrong_kind(
        flavor: Flavor,
        name: &str,
        kind: &str,
        needs: &str,
        answering: &[&str],
    ) -> Self {
        let message = format!(
            "the model `{name}` is a{} {kind} model, and this route needs {needs} model; {}",
            an(kind),
            if answering.is_empty() {
                "this server serves none".to_string()
            } else {
                format!("send `model` as one of {}", answering.join(", "))
            }
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(400, flavor, kind, message)
            .with_param("model")
            .with_code("wrong_model_type")
    }

    /// Too much work queued; the client may retry later. 429 on both routes.
    pub fn overloaded(flavor: Flavor, why: &str) -> Self {
        let message = format!("the model is overloaded: {why}; retry later");
        match flavor {
            Flavor::Tei => ApiError::new(429, flavor, OVERLOADED, message),
            Flavor::OpenAi | Flavor::Cohere => {
                ApiError::new(429, flavor, RATE_LIMIT, message).with_code("overloaded")
            }
        }
    }

    /// The model is not loaded (yet) or is broken. 503 on both routes.
    pub fn unavailable(flavor: Flavor, why: &str) -> Self {
        let message = format!("the model is unavailable: {why}");
        let kind = match flavor {
            Flavor::Tei => UNHEALTHY,
            Flavor::OpenAi | Flavor::Cohere => SERVER_ERROR,
        };
        ApiError::new(503, flavor, kind, message).with_code("unavailable")
    }

    /// Inference failed. TEI 424 `Backend`, OpenAI 500.
    pub fn backend(flavor: Flavor, why: &str) -> Self {
        let message = format!("inference failed: {why}");
        match flavor {
            Flavor::Tei => ApiError::new(424, flavor, BACKEND, message),
            Flavor::OpenAi | Flavor::Cohere => {
                ApiError::new(500, flavor, SERVER_ERROR, message).with_code("inference_failed")
            }
        }
    }

    /// A bug on the server's side (such as a NaN in an embedding). 500 on
    /// both routes, `Backend` on TEI's.
    pub fn internal(flavor: Flavor, why: &str) -> Self {
        let message = format!("internal error: {why}");
        let kind = match flavor {
            Flavor::Tei => BACKEND,
            Flavor::OpenAi | Flavor::Cohere => SERVER_ERROR,
        };
        ApiError::new(500, flavor, kind, message).with_code("internal_error")
    }

    /// No route for this path. 404; the OpenAI shape for paths under `/v1/`.
    pub fn not_found(method: &[u8], path: &[u8]) -> Self {
        let flavor = flavor_of_path(path);
        let message = format!(
            "no route for {} {}: this server answers POST /embed, POST /, POST /v1/embeddings, \
             POST /embed_all, POST /embed_sparse, POST /similarity, POST /rerank, \
             POST /predict, POST /v1/rerank, POST /v2/rerank, POST /tokenize, POST /decode, \
             GET /health, GET /info, GET /openapi.json and GET /v1/models, each also under \
             /models/NAME/ (GET /info's model_type says which \
             of them this model answers)",
            String::from_utf8_lossy(method),
            String::from_utf8_lossy(path)
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        ApiError::new(404, flavor, kind, message).with_code("not_found")
    }

    /// A known path asked with a method it does not take. 405, with the
    /// `Allow` value in [`ApiError::allow`].
    pub fn method_not_allowed(method: &[u8], path: &[u8], allow: &'static str) -> Self {
        let flavor = flavor_of_path(path);
        let message = format!(
            "{} is not allowed on {}: use {allow}",
            String::from_utf8_lossy(method),
            String::from_utf8_lossy(path)
        );
        let kind = match flavor {
            Flavor::Tei => VALIDATION,
            Flavor::OpenAi | Flavor::Cohere => INVALID_REQUEST,
        };
        let mut e = ApiError::new(405, flavor, kind, message).with_code("method_not_allowed");
        e.allow = Some(allow);
        e
    }

    /// HTTP status code.
    pub fn status(&self) -> u16 {
        self.status
    }

    /// `Content-Type` of [`ApiError::body`].
    pub fn content_type(&self) -> &'static str {
        "application/json"
    }

    /// The JSON body.
    pub fn body(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.message.len() + 96);
        self.write_body(&mut out);
        out
    }

    /// Appends the JSON body to `out`.
    pub fn write_body(&self, out: &mut Vec<u8>) {
        match self.flavor {
            Flavor::Tei => {
                out.extend_from_slice(b"{\"error\":");
                write_str(&self.message, out);
                out.extend_from_slice(b",\"error_type\":");
                write_str(self.kind, out);
                out.push(b'}');
            }
            // Cohere's: the message alone (its SDK raises the status's
            // exception with the body).
            Flavor::Cohere => {
                out.extend_from_slice(b"{\"message\":");
                write_str(&self.message, out);
                out.push(b'}');
            }
            Flavor::OpenAi => {
                out.extend_from_slice(b"{\"error\":{\"message\":");
                write_str(&self.message, out);
                out.extend_from_slice(b",\"type\":");
                write_str(self.kind, out);
                out.extend_from_slice(b",\"param\":");
                write_opt(self.param, out);
                out.extend_from_slice(b",\"code\":");
                write_opt(self.code, out);
                out.extend_from_slice(b"}}");
            }
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} {}: {}", self.status, self.kind, self.message)
    }
}

impl std::error::Error for ApiError {}

/// The `n` of "an" before `word` ("an embedding", "a reranker").
fn an(word: &str) -> &'static str {
    if word.starts_with(['a', 'e', 'i', 'o', 'u']) {
        "n"
    } else {
        ""
    }
}

fn write_opt(v: Option<&str>, out: &mut Vec<u8>) {
    match v {
        Some(s) => write_str(s, out),
        None => out.extend_from_slice(b"null"),
    }
}

fn input_field(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Tei => "inputs",
        Flavor::OpenAi => "input",
        Flavor::Cohere => "documents",
    }
}

fn example(flavor: Flavor) -> &'static str {
    match flavor {
        Flavor::Tei => "{\"inputs\": [\"some text\"]}",
        Flavor::OpenAi => "{\"input\": [\"some text\"], \"model\": \"...\"}",
        Flavor::Cohere => "{\"query\": \"a question\", \"documents\": [\"some text\"]}",
    }
}

fn flavor_of_path(path: &[u8]) -> Flavor {
    if path == b"/v1/rerank" || path == b"/v2/rerank" {
        Flavor::Cohere
    } else if path.starts_with(b"/v1/") || path == b"/v1" {
        Flavor::OpenAi
    } else {
        Flavor::Tei
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn parse(e: &ApiError) -> Value {
        serde_json::from_slice(&e.body()).expect("error bodies are JSON")
    }

    #[test]
    fn tei_shape_has_error_and_error_type_only() {
        let e = ApiError::too_many(Flavor::Tei, 40, 32);
        let v = parse(&e);
        let obj = v.as_object().unwrap();
        assert_eq!(obj.len(), 2);
        assert_eq!(v["error_type"], "Validation");
        assert_eq!(e.status(), 413);
        assert_eq!(e.content_type(), "application/json");
    }

    #[test]
    fn openai_shape_nests_message_type_param_code() {
        let e = ApiError::too_many(Flavor::OpenAi, 40, 32);
        let v = parse(&e);
        assert_eq!(v.as_object().unwrap().len(), 1);
        let inner = v["error"].as_object().unwrap();
        assert_eq!(inner.len(), 4);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "input");
        assert_eq!(v["error"]["code"], "too_many_inputs");
        assert_eq!(e.status(), 400);
    }

    #[test]
    fn tei_status_mapping_matches_tei_router() {
        let f = Flavor::Tei;
        let cases = [
            (ApiError::unavailable(f, "loading"), 503, "Unhealthy"),
            (ApiError::backend(f, "x"), 424, "Backend"),
            (ApiError::overloaded(f, "queue full"), 429, "Overloaded"),
            (ApiError::tokenizer(f, "bad"), 422, "Tokenizer"),
            (ApiError::too_long(f, 0, 600, 512), 413, "Validation"),
            (ApiError::too_many(f, 33, 32), 413, "Validation"),
            (ApiError::empty_input(f), 400, "Empty"),
            (ApiError::payload_too_large(f, 3, 2), 413, "Validation"),
            (ApiError::internal(f, "NaN"), 500, "Backend"),
        ];
        for (e, status, kind) in cases {
            assert_eq!(e.status, status, "{e}");
            assert_eq!(parse(&e)["error_type"], kind, "{e}");
        }
    }

    #[test]
    fn openai_status_mapping() {
        let f = Flavor::OpenAi;
        let cases = [
            (ApiError::unavailable(f, "loading"), 503, "server_error"),
            (ApiError::backend(f, "x"), 500, "server_error"),
            (
                ApiError::overloaded(f, "queue full"),
                429,
                "rate_limit_error",
            ),
            (ApiError::tokenizer(f, "bad"), 400, "invalid_request_error"),
            (
                ApiError::too_long(f, 0, 600, 512),
                400,
                "invalid_request_error",
            ),
            (ApiError::empty_input(f), 400, "invalid_request_error"),
            (
                ApiError::payload_too_large(f, 3, 2),
                413,
                "invalid_request_error",
            ),
            (ApiError::internal(f, "NaN"), 500, "server_error"),
        ];
        for (e, status, kind) in cases {
            assert_eq!(e.status, status, "{e}");
            assert_eq!(parse(&e)["error"]["type"], kind, "{e}");
        }
    }

    #[test]
    fn too_long_names_input_tokens_limit_and_fix() {
        let e = ApiError::too_long(Flavor::Tei, 3, 700, 512);
        assert!(e.message.contains("item 3"));
        assert!(e.message.contains("700 tokens"));
        assert!(e.message.contains("512"));
        assert!(e.message.contains("\"truncate\": true"));
        assert!(e.message.contains(ENV_AUTO_TRUNCATE));
        let e = ApiError::too_long(Flavor::OpenAi, 0, 700, 512);
        assert_eq!(e.code, Some("context_length_exceeded"));
        assert!(!e.message.contains("\"truncate\""));
    }

    #[test]
    fn too_many_and_payload_name_limit_and_setting() {
        let e = ApiError::too_many(Flavor::Tei, 33, 32);
        assert!(e.message.contains("33") && e.message.contains("32"));
        assert!(e.message.contains(ENV_MAX_CLIENT_BATCH_SIZE));
        let e = ApiError::too_many(Flavor::OpenAi, 2049, 2048);
        assert!(e.message.contains("2049") && e.message.contains("2048"));
        assert!(e.message.contains(ENV_MAX_OPENAI_INPUTS));
        assert!(!e.message.contains(ENV_MAX_CLIENT_BATCH_SIZE));
        let e = ApiError::payload_too_large(Flavor::Tei, 2_000_001, 2_000_000);
        assert!(e.message.contains("2000001") && e.message.contains("2000000"));
        assert!(e.message.contains(ENV_PAYLOAD_LIMIT));
    }

    #[test]
    fn token_id_errors_are_422_in_each_shape_and_say_what_to_do() {
        let e = ApiError::token_ids(Flavor::OpenAi);
        assert_eq!(e.status, 422);
        let v = parse(&e);
        assert_eq!(v["error"]["type"], "invalid_request_error");
        assert_eq!(v["error"]["param"], "input");
        assert_eq!(v["error"]["code"], "token_ids_unsupported");
        let m = v["error"]["message"].as_str().unwrap();
        assert!(m.contains("tokenizes text itself"), "{m}");
        assert!(m.contains("check_embedding_ctx_length=False"), "{m}");
        assert!(m.contains(ENV_ACCEPT_TOKEN_IDS), "{m}");
        let e = ApiError::token_ids(Flavor::Tei);
        assert_eq!(
            (e.status, parse(&e)["error_type"].as_str()),
            (422, Some("Validation"))
        );
        let e = ApiError::token_id_out_of_vocabulary(Flavor::OpenAi, 2, 5, "30522", 30522);
        assert_eq!(e.status, 422);
        assert_eq!(parse(&e)["error"]["code"], "token_id_out_of_vocabulary");
        assert!(e.message.contains("item 2") && e.message.contains("position 5"));
        assert!(e.message.contains("token id 30522") && e.message.contains("0 to 30521"));
    }

    #[test]
    fn messages_are_escaped() {
        let e = ApiError::tokenizer(Flavor::Tei, "quote \" backslash \\ newline \n nul \u{0}");
        let v = parse(&e);
        assert!(
            v["error"]
                .as_str()
                .unwrap()
                .contains("\" backslash \\ newline \n nul \u{0}")
        );
    }

    #[test]
    fn not_found_and_405_pick_shape_by_path() {
        let e = ApiError::not_found(b"GET", b"/nope");
        assert_eq!(e.status, 404);
        assert_eq!(e.flavor, Flavor::Tei);
        assert!(parse(&e)["error"].as_str().unwrap().contains("/nope"));
        let e = ApiError::not_found(b"POST", b"/v1/chat/completions");
        assert_eq!(e.flavor, Flavor::OpenAi);
        assert_eq!(parse(&e)["error"]["code"], "not_found");
        let e = ApiError::method_not_allowed(b"GET", b"/embed", "POST");
        assert_eq!(e.status, 405);
        assert_eq!(e.allow, Some("POST"));
        assert!(e.message.contains("use POST"));
    }
}
