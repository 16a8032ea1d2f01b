//! The forward passes of a batch and the replies they make: the jobs that
//! share a backend call ([`Pass`]) put their inputs together, in order, in
//! passes of at most `pass_tokens` tokens, so one client's pairs fill a
//! pass beside another's; each job then takes its rows back.

use m0serve_plugin::{Error, Header, Sent};

use super::jobs::{Job, Out, Pass, Pending};
use super::{JSON, Served, fail};
use crate::api::{self, ApiError, EmbedCall, Flavor};
use crate::backend::{Backend, BackendError};
use crate::model::{self, Encoded};

/// Why a run of passes gave no rows.
enum Failure {
    /// The backend has no such call (it answered `None`).
    Unserved,
    Backend(BackendError),
}

impl<B: Backend> Served<B> {
    /// Computes every pending job: the pooled, classifier and sparse
    /// jobs each in shared passes ([`Served::run`]), each `/embed_all`
    /// request in passes of its own. When a pass fails, each job of it
    /// gets the error, logged once.
    pub(super) fn forward(&self, pending: &mut [Pending<'_>]) {
        if pending.is_empty() {
            return;
        }
        let start = self.host.now_ns();
        for p in pending.iter_mut() {
            p.timing.queue_ns += start.saturating_sub(p.tokenized_ns);
        }
        let dim = self.backend.info().dim;
        let embed = |b: &B, batch: &[Encoded]| Some(b.embed(batch));
        self.run(pending, Pass::Pooled, dim, start, embed, Out::Floats);
        let labels = self.labels.len();
        self.run(
            pending,
            Pass::Classify,
            labels,
            start,
            B::classify,
            Out::Floats,
        );
        self.run(pending, Pass::Sparse, 1, start, B::sparse, Out::Sparse);
        for p in pending.iter_mut().filter(|p| p.job.pass() == Pass::Tokens) {
            self.run(
                std::slice::from_mut(p),
                Pass::Tokens,
                0,
                start,
                B::token_states,
                Out::Floats,
            );
        }
    }

    /// The jobs of `pending` that go through `pass`: their inputs in
    /// order, in passes of at most `pass_tokens` tokens through `call`,
    /// each job given its `width` items an input back (`width` 0: as many
    /// as its inputs' tokens, each token a row of `/embed_all`'s).
    fn run<T>(
        &self,
        pending: &mut [Pending<'_>],
        pass: Pass,
        width: usize,
        start: u64,
        call: impl Fn(&B, &[Encoded]) -> Option<Result<Vec<T>, BackendError>>,
        wrap: impl Fn(Vec<T>) -> Out,
    ) {
        let mut mine: Vec<&mut Pending<'_>> = pending
            .iter_mut()
            .filter(|p| p.job.pass() == pass)
            .collect();
        if mine.is_empty() {
            return;
        }
        let begun = self.host.now_ns();
        let mut all = Vec::new();
        let counts: Vec<usize> = mine
            .iter_mut()
            .map(|p| {
                let n = match width {
                    0 => p.timing.tokens * self.backend.info().dim,
                    w => p.encoded.len() * w,
                };
                all.append(&mut p.encoded);
                n
            })
            .collect();
        let want: usize = counts.iter().sum();
        let rows = passes(&all, self.pass_tokens, Encoded::tokens)
            .try_fold(Vec::with_capacity(want), |mut rows, one| {
                let tokens = one.iter().map(Encoded::tokens).sum();
                self.metrics.pass(&self.served_name, one.len(), tokens);
                match call(&self.backend, one) {
                    None => Err(Failure::Unserved),
                    Some(Err(e)) => Err(Failure::Backend(e)),
                    Some(Ok(r)) => {
                        rows.extend(r);
                        Ok(rows)
                    }
                }
            })
            .and_then(|rows| match rows.len() == want {
                true => Ok(rows),
                false => Err(Failure::Backend(BackendError::new(
                    format!(
                        "the backend gave {} values for {} inputs where {want} were due",
                        rows.len(),
                        all.len()
                    ),
                    "",
                ))),
            });
        let end = self.host.now_ns();
        match rows {
            Ok(rows) => {
                let mut rest = rows.into_iter();
                for (p, n) in mine.into_iter().zip(counts) {
                    let part: Vec<T> = rest.by_ref().take(n).collect();
                    p.out = Ok(wrap(part));
                    p.timing.queue_ns += begun.saturating_sub(start);
                    p.timing.inference_ns = end.saturating_sub(begun);
                }
            }
            Err(Failure::Backend(e)) => {
                self.log_failure(&e, all.len(), mine.len());
                for p in mine {
                    p.out = Err(ApiError::backend(p.job.flavor(), &e.message));
                }
            }
            Err(Failure::Unserved) => {
                for p in mine {
                    p.out = Err(ApiError::not_implemented(
                        p.job.flavor(),
                        &format!(
                            "{} is not served by the {} plugin: its backend {}; use the embed \
                             plugin, which serves it",
                            match pass {
                                Pass::Tokens => "/embed_all",
                                Pass::Classify => "a cross-encoder's scores",
                                Pass::Sparse => "a sparse model's vectors",
                                Pass::Pooled => "pooled vectors",
                            },
                            B::DESCRIPTION.name(),
                            match pass {
                                Pass::Tokens =>
                                    "gives pooled vectors only, not each token's \
                                                 (use /embed)",
                                _ => "does not give them",
                            },
                        ),
                    ));
                }
            }
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

    /// Answers a request whose output [`Served::forward`] has made, with
    /// TEI's timing headers.
    pub(super) fn reply(&self, mut p: Pending<'_>) -> Result<Sent, Error> {
        let output = match std::mem::replace(&mut p.out, Ok(Out::Floats(Vec::new()))) {
            Ok(o) => o,
            Err(e) => {
                self.metrics.failed(&self.served_name, &e);
                return fail(p.resp, &e);
            }
        };
        let mut out = Vec::new();
        if let Err(e) = self.render(&p, output, &mut out) {
            self.metrics.failed(&self.served_name, &e);
            return fail(p.resp, &e);
        }
        p.timing.total_ns = self.host.now_ns().saturating_sub(p.arrived_ns);
        self.metrics
            .succeeded(&self.served_name, &p.timing, &p.lens);
        let timing = p.timing.headers();
        let mut headers = Vec::with_capacity(timing.len() + 1);
        headers.push(JSON);
        headers.extend(timing.iter().map(|(k, v)| Header::new(k, v)));
        p.resp.send(200, &headers, &out)
    }

    /// The JSON reply of one job.
    fn render(&self, p: &Pending<'_>, output: Out, out: &mut Vec<u8>) -> Result<(), ApiError> {
        let dim = self.backend.info().dim;
        let rows = match output {
            Out::Sparse(vectors) => return api::write_sparse(&vectors, out),
            Out::Floats(rows) => rows,
        };
        match &p.job {
            Job::Embed(call) => self.render_embeddings(call, rows, p.timing.tokens, out),
            Job::EmbedAll(_) => api::write_embed_all(&rows, &p.lens, dim, out),
            Job::Similarity => api::write_similarity(&rows, dim, out),
            Job::Rerank(call) if call.cohere.is_some() => {
                let n = self
                    .requests
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let id = api::request_id(p.arrived_ns, n, std::process::id());
                api::write_cohere(call, &rows, &id, out)
            }
            Job::Rerank(call) => api::write_rerank(call, &rows, out),
            Job::Predict(call) => api::write_predict(call, &rows, &self.labels, out),
            Job::Sparse => Err(ApiError::internal(
                Flavor::Tei,
                "a sparse job was given dense rows",
            )),
        }
    }

    /// The JSON reply of one embedding request, normalized as it asked.
    fn render_embeddings(
        &self,
        call: &EmbedCall,
        mut vectors: Vec<f32>,
        tokens: usize,
        out: &mut Vec<u8>,
    ) -> Result<(), ApiError> {
        let dim = self.backend.info().dim;
        if call.normalize {
            model::normalize_rows(dim, &mut vectors);
        }
        let dim = match call.dimensions {
            Some(keep) => api::shrink_rows(&mut vectors, dim, keep, call.normalize),
            None => dim,
        };
        match call.flavor {
            Flavor::OpenAi => {
                api::write_openai(&vectors, dim, call.encoding, &self.served_name, tokens, out)
            }
            _ => api::write_tei(&vectors, dim, out),
        }
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
