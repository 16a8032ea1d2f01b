//! The plugin on the SDK: its models (`served.rs`, one per model ARG),
//! each request routed to one ([`crate::models`]) and admitted against
//! that model's budget, then answered there (`jobs.rs`, `forward.rs`,
//! `tokens.rs`), TEI's metrics recorded per model (`metrics.rs`).

use m0serve_plugin::{
    Admit, Batch, Description, Error, Header, Host, InitArgs, InitError, Plugin, Request, Response,
    Sent,
};

use crate::api::{self, ApiError, Route};
use crate::backend::Backend;
use crate::model::Model;
use crate::models::{self, Catalog, ModelArg};
use crate::settings::{self, Settings};

mod forward;
mod jobs;
mod metrics;
mod served;
mod tokens;

use jobs::{Begun, Pending};
use metrics::Metrics;
use served::Served;

const VERSION: &str = env!("CARGO_PKG_VERSION");
const JSON: Header<'static> = Header::new("Content-Type", "application/json");

/// One worker's models and what routes a request to one: the embedding
/// plugin over any [`Backend`], the native encoder by default.
pub struct Embed<B: Backend = Model> {
    host: &'static Host,
    /// The served models, in the order given (the first answers
    /// `GET /info` and the routes of its kind without a prefix).
    models: Vec<Served<B>>,
    /// Their names and kinds: where a request goes.
    catalog: Catalog,
    /// `GET /info`'s body without a prefix: the first model's, with
    /// `models`.
    info: Vec<u8>,
    /// `GET /v1/models`'s body.
    list: Vec<u8>,
    /// `GET /openapi.json`'s body without a prefix when the models are of
    /// several kinds: every route (each model's own is under its path).
    openapi: Option<Vec<u8>>,
    /// Largest body read ([`settings::ENV_PAYLOAD_LIMIT`]).
    payload_limit: usize,
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
        let settings = Settings::from_env().map_err(InitError::refused)?;
        let specs: Vec<ModelArg> = B::model_args(args)
            .iter()
            .map(|a| ModelArg::parse(a))
            .collect();
        let several = specs.len() > 1;
        if specs.len() > m0serve_abi::M0_MODELS_MAX {
            return Err(InitError::refused(format!(
                "{}: {} models given, and one server serves at most {}; serve the others \
                 from another m0serve",
                B::DESCRIPTION.name(),
                specs.len(),
                m0serve_abi::M0_MODELS_MAX
            )));
        }
        if several && settings.served_model_name.is_some() {
            return Err(InitError::refused(format!(
                "{}: {} names one model, and this server serves {}; name each model on the \
                 command line as NAME=DIR instead, and unset {}",
                B::DESCRIPTION.name(),
                settings::ENV_SERVED_MODEL_NAME,
                specs.len(),
                settings::ENV_SERVED_MODEL_NAME
            )));
        }
        let loaded = load_all::<B>(host, args, &settings, &specs)?;
        let metrics = Metrics::define(host);
        let mut models = Vec::with_capacity(loaded.len());
        for (index, one) in loaded.into_iter().enumerate() {
            let mut prefixes = Vec::new();
            if index == 0 {
                prefixes.push("embed.".to_string());
            }
            if several {
                prefixes.push(format!("embed.model.{index}."));
            }
            let served = Served::new(
                host,
                args,
                &settings,
                one,
                served::Facts {
                    prefixes: &prefixes,
                },
                several,
                metrics,
            )?;
            models.push(served);
        }
        let catalog = catalog(&models, &specs)?;
        // Well-formed constant key: the host refuses none.
        let _ = host.fact("embed.models", &catalog.names().join(","));
        let created = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs());
        let mut list = Vec::new();
        catalog.write_list(created, &mut list);
        // The first model's TEI fields, then every model's summary.
        let mut info = models[0].info.clone();
        info.pop();
        info.extend_from_slice(b",\"models\":[");
        for (i, m) in models.iter().enumerate() {
            if i > 0 {
                info.push(b',');
            }
            m.write_summary(&mut info);
        }
        info.extend_from_slice(b"]}");
        let openapi = match models.iter().all(|m| m.kind == models[0].kind) {
            true => None,
            false => Some(
                api::openapi_document(&models[0].limits, VERSION, None)
                    .map_err(InitError::refused)?,
            ),
        };
        Ok(Embed {
            host,
            models,
            catalog,
            info,
            list,
            openapi,
            payload_limit: settings.payload_limit,
        })
    }

    fn thread_start(&self, index: u32) -> Result<(), Error> {
        self.models
            .iter()
            .try_for_each(|m| m.backend.thread_start(index))
    }

    fn thread_stop(&self, index: u32) {
        for m in &self.models {
            m.backend.thread_stop(index);
        }
    }

    fn admit(&self, req: &Request<'_>, resp: Response<'_>, in_flight: u64) -> Admit {
        let mut body = None;
        let choice = self.catalog.choose(req.method(), req.target(), || {
            let b = req.read_body(self.payload_limit).ok()?;
            let model = api::body_model(&b);
            body = Some(b);
            model
        });
        let choice = match choice {
            Ok(c) => c,
            // No such model: the handler answers why, at no cost.
            Err(_) => return Admit::Cost(0),
        };
        match choice.route {
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
        let served = &self.models[choice.model];
        // Over the payload limit: the handler refuses it unread.
        let Some(body) = body.or_else(|| req.read_body(self.payload_limit).ok()) else {
            return Admit::Cost(0);
        };
        let inputs = api::count_inputs(&body, choice.route, &served.limits);
        // The model's own budget where the host keeps one per model.
        let in_flight = match served.id {
            Some(id) => self.host.model_in_flight(id),
            None => in_flight,
        };
        match api::admit(
            choice.route.flavor(),
            inputs,
            in_flight,
            served.max_concurrent_inputs,
        ) {
            Ok(cost) => {
                if let Some(id) = served.id {
                    // In admit, for a registered id: the host refuses
                    // neither. Its batches and metrics are this model's.
                    let _ = req.set_model(id);
                }
                Admit::Cost(cost)
            }
            Err(e) => {
                // Never handled: counted here.
                served.metrics.request(&served.served_name);
                served.metrics.failed(&served.served_name, &e);
                Admit::Answered(fail(resp, &e))
            }
        }
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let (model, begun) = self.begin(req, resp);
        match begun {
            Begun::Answered(sent) => sent,
            Begun::Compute(mut one) => {
                let served = &self.models[model];
                served.forward(std::slice::from_mut(&mut *one));
                served.reply(*one)
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
        // Each model's requests in passes of their own: models never mix
        // in one forward pass, whatever batch the host formed.
        let mut pending: Vec<Vec<Pending<'_>>> = self.models.iter().map(|_| Vec::new()).collect();
        for (req, resp) in batch {
            match self.begin(&req, resp) {
                (_, Begun::Answered(sent)) => keep_first(&mut first, sent),
                (model, Begun::Compute(p)) => pending[model].push(*p),
            }
        }
        for (served, mut mine) in self.models.iter().zip(pending) {
            if mine.is_empty() {
                continue;
            }
            served.forward(&mut mine);
            for p in mine {
                keep_first(&mut first, served.reply(p));
            }
        }
        first
    }
}

impl<B: Backend> Embed<B> {
    /// Routes a request to its model and begins it there; the server's
    /// own routes (`/v1/models`, `/info` without a prefix) and requests
    /// for no served model are answered here.
    fn begin<'a>(&self, req: &Request<'_>, resp: Response<'a>) -> (usize, Begun<'a>) {
        // A body read here to pick the model is the handler's: a body is
        // read once.
        let mut body = None;
        let choice = self.catalog.choose(req.method(), req.target(), || {
            if req.content_length() > self.payload_limit as u64 {
                return None;
            }
            let b = req.read_body(self.payload_limit).ok()?;
            let model = api::body_model(&b);
            body = Some(b);
            model
        });
        let choice = match choice {
            Ok(c) => c,
            Err(e) => return (0, Begun::Answered(fail(resp, &e))),
        };
        match choice.route {
            Route::Models => (0, Begun::Answered(resp.send(200, &[JSON], &self.list))),
            Route::Info if !choice.prefixed => {
                (0, Begun::Answered(resp.send(200, &[JSON], &self.info)))
            }
            Route::OpenApi if !choice.prefixed && self.openapi.is_some() => {
                let doc = self.openapi.as_deref().unwrap_or_default();
                (0, Begun::Answered(resp.send(200, &[JSON], doc)))
            }
            // Which of this server's models would answer, by name.
            Route::WrongModel { needs } if self.models.len() > 1 => {
                let m = &self.models[choice.model];
                let e = ApiError::wrong_served_model(
                    choice.path_route.flavor(),
                    needs,
                    &m.served_name,
                    m.kind.name(),
                    &api::served_by(m.kind),
                    &self.catalog.answering(choice.path_route),
                );
                (choice.model, Begun::Answered(fail(resp, &e)))
            }
            _ => (
                choice.model,
                self.models[choice.model].begin(req, resp, choice, body),
            ),
        }
    }
}

/// Loads every model ARG's backend: one on this thread (a backend in
/// another runtime may need it), several at once on as many threads as
/// the CPUs allow. The first that fails refuses the start, naming its ARG.
fn load_all<B: Backend>(
    host: &'static Host,
    args: &InitArgs,
    settings: &Settings,
    specs: &[ModelArg],
) -> Result<Vec<served::Loaded<B>>, InitError> {
    if let [one] = specs {
        return Ok(vec![served::load(host, args, settings, one)?]);
    }
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
    let mut loaded = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(cpus) {
        let results: Vec<Result<served::Loaded<B>, InitError>> = std::thread::scope(|s| {
            let threads: Vec<_> = chunk
                .iter()
                .map(|spec| s.spawn(move || served::load(host, args, settings, spec)))
                .collect();
            threads
                .into_iter()
                .zip(chunk)
                .map(|(t, spec)| {
                    t.join().unwrap_or_else(|_| {
                        Err(InitError::failed(format!(
                            "{}: loading the model {} panicked",
                            B::DESCRIPTION.name(),
                            spec.dir
                        )))
                    })
                })
                .collect()
        });
        for (r, spec) in results.into_iter().zip(chunk) {
            loaded.push(r.map_err(|e| naming(e, spec))?);
        }
    }
    Ok(loaded)
}

/// A model's refusal, naming the ARG it came from (with several, the
/// folder alone may not say which).
fn naming(e: InitError, spec: &ModelArg) -> InitError {
    let arg = match &spec.name {
        Some(n) => format!("{n}={}", spec.dir),
        None => spec.dir.clone(),
    };
    let message = format!("{} (model ARG `{arg}`)", e.message());
    if e.is_refusal() {
        InitError::refused(message)
    } else {
        InitError::failed(message)
    }
}

/// The served names and kinds, each name valid and used once.
fn catalog<B: Backend>(models: &[Served<B>], specs: &[ModelArg]) -> Result<Catalog, InitError> {
    let plugin = B::DESCRIPTION.name();
    let mut seen: Vec<(&str, &str)> = Vec::new();
    for (m, spec) in models.iter().zip(specs) {
        let name = m.served_name.as_str();
        models::check_name(name).map_err(|why| {
            InitError::refused(format!(
                "{plugin}: the model from {} cannot be served as `{}`: {why}; name it on the \
                 command line as NAME=DIR",
                spec.dir,
                name.escape_default()
            ))
        })?;
        if let Some((_, other)) = seen.iter().find(|(n, _)| *n == name) {
            return Err(InitError::refused(format!(
                "{plugin}: two models are served as `{name}`, from {other} and from {}; give \
                 each its own name on the command line as NAME=DIR",
                spec.dir
            )));
        }
        seen.push((name, spec.dir.as_str()));
    }
    Ok(Catalog::new(
        models
            .iter()
            .map(|m| (m.served_name.clone(), m.kind))
            .collect(),
    ))
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
