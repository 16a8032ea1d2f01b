//! The event loop's side of admission (`M0_CAP_ADMIT`, ABI 1.5): the
//! plugin sees each request here, on the loop's thread, before it is
//! queued for the pool, and either names its cost or answers it at once.
//!
//! A plugin whose work grows with what a request holds (an embedding
//! model: its inputs) cannot be protected by the queue's depth in
//! requests: 64 queued requests of 32 inputs each are 2048 inputs, and the
//! last waits for all of them. Asked here, before the queue, the plugin
//! refuses what would take its worker over its limit with an answer in
//! its own API's shape (a 429 with `Retry-After`) instead of a wait.
//!
//! The loop, not the plugin, keeps the sum of the costs in flight: every
//! job leaves the loop's hands through one of three doors (its completion
//! from the pool or a loop call, the end of an inline call, or the 503 of
//! a full queue), and each gives its cost back, whatever the plugin did
//! (a panic is a 500 from the SDK, a client gone is a failed write; both
//! still complete the job). So no count can leak.

use super::EventLoop;
use crate::plugin::call::{Admission, CallBuffers, Job};
use crate::plugin::models;

/// What the loop keeps for the plugin's `admit` calls.
pub(super) struct Admitting {
    bufs: CallBuffers,
    /// Bytes of a refusal the socket did not take.
    spilled: Vec<u8>,
    /// The costs of the jobs admitted and not yet back.
    in_flight: u64,
    admitted: u64,
    refused: u64,
    /// The most `in_flight` has been.
    peak: u64,
}

impl EventLoop {
    /// Ask the plugin about each request before queueing it, when it
    /// declares `M0_CAP_ADMIT` and has an `admit` call. Returns whether
    /// admission is on.
    pub fn enable_admission(&mut self, declared: bool) -> bool {
        if declared && self.pool.has_admit() {
            self.admission = Some(Admitting {
                // Its index is never handed to the plugin (admit calls
                // carry M0_THREAD_NONE).
                bufs: CallBuffers::new(m0serve_abi::M0_THREAD_NONE),
                spilled: Vec::new(),
                in_flight: 0,
                admitted: 0,
                refused: 0,
                peak: 0,
            });
        }
        self.admission.is_some()
    }

    /// The job with its cost held, or, when the plugin answered it itself,
    /// whether the connection is ready for its next request now.
    pub(super) fn admit_request(&mut self, key: usize, mut job: Job) -> Result<Job, bool> {
        let Some(a) = &mut self.admission else {
            return Ok(job);
        };
        a.spilled.clear();
        match self
            .pool
            .admit(&job, &mut a.bufs, &mut a.spilled, a.in_flight)
        {
            Admission::Admitted { cost, model } => {
                a.admitted += 1;
                a.in_flight = a.in_flight.saturating_add(cost);
                a.peak = a.peak.max(a.in_flight);
                models::hold(model, cost);
                job.cost = cost;
                job.model = model;
                Ok(job)
            }
            Admission::Answered(outcome) => {
                a.refused += 1;
                let mut spilled = std::mem::take(&mut a.spilled);
                let ready = self.answered_on_loop(key, job, outcome, &mut spilled);
                if let Some(a) = &mut self.admission {
                    a.spilled = spilled;
                }
                Err(ready)
            }
        }
    }

    /// A job is back (or refused by the host): its cost is no longer in
    /// flight, in the worker's sum and its model's.
    pub(super) fn release_cost(&mut self, job: &Job) {
        if let Some(a) = &mut self.admission {
            debug_assert!(a.in_flight >= job.cost, "released more than was admitted");
            a.in_flight = a.in_flight.saturating_sub(job.cost);
            models::release(job.model, job.cost);
        }
    }

    /// "admission: 120 request(s) admitted, 37 answered by the plugin's
    /// admit; peak cost in flight 64, at the end 0", for the closing log;
    /// None when admission is off.
    pub fn admission_summary(&self) -> Option<String> {
        self.admission.as_ref().map(|a| {
            format!(
                "admission: {} request(s) admitted, {} answered by the plugin's admit; \
                 peak cost in flight {}, at the end {}",
                a.admitted, a.refused, a.peak, a.in_flight
            )
        })
    }
}
