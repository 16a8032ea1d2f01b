//! MPNet (`model_type` `mpnet`: all-mpnet-base-v2, multi-qa-mpnet,
//! paraphrase-mpnet): BERT's post-norm encoder (bert.rs's [`PostNorm`])
//! with what transformers' MPNetModel does differently:
//!
//! - one relative position bias, `encoder.relative_attention_bias.weight`
//!   `[32, heads]`, shared by every layer and added to every head's scaled
//!   scores (layers/relative_bias.rs: T5's buckets over `i - j`, made once
//!   per model at load);
//! - its names: `encoder.layer.N.attention.attn.{q,k,v,o}`,
//!   `attention.LayerNorm`, then BERT's `intermediate.dense`,
//!   `output.{dense,LayerNorm}`; names prefixed `mpnet.` when saved from a
//!   task model;
//! - positions as RoBERTa's, from `padding_idx + 1` = 2, `padding_idx`
//!   hard-coded 1 in `MPNetEmbeddings` (config's pad_token_id is not read),
//!   so `max_position_embeddings` (514) takes 512 tokens;
//! - no token types. The checkpoints' I64 `embeddings.position_ids`
//!   buffer is never declared, so never read.

use std::path::Path;

use serde_json::Value;

use super::bert::{LayerNames, Names, Positions, PostNorm, read};
use crate::model::error::ModelError;

fn layer(l: usize) -> LayerNames {
    let p = format!("encoder.layer.{l}");
    LayerNames {
        qkv: format!("{p}.attention.attn.qkv"),
        qkv_from: ["q", "k", "v"].map(|w| format!("{p}.attention.attn.{w}")),
        attn_out: format!("{p}.attention.attn.o"),
        attn_norm: format!("{p}.attention.LayerNorm"),
        ffn_in: format!("{p}.intermediate.dense"),
        ffn_out: format!("{p}.output.dense"),
        ffn_norm: format!("{p}.output.LayerNorm"),
    }
}

const NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: None,
    embed_norm: "embeddings.LayerNorm",
    layer,
};

/// MPNetEmbeddings' padding_idx.
const PAD: u32 = 1;

pub(crate) fn mpnet(v: &Value, file: &Path) -> Result<PostNorm, ModelError> {
    let mut arch = read(
        v,
        file,
        "mpnet",
        Positions::AfterPadding { pad: PAD },
        &["mpnet."],
    )?;
    arch.names = NAMES;
    arch.type_vocab = 0;
    arch.relative_bias = Some("encoder.relative_attention_bias.weight");
    Ok(arch)
}
