//! Dynamic batching: many requests in one plugin call.
//!
//! A plugin that declares `M0_CAP_BATCH` computes a batch for far less than
//! its requests one by one (a sentence-embedding model does about three
//! times the sentences per second at 32 per forward pass as at one). A
//! handler thread that picks up work takes every request already queued, up
//! to the plugin's limits, and makes one `handle_batch` call. A lone
//! request is served at once, and under load the next batch forms by itself
//! while the previous one computes; only a batch short of the previous one
//! waits briefly for the rest (see `gather`). Requests are taken in
//! arrival order and a batch never skips one of its model (a batch holds
//! one model's requests, and models take turns: `job_queue.rs`), so none
//! waits behind later ones; each has its whole body (the loop dispatches only complete
//! requests, one per connection at a time, so pipelined requests keep
//! their order).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::plugin::Descriptor;
use crate::plugin::models::{CLASSES, class};

/// How many requests and body bytes one call may hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub max_requests: usize,
    pub max_bytes: usize,
    /// The most a short batch waits to fill (`--batch-wait`); zero: never.
    pub max_wait: Duration,
}

/// Whether a worker batches, with what limits, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Plan {
    pub limits: Option<Limits>,
    pub reason: String,
}

/// The plan for `desc` (`no_batch`: `--no-batch` / `M0_NO_BATCH`;
/// `max_wait`: `--batch-wait` / `M0_BATCH_WAIT`).
pub fn decide(desc: &Descriptor, no_batch: bool, max_wait: Duration) -> Plan {
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
            max_wait,
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
                "on (up to {}, {} per call; {})",
                bound(l.max_requests, "requests"),
                bound(l.max_bytes, "bytes"),
                if l.max_wait.is_zero() {
                    "a call takes what is queued: --batch-wait 0".to_string()
                } else {
                    format!(
                        "a call short of the last one's size waits up to {} ms for the rest, \
                         --batch-wait",
                        l.max_wait.as_secs_f64() * 1000.0
                    )
                }
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

/// The previous call: how many requests it held, how long it took, and
/// how many were queued behind it when it ended (they arrived during it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LastCall {
    pub size: usize,
    pub took: Duration,
    pub behind: usize,
}

/// A short batch's wait for the requests expected to follow.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Gather {
    /// Start the call once this many requests are queued...
    pub want: usize,
    /// ...or once this much time has passed, whichever comes first.
    pub wait: Duration,
}

/// A short batch waits at most this fraction of the previous call's time.
const GATHER_SHARE: u32 = 8;

/// Whether a thread about to call the plugin with `queued` requests waits
/// for more first. Under a steady load from clients that send their next
/// request when the last is answered, taking only what is queued lets the
/// batches split for good: a lone request that arrived during a call of 15
/// goes alone, the 15 answered by that call queue behind it and go
/// together, and so on. Each call pays its fixed cost (an embedding model
/// streams all its weights once per forward pass, batch of 1 or 16), so
/// the split costs a whole call per cycle. The clients a call answered
/// are the ones most likely to send next, on top of the requests that
/// arrived during it: when fewer are queued than the two together, the
/// thread waits for the difference, briefly (at most an eighth of that
/// call's time, and `--batch-wait`), so a load that has dropped costs one
/// short wait, after which the smaller call sets the next expectation.
/// Counting only the answered clients left the calls one short for good:
/// a call of 7 waited for 7, and the eighth client, which had sent during
/// the call of 1 before, missed every call in turn. A lone client (calls of
/// one, nothing behind them) never waits, and neither does a pool of more
/// than one thread (the pool decides that: a later request goes to another
/// thread, beside this call).
pub fn gather(limits: Limits, queued: usize, last: Option<LastCall>) -> Option<Gather> {
    let last = last?;
    let want = (last.size + last.behind).min(limits.max_requests);
    let wait = (last.took / GATHER_SHARE).min(limits.max_wait);
    (queued < want && !wait.is_zero()).then_some(Gather { want, wait })
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

/// Calls of one class (a model, or no model) and their sizes.
#[derive(Default)]
struct ClassSizes {
    calls: AtomicU64,
    requests: AtomicU64,
    buckets: [AtomicU64; BUCKETS.len()],
}

/// Batch calls made and their sizes, per model (each call holds one
/// model's requests), and the short calls that waited for more
/// (`gather`).
#[derive(Default)]
pub struct Sizes {
    classes: [ClassSizes; CLASSES],
    waits: AtomicU64,
    waits_filled: AtomicU64,
}

impl Sizes {
    /// Calls, requests, and calls per bucket (1, 2-3, ... 64+) of the jobs
    /// of `class` (`models::class`).
    pub fn snapshot(&self, class: usize) -> (u64, u64, [u64; BUCKETS.len()]) {
        let c = &self.classes[class];
        (
            c.calls.load(Ordering::Relaxed),
            c.requests.load(Ordering::Relaxed),
            std::array::from_fn(|i| c.buckets[i].load(Ordering::Relaxed)),
        )
    }

    /// A call of `size` requests of `model`.
    pub fn record(&self, model: u32, size: usize) {
        let c = &self.classes[class(model)];
        c.calls.fetch_add(1, Ordering::Relaxed);
        c.requests.fetch_add(size as u64, Ordering::Relaxed);
        let bucket = BUCKETS
            .iter()
            .position(|&(upper, _)| size <= upper)
            .unwrap_or(BUCKETS.len() - 1);
        c.buckets[bucket].fetch_add(1, Ordering::Relaxed);
    }

    /// Short calls that waited for more requests, and those the queue
    /// filled.
    pub fn waits(&self) -> (u64, u64) {
        (
            self.waits.load(Ordering::Relaxed),
            self.waits_filled.load(Ordering::Relaxed),
        )
    }

    /// A short call waited for more requests; `filled`: the queue reached
    /// what it waited for before the time ran out.
    pub fn record_wait(&self, filled: bool) {
        self.waits.fetch_add(1, Ordering::Relaxed);
        if filled {
            self.waits_filled.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// "batching: 12 call(s) for 65 request(s), mean 5.42 per call; sizes
    /// 1:2 2-3:1 ...; 3 short call(s) waited for more, 2 filled", for the
    /// closing line: every model's calls together.
    pub fn summary(&self) -> String {
        let (mut calls, mut requests, mut buckets) = (0, 0, [0u64; BUCKETS.len()]);
        for class in 0..CLASSES {
            let (c, r, b) = self.snapshot(class);
            calls += c;
            requests += r;
            for (to, n) in buckets.iter_mut().zip(b) {
                *to += n;
            }
        }
        let mut line = format!(
            "batching: {calls} call(s) for {requests} request(s), mean {:.2} per call; sizes",
            requests as f64 / calls.max(1) as f64
        );
        for ((_, name), count) in BUCKETS.iter().zip(buckets) {
            line.push_str(&format!(" {name}:{count}"));
        }
        let (waits, filled) = self.waits();
        line.push_str(&format!(
            "; {waits} short call(s) waited for more, {filled} filled"
        ));
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIMITS: Limits = Limits {
        max_requests: 32,
        max_bytes: 1 << 16,
        max_wait: Duration::from_millis(2),
    };

    fn last(size: usize, took_ms: u64) -> Option<LastCall> {
        Some(LastCall {
            size,
            took: Duration::from_millis(took_ms),
            behind: 0,
        })
    }

    #[test]
    fn a_batch_short_of_the_last_call_waits_for_the_rest_briefly() {
        // A call of 15 that took 48 ms, one request queued: wait for 14
        // more, at most 2 ms (an eighth of 48 ms is 6 ms).
        assert_eq!(
            gather(LIMITS, 1, last(15, 48)),
            Some(Gather {
                want: 15,
                wait: Duration::from_millis(2)
            })
        );
        // A fast call bounds the wait by an eighth of its time.
        assert_eq!(
            gather(LIMITS, 3, last(8, 4)),
            Some(Gather {
                want: 8,
                wait: Duration::from_micros(500)
            })
        );
        // Never for more than one call may hold.
        assert_eq!(gather(LIMITS, 31, last(40, 80)).map(|g| g.want), Some(32));
    }

    #[test]
    fn the_requests_that_arrived_during_the_last_call_count_too() {
        // A call of 7 with one request queued behind it: that one and the
        // seven answered clients make 8.
        let behind_one = Some(LastCall {
            behind: 1,
            ..last(7, 48).unwrap()
        });
        assert_eq!(gather(LIMITS, 1, behind_one).map(|g| g.want), Some(8));
        assert_eq!(gather(LIMITS, 7, behind_one).map(|g| g.want), Some(8));
        assert_eq!(gather(LIMITS, 8, behind_one), None);
        // A call of one with seven behind it: the eighth is its client.
        let ones = Some(LastCall {
            behind: 7,
            ..last(1, 48).unwrap()
        });
        assert_eq!(gather(LIMITS, 7, ones).map(|g| g.want), Some(8));
        // Never past what one call may hold.
        let full = Some(LastCall {
            behind: 30,
            ..last(32, 48).unwrap()
        });
        assert_eq!(gather(LIMITS, 31, full).map(|g| g.want), Some(32));
        assert_eq!(gather(LIMITS, 32, full), None);
    }

    #[test]
    fn nothing_waits_without_a_reason_to_expect_more() {
        // The first call, a lone client, a queue as full as the last call.
        assert_eq!(gather(LIMITS, 1, None), None);
        assert_eq!(gather(LIMITS, 1, last(1, 50)), None);
        assert_eq!(gather(LIMITS, 8, last(8, 50)), None);
        assert_eq!(gather(LIMITS, 32, last(40, 50)), None);
        // A call too short to measure, or waiting turned off.
        assert_eq!(gather(LIMITS, 1, last(8, 0)), None);
        let greedy = Limits {
            max_wait: Duration::ZERO,
            ..LIMITS
        };
        assert_eq!(gather(greedy, 1, last(15, 48)), None);
    }

    #[test]
    fn sizes_fall_into_their_buckets() {
        let sizes = Sizes::default();
        for n in [1, 2, 3, 4, 8, 31, 32, 64, 1000] {
            sizes.record(if n == 8 { 0 } else { u32::MAX }, n);
        }
        assert_eq!(sizes.snapshot(0).0, 1, "model 0's call is its own");
        for filled in [true, false, true] {
            sizes.record_wait(filled);
        }
        assert_eq!(
            sizes.summary(),
            "batching: 9 call(s) for 1145 request(s), mean 127.22 per call; sizes 1:1 2-3:2 4-7:1 8-15:1 16-31:1 32-63:1 64+:2; \
             3 short call(s) waited for more, 2 filled"
        );
    }
}
