//! Several models behind one port, and the plugin's own metrics (ABI
//! 1.6): naming the models a worker serves, saying which one a request is
//! for (in [`Plugin::admit`](crate::Plugin::admit)), reading a model's
//! admitted cost, and counters and histograms on the `--metrics` page.
//!
//! On a host older than 1.6 none of these reach the host: registering and
//! defining return [`Error::UNAVAILABLE`], `model_in_flight` is 0 and
//! `record` does nothing.

use m0serve_abi::{M0_METRIC_COUNTER, M0_METRIC_HISTOGRAM, M0_METRIC_LABELS_MAX, M0Header, M0Str};

use crate::{Error, Host, Request};

/// A model this worker serves, as [`Host::register_model`] named it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ModelId(pub u32);

/// One of the plugin's metrics, as [`Host::define_counter`] or
/// [`Host::define_histogram`] defined it.
#[derive(Clone, Copy, Debug)]
pub struct Metric(u32);

/// A host function's return: the id it made (>= 0), or its error.
fn id(code: i32) -> Result<u32, Error> {
    u32::try_from(code).map_err(|_| Error::from_code(code).unwrap_or(Error::INTERNAL))
}

impl Host {
    /// Names a model this worker serves (1-128 bytes of visible ASCII, no
    /// `"` or `\`): the same name gives the same id, and a process serves
    /// at most 16. Call it at init.
    pub fn register_model(&self, name: &str) -> Result<ModelId, Error> {
        let register = self.model_register.ok_or(Error::UNAVAILABLE)?;
        // SAFETY: a host function valid for the life of the process; the
        // pointer and length describe `name`, alive for the call.
        id(unsafe { register(name.as_ptr(), name.len()) }).map(ModelId)
    }

    /// The sum of the costs admitted for `model` whose responses are not
    /// yet complete (0 for an unknown model, or from a host before 1.6).
    pub fn model_in_flight(&self, model: ModelId) -> u64 {
        match self.model_in_flight {
            // SAFETY: a host function, callable from any thread.
            Some(in_flight) => unsafe { in_flight(model.0) },
            None => 0,
        }
    }

    /// Defines a counter (a Prometheus name, `[a-zA-Z_:][a-zA-Z0-9_:]*`,
    /// at most 64 bytes, not beginning `m0serve_`; `help` one line). Call
    /// it at init.
    pub fn define_counter(&self, name: &str, help: &str) -> Result<Metric, Error> {
        self.define(M0_METRIC_COUNTER, name, help, &[])
    }

    /// Defines a histogram over `bounds` (ascending, finite, at most 16);
    /// the page shows its buckets cumulative, with `+Inf`, `_sum` and
    /// `_count`. Call it at init.
    pub fn define_histogram(
        &self,
        name: &str,
        help: &str,
        bounds: &[f64],
    ) -> Result<Metric, Error> {
        self.define(M0_METRIC_HISTOGRAM, name, help, bounds)
    }

    fn define(&self, kind: u32, name: &str, help: &str, bounds: &[f64]) -> Result<Metric, Error> {
        let define = self.metric_define.ok_or(Error::UNAVAILABLE)?;
        // SAFETY: a host function valid for the life of the process; each
        // pointer and length describes a slice alive for the call.
        id(unsafe {
            define(
                kind,
                name.as_ptr(),
                name.len(),
                help.as_ptr(),
                help.len(),
                bounds.as_ptr(),
                bounds.len(),
            )
        })
        .map(Metric)
    }

    /// Adds `value` to a counter (>= 0) or observes it on a histogram, in
    /// the series of `labels` (at most 4 `(name, value)` pairs). Errors are
    /// ignored: a metric never fails a request. Does not allocate.
    pub fn record(&self, metric: Metric, labels: &[(&str, &str)], value: f64) {
        let Some(record) = self.metric_record else {
            return;
        };
        if labels.len() > M0_METRIC_LABELS_MAX {
            return;
        }
        let mut pairs = [M0Header {
            name: M0Str::EMPTY,
            value: M0Str::EMPTY,
        }; M0_METRIC_LABELS_MAX];
        for (pair, (name, value)) in pairs.iter_mut().zip(labels) {
            *pair = M0Header {
                name: M0Str::from_bytes(name.as_bytes()),
                value: M0Str::from_bytes(value.as_bytes()),
            };
        }
        // SAFETY: a host function, callable from any thread; `labels.len()`
        // pairs of views into `labels`, alive for the call.
        let _ = unsafe { record(metric.0, pairs.as_ptr(), labels.len(), value) };
    }
}

impl Request<'_> {
    /// Says which model this request is for: only in
    /// [`Plugin::admit`](crate::Plugin::admit) (`Error::STATE` elsewhere).
    /// The host then batches it only with requests of the same model,
    /// takes turns between models, counts its cost in
    /// [`Host::model_in_flight`] and names the model in its metrics and
    /// access log line.
    pub fn set_model(&self, model: ModelId) -> Result<(), Error> {
        let set = self.host.request_model.ok_or(Error::UNAVAILABLE)?;
        // SAFETY: a host function; the request is the host's own for the
        // call in progress.
        Error::check(unsafe { set(self.raw(), model.0) })
    }
}
