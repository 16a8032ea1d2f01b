//! The blocks the encoder architectures compose, beyond BERT's: each works
//! on the packed layout of encoder.rs (every sequence's tokens one after
//! another, `[tokens, width]` row-major, no padding) and runs with the
//! instruction set [`super::kernels::Isa`] picked at load.
//!
//! `rotary` (ModernBERT's rotary position embedding of queries and keys),
//! `window` (attention of one sequence and one head over a band of keys:
//! ModernBERT's sliding layers, and MPNet's biased scores), `relative_bias`
//! (MPNet's T5-style relative position buckets and their per-head bias),
//! `geglu` (ModernBERT's gated feed-forward activation); `fixtures` (tests:
//! the four composed into naive ModernBERT and MPNet passes reproduce the
//! tiny fixtures' sentence-transformers vectors).

// Until the architectures that call them land (issue #51), only the tests
// do.
#![cfg_attr(not(test), allow(dead_code))]

#[cfg(test)]
mod fixtures;
pub(crate) mod geglu;
pub(crate) mod relative_bias;
pub(crate) mod rotary;
pub(crate) mod window;
