//! Where a forward pass's time goes, by kind of layer: the dense products,
//! attention, layer norms and the feed-forward activation. Opt-in, with
//! the crate's `profile` feature; without it [`span`] returns an empty
//! value that does nothing, so the layers pay nothing for their timers.
//!
//! Each timed layer function opens a span of its [`Part`] on its first
//! line; the span adds its wall time to that part's total when it ends.
//! The spans sit on the thread that calls the layer, around the whole
//! call (its helpers' pieces included), so with one pass at a time the totals
//! are wall time and add up to less than the pass: what is left
//! (embeddings' lookup, scratch buffers, pooling) is the pass's time
//! minus their sum. No timed function calls another, so nothing is
//! counted twice. The totals are the process's, shared by every thread:
//! profile one pass at a time (`examples/embed_bench.rs --profile`).

/// A kind of layer whose time is counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Part {
    /// The dense layers (`layers::linear::matmul`).
    Products,
    /// Scores, softmax and the weighted sum of values, every head
    /// (`layers::attention::Attention::forward`).
    Attention,
    /// Every LayerNorm, residual adds folded into them, and the
    /// embeddings' sum (one kernel with their norm).
    LayerNorms,
    /// The feed-forward activation (`layers::activation`: GELU for
    /// BERT). ModernBERT's GeGLU, a kernel its architecture calls, is
    /// not timed: it lands in what is left.
    Activation,
}

impl Part {
    /// Every part, in the order [`take`] reports them.
    pub const ALL: [Part; 4] = [
        Part::Products,
        Part::Attention,
        Part::LayerNorms,
        Part::Activation,
    ];

    /// Its name in a profile's table.
    pub fn name(self) -> &'static str {
        match self {
            Part::Products => "products",
            Part::Attention => "attention",
            Part::LayerNorms => "layer norms",
            Part::Activation => "activation",
        }
    }
}

/// Whether this build counts (the `profile` feature).
pub const ENABLED: bool = cfg!(feature = "profile");

#[cfg(feature = "profile")]
mod timers {
    use super::Part;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::time::{Duration, Instant};

    static NANOS: [AtomicU64; Part::ALL.len()] = [const { AtomicU64::new(0) }; Part::ALL.len()];

    /// Adds its lifetime to its part's total when dropped.
    pub struct Span {
        part: Part,
        start: Instant,
    }

    impl Drop for Span {
        fn drop(&mut self) {
            let ns = u64::try_from(self.start.elapsed().as_nanos()).unwrap_or(u64::MAX);
            NANOS[self.part as usize].fetch_add(ns, Ordering::Relaxed);
        }
    }

    pub fn span(part: Part) -> Span {
        Span {
            part,
            start: Instant::now(),
        }
    }

    pub fn take() -> [Duration; Part::ALL.len()] {
        Part::ALL.map(|p| Duration::from_nanos(NANOS[p as usize].swap(0, Ordering::Relaxed)))
    }
}

#[cfg(not(feature = "profile"))]
mod timers {
    use super::Part;
    use std::time::Duration;

    /// Nothing: no clock is read and nothing is added.
    pub struct Span;

    #[inline(always)]
    pub fn span(_: Part) -> Span {
        Span
    }

    pub fn take() -> [Duration; Part::ALL.len()] {
        [Duration::ZERO; Part::ALL.len()]
    }
}

/// The timer of one call of a layer of `part`: bind it (`let _span =`) so
/// that it ends with the call.
pub use timers::Span;

/// Starts the timer of one call of a layer of `part`.
pub use timers::span;

/// The time counted for each part (in [`Part::ALL`]'s order) since the
/// last call, and starts again from zero; all zero without the feature.
pub use timers::take;

#[cfg(all(test, feature = "profile"))]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_span_adds_its_time_to_its_part() {
        // Other tests' layers may add to any part meanwhile (the totals
        // are the process's), never take from it.
        {
            let _span = span(Part::Attention);
            std::thread::sleep(Duration::from_millis(2));
        }
        assert!(take()[1] >= Duration::from_millis(2));
    }
}
