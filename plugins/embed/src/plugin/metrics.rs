//! TEI's inference metrics (its router's `te_*` series, in its names and
//! units), per model: each series labelled `model`, failures also `err`.
//! Defined once at init through the host, which shows them on the
//! `--metrics` page summed over the workers; recorded on the hot path with
//! borrowed labels (nothing allocated per request).
//!
//! - `te_request_count`, `te_request_success`: requests for a forward
//!   pass, and those answered 200;
//! - `te_request_failure{err}`: the others, by reason: `validation` (the
//!   client's mistake), `overloaded` (429), `backend` (the pass failed);
//! - `te_request_duration`, `te_request_tokenization_duration`,
//!   `te_request_queue_duration`, `te_request_inference_duration`: seconds
//!   per successful request, as TEI's `x-*-time` headers split them;
//! - `te_request_input_length`: tokens per input;
//! - `te_batch_next_size`, `te_batch_next_tokens`: inputs and tokens per
//!   forward pass.

use m0serve_plugin::{Host, Metric};

use crate::api::{ApiError, Timing};

/// Seconds: from 1 ms to 10 s, roughly doubling (TEI's exponential
/// buckets start at 1 ms as well).
const SECONDS: &[f64] = &[
    0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0,
];
/// Tokens of an input, or of a pass.
const TOKENS: &[f64] = &[
    8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0, 32768.0,
];
/// Inputs of a pass.
const INPUTS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0,
];

/// Why a request failed, as `te_request_failure`'s `err` says it.
fn reason(e: &ApiError) -> &'static str {
    match e.status {
        429 => "overloaded",
        // TEI's 424 for a route the model cannot answer is the client's.
        424 if e.code == Some("wrong_model_type") => "validation",
        424 | 500.. => "backend",
        _ => "validation",
    }
}

/// The metrics' ids; `None` where the host has no metrics (older than
/// ABI 1.6) or refused one: then nothing is recorded.
#[derive(Clone, Copy)]
pub(super) struct Metrics {
    host: &'static Host,
    count: Option<Metric>,
    success: Option<Metric>,
    failure: Option<Metric>,
    duration: Option<Metric>,
    tokenization: Option<Metric>,
    queue: Option<Metric>,
    inference: Option<Metric>,
    input_length: Option<Metric>,
    batch_size: Option<Metric>,
    batch_tokens: Option<Metric>,
}

impl Metrics {
    /// Defines the series (the same definitions give the same ids, so
    /// every model shares them).
    pub(super) fn define(host: &'static Host) -> Metrics {
        let counter = |name: &str, help: &str| host.define_counter(name, help).ok();
        let histogram =
            |name: &str, help: &str, bounds: &[f64]| host.define_histogram(name, help, bounds).ok();
        Metrics {
            host,
            count: counter("te_request_count", "Requests for a forward pass"),
            success: counter("te_request_success", "Requests answered 200"),
            failure: counter(
                "te_request_failure",
                "Requests refused or failed, by reason (err: validation, overloaded, backend)",
            ),
            duration: histogram(
                "te_request_duration",
                "Seconds from arrival to the reply, per successful request",
                SECONDS,
            ),
            tokenization: histogram(
                "te_request_tokenization_duration",
                "Seconds spent tokenizing, per successful request",
                SECONDS,
            ),
            queue: histogram(
                "te_request_queue_duration",
                "Seconds waiting for the forward pass, per successful request",
                SECONDS,
            ),
            inference: histogram(
                "te_request_inference_duration",
                "Seconds in the forward pass, per successful request",
                SECONDS,
            ),
            input_length: histogram(
                "te_request_input_length",
                "Tokens per input of a successful request",
                TOKENS,
            ),
            batch_size: histogram("te_batch_next_size", "Inputs per forward pass", INPUTS),
            batch_tokens: histogram("te_batch_next_tokens", "Tokens per forward pass", TOKENS),
        }
    }

    fn add(&self, metric: Option<Metric>, labels: &[(&str, &str)], value: f64) {
        if let Some(m) = metric {
            self.host.record(m, labels, value);
        }
    }

    /// A request of `model` for a forward pass arrived.
    pub(super) fn request(&self, model: &str) {
        self.add(self.count, &[("model", model)], 1.0);
    }

    /// A request of `model` is answered with `e`.
    pub(super) fn failed(&self, model: &str, e: &ApiError) {
        self.add(self.failure, &[("model", model), ("err", reason(e))], 1.0);
    }

    /// A request of `model` is answered 200 after `timing`, its inputs
    /// of `lens` tokens.
    pub(super) fn succeeded(&self, model: &str, timing: &Timing, lens: &[usize]) {
        let labels = &[("model", model)];
        let seconds = |ns: u64| ns as f64 / 1e9;
        self.add(self.success, labels, 1.0);
        self.add(self.duration, labels, seconds(timing.total_ns));
        self.add(self.tokenization, labels, seconds(timing.tokenization_ns));
        self.add(self.queue, labels, seconds(timing.queue_ns));
        self.add(self.inference, labels, seconds(timing.inference_ns));
        for &n in lens {
            self.add(self.input_length, labels, n as f64);
        }
    }

    /// A forward pass of `model` over `inputs` inputs of `tokens` tokens.
    pub(super) fn pass(&self, model: &str, inputs: usize, tokens: usize) {
        let labels = &[("model", model)];
        self.add(self.batch_size, labels, inputs as f64);
        self.add(self.batch_tokens, labels, tokens as f64);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::Flavor;

    #[test]
    fn failures_are_told_apart_by_reason() {
        assert_eq!(
            reason(&ApiError::overloaded(Flavor::Tei, "x")),
            "overloaded"
        );
        assert_eq!(reason(&ApiError::backend(Flavor::Tei, "x")), "backend");
        assert_eq!(reason(&ApiError::backend(Flavor::OpenAi, "x")), "backend");
        assert_eq!(
            reason(&ApiError::too_many(Flavor::Tei, 40, 32)),
            "validation"
        );
        assert_eq!(
            reason(&ApiError::wrong_model(
                Flavor::Tei,
                "a re-ranker",
                "embedding",
                ""
            )),
            "validation"
        );
        assert_eq!(
            reason(&ApiError::unknown_model(Flavor::OpenAi, "x", &["a"])),
            "validation"
        );
    }
}
