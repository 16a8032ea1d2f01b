//! The plugin: the model behind TEI's and OpenAI's routes, on the SDK.

use m0serve_plugin::{
    Description, Error, Header, Host, InitArgs, InitError, Plugin, Request, Response, Sent,
};

use crate::api::{
    self, ApiError, EmbedCall, Flavor, InfoFields, Limits, Route, TruncationDirection,
};
use crate::model::{LoadOptions, Model, TokenizeError};
use crate::settings::{self, Settings};

const VERSION: &str = env!("CARGO_PKG_VERSION");
const JSON: Header<'static> = Header::new("Content-Type", "application/json");

/// One worker's model and what its routes need.
pub struct Embed {
    model: Model,
    limits: Limits,
    /// `GET /info`'s body, made once.
    info: Vec<u8>,
}

impl Plugin for Embed {
    // Reentrant with no process-wide lock: concurrent calls each run their
    // own forward pass. A call computes for milliseconds, so it is never
    // made on the event loop.
    const DESCRIPTION: Description = Description::new(c"embed", c"0.1.0");

    fn describe() -> Description {
        Self::DESCRIPTION.compute_threads(Settings::threads_for_descriptor())
    }

    fn init(host: &'static Host, args: &InitArgs) -> Result<Self, InitError> {
        let settings = Settings::from_env().map_err(InitError::refused)?;
        let (dir, name) =
            settings::model_dir(&args.arg, args.venv.as_deref()).map_err(InitError::refused)?;
        let model = Model::load(
            &dir,
            LoadOptions {
                threads: settings.threads,
                name,
            },
        )
        .map_err(|e| InitError::refused(format!("embed: cannot load the model: {e}")))?;
        let m = model.info();
        for (key, value) in [
            ("embed.model", m.name.clone()),
            ("embed.model_dir", dir.display().to_string()),
            ("embed.dim", m.dim.to_string()),
            ("embed.layers", m.layers.to_string()),
            ("embed.max_len", m.max_len.to_string()),
            ("embed.pooling", pooling_name(&model).to_string()),
            ("embed.normalize", m.normalize.to_string()),
            ("embed.weight_bytes", m.weight_bytes.to_string()),
            ("embed.dtype", m.dtype.to_string()),
            ("embed.threads", m.threads.to_string()),
        ] {
            // Well-formed constant keys: the host refuses none of them.
            let _ = host.fact(key, &value);
        }
        host.info(&format!(
            "embed: {} from {} ({} layers, dim {}, max {} tokens, {} pooling, {:.1} MB of f32 weights, {} compute thread(s) per call)",
            m.name,
            dir.display(),
            m.layers,
            m.dim,
            m.max_len,
            pooling_name(&model),
            m.weight_bytes as f64 / 1e6,
            m.threads,
        ));
        let limits = Limits {
            max_client_batch_size: settings.max_client_batch_size,
            payload_limit: settings.payload_limit,
            auto_truncate: settings.auto_truncate,
            dim: m.dim,
        };
        let mut info = Vec::new();
        let threads = args.max_handler_threads.max(args.handler_threads).max(1) as usize;
        api::write_info(
            &InfoFields {
                model_id: &m.name,
                model_sha: None,
                model_dtype: m.dtype,
                pooling: pooling_name(&model),
                dim: m.dim,
                max_concurrent_requests: threads * args.workers.max(1) as usize,
                max_input_length: m.max_len,
                max_batch_tokens: limits.max_client_batch_size * m.max_len,
                max_batch_requests: Some(limits.max_client_batch_size),
                max_client_batch_size: limits.max_client_batch_size,
                auto_truncate: limits.auto_truncate,
                tokenization_workers: threads,
                version: VERSION,
                sha: None,
                docker_label: None,
                served_model_name: None,
            },
            &mut info,
        );
        Ok(Embed {
            model,
            limits,
            info,
        })
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        match api::route(req.method(), req.target()) {
            Route::Health => resp.send(200, &[], b""),
            Route::Info => resp.send(200, &[JSON], &self.info),
            Route::Embed => self.embed(req, resp, Flavor::Tei),
            Route::OpenAiEmbeddings => self.embed(req, resp, Flavor::OpenAi),
            Route::NotFound => fail(resp, &ApiError::not_found(req.method(), req.path())),
            Route::MethodNotAllowed { allow } => fail(
                resp,
                &ApiError::method_not_allowed(req.method(), req.path(), allow),
            ),
        }
    }
}

m0serve_plugin::export!(Embed);

fn pooling_name(model: &Model) -> &'static str {
    model.info().pooling.as_str()
}

/// Answers with the error's status and JSON body.
fn fail(resp: Response<'_>, e: &ApiError) -> Result<Sent, Error> {
    let body = e.body();
    match e.allow {
        Some(allow) => resp.send(e.status(), &[JSON, Header::new("Allow", allow)], &body),
        None => resp.send(e.status(), &[JSON], &body),
    }
}

impl Embed {
    fn embed(&self, req: &Request<'_>, resp: Response<'_>, flavor: Flavor) -> Result<Sent, Error> {
        let mut out = Vec::new();
        match self.answer(req, flavor, &mut out) {
            Ok(()) => resp.send(200, &[JSON], &out),
            Err(e) => fail(resp, &e),
        }
    }

    /// The JSON reply of one embedding request, or why there is none.
    fn answer(&self, req: &Request<'_>, flavor: Flavor, out: &mut Vec<u8>) -> Result<(), ApiError> {
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
        let (mut vectors, tokens) = self.vectors(&call)?;
        let dim = self.model.info().dim;
        let dim = match call.dimensions {
            Some(keep) => api::shrink_rows(&mut vectors, dim, keep, call.normalize),
            None => dim,
        };
        match flavor {
            Flavor::Tei => api::write_tei(&vectors, dim, out),
            Flavor::OpenAi => {
                let name = call.model.as_deref().unwrap_or(&self.model.info().name);
                api::write_openai(&vectors, dim, call.encoding, name, tokens, out)
            }
        }
    }

    /// The call's embeddings, row after row, and the tokens they took.
    fn vectors(&self, call: &EmbedCall) -> Result<(Vec<f32>, usize), ApiError> {
        let texts: Vec<&str> = call.inputs.iter().map(String::as_str).collect();
        // This model cuts at the end only: an input that needs cutting at
        // its start is refused below, by tokenizing it whole.
        let cut_end = call.truncate && call.truncation_direction == TruncationDirection::Right;
        let batch = self.model.tokenize(&texts, cut_end).map_err(|e| match e {
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
        let tokens = batch.iter().map(|e| e.tokens()).sum();
        Ok((self.model.embed(&batch, call.normalize), tokens))
    }
}
