//! The HTTP API of the embedding plugin: routing, request parsing, error
//! replies and response rendering for text-embeddings-inference's and
//! OpenAI's embedding APIs. Pure Rust: no ABI, no model.
//!
//! A request goes: [`route`] on the request line; for the two embedding
//! routes, [`parse_tei`] or [`parse_openai`] on the body, giving an
//! [`EmbedCall`]; the model embeds `EmbedCall::inputs`, texts or (when the
//! server accepts them) token ids, (refusing over-long
//! inputs with [`ApiError::too_long`] unless `truncate`); [`shrink_rows`]
//! applies `dimensions`; [`write_tei`] or [`write_openai`] writes the reply.
//! Any failure is an [`ApiError`], whose [`ApiError::status`],
//! [`ApiError::content_type`] and [`ApiError::body`] are the reply.
//! [`count_inputs`] and [`admit`] decide, before a request is queued,
//! whether its inputs fit under the worker's limit (`admission.rs`).
//! [`openapi_document`] describes all of it as OpenAPI 3.1
//! (`openapi.json` beside this file, with the server's limits filled in).
//! [`parse_tokenize`], [`parse_decode`] and [`parse_embed_all`] serve TEI's
//! token routes; [`Timing`] writes TEI's `x-*-time` headers.
//!
//! The other models' routes, a file each: `rerank.rs` (TEI's `/rerank`),
//! `cohere.rs` (Cohere's `/v1/rerank`, `/v2/rerank`), `predict.rs`
//! (`/predict`), `similarity.rs` (`/similarity`), `sparse.rs`
//! (`/embed_sparse`), `scores.rs` (logits to scores, shared). Which model
//! answers which route is [`ROUTES`]' to say, and [`resolve`] decides it.

mod admission;
mod cohere;
mod error;
mod info;
mod json;
mod openapi;
mod predict;
mod render;
mod request;
mod rerank;
mod route;
mod scores;
mod similarity;
mod sparse;
mod timing;
mod tokens;

pub use admission::{RETRY_AFTER, admit, body_model, count_inputs};
pub use cohere::{parse_cohere, request_id, write_cohere};
pub use error::{ApiError, Flavor};
pub use info::{InfoFields, write_info};
pub(crate) use json::write_str as write_json_str;
pub use openapi::openapi_document;
pub use predict::{PredictCall, Sequence, parse_predict, write_predict};
pub use render::{shrink_rows, write_openai, write_tei};
pub use request::{
    EmbedCall, Encoding, Inputs, Limits, TruncationDirection, parse_openai, parse_tei,
};
pub use rerank::{RerankCall, parse_rerank, write_rerank};
pub(crate) use route::lookup;
pub use route::{CohereVersion, ModelKind, ROUTES, Route, RouteEntry, resolve, route, served_by};
pub use similarity::{SimilarityCall, parse_similarity, write_similarity};
pub use sparse::write_sparse;
pub use timing::{COMPUTE_TYPE, Timing};
pub use tokens::{
    DecodeCall, TokenOut, TokenizeCall, parse_decode, parse_embed_all, parse_tokenize,
    write_decoded, write_embed_all, write_tokens,
};
