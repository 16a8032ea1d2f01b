//! Dynamic batching: many requests in one plugin call.
//!
//! A plugin that declares `M0_CAP_BATCH` computes a batch for far less than
//! its requests one by one (a sentence-embedding model does about three
//! times the sentences per second at 32 per forward pass as at one). A
//! handler thread that picks up work takes every request already queued, up
//! to the plugin's limits, and makes one `handle_batch` call. There is no
//! timer: a lone request is served at once, and under load the next batch
//! forms by itself while the previous one computes. Requests are taken in
//! arrival order and a batch never skips one, so none waits behind later
//! ones; each has its whole body (the loop dispatches only complete
//! requests, one per connection at a time, so pipelined requests keep
//! their order).

use std::collections::VecDeque;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::plugin::Descriptor;
use crate::plugin::call::Job;

/// How many requests and body bytes one call may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_requests: usize,
    pub max_bytes: usize,
}

/// Whether a worker batches, with what limits, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub limits: Option<Limits>,
    pub reason: String,
}

/// The plan for `desc` (`no_batch`: `--no-batch` / `M0_NO_BATCH`).
pub fn decide(desc: &Descriptor, no_batch: bool) -> Plan {
    let off = |reason: &str| Plan {
        limits: None,
        reason: reason.to_string(),
    };
    if !desc.batch {
        return off("the plugin does not declare M0_CAP_BATCH");
    }
    if no_batch {
        return off("turned off with --no-batch");
    }
    let limit = |n: u32| if n == 0 { usize::MAX } else { n as usize };
    Plan {
        limits: Some(Limits {
            max_requests: limit(desc.max_batch),
            max_bytes: limit(desc.max_batch_bytes),
        }),
        reason: "the plugin declares M0_CAP_BATCH".to_string(),
    }
}

impl Plan {
    /// After init: a plugin that declares batches but has no `handle_batch`
    /// in its calls table is called one request at a time.
    pub fn require_entry_point(&mut self, has_handle_batch: bool) {
        if self.limits.is_some() && !has_handle_batch {
            self.limits = None;
            self.reason =
                "the plugin declares M0_CAP_BATCH but its calls table has no handle_batch".into();
        }
    }

    /// "on (up to 8 requests, 1000 bytes per call)" or "off (why)", for the
    /// start line.
    pub fn summary(&self) -> String {
        match self.limits {
            Some(l) => format!(
                "on (up to {}, {} per call)",
                bound(l.max_requests, "requests"),
                bound(l.max_bytes, "bytes")
            ),
            None => format!("off ({})", self.reason),
        }
    }
}

fn bound(n: usize, unit: &str) -> String {
    if n == usize::MAX {
        format!("any number of {unit}")
    } else {
        format!("{n} {unit}")
    }
}

/// Move the next batch from the front of `queue` into `into`: the first job
/// always (a request larger than the byte limit on its own goes alone),
/// then each following one while both limits hold.
pub fn take(queue: &mut VecDeque<Job>, limits: Limits, into: &mut Vec<Job>) {
    let Some(first) = queue.pop_front() else {
        return;
    };
    let mut bytes = first.body_len();
    into.push(first);
    while into.len() < limits.max_requests {
        let Some(next) = queue.front() else { break };
        let Some(total) = bytes
            .checked_add(next.body_len())
            .filter(|&t| t <= limits.max_bytes)
        else {
            break;
        };
        bytes = total;
        into.extend(queue.pop_front());
    }
}

/// Upper bounds of the size buckets the closing line shows (the last one
/// is open).
const BUCKETS: [(usize, &str); 7] = [
    (1, "1"),
    (3, "2-3"),
    (7, "4-7"),
    (15, "8-15"),
    (31, "16-31"),
    (63, "32-63"),
    (usize::MAX, "64+"),
];

/// Batch calls made and their sizes.
#[derive(Default)]
pub struct Sizes {
    calls: AtomicU64,
    requests: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
}

impl Sizes {
    /// Calls, requests, and calls per bucket (1, 2-3, ... 64+).
    pub fn snapshot(&self) -> (u64, u64, [u64; BUCKETS.len()]) {
        (
            self.calls.load(Ordering::Relaxed),
            self.requests.load(Ordering::Relaxed),
            std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
        )
    }

    pub fn record(&self, size: usize) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        self.requests.fetch_add(size as u64, Ordering::Relaxed);
        let bucket = BUCKETS
            .iter()
            .position(|&(upper, _)| size <= upper)
            .unwrap_or(BUCKETS.len() - 1);
        self.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// "batching: 12 call(s) for 65 request(s), mean 5.42 per call; sizes
    /// 1:2 2-3:1 ...", for the closing line.
    pub fn summary(&self) -> String {
        let calls = self.calls.load(Ordering::Relaxed);
        let requests = self.requests.load(Ordering::Relaxed);
        let mut line = format!(
            "batching: {calls} call(s) for {requests} request(s), mean {:.2} per call; sizes",
            requests as f64 / calls.max(1) as f64
        );
        for ((_, name), count) in BUCKETS.iter().zip(&self.buckets) {
            line.push_str(&format!(" {name}:{}", count.load(Ordering::Relaxed)));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_fall_into_their_buckets() {
        let sizes = Sizes::default();
        for n in [1, 2, 3, 4, 8, 31, 32, 64, 1000] {
            sizes.record(n);
        }
        assert_eq!(
            sizes.summary(),
            "batching: 9 call(s) for 1145 request(s), mean 127.22 per call; sizes 1:1 2-3:2 4-7:1 8-15:1 16-31:1 32-63:1 64+:2"
        );
    }
}
