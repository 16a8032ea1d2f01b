//! m0serve plugin: the embedding plugin with its forward pass in Python.
//!
//! `m0serve --plugin pyembed --app-dir DIR MODULE`: MODULE (say
//! `numpy_minilm`) is imported from `--app-dir` in an embedded CPython
//! started in each worker (never in the supervisor, so forked and spawned
//! workers alike run it), and its `load(model_dir, *, max_batch,
//! max_tokens)` gives the object whose `forward(input_ids, attention_mask,
//! token_type_ids)` embeds a padded batch. Everything else is m0-embed's
//! [`Embed`](m0_embed::Embed): the model folder (`M0_EMBED_MODEL_DIR`, else
//! the default package in `--venv`), tokenizing, the TEI and OpenAI APIs,
//! errors, normalisation, batching.
//!
//! The plugin is reentrant; the GIL is declared held for the whole call
//! unless `M0_PYEMBED_GIL=released` (a backend whose forward pass runs
//! outside Python), and the time spent waiting for it is reported.

#![deny(clippy::undocumented_unsafe_blocks)]

mod backend;

m0serve_plugin::export!(m0_embed::Embed<backend::PyBackend>);
