//! A request's first step, once [`crate::models`] has routed it to a
//! model: answered at once where it needs no forward pass, else parsed and
//! tokenized into a [`Pending`] job whose inputs join the batch's passes:
//! an embedding's texts, a rerank's (query, text) pairs, a prediction's
//! texts and pairs, each one input of the pass.

use m0serve_plugin::{Error, Request, Response, Sent};

use super::{JSON, Served, fail};
use crate::api::{
    self, ApiError, EmbedCall, Encoding, Flavor, Inputs, PredictCall, RerankCall, Route, Sequence,
    Timing, TruncationDirection,
};
use crate::backend::Backend;
use crate::model::{Encoded, Side, TokenizeError};
use crate::models::Choice;

/// A request after its first step: answered (every route that needs no
/// forward pass, and every refused request), or waiting for the pass.
pub(super) enum Begun<'a> {
    Answered(Result<Sent, Error>),
    Compute(Box<Pending<'a>>),
}

/// What a request asks of the forward pass, and how its reply is made.
pub(super) enum Job {
    /// Pooled vectors (`/embed`, `/` of an embedder, `/v1/embeddings`).
    Embed(EmbedCall),
    /// Every token's vector (`/embed_all`): passes of its own.
    EmbedAll(EmbedCall),
    /// Pooled vectors, answered as cosines with the first (`/similarity`).
    Similarity,
    /// SPLADE vectors (`/embed_sparse`).
    Sparse,
    /// One logit per (query, text) pair (`/rerank`, Cohere's rerank).
    Rerank(RerankCall),
    /// Every label's logit per text or pair (`/predict`).
    Predict(PredictCall),
}

/// Which of the backend's calls a job's inputs go through: the jobs of a
/// batch that share one are computed in the same passes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Pass {
    Pooled,
    Tokens,
    Classify,
    Sparse,
}

impl Job {
    pub(super) fn pass(&self) -> Pass {
        match self {
            Job::Embed(_) | Job::Similarity => Pass::Pooled,
            Job::EmbedAll(_) => Pass::Tokens,
            Job::Sparse => Pass::Sparse,
            Job::Rerank(_) | Job::Predict(_) => Pass::Classify,
        }
    }

    pub(super) fn flavor(&self) -> Flavor {
        match self {
            Job::Embed(c) | Job::EmbedAll(c) => c.flavor,
            Job::Rerank(c) => c.flavor(),
            _ => Flavor::Tei,
        }
    }
}

/// What a pass gave a job.
pub(super) enum Out {
    /// `width` floats an input (a vector, or a cross-encoder's logits).
    Floats(Vec<f32>),
    /// An input's nonzero entries.
    Sparse(Vec<Vec<(u32, f32)>>),
}

/// A request parsed and tokenized, with its response.
pub(super) struct Pending<'a> {
    pub(super) resp: Response<'a>,
    pub(super) job: Job,
    /// The inputs' tokens, until [`Served::forward`] takes them.
    pub(super) encoded: Vec<Encoded>,
    /// Each input's tokens, for `/embed_all`'s reply.
    pub(super) lens: Vec<usize>,
    /// When the host queued the request, on the host's clock.
    pub(super) arrived_ns: u64,
    /// When tokenizing ended.
    pub(super) tokenized_ns: u64,
    /// The timing headers' figures, filled in as the request goes.
    pub(super) timing: Timing,
    /// What the forward pass gave, once [`Served::forward`] has run, or the
    /// reply that says why not.
    pub(super) out: Result<Out, ApiError>,
}

impl<B: Backend> Served<B> {
    /// Answers a request routed to this model ([`Choice`]) unless it
    /// needs the forward pass; `body`: its body, if routing read it.
    pub(super) fn begin<'a>(
        &self,
        req: &Request<'_>,
        resp: Response<'a>,
        choice: Choice,
        body: Option<Vec<u8>>,
    ) -> Begun<'a> {
        let started_ns = self.host.now_ns();
        let arrived_ns = req.queued_ns().unwrap_or(started_ns).min(started_ns);
        let prepared = match choice.route {
            Route::Health => return Begun::Answered(resp.send(200, &[], b"")),
            Route::Info => return Begun::Answered(resp.send(200, &[JSON], &self.info)),
            Route::OpenApi => return Begun::Answered(resp.send(200, &[JSON], &self.openapi)),
            Route::Tokenize => return Begun::Answered(self.tokenize(req, resp)),
            Route::Decode => return Begun::Answered(self.decode(req, resp)),
            Route::NotFound => {
                let e = ApiError::not_found(req.method(), req.path());
                return Begun::Answered(fail(resp, &e));
            }
            Route::MethodNotAllowed { allow } => {
                let e = ApiError::method_not_allowed(req.method(), req.path(), allow);
                return Begun::Answered(fail(resp, &e));
            }
            Route::WrongModel { needs } => {
                let e = ApiError::wrong_model(
                    choice.path_route.flavor(),
                    needs,
                    self.kind.name(),
                    &api::served_by(self.kind),
                );
                return Begun::Answered(fail(resp, &e));
            }
            route => {
                self.metrics.request(&self.served_name);
                self.prepare(req, route, choice.path_route == Route::Root, body)
            }
        };
        match prepared {
            Ok((job, encoded, characters)) => {
                let tokenized_ns = self.host.now_ns();
                let tokens = encoded.iter().map(Encoded::tokens).sum();
                Begun::Compute(Box::new(Pending {
                    resp,
                    lens: encoded.iter().map(Encoded::tokens).collect(),
                    job,
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
                    out: Ok(Out::Floats(Vec::new())),
                }))
            }
            Err(e) => {
                self.metrics.failed(&self.served_name, &e);
                Begun::Answered(fail(resp, &e))
            }
        }
    }

    /// The body of a request, refused past the payload limit before a
    /// byte of it is read.
    pub(super) fn body(&self, req: &Request<'_>, flavor: Flavor) -> Result<Vec<u8>, ApiError> {
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
    pub(super) fn prompt(
        &self,
        name: Option<&str>,
        flavor: Flavor,
    ) -> Result<Option<&str>, ApiError> {
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

    /// A request to a route of the forward pass: its job, tokens and
    /// characters (prompts included), or why it is refused.
    /// `at_root`: posted to `POST /` (of the model's path); `body`: the
    /// body already read, else it is read here.
    fn prepare(
        &self,
        req: &Request<'_>,
        route: Route,
        at_root: bool,
        body: Option<Vec<u8>>,
    ) -> Result<(Job, Vec<Encoded>, usize), ApiError> {
        let body = match body {
            Some(b) => b,
            None => self.body(req, route.flavor())?,
        };
        let l = &self.limits;
        let texts = |call: EmbedCall, job: fn(EmbedCall) -> Job| {
            let (encoded, characters) = self.tokenize_call(&call)?;
            Ok((job(call), encoded, characters))
        };
        match route {
            // huggingface_hub's `sentence_similarity` posts TEI's
            // similarity body to the base URL: on an embedder's `POST /`
            // an `inputs` object of `source_sentence` is a similarity
            // (where TEI needs TASK=sentence-similarity to serve it).
            Route::Embed => match api::parse_tei(&body, l) {
                Ok(call) => texts(call, Job::Embed),
                Err(e) if at_root => match api::parse_similarity(&body, l) {
                    Ok(s) => texts(similarity_call(s), |_| Job::Similarity),
                    Err(_) => Err(e),
                },
                Err(e) => Err(e),
            },
            Route::OpenAiEmbeddings => texts(api::parse_openai(&body, l)?, Job::Embed),
            Route::EmbedAll => texts(api::parse_embed_all(&body, l)?, Job::EmbedAll),
            // TEI's EmbedSparseRequest has /embed_all's fields.
            Route::EmbedSparse => texts(api::parse_embed_all(&body, l)?, |_| Job::Sparse),
            Route::Similarity => texts(similarity_call(api::parse_similarity(&body, l)?), |_| {
                Job::Similarity
            }),
            Route::Rerank => self.rerank(api::parse_rerank(&body, l)?),
            Route::CohereRerank(v) => self.rerank(api::parse_cohere(&body, l, v)?),
            Route::Predict => self.predict(api::parse_predict(&body, l)?),
            // Every other route was answered by `begin`.
            r => Err(ApiError::internal(
                r.flavor(),
                &format!("{r:?} reached the forward pass"),
            )),
        }
    }

    /// An embedding call's inputs tokenized (prompted, cut as it asks) and
    /// their characters.
    fn tokenize_call(&self, call: &EmbedCall) -> Result<(Vec<Encoded>, usize), ApiError> {
        let prompt = self.prompt(call.prompt_name.as_deref(), call.flavor)?;
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
        let field = match call.flavor {
            Flavor::OpenAi => "input",
            _ => "inputs",
        };
        let encoded = encoded.map_err(|e| tokenize_error(e, call.flavor, field, 0))?;
        Ok((encoded, characters))
    }

    /// A rerank's (query, text) pairs, each one input.
    fn rerank(&self, call: RerankCall) -> Result<(Job, Vec<Encoded>, usize), ApiError> {
        let flavor = call.flavor();
        let field = match flavor {
            Flavor::Cohere => "documents",
            _ => "texts",
        };
        let encoded = self
            .backend
            .tokenizer()
            .tokenize_pairs(&call.pairs(), call.truncate)
            .map_err(|e| tokenize_error(e, flavor, field, 0))?;
        let query = call.query.chars().count();
        let characters = call.texts.iter().map(|t| query + t.chars().count()).sum();
        Ok((Job::Rerank(call), encoded, characters))
    }

    /// A prediction's texts and pairs, each one input, in order.
    fn predict(&self, call: PredictCall) -> Result<(Job, Vec<Encoded>, usize), ApiError> {
        let tokenizer = self.backend.tokenizer();
        let cut = call.truncate.then_some(Side::Right);
        let mut encoded = Vec::with_capacity(call.inputs.len());
        let mut characters = 0;
        for (index, seq) in call.inputs.iter().enumerate() {
            let one = match seq {
                Sequence::Single(a) => {
                    characters += a.chars().count();
                    tokenizer.tokenize_cut(&[a.as_str()], cut)
                }
                Sequence::Pair(a, b) => {
                    characters += a.chars().count() + b.chars().count();
                    tokenizer.tokenize_pairs(&[(a.as_str(), b.as_str())], call.truncate)
                }
            };
            encoded.extend(one.map_err(|e| tokenize_error(e, Flavor::Tei, "inputs", index))?);
        }
        Ok((Job::Predict(call), encoded, characters))
    }
}

/// The reply to a tokenizer's refusal of item `offset` + its index of
/// `field`: too long (413, or 400 on OpenAI's and Cohere's routes), or
/// not tokenizable.
fn tokenize_error(
    e: TokenizeError,
    flavor: Flavor,
    field: &'static str,
    offset: usize,
) -> ApiError {
    match e {
        TokenizeError::TooLong(t) => {
            ApiError::too_long_in(flavor, field, offset + t.index, t.tokens, t.max)
        }
        TokenizeError::Failed { index, message } => ApiError::tokenizer(
            flavor,
            &format!("input {} could not be tokenized: {message}", offset + index),
        ),
    }
}

/// A similarity's sentences as an embedding call: embedded as `/embed`'s
/// inputs, not normalized (the cosine divides by the norms).
fn similarity_call(s: api::SimilarityCall) -> EmbedCall {
    EmbedCall {
        inputs: Inputs::Texts(s.texts),
        normalize: false,
        truncate: s.truncate,
        truncation_direction: s.truncation_direction,
        encoding: Encoding::Float,
        model: None,
        flavor: Flavor::Tei,
        dimensions: None,
        prompt_name: s.prompt_name,
    }
}
