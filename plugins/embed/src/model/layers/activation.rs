//! The feed-forward activations (`hidden_act` / `activation`), applied in
//! place over the packed rows.

use super::for_rows;
use crate::model::kernels::{self, Isa};
use crate::model::profile::{self, Part};

/// The names [`Activation::from_name`] takes, for refusals.
pub(crate) const ACTIVATIONS: &str = "gelu, gelu_new, gelu_pytorch_tanh, gelu_fast, relu";

/// The activation of the feed-forward block.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Activation {
    /// `gelu`: x * Phi(x) with the exact erf, as BERT uses.
    GeluErf,
    /// `gelu_new` / `gelu_pytorch_tanh`: the tanh approximation.
    GeluTanh,
    /// `relu`.
    Relu,
}

impl Activation {
    /// transformers' name of it (`ACT2FN`'s keys that map here).
    pub(crate) fn from_name(name: &str) -> Option<Activation> {
        match name {
            "gelu" => Some(Activation::GeluErf),
            "gelu_new" | "gelu_pytorch_tanh" | "gelu_fast" => Some(Activation::GeluTanh),
            "relu" => Some(Activation::Relu),
            _ => None,
        }
    }

    /// y = act(y) over rows of `width`, on `threads` threads.
    pub(crate) fn apply(self, isa: Isa, y: &mut [f32], width: usize, threads: usize) {
        let _span = profile::span(Part::Activation);
        for_rows(threads, y, width, |rows, _| match self {
            Activation::GeluErf => kernels::gelu_erf(isa, rows),
            Activation::GeluTanh => kernels::gelu_tanh(isa, rows),
            Activation::Relu => kernels::relu(isa, rows),
        });
    }
}
