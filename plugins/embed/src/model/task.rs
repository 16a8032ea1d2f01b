//! What a model folder is served for, decided once when it loads.

/// The task of a loaded model: which routes it answers and what its
/// forward pass ends in.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Task {
    /// Sentence embeddings (a sentence-transformers bi-encoder): the
    /// encoder, then pooling (and Normalize where the pipeline has it).
    Embed,
    /// A cross-encoder (`*ForSequenceClassification`): the encoder, the
    /// pooler where the architecture has one, the classifier head, giving
    /// one logit per label. One label is a reranker, several a classifier.
    Classify {
        /// config.json's `id2label`, in id order.
        labels: Vec<String>,
    },
    /// SPLADE (`*ForMaskedLM` with sentence-transformers' `SpladePooling`):
    /// the MLM head's logits, max over tokens of log(1 + relu(logit)).
    Sparse,
}

impl Task {
    /// What TEI calls a model of this task (`/info`'s `model_type` key):
    /// `embedding`, `reranker` (one label), `classifier` or `sparse`.
    pub fn kind(&self) -> &'static str {
        match self {
            Task::Embed => "embedding",
            Task::Classify { labels } if labels.len() == 1 => "reranker",
            Task::Classify { .. } => "classifier",
            Task::Sparse => "sparse",
        }
    }
}
