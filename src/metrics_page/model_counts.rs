//! A model's share of a worker's counters (ABI 1.6, several models behind
//! one port): its responses, their durations and its batches, which the
//! exposition labels `model="NAME"`. A request with a model counts here
//! and not in the block's own fields, so summing a family over its series
//! gives every request once.
//!
//! Slot `i` of a worker's block is the worker's model id `i`; the name is
//! written by the worker before it counts (a `Text`, published last). The
//! retired block's slots are claimed by name when a dead worker's counts
//! are folded, so ids need not agree between workers.

use std::sync::atomic::{AtomicU64, Ordering};

use super::text::Text;
use super::{BATCH_BOUNDS, DURATION_BOUNDS_US};

/// Model slots per block (ABI `M0_MODELS_MAX`).
pub const MODELS: usize = 16;

#[repr(C)]
pub struct ModelCounts {
    pub name: Text<16>,
    /// Responses by status class: 1xx .. 5xx.
    pub responses: [AtomicU64; 5],
    pub duration: [AtomicU64; DURATION_BOUNDS_US.len() + 1],
    pub duration_sum_us: AtomicU64,
    pub batches: [AtomicU64; BATCH_BOUNDS.len() + 1],
    pub batched_requests: AtomicU64,
    pub queue_wait_ns: AtomicU64,
}

impl ModelCounts {
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        self.responses
            .iter()
            .chain(&self.duration)
            .chain([&self.duration_sum_us])
            .chain(&self.batches)
            .chain([&self.batched_requests, &self.queue_wait_ns])
    }

    /// Moves the counts into `to` (the same model's slot of the retired
    /// block); they start again from zero here.
    pub fn fold_into(&self, to: &ModelCounts) {
        for (to, mine) in to.counters().zip(self.counters()) {
            to.fetch_add(mine.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        }
    }
}

/// The slot of `slots` that holds `name`, or a free one, named now (the
/// supervisor folding into the retired block); `None` when all are taken.
pub fn slot_for<'a>(slots: &'a [ModelCounts; MODELS], name: &[u8]) -> Option<&'a ModelCounts> {
    if let Some(slot) = slots.iter().find(|s| s.name.holds(name)) {
        return Some(slot);
    }
    let free = slots.iter().find(|s| s.name.is_empty())?;
    free.name.store(name);
    Some(free)
}
