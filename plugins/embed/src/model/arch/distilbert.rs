//! DistilBERT (`model_type` `distilbert`: msmarco-distilbert-*,
//! distiluse, many older sentence-transformers models): BERT's post-norm
//! encoder (bert.rs's [`PostNorm`]) under other names and fields, as
//! transformers' DistilBertModel has it:
//!
//! - `transformer.layer.N.attention.{q,k,v,out}_lin`, `sa_layer_norm`,
//!   `ffn.lin1` / `ffn.lin2`, `output_layer_norm`; names prefixed
//!   `distilbert.` when saved from a task model;
//! - no token types, no pooler; positions from 0;
//! - config.json's `dim`, `hidden_dim`, `n_heads`, `n_layers`,
//!   `activation`; every LayerNorm's epsilon is 1e-12, hard-coded (there
//!   is no config field);
//! - the position table is read from the file even when
//!   `sinusoidal_pos_embds` is set (transformers saves the sinusoids).

use std::path::Path;

use serde_json::Value;

use super::Dims;
use super::bert::{LayerNames, Names, Positions, PostNorm, activation, heads, name_or_path};
use crate::model::config::field_usize;
use crate::model::error::ModelError;

fn layer(l: usize) -> LayerNames {
    let p = format!("transformer.layer.{l}");
    LayerNames {
        qkv: format!("{p}.attention.qkv_lin"),
        qkv_from: ["q_lin", "k_lin", "v_lin"].map(|w| format!("{p}.attention.{w}")),
        attn_out: format!("{p}.attention.out_lin"),
        attn_norm: format!("{p}.sa_layer_norm"),
        ffn_in: format!("{p}.ffn.lin1"),
        ffn_out: format!("{p}.ffn.lin2"),
        ffn_norm: format!("{p}.output_layer_norm"),
    }
}

const NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: None,
    embed_norm: "embeddings.LayerNorm",
    layer,
};

pub(crate) fn distilbert(v: &Value, file: &Path) -> Result<PostNorm, ModelError> {
    let hidden = field_usize(v, "dim", file)?;
    let max_position = field_usize(v, "max_position_embeddings", file)?;
    Ok(PostNorm {
        name: "distilbert",
        dims: Dims {
            hidden,
            layers: field_usize(v, "n_layers", file)?,
            heads: heads(v, "n_heads", hidden, file)?,
            intermediate: field_usize(v, "hidden_dim", file)?,
            vocab: field_usize(v, "vocab_size", file)?,
            max_tokens: max_position,
            name_or_path: name_or_path(v),
        },
        max_position,
        type_vocab: 0,
        eps: 1e-12,
        activation: activation(v, "activation", file)?,
        positions: Positions::FromZero,
        names: NAMES,
        prefixes: &["distilbert."],
        relative_bias: None,
        pair_types: false,
    })
}
