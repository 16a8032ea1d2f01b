//! The plugin: a forward pass behind TEI's and OpenAI's routes, on the SDK.

use m0serve_plugin::{
    Admit, Batch, Description, Error, Header, Host, InitArgs, InitError, Plugin, Request, Response,
    Sent,
};

use crate::api::{
    self, ApiError, EmbedCall, Flavor, InfoFields, Inputs, Limits, Route, TruncationDirection,
};
use crate::backend::{Backend, BackendError, ModelSource};
use crate::model::{self, Encoded, Model, TokenizeError};
use crate::settings::{self, Settings};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const JSON: Header<'static> = Header::new("Content-Type", "application/json");

/// One worker's forward pass and what its routes need: the embedding
/// plugin over any [`Backend`], the native encoder by default.
pub struct Embed<B: Backend = Model> {
    backend: B,
    limits: Limits,
    /// Most tokens one [`Backend::embed`] call is given: what bounds the
    /// memory of a pass, however many inputs the requests behind it hold.
    pass_tokens: usize,
    /// `GET /info`'s body, made once.
    info: Vec<u8>,
    /// `GET /openapi.json`'s body, made once, with this server's limits.
    openapi: Vec<u8>,
    /// Most inputs in flight in this worker (`M0_EMBED_MAX_CONCURRENT_INPUTS`).
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
        let facts = [
            ("embed.model", m.name.clone()),
            ("embed.model_dir", dir.display().to_string()),
            ("embed.dim", m.dim.to_string()),
            ("embed.layers", m.layers.to_string()),
            ("embed.max_len", m.max_len.to_string()),
            ("embed.pooling", pooling.to_string()),
            ("embed.normalize", m.normalize.to_string()),
            ("embed.weight_bytes", m.weight_bytes.to_string()),
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
            // Well-formed constant keys: the host refuses none of them.
            let _ = host.fact(key, &value);
        }
        let weights = if m.weight_bytes > 0 {
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
                served_model_name: None,
            },
            &mut info,
        );
        let openapi = api::openapi_document(&limits, VERSION).map_err(InitError::refused)?;
        Ok(Embed {
            backend,
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
            Route::Embed => Flavor::Tei,
            Route::OpenAiEmbeddings => Flavor::OpenAi,
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
                self.forward(std::slice::from_mut(&mut one));
                self.reply(one)
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
                Begun::Embed(p) => pending.push(p),
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

/// A request after its first step: answered (every route but the two
/// embedding ones, and every refused embedding request), or waiting for
/// the forward pass.
enum Begun<'a> {
    Answered(Result<Sent, Error>),
    Embed(Pending<'a>),
}

/// An embedding request parsed and tokenized, with its response.
struct Pending<'a> {
    resp: Response<'a>,
    call: EmbedCall,
    /// The inputs' tokens, until [`Embed::forward`] takes them.
    encoded: Vec<Encoded>,
    /// Tokens in all, for OpenAI's usage.
    tokens: usize,
    /// The embeddings, row after row, once [`Embed::forward`] has run, or
    /// why the forward pass failed.
    rows: Result<Vec<f32>, BackendError>,
}

impl<B: Backend> Embed<B> {
    /// Routes a request and answers it unless it needs the model.
    fn begin<'a>(&self, req: &Request<'_>, resp: Response<'a>) -> Begun<'a> {
        let flavor = match api::route(req.method(), req.target()) {
            Route::Health => return Begun::Answered(resp.send(200, &[], b"")),
            Route::Info => return Begun::Answered(resp.send(200, &[JSON], &self.info)),
            Route::OpenApi => return Begun::Answered(resp.send(200, &[JSON], &self.openapi)),
            Route::Embed => Flavor::Tei,
            Route::OpenAiEmbeddings => Flavor::OpenAi,
            Route::NotFound => {
                let e = ApiError::not_found(req.method(), req.path());
                return Begun::Answered(fail(resp, &e));
            }
            Route::MethodNotAllowed { allow } => {
                let e = ApiError::method_not_allowed(req.method(), req.path(), allow);
                return Begun::Answered(fail(resp, &e));
            }
        };
        match self.prepare(req, flavor) {
            Ok((call, encoded)) => Begun::Embed(Pending {
                resp,
                tokens: encoded.iter().map(Encoded::tokens).sum(),
                call,
                encoded,
                rows: Ok(Vec::new()),
            }),
            Err(e) => Begun::Answered(fail(resp, &e)),
        }
    }

    /// One embedding request's call and tokens, or why it is refused.
    fn prepare(
        &self,
        req: &Request<'_>,
        flavor: Flavor,
    ) -> Result<(EmbedCall, Vec<Encoded>), ApiError> {
        let length = req.content_length();
        if length > self.limits.payload_limit as u64 {
            // Refused before a byte of it is read.
            return Err(ApiError::payload_too_large(
                flavor,
                usize::try_from(length).unwrap_or(usize::MAX),
                self.limits.payload_limit,
            ));
        }
        let body = req
            .read_body(self.limits.payload_limit)
            .map_err(|e| ApiError::internal(flavor, &format!("reading the body failed: {e}")))?;
        let call = match flavor {
            Flavor::Tei => api::parse_tei(&body, &self.limits)?,
            Flavor::OpenAi => api::parse_openai(&body, &self.limits)?,
        };
        // This model cuts at the end only: an input that needs cutting at
        // its start is refused below, by tokenizing it whole.
        let cut_end = call.truncate && call.truncation_direction == TruncationDirection::Right;
        let tokenizer = self.backend.tokenizer();
        let encoded = match &call.inputs {
            Inputs::Texts(texts) => {
                let texts: Vec<&str> = texts.iter().map(String::as_str).collect();
                tokenizer.tokenize(&texts, cut_end)
            }
            Inputs::Ids(seqs) => tokenizer.from_ids(seqs, cut_end),
        };
        let encoded = encoded.map_err(|e| match e {
            TokenizeError::TooLong(t) if call.truncate => ApiError::tokenizer(
                call.flavor,
                &format!(
                    "input {} is {} tokens, more than the model's {}, and truncation_direction \
                     Left is not supported: send \"Right\" or shorten the input",
                    t.index, t.tokens, t.max
                ),
            ),
            TokenizeError::TooLong(t) => ApiError::too_long(call.flavor, t.index, t.tokens, t.max),
            TokenizeError::Failed { index, message } => ApiError::tokenizer(
                call.flavor,
                &format!("input {index} could not be tokenized: {message}"),
            ),
        })?;
        Ok((call, encoded))
    }

    /// Embeds the inputs of every pending request and gives each its rows,
    /// normalized as it asked; when a pass fails, each gets the error,
    /// logged once here. The inputs go to the backend in order, in passes
    /// of at most `pass_tokens` tokens ([`passes`]): one pass for what the
    /// host batched, several for a request of many inputs.
    fn forward(&self, pending: &mut [Pending<'_>]) {
        if pending.is_empty() {
            return;
        }
        let mut all = Vec::new();
        let parts: Vec<(usize, bool)> = pending
            .iter_mut()
            .map(|p| {
                let n = p.encoded.len();
                all.append(&mut p.encoded);
                (n, p.call.normalize)
            })
            .collect();
        let dim = self.backend.info().dim;
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
        match rows {
            Ok(rows) => {
                for (p, mine) in pending
                    .iter_mut()
                    .zip(model::split_rows(&rows, dim, &parts))
                {
                    p.rows = Ok(mine);
                }
            }
            Err(e) => {
                let host = m0serve_plugin::host();
                if let Some(host) = host {
                    let detail = if e.detail.is_empty() {
                        String::new()
                    } else {
                        format!(":\n{}", e.detail)
                    };
                    host.error(&format!(
                        "{}: the forward pass of {} input(s) from {} request(s) failed, answering 424 (TEI) / 500 (OpenAI): {}{detail}",
                        B::DESCRIPTION.name(),
                        all.len(),
                        pending.len(),
                        e.message
                    ));
                }
                for p in pending.iter_mut() {
                    p.rows = Err(e.clone());
                }
            }
        }
    }

    /// Answers a request whose rows [`Embed::forward`] has made.
    fn reply(&self, p: Pending<'_>) -> Result<Sent, Error> {
        let rows = match p.rows {
            Ok(rows) => rows,
            Err(e) => return fail(p.resp, &ApiError::backend(p.call.flavor, &e.message)),
        };
        let mut out = Vec::new();
        match self.render(&p.call, rows, p.tokens, &mut out) {
            Ok(()) => p.resp.send(200, &[JSON], &out),
            Err(e) => fail(p.resp, &e),
        }
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
                let name = call.model.as_deref().unwrap_or(&self.backend.info().name);
                api::write_openai(&vectors, dim, call.encoding, name, tokens, out)
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
