//! One served model: its backend and everything its routes need (kind,
//! limits, prompts, `/info` and OpenAPI bodies, admission budget), made
//! once at init from its folder.

use m0serve_plugin::{Host, InitArgs, InitError, ModelId};

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::AtomicU64;

use super::VERSION;
use super::metrics::Metrics;
use crate::api::{self, InfoFields, Limits, ModelKind};
use crate::backend::{Backend, ModelSource};
use crate::model::{Model, Task};
use crate::settings::{self, Settings};

/// A model this worker serves, under its name.
pub(super) struct Served<B: Backend = Model> {
    pub(super) host: &'static Host,
    pub(super) backend: B,
    /// The name requests pick it by (`model`, `/models/{name}/`) and
    /// `/v1/embeddings` answers with.
    pub(super) served_name: String,
    /// The model's prompts by name (config_sentence_transformers.json).
    pub(super) prompts: BTreeMap<String, String>,
    /// The prompt for inputs that name none
    /// ([`settings::ENV_DEFAULT_PROMPT_NAME`]'s or
    /// [`settings::ENV_DEFAULT_PROMPT`]'s).
    pub(super) default_prompt: Option<String>,
    pub(super) limits: Limits,
    /// Most tokens one [`Backend::embed`] call is given: what bounds the
    /// memory of a pass, however many inputs the requests behind it hold.
    pub(super) pass_tokens: usize,
    /// `GET /info`'s body, made once.
    pub(super) info: Vec<u8>,
    /// `GET /openapi.json`'s body, made once, with this server's limits.
    pub(super) openapi: Vec<u8>,
    /// Most inputs of this model in flight in this worker
    /// ([`settings::ENV_MAX_CONCURRENT_INPUTS`]).
    pub(super) max_concurrent_inputs: usize,
    /// What the model is served for: which routes it answers.
    pub(super) kind: ModelKind,
    /// A cross-encoder's labels, in id order (empty for other models).
    pub(super) labels: Vec<String>,
    /// Requests answered with an id (Cohere's), for the next id.
    pub(super) requests: AtomicU64,
    /// The host's id of this model: its requests' batches, admitted
    /// inputs and metrics are its own. `None` from a host before ABI 1.6
    /// (then every model shares the worker's budget).
    pub(super) id: Option<ModelId>,
    /// TEI's `te_*` series, labelled with this model's name.
    pub(super) metrics: Metrics,
}

/// A model's folder as init found it, and the backend loaded from it.
pub(super) struct Loaded<B> {
    pub(super) dir: PathBuf,
    /// `NAME` of `NAME=DIR`.
    pub(super) name: Option<String>,
    pub(super) backend: B,
}

/// Finds the folder of one model ARG and loads its backend (on any
/// thread: several load at once).
pub(super) fn load<B: Backend>(
    host: &'static Host,
    args: &InitArgs,
    settings: &Settings,
    arg: &crate::models::ModelArg,
) -> Result<Loaded<B>, InitError> {
    let (dir, name) = settings::model_dir(&arg.dir, args.venv.as_deref(), B::MODEL_DIR_HINT)
        .map_err(InitError::refused)?;
    let backend = B::load(
        host,
        args,
        ModelSource {
            dir: &dir,
            name,
            settings,
        },
    )?;
    Ok(Loaded {
        dir,
        name: arg.name.clone(),
        backend,
    })
}

/// What a model's facts are stated under: `embed.` for the first (as with
/// one model), and `embed.model.{index}.` for each of several.
pub(super) struct Facts<'a> {
    pub(super) prefixes: &'a [String],
}

impl<B: Backend> Served<B> {
    /// The model's routes' state, its facts (under each of `facts`'
    /// prefixes) and its start line; `several`: one of several models,
    /// whose line names it.
    pub(super) fn new(
        host: &'static Host,
        args: &InitArgs,
        settings: &Settings,
        loaded: Loaded<B>,
        facts: Facts<'_>,
        several: bool,
        metrics: Metrics,
    ) -> Result<Served<B>, InitError> {
        let plugin = B::DESCRIPTION.name();
        let Loaded {
            dir,
            name: arg_name,
            backend,
        } = loaded;
        let threads = args.max_handler_threads.max(args.handler_threads).max(1) as usize;
        let max_concurrent_inputs = settings.max_concurrent_inputs(threads);
        let m = backend.info();
        let (kind, labels) = match &m.task {
            Task::Embed => (ModelKind::Embedding, Vec::new()),
            Task::Classify { labels } if labels.len() == 1 => (ModelKind::Reranker, labels.clone()),
            Task::Classify { labels } => (ModelKind::Classifier, labels.clone()),
            Task::Sparse => (ModelKind::Sparse, Vec::new()),
        };
        // TEI reports a SPLADE model as an embedder of `splade` pooling.
        let pooling = match kind {
            ModelKind::Sparse => "splade",
            _ => m.pooling.as_str(),
        };
        let served_name = arg_name
            .or_else(|| settings.served_model_name.clone())
            .unwrap_or_else(|| m.name.clone());
        let prompts = settings::prompts(&dir).map_err(InitError::refused)?;
        let default_prompt = match (&settings.default_prompt_name, &settings.default_prompt) {
            (Some(name), _) => Some(prompts.get(name).cloned().ok_or_else(|| {
                let known: Vec<&str> = prompts.keys().map(String::as_str).collect();
                InitError::refused(format!(
                    "{plugin}: {}={name:?} is not a prompt of the model in {} ({}); set it to \
                     one of its prompts, or unset it",
                    settings::ENV_DEFAULT_PROMPT_NAME,
                    dir.display(),
                    if known.is_empty() {
                        "its config_sentence_transformers.json has none".to_string()
                    } else {
                        format!("it has {}", known.join(", "))
                    }
                ))
            })?),
            (None, Some(text)) => Some(text.clone()),
            (None, None) => None,
        };
        let prompt_names = prompts.keys().cloned().collect::<Vec<_>>().join(",");
        let mapped_bytes = m.weights_file.as_ref().map_or(0, |_| m.weight_bytes);
        let model_facts = [
            ("model", m.name.clone()),
            ("model_dir", dir.display().to_string()),
            ("architecture", m.architecture.to_string()),
            // TEI's model type: which routes answer (the others are 424).
            ("task", kind.name().to_string()),
            ("labels", labels.join(",")),
            ("dim", m.dim.to_string()),
            ("layers", m.layers.to_string()),
            ("max_len", m.max_len.to_string()),
            ("pooling", pooling.to_string()),
            ("normalize", m.normalize.to_string()),
            ("weight_bytes", m.weight_bytes.to_string()),
            // Bytes of weights this process maps from the cache file, and
            // whether those pages are shared with the other workers (a
            // read-only MAP_SHARED mapping of one file): the memory a
            // worker adds is what `Pss` shows, not these bytes again.
            ("weights_mapped_bytes", mapped_bytes.to_string()),
            ("weights_shared", m.weights_file.is_some().to_string()),
            (
                "weights_file",
                m.weights_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            // M0_EMBED_DTYPE as this CPU resolved it, and the dense
            // layers' products that compute it.
            ("dtype", m.dtype.to_string()),
            ("kernels", m.kernels.to_string()),
            ("threads", m.threads.to_string()),
            ("served_model_name", served_name.clone()),
            ("prompts", prompt_names),
        ];
        let setting_facts = [
            (
                "max_batch_requests",
                settings.max_batch_requests.to_string(),
            ),
            ("max_batch_bytes", settings.max_batch_bytes.to_string()),
            (
                "max_client_batch_size",
                settings.max_client_batch_size.to_string(),
            ),
            ("max_openai_inputs", settings.max_openai_inputs.to_string()),
            (
                "max_cohere_documents",
                settings.max_cohere_documents.to_string(),
            ),
            ("accept_token_ids", settings.accept_token_ids.to_string()),
            ("payload_limit", settings.payload_limit.to_string()),
            (
                "default_prompt_name",
                settings.default_prompt_name.clone().unwrap_or_default(),
            ),
            (
                "default_prompt",
                settings.default_prompt.clone().unwrap_or_default(),
            ),
            ("max_concurrent_inputs", max_concurrent_inputs.to_string()),
        ];
        for prefix in facts.prefixes {
            // The settings are the process's: stated once, under `embed.`.
            let settings = if prefix == "embed." {
                &setting_facts[..]
            } else {
                &[]
            };
            for (key, value) in model_facts.iter().chain(settings) {
                // Held outside this process (another runtime's): not known.
                if (*key == "weight_bytes" && m.weight_bytes == 0)
                    || (*key == "kernels" && m.kernels.is_empty())
                {
                    continue;
                }
                if key.starts_with("weights_") && m.weights_file.is_none() {
                    continue;
                }
                // Well-formed keys (a constant prefix and name): the host
                // refuses none of them.
                let _ = host.fact(&format!("{prefix}{key}"), value);
            }
        }
        let weights_of = match m.dtype {
            "bfloat16" => "weights (dense layers bf16)",
            _ => "f32 weights",
        };
        let weights = if let Some(file) = &m.weights_file {
            let built = m
                .weights_built
                .as_ref()
                .map_or(String::new(), |why| format!(", written now: it was {why}"));
            format!(
                ", {:.1} MB of {weights_of} mapped shared from {}{built}",
                m.weight_bytes as f64 / 1e6,
                file.display()
            )
        } else if m.weight_bytes > 0 {
            format!(", {:.1} MB of f32 weights", m.weight_bytes as f64 / 1e6)
        } else {
            String::new()
        };
        let served_as = if several {
            format!(" (served as `{served_name}`)")
        } else {
            String::new()
        };
        host.info(&format!(
            "{plugin}: {} {} model{served_as} from {} ({} layers, dim {}, max {} tokens, {pooling} pooling{weights}, up to {} compute thread(s) a call (its part of the CPUs while other calls compute), batches of up to {} requests and {} body bytes)",
            m.name,
            kind.name(),
            dir.display(),
            m.layers,
            m.dim,
            m.max_len,
            m.threads,
            settings.max_batch_requests,
            settings.max_batch_bytes,
        ));
        let limits = Limits {
            max_client_batch_size: settings.max_client_batch_size,
            max_openai_inputs: settings.max_openai_inputs,
            max_cohere_documents: settings.max_cohere_documents,
            accept_token_ids: settings.accept_token_ids,
            vocab: backend.tokenizer().vocab(),
            payload_limit: settings.payload_limit,
            auto_truncate: settings.auto_truncate,
            dim: m.dim,
            prompt_names: prompts.keys().cloned().collect(),
        };
        // The host bounds a batch by body bytes, not tokens; at about 4
        // bytes a token (English in JSON) the byte budget is this many
        // tokens, and each forward pass is cut to it. A request over the
        // host's budget still arrives, alone (one /v1/embeddings request
        // may hold 2048 inputs), and is embedded in passes of this many
        // tokens, in order; one input of max_len always fits.
        let max_batch_tokens = (settings.max_batch_bytes as usize / 4).max(m.max_len);
        let mut info = Vec::new();
        api::write_info(
            &InfoFields {
                model_id: &m.name,
                model_sha: None,
                model_dtype: m.dtype,
                pooling,
                kind,
                labels: &labels,
                dim: m.dim,
                max_concurrent_requests: threads * args.workers.max(1) as usize,
                max_input_length: m.max_len,
                max_batch_tokens,
                max_batch_requests: Some(settings.max_batch_requests as usize),
                max_client_batch_size: limits.max_client_batch_size,
                max_openai_inputs: limits.max_openai_inputs,
                max_concurrent_inputs,
                auto_truncate: limits.auto_truncate,
                tokenization_workers: threads,
                version: VERSION,
                sha: None,
                docker_label: None,
                served_model_name: Some(&served_name),
                payload_limit: limits.payload_limit,
                prompt_names: &prompts.keys().map(String::as_str).collect::<Vec<_>>(),
                default_prompt_name: settings.default_prompt_name.as_deref(),
            },
            &mut info,
        );
        let openapi =
            api::openapi_document(&limits, VERSION, Some(kind)).map_err(InitError::refused)?;
        // A host before 1.6 has no registry (`UNAVAILABLE`): one budget
        // then, as before. The name was checked as the registry checks it.
        let id = host.register_model(&served_name).ok();
        Ok(Served {
            id,
            metrics,
            host,
            backend,
            served_name,
            prompts,
            default_prompt,
            limits,
            pass_tokens: max_batch_tokens,
            info,
            openapi,
            max_concurrent_inputs,
            kind,
            labels,
            requests: AtomicU64::new(0),
        })
    }

    /// Its entry in `/info`'s `models`: name, kind, width, token limit
    /// and labels.
    pub(super) fn write_summary(&self, out: &mut Vec<u8>) {
        let m = self.backend.info();
        out.extend_from_slice(b"{\"name\":");
        api::write_json_str(&self.served_name, out);
        out.extend_from_slice(b",\"kind\":");
        api::write_json_str(self.kind.name(), out);
        out.extend_from_slice(
            format!(",\"dim\":{},\"max_input_length\":{}", m.dim, m.max_len).as_bytes(),
        );
        out.extend_from_slice(b",\"labels\":[");
        for (i, l) in self.labels.iter().enumerate() {
            if i > 0 {
                out.push(b',');
            }
            api::write_json_str(l, out);
        }
        out.extend_from_slice(b"]}");
    }
}
