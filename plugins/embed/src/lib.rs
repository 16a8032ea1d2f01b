//! m0serve plugin: sentence embeddings from a BERT-family model.
//!
//! `model` loads a sentence-transformers folder and runs the encoder;
//! `api` speaks the request and response formats of text-embeddings-inference
//! and OpenAI.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod model;
