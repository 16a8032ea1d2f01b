//! The plugin: a forward pass behind TEI's and OpenAI's routes, on the SDK.

use m0serve_plugin::{
    Admit, Batch, Description, Error, Header, Host, InitArgs, InitError, Plugin, Request, Response,
    Sent,
};

use std::collections::BTreeMap;
use std::sync::atomic::AtomicU64;

use crate::api::{self, ApiError, InfoFields, Limits, ModelKind, Route};
use crate::backend::{Backend, ModelSource};
use crate::model::{Model, Task};
use crate::settings::{self, Settings};

mod forward;
mod jobs;
mod tokens;

use jobs::Begun;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const JSON: Header<'static> = Header::new("Content-Type", "application/json");

/// One worker's forward pass and what its routes need: the embedding
/// plugin over any [`Backend`], the native encoder by default.
pub struct Embed<B: Backend = Model> {
    host: &'static Host,
    backend: B,
    /// The name `/v1/embeddings` answers with, whatever `model` a request
    /// sends (clients send their own defaults).
    served_name: String,
    /// The model's prompts by name (config_sentence_transformers.json).
    prompts: BTreeMap<String, String>,
    /// The prompt for inputs that name none
    /// ([`settings::ENV_DEFAULT_PROMPT_NAME`]'s or
    /// [`settings::ENV_DEFAULT_PROMPT`]'s).
    default_prompt: Option<String>,
    limits: Limits,
    /// Most tokens one [`Backend::embed`] call is given: what bounds the
    /// memory of a pass, however many inputs the requests behind it hold.
    pass_tokens: usize,
    /// `GET /info`'s body, made once.
    info: Vec<u8>,
    /// `GET /openapi.json`'s body, made once, with this server's limits.
    openapi: Vec<u8>,
    /// Most inputs in flight in this worker
    /// ([`settings::ENV_MAX_CONCURRENT_INPUTS`]).
    max_concurrent_inputs: usize,
    /// What the model is served for: which routes it answers.
    kind: ModelKind,
    /// A cross-encoder's labels, in id order (empty for other models).
    labels: Vec<String>,
    /// Requests answered with an id (Cohere's), for the next id.
    requests: AtomicU64,
}

impl<B: Backend> Plugin for Embed<B> {
    const DESCRIPTION: Description = B::DESCRIPTION;

    fn describe() -> Description {
        // Requests that wait together share one forward pass, which costs
        // less than a pass each: the dense layers run as larger matrix
        // products.
        let (requests, bytes) = Settings::batch_for_descriptor();
        // Admission: each request's inputs are counted on the host's loop
        // before it is queued, and one over the limit is answered at once.
        B::describe(
            Self::DESCRIPTION
                .compute_threads(Settings::threads_for_descriptor())
                .batch(requests)
                .batch_bytes(bytes)
                .admits(),
        )
    }

    fn init(host: &'static Host, args: &InitArgs) -> Result<Self, InitError> {
        let plugin = B::DESCRIPTION.name();
        let settings = Settings::from_env().map_err(InitError::refused)?;
        let threads = args.max_handler_threads.max(args.handler_threads).max(1) as usize;
        let max_concurrent_inputs = settings.max_concurrent_inputs(threads);
        let (dir, name) =
            settings::model_dir(&B::model_arg(args), args.venv.as_deref(), B::MODEL_DIR_HINT)
                .map_err(InitError::refused)?;
        let backend = B::load(
            host,
            args,
            ModelSource {
                dir: &dir,
                name,
                settings: &settings,
            },
        )?;
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
        let served_name = settings
            .served_model_name
            .clone()
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
        let facts = [
            ("embed.model", m.name.clone()),
            ("embed.model_dir", dir.display().to_string()),
            ("embed.architecture", m.architecture.to_string()),
            // TEI's model type: which routes answer (the others are 424).
            ("embed.task", kind.name().to_string()),
            ("embed.labels", labels.join(",")),
            ("embed.dim", m.dim.to_string()),
            ("embed.layers", m.layers.to_string()),
            ("embed.max_len", m.max_len.to_string()),
            ("embed.pooling", pooling.to_string()),
            ("embed.normalize", m.normalize.to_string()),
            ("embed.weight_bytes", m.weight_bytes.to_string()),
            // Bytes of weights this process maps from the cache file, and
            // whether those pages are shared with the other workers (a
            // read-only MAP_SHARED mapping of one file): the memory a
            // worker adds is what `Pss` shows, not these bytes again.
            (
                "embed.weights_mapped_bytes",
                m.weights_file
                    .as_ref()
                    .map_or(0, |_| m.weight_bytes)
                    .to_string(),
            ),
            ("embed.weights_shared", m.weights_file.is_some().to_string()),
            (
                "embed.weights_file",
                m.weights_file
                    .as_ref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            ("embed.dtype", m.dtype.to_string()),
            ("embed.threads", m.threads.to_string()),
            (
                "embed.max_batch_requests",
                settings.max_batch_requests.to_string(),
            ),
            (
                "embed.max_batch_bytes",
                settings.max_batch_bytes.to_string(),
            ),
            (
                "embed.max_client_batch_size",
                settings.max_client_batch_size.to_string(),
            ),
            (
                "embed.max_openai_inputs",
                settings.max_openai_inputs.to_string(),
            ),
            (
                "embed.max_cohere_documents",
                settings.max_cohere_documents.to_string(),
            ),
            (
                "embed.accept_token_ids",
                settings.accept_token_ids.to_string(),
            ),
            ("embed.payload_limit", settings.payload_limit.to_string()),
            ("embed.served_model_name", served_name.clone()),
            ("embed.prompts", prompt_names),
            (
                "embed.default_prompt_name",
                settings.default_prompt_name.clone().unwrap_or_default(),
            ),
            (
                "embed.default_prompt",
                settings.default_prompt.clone().unwrap_or_default(),
            ),
            (
                "embed.max_concurrent_inputs",
                max_concurrent_inputs.to_string(),
            ),
        ];
        for (key, value) in facts {
            // Held outside this process (another runtime's): not known.
            if key == "embed.weight_bytes" && m.weight_bytes == 0 {
                continue;
            }
            if key.starts_with("embed.weights_") && m.weights_file.is_none() {
                continue;
            }
            // Well-formed constant keys: the host refuses none of them.
            let _ = host.fact(key, &value);
        }
        let weights = if let Some(file) = &m.weights_file {
            let built = m
                .weights_built
                .as_ref()
                .map_or(String::new(), |why| format!(", written now: it was {why}"));
            format!(
                ", {:.1} MB of f32 weights mapped shared from {}{built}",
                m.weight_bytes as f64 / 1e6,
                file.display()
            )
        } else if m.weight_bytes > 0 {
            format!(", {:.1} MB of f32 weights", m.weight_bytes as f64 / 1e6)
        } else {
            String::new()
        };
        host.info(&format!(
            "{plugin}: {} {} model from {} ({} layers, dim {}, max {} tokens, {pooling} pooling{weights}, {} compute thread(s) per call, batches of up to {} requests and {} body bytes)",
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
        Ok(Embed {
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

    fn thread_start(&self, index: u32) -> Result<(), Error> {
        self.backend.thread_start(index)
    }

    fn thread_stop(&self, index: u32) {
        self.backend.thread_stop(index)
    }

    fn admit(&self, req: &Request<'_>, resp: Response<'_>, in_flight: u64) -> Admit {
        let route = api::resolve(req.method(), req.target(), self.kind);
        match route {
            // Each input (a text, a pair, a sentence) costs one; a route
            // the model cannot answer, tokenizing and decoding cost no
            // forward pass.
            Route::Embed
            | Route::EmbedAll
            | Route::OpenAiEmbeddings
            | Route::EmbedSparse
            | Route::Similarity
            | Route::Rerank
            | Route::Predict
            | Route::CohereRerank(_) => {}
            _ => return Admit::Cost(0),
        };
        // Over the payload limit: the handler refuses it unread.
        let Ok(body) = req.read_body(self.limits.payload_limit) else {
            return Admit::Cost(0);
        };
        let inputs = api::count_inputs(&body, route, &self.limits);
        match api::admit(
            route.flavor(),
            inputs,
            in_flight,
            self.max_concurrent_inputs,
        ) {
            Ok(cost) => Admit::Cost(cost),
            Err(e) => Admit::Answered(fail(resp, &e)),
        }
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        match self.begin(req, resp) {
            Begun::Answered(sent) => sent,
            Begun::Compute(mut one) => {
                self.forward(std::slice::from_mut(&mut *one));
                self.reply(*one)
            }
        }
    }

    fn handle_batch(&self, batch: Batch<'_>) -> Result<(), Error> {
        // As the SDK's default does: the first error is the call's, and
        // every request has been answered by then.
        fn keep_first(first: &mut Result<(), Error>, sent: Result<Sent, Error>) {
            if first.is_ok() {
                *first = sent.map(|_| ());
            }
        }
        let mut first = Ok(());
        let mut pending = Vec::with_capacity(batch.len());
        for (req, resp) in batch {
            match self.begin(&req, resp) {
                Begun::Answered(sent) => keep_first(&mut first, sent),
                Begun::Compute(p) => pending.push(*p),
            }
        }
        self.forward(&mut pending);
        for p in pending {
            keep_first(&mut first, self.reply(p));
        }
        first
    }
}

/// Answers with the error's status and JSON body (a 405 with `Allow`, a
/// 429 with `Retry-After`).
fn fail(resp: Response<'_>, e: &ApiError) -> Result<Sent, Error> {
    let body = e.body();
    match (e.allow, e.status()) {
        (Some(allow), _) => resp.send(e.status(), &[JSON, Header::new("Allow", allow)], &body),
        (None, 429) => resp.send(
            e.status(),
            &[JSON, Header::new("Retry-After", api::RETRY_AFTER)],
            &body,
        ),
        (None, _) => resp.send(e.status(), &[JSON], &body),
    }
}
