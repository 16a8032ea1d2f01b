//! RoBERTa, XLM-RoBERTa and CamemBERT (`model_type` `roberta`,
//! `xlm-roberta`, `camembert`: multilingual-e5, bge-m3, paraphrase-
//! multilingual, sentence-camembert): BERT's encoder and BERT's tensor
//! names (bert.rs's [`PostNorm`]), with what transformers' RobertaModel
//! does differently:
//!
//! - position ids start past the padding id: `pad_token_id + 1` (2 for
//!   these models), so a sequence of n tokens reads rows 2..n+1 of the
//!   position table, and `max_position_embeddings` (514) takes 512 tokens;
//!   a `<pad>` inside a sequence reads row `pad_token_id` and does not
//!   count (`cumsum(ids != pad) + pad`);
//! - one token type (`type_vocab_size` 1);
//! - LayerNorm epsilon 1e-5 from config.json;
//! - names prefixed `roberta.` when saved from a task model (all three
//!   use RobertaModel's prefix).
//!
//! Their tokenizers (SentencePiece Unigram with Metaspace, or byte-level
//! BPE, `<s>`/`</s>` added by the post-processor) come from tokenizer.json
//! like BERT's.

use std::path::Path;

use serde_json::Value;

use super::bert::{Positions, PostNorm, read};
use crate::model::config::field_usize;
use crate::model::error::ModelError;

/// The model_types served here.
pub(crate) const MODEL_TYPES: [&str; 3] = ["roberta", "xlm-roberta", "camembert"];

/// `model_type` is one of [`MODEL_TYPES`].
pub(crate) fn roberta(
    v: &Value,
    file: &Path,
    model_type: &'static str,
) -> Result<PostNorm, ModelError> {
    // RobertaEmbeddings' padding_idx is config.pad_token_id (1 when absent).
    let pad = match v.get("pad_token_id") {
        None | Some(Value::Null) => 1,
        Some(_) => field_usize(v, "pad_token_id", file)?,
    };
    let pad = u32::try_from(pad).unwrap_or(u32::MAX);
    read(
        v,
        file,
        model_type,
        Positions::AfterPadding { pad },
        &["roberta."],
    )
}
