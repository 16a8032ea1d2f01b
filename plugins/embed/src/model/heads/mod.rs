//! What a task model adds after the encoder: a cross-encoder's classifier
//! head (`classifier`) or SPLADE's masked-LM head and pooling (`splade`).
//! registry.rs decides which from config.json and modules.json; the head
//! declares its tensors after the architecture's (one list, one packed
//! cache) and runs on the encoder's packed last hidden state. Heads know
//! shapes, names and config fields, never the encoder's forward pass: the
//! arch/ files do not know heads exist.

pub(crate) mod classifier;
pub(crate) mod splade;

use super::cache::Packed;
use super::kernels::Isa;
use super::tensors::TensorList;

/// The head a folder's model ends in, before its weights.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Head {
    Classifier(classifier::Spec),
    Splade(splade::Spec),
}

/// A loaded head.
pub(crate) enum Loaded {
    Classifier(classifier::Classifier),
    Splade(splade::Splade),
}

impl Head {
    /// Declares the head's tensors after the encoder's (`hidden` wide).
    pub(crate) fn declare(&self, t: &mut TensorList, hidden: usize) {
        match self {
            Head::Classifier(c) => c.declare(t, hidden),
            Head::Splade(s) => s.declare(t),
        }
    }

    /// The head over the packed cache; `word` is the encoder's word table's
    /// name there (SPLADE's tied decoder).
    pub(crate) fn load(&self, packed: &Packed, hidden: usize, word: &str, isa: Isa) -> Loaded {
        match self {
            Head::Classifier(c) => Loaded::Classifier(c.load(packed, hidden, isa)),
            Head::Splade(s) => Loaded::Splade(s.load(packed, word, isa)),
        }
    }
}
