//! The plugin: a forward pass behind TEI's and OpenAI's routes, on the SDK.

use m0serve_plugin::{
    Admit, Batch, Description, Error, Header, Host, InitArgs, InitError, Plugin, Request, Response,
    Sent,
};

use std::collections::BTreeMap;

use crate::api::{
    self, ApiError, EmbedCall, Flavor, InfoFields, Inputs, Limits, Route, Timing,
    TruncationDirection,
};
use crate::backend::{Backend, BackendError, ModelSource};
use crate::model::{self, Encoded, Model, Side, TokenizeError};
use crate::settings::{self, Settings};

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
        let pooling = m.pooling.as_str();
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
            "{plugin}: {} from {} ({} layers, dim {}, max {} tokens, {pooling} pooling{weights}, {} compute thread(s) per call, batches of up to {} requests and {} body bytes)",
            m.name,
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
        let openapi = api::openapi_document(&limits, VERSION).map_err(InitError::refused)?;
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
        })
    }

    fn thread_start(&self, index: u32) -> Result<(), Error> {
        self.backend.thread_start(index)
    }

    fn thread_stop(&self, index: u32) {
        self.backend.thread_stop(index)
    }

    fn admit(&self, req: &Request<'_>, resp: Response<'_>, in_flight: u64) -> Admit {
        let flavor = match api::route(req.method(), req.target()) {
            // `/embed_all` runs the same forward pass over the same `inputs`.
            Route::Embed | Route::EmbedAll => Flavor::Tei,
            Route::OpenAiEmbeddings => Flavor::OpenAi,
            // Tokenizing and decoding cost no forward pass.
            _ => return Admit::Cost(0),
        };
        // Over the payload limit: the handler refuses it unread.
        let Ok(body) = req.read_body(self.limits.payload_limit) else {
            return Admit::Cost(0);
        };
        let inputs = api::count_inputs(&body, flavor, &self.limits);
        match api::admit(flavor, inputs, in_flight, self.max_concurrent_inputs) {
            Ok(cost) => Admit::Cost(cost),
            Err(e) => Admit::Answered(fail(resp, &e)),
        }
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        match self.begin(req, resp) {
            Begun::Answered(sent) => sent,
            Begun::Embed(mut one) => {
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
                Begun::Embed(p) => pending.push(*p),
            }
        }
        self.forward(&mut pending);
        for p in pending {
            keep_first(&mut first, self.reply(p));
        }
        first
    }
}

/// `inputs` cut into consecutive runs of at most `budget` tokens each (an
/// input longer than the budget alone), in order; `tokens` counts an
/// input's.
fn passes<T>(
    inputs: &[T],
    budget: usize,
    tokens: impl Fn(&T) -> usize,
) -> impl Iterator<Item = &[T]> {
    let mut rest = inputs;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let mut sum = 0;
        let n = rest
            .iter()
            .position(|e| {
                sum += tokens(e);
                sum > budget
            })
            .unwrap_or(rest.len())
            .max(1);
        let (pass, tail) = rest.split_at(n);
        rest = tail;
        Some(pass)
    })
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

/// A request after its first step: answered (every route but the
/// embedding ones, and every refused embedding request), or waiting for
/// the forward pass.
enum Begun<'a> {
    Answered(Result<Sent, Error>),
    Embed(Box<Pending<'a>>),
}

/// What an embedding request wants from the forward pass.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Want {
    /// One pooled vector per input (`/embed`, `/v1/embeddings`).
    Pooled,
    /// Every token's vector (`/embed_all`).
    Tokens,
}

/// An embedding request parsed and tokenized, with its response.
struct Pending<'a> {
    resp: Response<'a>,
    call: EmbedCall,
    want: Want,
    /// The inputs' tokens, until [`Embed::forward`] takes them.
    encoded: Vec<Encoded>,
    /// Each input's tokens, for `/embed_all`'s reply.
    lens: Vec<usize>,
    /// When the host queued the request, on the host's clock.
    arrived_ns: u64,
    /// When tokenizing ended.
    tokenized_ns: u64,
    /// The timing headers' figures, filled in as the request goes.
    timing: Timing,
    /// The embeddings (or token vectors), row after row, once
    /// [`Embed::forward`] has run, or the reply that says why not.
    rows: Result<Vec<f32>, ApiError>,
}

impl<B: Backend> Embed<B> {
    /// Routes a request and answers it unless it needs the model.
    fn begin<'a>(&self, req: &Request<'_>, resp: Response<'a>) -> Begun<'a> {
        let started_ns = self.host.now_ns();
        let arrived_ns = req.queued_ns().unwrap_or(started_ns).min(started_ns);
        let (flavor, want) = match api::route(req.method(), req.target()) {
            Route::Health => return Begun::Answered(resp.send(200, &[], b"")),
            Route::Info => return Begun::Answered(resp.send(200, &[JSON], &self.info)),
            Route::OpenApi => return Begun::Answered(resp.send(200, &[JSON], &self.openapi)),
            Route::Tokenize => return Begun::Answered(self.tokenize(req, resp)),
            Route::Decode => return Begun::Answered(self.decode(req, resp)),
            Route::Embed => (Flavor::Tei, Want::Pooled),
            Route::EmbedAll => (Flavor::Tei, Want::Tokens),
            Route::OpenAiEmbeddings => (Flavor::OpenAi, Want::Pooled),
            Route::NotFound => {
                let e = ApiError::not_found(req.method(), req.path());
                return Begun::Answered(fail(resp, &e));
            }
            Route::MethodNotAllowed { allow } => {
                let e = ApiError::method_not_allowed(req.method(), req.path(), allow);
                return Begun::Answered(fail(resp, &e));
            }
        };
        match self.prepare(req, flavor, want) {
            Ok((call, encoded, characters)) => {
                let tokenized_ns = self.host.now_ns();
                let tokens = encoded.iter().map(Encoded::tokens).sum();
                Begun::Embed(Box::new(Pending {
                    resp,
                    lens: encoded.iter().map(Encoded::tokens).collect(),
                    call,
                    want,
                    encoded,
                    arrived_ns,
                    tokenized_ns,
                    timing: Timing {
                        // Waiting for this call; the wait for the pass is
                        // added when it starts.
                        queue_ns: started_ns - arrived_ns,
                        tokenization_ns: tokenized_ns.saturating_sub(started_ns),
                        characters,
                        tokens,
                        ..Timing::default()
                    },
                    rows: Ok(Vec::new()),
                }))
            }
            Err(e) => Begun::Answered(fail(resp, &e)),
        }
    }

    /// The body of a request to a TEI or OpenAI route, refused past the
    /// payload limit before a byte of it is read.
    fn body(&self, req: &Request<'_>, flavor: Flavor) -> Result<Vec<u8>, ApiError> {
        let length = req.content_length();
        if length > self.limits.payload_limit as u64 {
            return Err(ApiError::payload_too_large(
                flavor,
                usize::try_from(length).unwrap_or(usize::MAX),
                self.limits.payload_limit,
            ));
        }
        req.read_body(self.limits.payload_limit)
            .map_err(|e| ApiError::internal(flavor, &format!("reading the body failed: {e}")))
    }

    /// The prompt to prepend: the one `name` names, else the default
    /// (none without one); an unknown name is refused, naming the known.
    fn prompt(&self, name: Option<&str>, flavor: Flavor) -> Result<Option<&str>, ApiError> {
        match name {
            None => Ok(self.default_prompt.as_deref()),
            Some(n) => match self.prompts.get(n) {
                Some(p) => Ok(Some(p)),
                None => {
                    let known: Vec<&str> = self.prompts.keys().map(String::as_str).collect();
                    Err(ApiError::unknown_prompt(flavor, n, &known))
                }
            },
        }
    }

    /// One embedding request's call, tokens and characters (prompts
    /// included), or why it is refused.
    fn prepare(
        &self,
        req: &Request<'_>,
        flavor: Flavor,
        want: Want,
    ) -> Result<(EmbedCall, Vec<Encoded>, usize), ApiError> {
        let body = self.body(req, flavor)?;
        let call = match (flavor, want) {
            (Flavor::Tei, Want::Pooled) => api::parse_tei(&body, &self.limits)?,
            (Flavor::Tei, Want::Tokens) => api::parse_embed_all(&body, &self.limits)?,
            (Flavor::OpenAi, _) => api::parse_openai(&body, &self.limits)?,
        };
        let prompt = self.prompt(call.prompt_name.as_deref(), flavor)?;
        let cut = call.truncate.then_some(match call.truncation_direction {
            TruncationDirection::Right => Side::Right,
            TruncationDirection::Left => Side::Left,
        });
        let tokenizer = self.backend.tokenizer();
        let mut characters = 0;
        let encoded = match &call.inputs {
            Inputs::Texts(texts) => {
                let prompted: Vec<String>;
                let texts: Vec<&str> = match prompt {
                    Some(p) => {
                        prompted = texts.iter().map(|t| format!("{p}{t}")).collect();
                        prompted.iter().map(String::as_str).collect()
                    }
                    None => texts.iter().map(String::as_str).collect(),
                };
                characters = texts.iter().map(|t| t.chars().count()).sum();
                tokenizer.tokenize_cut(&texts, cut)
            }
            // Ids are the client's own tokens: no prompt goes before them.
            Inputs::Ids(seqs) => tokenizer.from_ids_cut(seqs, cut),
        };
        let encoded = encoded.map_err(|e| match e {
            TokenizeError::TooLong(t) => ApiError::too_long(call.flavor, t.index, t.tokens, t.max),
            TokenizeError::Failed { index, message } => ApiError::tokenizer(
                call.flavor,
                &format!("input {index} could not be tokenized: {message}"),
            ),
        })?;
        Ok((call, encoded, characters))
    }

    /// `POST /tokenize`: each input's tokens, with their byte offsets.
    fn tokenize(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let run = || -> Result<Vec<u8>, ApiError> {
            let body = self.body(req, Flavor::Tei)?;
            let call = api::parse_tokenize(&body, &self.limits)?;
            let prompt = self.prompt(call.prompt_name.as_deref(), Flavor::Tei)?;
            let tokenizer = self.backend.tokenizer();
            let mut all = Vec::with_capacity(call.inputs.len());
            for (index, text) in call.inputs.iter().enumerate() {
                let text = match prompt {
                    Some(p) => format!("{p}{text}"),
                    None => text.clone(),
                };
                let spans = tokenizer
                    .spans(&text, call.add_special_tokens)
                    .map_err(|e| {
                        ApiError::tokenizer(
                            Flavor::Tei,
                            &format!("input {index} could not be tokenized: {e}"),
                        )
                    })?;
                all.push(spans);
            }
            let mut out = Vec::new();
            api::write_tokens(
                all.iter().map(|spans| {
                    spans
                        .iter()
                        .map(|t| api::TokenOut {
                            id: t.id,
                            text: &t.text,
                            special: t.special,
                            span: t.span,
                        })
                        .collect()
                }),
                &mut out,
            );
            Ok(out)
        };
        match run() {
            Ok(out) => resp.send(200, &[JSON], &out),
            Err(e) => fail(resp, &e),
        }
    }

    /// `POST /decode`: each id list's text.
    fn decode(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let run = || -> Result<Vec<u8>, ApiError> {
            let body = self.body(req, Flavor::Tei)?;
            let call = api::parse_decode(&body, &self.limits)?;
            let tokenizer = self.backend.tokenizer();
            let texts = call
                .ids
                .iter()
                .enumerate()
                .map(|(index, ids)| {
                    tokenizer
                        .decode(ids, call.skip_special_tokens)
                        .map_err(|e| {
                            ApiError::tokenizer(
                                Flavor::Tei,
                                &format!("ids {index} could not be decoded: {e}"),
                            )
                        })
                })
                .collect::<Result<Vec<_>, _>>()?;
            let mut out = Vec::new();
            api::write_decoded(&texts, &mut out);
            Ok(out)
        };
        match run() {
            Ok(out) => resp.send(200, &[JSON], &out),
            Err(e) => fail(resp, &e),
        }
    }

    /// Embeds the inputs of every pending request and gives each its rows,
    /// normalized as it asked; when a pass fails, each gets the error,
    /// logged once here. The pooled requests' inputs go to the backend in
    /// order, in passes of at most `pass_tokens` tokens ([`passes`]): one
    /// pass for what the host batched, several for a request of many
    /// inputs; each `/embed_all` request then has passes of its own.
    fn forward(&self, pending: &mut [Pending<'_>]) {
        if pending.is_empty() {
            return;
        }
        let start = self.host.now_ns();
        for p in pending.iter_mut() {
            p.timing.queue_ns += start.saturating_sub(p.tokenized_ns);
        }
        let mut all = Vec::new();
        let parts: Vec<(usize, bool)> = pending
            .iter_mut()
            .filter(|p| p.want == Want::Pooled)
            .map(|p| {
                let n = p.encoded.len();
                all.append(&mut p.encoded);
                (n, p.call.normalize)
            })
            .collect();
        let dim = self.backend.info().dim;
        if !parts.is_empty() {
            let rows = passes(&all, self.pass_tokens, Encoded::tokens)
                .try_fold(Vec::with_capacity(all.len() * dim), |mut rows, pass| {
                    rows.extend(self.backend.embed(pass)?);
                    Ok(rows)
                })
                .and_then(|rows| match rows.len() == all.len() * dim {
                    true => Ok(rows),
                    false => Err(BackendError::new(
                        format!(
                            "the backend gave {} floats for {} inputs of dimension {dim}",
                            rows.len(),
                            all.len()
                        ),
                        "",
                    )),
                });
            let end = self.host.now_ns();
            let mine = pending.iter_mut().filter(|p| p.want == Want::Pooled);
            match rows {
                Ok(rows) => {
                    for (p, rows) in mine.zip(model::split_rows(&rows, dim, &parts)) {
                        p.rows = Ok(rows);
                        p.timing.inference_ns = end.saturating_sub(start);
                    }
                }
                Err(e) => {
                    self.log_failure(&e, all.len(), parts.len());
                    for p in mine {
                        p.rows = Err(ApiError::backend(p.call.flavor, &e.message));
                    }
                }
            }
        }
        for p in pending.iter_mut().filter(|p| p.want == Want::Tokens) {
            let begun = self.host.now_ns();
            p.timing.queue_ns += begun.saturating_sub(start);
            let encoded = std::mem::take(&mut p.encoded);
            let mut states = Vec::new();
            for pass in passes(&encoded, self.pass_tokens, Encoded::tokens) {
                match self.backend.token_states(pass) {
                    None => {
                        p.rows = Err(ApiError::not_implemented(
                            Flavor::Tei,
                            &format!(
                                "/embed_all is not served by the {} plugin: its backend \
                                 gives pooled vectors only, not each token's; use /embed, or \
                                 the embed plugin, which serves it",
                                B::DESCRIPTION.name()
                            ),
                        ));
                        break;
                    }
                    Some(Err(e)) => {
                        self.log_failure(&e, encoded.len(), 1);
                        p.rows = Err(ApiError::backend(Flavor::Tei, &e.message));
                        break;
                    }
                    Some(Ok(s)) => states.extend(s),
                }
            }
            if p.rows.is_ok() {
                p.rows = Ok(states);
            }
            p.timing.inference_ns = self.host.now_ns().saturating_sub(begun);
        }
    }

    fn log_failure(&self, e: &BackendError, inputs: usize, requests: usize) {
        let detail = if e.detail.is_empty() {
            String::new()
        } else {
            format!(":\n{}", e.detail)
        };
        self.host.error(&format!(
            "{}: the forward pass of {inputs} input(s) from {requests} request(s) failed, answering 424 (TEI) / 500 (OpenAI): {}{detail}",
            B::DESCRIPTION.name(),
            e.message
        ));
    }

    /// Answers a request whose rows [`Embed::forward`] has made, with
    /// TEI's timing headers.
    fn reply(&self, mut p: Pending<'_>) -> Result<Sent, Error> {
        let rows = match std::mem::replace(&mut p.rows, Ok(Vec::new())) {
            Ok(rows) => rows,
            Err(e) => return fail(p.resp, &e),
        };
        let mut out = Vec::new();
        let rendered = match p.want {
            Want::Pooled => self.render(&p.call, rows, p.timing.tokens, &mut out),
            Want::Tokens => api::write_embed_all(&rows, &p.lens, self.backend.info().dim, &mut out),
        };
        if let Err(e) = rendered {
            return fail(p.resp, &e);
        }
        p.timing.total_ns = self.host.now_ns().saturating_sub(p.arrived_ns);
        let timing = p.timing.headers();
        let mut headers = Vec::with_capacity(timing.len() + 1);
        headers.push(JSON);
        headers.extend(timing.iter().map(|(k, v)| Header::new(k, v)));
        p.resp.send(200, &headers, &out)
    }

    /// The JSON reply of one embedding request.
    fn render(
        &self,
        call: &EmbedCall,
        mut vectors: Vec<f32>,
        tokens: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let dim = self.backend.info().dim;
        let dim = match call.dimensions {
            Some(keep) => api::shrink_rows(&mut vectors, dim, keep, call.normalize),
            None => dim,
        };
        match call.flavor {
            Flavor::Tei => api::write_tei(&vectors, dim, out),
            Flavor::OpenAi => {
                api::write_openai(&vectors, dim, call.encoding, &self.served_name, tokens, out)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::passes;

    fn cut(lens: &[usize], budget: usize) -> Vec<Vec<usize>> {
        passes(lens, budget, |&n| n)
            .map(<[usize]>::to_vec)
            .collect()
    }

    #[test]
    fn passes_keep_order_and_stay_within_the_budget() {
        assert_eq!(cut(&[], 10), Vec::<Vec<usize>>::new());
        assert_eq!(cut(&[3, 3, 3], 10), [vec![3, 3, 3]]);
        assert_eq!(cut(&[4, 4, 4, 4], 8), [vec![4, 4], vec![4, 4]]);
        assert_eq!(cut(&[5, 6, 1, 9], 10), [vec![5], vec![6, 1], vec![9]]);
        // An input over the budget runs alone rather than not at all.
        assert_eq!(cut(&[2, 30, 2], 10), [vec![2], vec![30], vec![2]]);
        // 2048 inputs of 14 tokens at 16384 a pass: 2 passes, all kept.
        let many = vec![14; 2048];
        let got = cut(&many, 16384);
        assert_eq!(got.len(), 2);
        assert_eq!(got.iter().map(Vec::len).sum::<usize>(), 2048);
        assert!(got.iter().all(|p| p.iter().sum::<usize>() <= 16384));
    }
}
