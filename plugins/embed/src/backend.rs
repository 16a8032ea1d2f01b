//! What runs the forward pass behind the plugin: the native encoder
//! ([`Model`]), or a backend in another runtime (a Python module, in the
//! pyembed plugin). Everything around it is the plugin's, whatever the
//! backend: tokenizing, validation, the two APIs, errors, normalisation,
//! `/health`, `/info`, batching.

use std::fmt;
use std::path::Path;

use m0serve_plugin::{Description, Error, Host, InitArgs, InitError};

use crate::model::{Encoded, LoadOptions, Model, ModelInfo, Tokenizer};
use crate::settings::Settings;

/// Where a backend's model comes from, as init found it.
#[derive(Debug)]
pub struct ModelSource<'a> {
    /// The sentence-transformers folder.
    pub dir: &'a Path,
    /// The name the model goes by, when the folder is the default package's.
    pub name: Option<String>,
    /// The `M0_EMBED_*` variables.
    pub settings: &'a Settings,
}

/// One input's sparse vector: its nonzero `(vocabulary index, value)`
/// entries, ascending by index.
pub type SparseVector = Vec<(u32, f32)>;

/// A forward pass for [`Embed`](crate::Embed).
///
/// `Send + Sync`: the host calls the plugin from several handler threads at
/// once (its descriptor permitting), and each call may embed.
pub trait Backend: Sized + Send + Sync + 'static {
    /// The plugin's name and version, and how it may be called; the plugin
    /// adds its compute threads and batch limits.
    const DESCRIPTION: Description;

    /// How a model folder is given to this plugin, for the message that
    /// says none was found ("pass ... as ARG").
    const MODEL_DIR_HINT: &'static str;

    /// The description the host reads (before init, with no side effects:
    /// `--doctor` calls it in a throwaway process), from the one the plugin
    /// made; by default unchanged.
    fn describe(plugin: Description) -> Description {
        plugin
    }

    /// The model folder this plugin was asked for; empty for the default
    /// package's. By default ARG.
    fn model_arg(args: &InitArgs) -> String {
        args.arg.clone()
    }

    /// The model folders this plugin was asked for, each `DIR` or
    /// `NAME=DIR`, one model served per item; by default
    /// [`Backend::model_arg`]'s one.
    fn model_args(args: &InitArgs) -> Vec<String> {
        vec![Self::model_arg(args)]
    }

    /// Starts the backend in this worker for the folder. It may state facts
    /// of its own; the plugin states `embed.*`.
    fn load(
        host: &'static Host,
        args: &InitArgs,
        model: ModelSource<'_>,
    ) -> Result<Self, InitError>;

    /// What the model is. [`ModelInfo::threads`] is the compute threads of
    /// one [`Backend::embed`] call; a `weight_bytes` of 0 is not reported.
    fn info(&self) -> &ModelInfo;

    /// The model's tokenizer.
    fn tokenizer(&self) -> &Tokenizer;

    /// The pooled embeddings of a batch, not normalized: `batch.len() *
    /// info().dim` floats, row after row in the batch's order (the plugin
    /// normalizes the rows of the requests that ask). Inputs are never
    /// empty and never longer than `info().max_len`.
    fn embed(&self, batch: &[Encoded]) -> Result<Vec<f32>, BackendError>;

    /// Every token's last hidden state, before pooling, for `/embed_all`:
    /// `sum(tokens) * info().dim` floats, the inputs' tokens one after
    /// another. `None` (the default) when this backend gives pooled
    /// vectors only: the route then answers 501.
    fn token_states(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        let _ = batch;
        None
    }

    /// A cross-encoder's raw logits for a batch of pairs (or single
    /// texts), for `/rerank`, `/predict` and Cohere's rerank:
    /// `batch.len() * labels` floats, row after row, where `labels` is
    /// [`ModelInfo::task`]'s. `None` (the default) when this backend
    /// serves no cross-encoder (its models load as embedders, and those
    /// routes answer 424 before a forward pass).
    fn classify(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        let _ = batch;
        None
    }

    /// A SPLADE model's sparse vectors for `/embed_sparse`: per input,
    /// its nonzero `(index, value)` entries in ascending index. `None`
    /// (the default) as for [`Backend::classify`].
    fn sparse(&self, batch: &[Encoded]) -> Option<Result<Vec<SparseVector>, BackendError>> {
        let _ = batch;
        None
    }

    /// On each handler thread before its first call.
    fn thread_start(&self, index: u32) -> Result<(), Error> {
        let _ = index;
        Ok(())
    }

    /// On each handler thread before it exits.
    fn thread_stop(&self, index: u32) {
        let _ = index;
    }
}

/// Why a forward pass failed: every request of its batch is answered as
/// TEI answers a backend failure (424 `Backend`; 500 on OpenAI's route)
/// with [`BackendError::message`], and the plugin logs
/// [`BackendError::detail`] once.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackendError {
    /// For the clients: one line.
    pub message: String,
    /// For the log: the whole story (a traceback); empty when the message
    /// says it all.
    pub detail: String,
}

impl BackendError {
    pub fn new(message: impl Into<String>, detail: impl Into<String>) -> BackendError {
        BackendError {
            message: message.into(),
            detail: detail.into(),
        }
    }
}

impl fmt::Display for BackendError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for BackendError {}

/// The CPUs a worker's passes share: what it may run on (`available`:
/// affinity and quota), at most what its handler threads compute at once
/// (each with the compute threads the descriptor declared). Two workers
/// on two CPUs get one each, as the server gave each one handler thread.
fn worker_cpus(args: &InitArgs, available: usize) -> usize {
    let per_call = crate::settings::Settings::threads_for_descriptor().max(1) as usize;
    (args.handler_threads.max(1) as usize)
        .saturating_mul(per_call)
        .min(available)
        .max(1)
}

/// The native encoder: pure Rust, no process-wide lock,
/// [`crate::settings::ENV_THREADS`] compute threads per call.
impl Backend for Model {
    // Reentrant with no process-wide lock: concurrent calls each run their
    // own forward pass. A call computes for milliseconds, so it is never
    // made on the event loop.
    // One model per ARG (`DIR` or `NAME=DIR`): a host of ABI 1.6 or later.
    const DESCRIPTION: Description = Description::new(c"embed", c"0.1.0").several_args();

    const MODEL_DIR_HINT: &'static str =
        "pass a sentence-transformers model folder as ARG (m0serve --plugin embed MODEL_DIR)";

    /// Every ARG, one model each (`DIR` or `NAME=DIR`); the default
    /// package's when none is given.
    fn model_args(args: &InitArgs) -> Vec<String> {
        match args.args.is_empty() {
            true => vec![args.arg.clone()],
            false => args.args.clone(),
        }
    }

    fn load(
        _host: &'static Host,
        args: &InitArgs,
        model: ModelSource<'_>,
    ) -> Result<Model, InitError> {
        // Before the folder is read: a CPU that cannot run bf16 is the
        // setting's fault, named as such, not the model's.
        crate::model::dtype_on_this_cpu(model.settings.dtype)
            .map_err(|why| InitError::refused(format!("embed: {why}")))?;
        let available = std::thread::available_parallelism().map_or(1, |n| n.get());
        let cpus = worker_cpus(args, available);
        crate::model::share_cpus(cpus);
        Model::load(
            model.dir,
            LoadOptions {
                threads: model.settings.threads.unwrap_or(cpus),
                name: model.name,
                cache_dir: model.settings.cache_dir.clone(),
                dtype: model.settings.dtype,
            },
        )
        .map_err(|e| InitError::refused(format!("embed: cannot load the model: {e}")))
    }

    fn info(&self) -> &ModelInfo {
        Model::info(self)
    }

    fn tokenizer(&self) -> &Tokenizer {
        Model::tokenizer(self)
    }

    fn embed(&self, batch: &[Encoded]) -> Result<Vec<f32>, BackendError> {
        Ok(Model::embed(self, batch, false))
    }

    fn token_states(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        Some(Ok(Model::token_states(self, batch)))
    }

    fn classify(&self, batch: &[Encoded]) -> Option<Result<Vec<f32>, BackendError>> {
        Some(Ok(Model::classify(self, batch)))
    }

    fn sparse(&self, batch: &[Encoded]) -> Option<Result<Vec<SparseVector>, BackendError>> {
        Some(Ok(Model::sparse(self, batch)))
    }
}
