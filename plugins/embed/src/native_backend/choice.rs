//! What `libm0_embed.so` serves: the native encoder, or a native backend
//! library when [`ENV_BACKEND`](super::ENV_BACKEND) is set. Chosen in
//! [`Backend::load`], in the worker; the plugin is `embed` either way.

use m0serve_plugin::{Description, Error, Host, InitArgs, InitError};

use super::NativeBackend;
use crate::backend::{Backend, BackendError, ModelSource, SparseVector};
use crate::model::{Encoded, Model, ModelInfo, Tokenizer};

/// The forward pass `libm0_embed.so` runs.
pub enum EmbedBackend {
    /// The native encoder ([`Model`]).
    Encoder(Model),
    /// A library written against include/m0embed_backend.h.
    Native(NativeBackend),
}

impl Backend for EmbedBackend {
    const DESCRIPTION: Description = <Model as Backend>::DESCRIPTION;

    const MODEL_DIR_HINT: &'static str = <Model as Backend>::MODEL_DIR_HINT;

    /// The encoder's: one model per ARG. The default took ARG alone, so
    /// every model after the first was dropped without a word.
    fn model_args(args: &InitArgs) -> Vec<String> {
        <Model as Backend>::model_args(args)
    }

    fn load(
        host: &'static Host,
        args: &InitArgs,
        model: ModelSource<'_>,
    ) -> Result<EmbedBackend, InitError> {
        if super::configured().is_some() {
            NativeBackend::load(host, args, model).map(EmbedBackend::Native)
        } else {
            <Model as Backend>::load(host, args, model).map(EmbedBackend::Encoder)
        }
    }

    fn info(&self) -> &ModelInfo {
        match self {
            EmbedBackend::Encoder(m) => Backend::info(m),
            EmbedBackend::Native(n) => n.info(),
        }
    }

    fn tokenizer(&self) -> &Tokenizer {
        match self {
            EmbedBackend::Encoder(m) => Backend::tokenizer(m),
            EmbedBackend::Native(n) => n.tokenizer(),
        }
    }

    fn embed(&self, batch: &[Encoded]) -> Result<Vec<f32>, BackendError> {
        match self {
            EmbedBackend::Encoder(m) => Backend::embed(m, batch),
            EmbedBackend::Native(n) => n.embed(batch),
        }
    }

    fn token_states(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        match self {
            EmbedBackend::Encoder(m) => Backend::token_states(m, batch),
            EmbedBackend::Native(n) => n.token_states(batch),
        }
    }

    fn classify(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        match self {
            EmbedBackend::Encoder(m) => Backend::classify(m, batch),
            EmbedBackend::Native(n) => n.classify(batch),
        }
    }

    fn sparse(&self, batch: &[Encoded]) -> Option<Result<Vec<SparseVector>, BackendError>> {
        match self {
            EmbedBackend::Encoder(m) => Backend::sparse(m, batch),
            EmbedBackend::Native(n) => n.sparse(batch),
        }
    }

    fn thread_start(&self, index: u32) -> Result<(), Error> {
        match self {
            EmbedBackend::Encoder(m) => m.thread_start(index),
            EmbedBackend::Native(n) => n.thread_start(index),
        }
    }

    fn thread_stop(&self, index: u32) {
        match self {
            EmbedBackend::Encoder(m) => m.thread_stop(index),
            EmbedBackend::Native(n) => n.thread_stop(index),
        }
    }
}
