//! One file per encoder architecture, behind one trait (as TEI's candle
//! backend has it): each reads its own config.json fields, declares its
//! tensors once ([`Architecture::tensors`], the list the packed cache is
//! written from and checked against), and composes the blocks of
//! `layers/` into its packed forward pass ([`Encoder::forward`]). Which
//! file serves a folder is registry.rs's choice, by `model_type`.
//!
//! - `bert`: BERT, and the post-norm encoder that RoBERTa and DistilBERT
//!   share with it (their differences are names, positions and token
//!   types, not code);
//! - `roberta`: RoBERTa, XLM-RoBERTa, CamemBERT (positions after padding's);
//! - `distilbert`: DistilBERT (its own names, no token types);
//! - `mpnet`: MPNet (the post-norm encoder with a relative position bias);
//! - `modernbert`: ModernBERT (pre-norm, rotary, local windows, GeGLU).
//!
//! An architecture owns its whole forward pass: MPNet's relative position
//! bias is one score rule (`layers::attention::Scores`) on the post-norm
//! encoder; ModernBERT's rotary embeddings, local windows, GeGLU and
//! pre-norm with a final norm need a pass of their own, with zeros for the
//! biases the family lacks (`TensorList::dense_without_bias`,
//! `norm_without_bias`).

pub(crate) mod bert;
pub(crate) mod distilbert;
pub(crate) mod modernbert;
pub(crate) mod mpnet;
pub(crate) mod roberta;

use super::cache::Packed;
use super::kernels::Isa;
use super::mmap::Scratch;
use super::team::Pass;
use super::tensors::TensorList;

/// What every architecture's config.json says of its shape.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Dims {
    pub hidden: usize,
    pub layers: usize,
    pub heads: usize,
    /// Feed-forward inner size.
    pub intermediate: usize,
    /// Rows of the token embedding table.
    pub vocab: usize,
    /// The most tokens one input can have: the position table's rows
    /// that real tokens use (RoBERTa's first two are padding's).
    pub max_tokens: usize,
    /// config.json's `_name_or_path`, when set.
    pub name_or_path: Option<String>,
}

/// An encoder architecture as config.json describes it, before its
/// weights.
pub(crate) trait Architecture: Send + Sync {
    /// The `model_type` it serves this folder as (`bert`, `xlm-roberta`...).
    fn name(&self) -> &'static str;

    /// Its shape.
    fn dims(&self) -> &Dims;

    /// Every tensor its forward pass reads, in the cache's order, with
    /// where each comes from in model.safetensors: the packed cache is
    /// written from this list and checked against it.
    fn tensors(&self) -> TensorList;

    /// The encoder over the packed cache's tensors (which the cache has
    /// checked against [`Architecture::tensors`]), cutting inputs at
    /// `max_len` tokens.
    fn encoder(&self, packed: &Packed, max_len: usize, isa: Isa) -> Box<dyn Encoder>;
}

/// A loaded encoder: the packed forward pass.
pub(crate) trait Encoder: Send + Sync {
    /// The last hidden state of every token of every sequence, packed:
    /// `sum(lens) x hidden` rows, sequence after sequence, each layer on
    /// as many threads as `pass` has at its start. Sequences longer than max_len
    /// are cut to it; ids outside the vocabulary read as 0. `second[i]` is
    /// where sequence i's second text (token type 1) starts, for the
    /// architectures that read token types in a cross-encoder; others
    /// ignore it.
    fn forward(&self, seqs: &[&[u32]], second: &[usize], pass: &Pass) -> Scratch;

    /// The last hidden state of each sequence's first token only (all a
    /// CLS pooler or a cross-encoder's head reads): `seqs.len() x hidden`
    /// rows, as [`Encoder::forward`] computes them, within float rounding.
    /// Every sequence has a token. An encoder that can skip the last
    /// layer's work on the other tokens (their keys and values are still
    /// needed: the first token attends to them) does; `None` when it
    /// cannot, and the caller picks the rows of the whole pass.
    fn forward_first(&self, seqs: &[&[u32]], second: &[usize], pass: &Pass) -> Option<Scratch> {
        let _ = (seqs, second, pass);
        None
    }

    /// Multiply-adds x2 of the dense layers for `tokens` tokens (for
    /// GFLOP/s in benchmarks: attention, norms and activations not
    /// counted).
    fn dense_flops(&self, tokens: usize) -> f64;
}
