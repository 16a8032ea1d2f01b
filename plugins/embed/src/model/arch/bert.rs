//! BERT (`model_type` `bert`: all-MiniLM, bge, e5, gte...), and the
//! post-norm encoder it shares with RoBERTa and DistilBERT.
//!
//! The three differ only in what [`PostNorm`] is given: their tensors'
//! names ([`Names`]), where positions start ([`Positions`]), whether a
//! token type row is added, the norms' epsilon. The forward pass is one:
//! embeddings (word + position + token type 0, LayerNorm), then per layer
//! attention (query, key and value as one product), output projection,
//! residual + LayerNorm, feed-forward with its activation, residual +
//! LayerNorm; every dense layer over all M real tokens of the packed
//! batch, attention per sequence over its own tokens.

use std::path::Path;

use serde_json::Value;

use super::{Architecture, Dims, Encoder};
use crate::model::cache::Packed;
use crate::model::config::{field_eps, field_str, field_usize};
use crate::model::error::{FIX_REEXPORT, ModelError};
use crate::model::kernels::Isa;
use crate::model::layers::activation::{ACTIVATIONS, Activation};
use crate::model::layers::attention::{Attention, Scores};
use crate::model::layers::linear::{Linear, matmul, matmul_columns, whole_panels};
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::relative_bias::{NUM_BUCKETS, RelativeBias};
use crate::model::mmap::{Scratch, Tensor};
use crate::model::team::Pass;
use crate::model::tensors::{Naming, TensorList};

/// Where a sequence's position ids start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Positions {
    /// 0, 1, 2... (BERT, DistilBERT).
    FromZero,
    /// RoBERTa's: `cumsum(ids != pad) + pad` for real tokens (pad + 1,
    /// pad + 2...), `pad` for a padding token.
    AfterPadding { pad: u32 },
}

impl Positions {
    /// Rows of the position table before the first real token's.
    pub(crate) fn offset(self) -> usize {
        match self {
            Positions::FromZero => 0,
            Positions::AfterPadding { pad } => pad as usize + 1,
        }
    }
}

/// The tensors of one layer, as the cache names them, and the layers
/// query, key and value come from.
pub(crate) struct LayerNames {
    /// The stacked query, key and value product.
    pub qkv: String,
    /// Query's, key's and value's layers in model.safetensors.
    pub qkv_from: [String; 3],
    pub attn_out: String,
    pub attn_norm: String,
    pub ffn_in: String,
    pub ffn_out: String,
    pub ffn_norm: String,
}

/// The names of a post-norm encoder's tensors, declared once: the cache
/// is written from them and the encoder reads them back by them.
pub(crate) struct Names {
    pub word: &'static str,
    pub position: &'static str,
    /// The token type table, when the architecture has one: its row 0 is
    /// packed as `{name without .weight}.0`.
    pub token_type: Option<&'static str>,
    pub embed_norm: &'static str,
    /// Layer l's names.
    pub layer: fn(usize) -> LayerNames,
}

/// The cache's name of the token type table's row `row`.
fn type_row(table: &str, row: usize) -> String {
    format!("{}.{row}", table.strip_suffix(".weight").unwrap_or(table))
}

/// BERT's names, which RoBERTa's are too.
pub(crate) fn bert_layer(l: usize) -> LayerNames {
    let p = format!("encoder.layer.{l}");
    LayerNames {
        qkv: format!("{p}.attention.self.qkv"),
        qkv_from: ["query", "key", "value"].map(|w| format!("{p}.attention.self.{w}")),
        attn_out: format!("{p}.attention.output.dense"),
        attn_norm: format!("{p}.attention.output.LayerNorm"),
        ffn_in: format!("{p}.intermediate.dense"),
        ffn_out: format!("{p}.output.dense"),
        ffn_norm: format!("{p}.output.LayerNorm"),
    }
}

pub(crate) const BERT_NAMES: Names = Names {
    word: "embeddings.word_embeddings.weight",
    position: "embeddings.position_embeddings.weight",
    token_type: Some("embeddings.token_type_embeddings.weight"),
    embed_norm: "embeddings.LayerNorm",
    layer: bert_layer,
};

/// A post-norm encoder: BERT, RoBERTa's family, DistilBERT.
pub(crate) struct PostNorm {
    /// The model_type it serves.
    pub name: &'static str,
    pub dims: Dims,
    /// Rows of the position table.
    pub max_position: usize,
    /// Rows of the token type table (row 0 is read, and row 1 with
    /// `pair_types`).
    pub type_vocab: usize,
    /// Whether inputs are pairs whose second text is of token type 1 (a
    /// cross-encoder's, registry.rs decides): row 1 is packed too, and
    /// added to the tokens from [`Encoded::second`](crate::model::Encoded::second) on. Off for
    /// embedders, whose cache holds row 0 alone as it always has.
    pub pair_types: bool,
    /// Every LayerNorm's epsilon.
    pub eps: f32,
    pub activation: Activation,
    pub positions: Positions,
    pub names: Names,
    /// Prefixes the file's names may carry.
    pub prefixes: &'static [&'static str],
    /// The `[32, heads]` relative position bias table shared by every
    /// layer's attention (MPNet's), when there is one.
    pub relative_bias: Option<&'static str>,
}

/// BERT's and RoBERTa's config.json fields.
pub(crate) fn read(
    v: &Value,
    file: &Path,
    name: &'static str,
    positions: Positions,
    prefixes: &'static [&'static str],
) -> Result<PostNorm, ModelError> {
    if let Some(pe) = field_str(v, "position_embedding_type")
        && pe != "absolute"
    {
        return Err(ModelError::new(
            file,
            format!("position_embedding_type is \"{pe}\"; only \"absolute\" is supported"),
            format!("use a {name} model with absolute position embeddings"),
        ));
    }
    let activation = activation(v, "hidden_act", file)?;
    let hidden = field_usize(v, "hidden_size", file)?;
    let heads = heads(v, "num_attention_heads", hidden, file)?;
    let max_position = field_usize(v, "max_position_embeddings", file)?;
    let offset = positions.offset();
    if max_position <= offset + 2 {
        return Err(ModelError::new(
            file,
            format!(
                "max_position_embeddings {max_position} leaves no positions past the first \
                 {offset} (padding's)"
            ),
            FIX_REEXPORT,
        ));
    }
    Ok(PostNorm {
        name,
        dims: Dims {
            hidden,
            layers: field_usize(v, "num_hidden_layers", file)?,
            heads,
            intermediate: field_usize(v, "intermediate_size", file)?,
            vocab: field_usize(v, "vocab_size", file)?,
            max_tokens: max_position - offset,
            name_or_path: name_or_path(v),
        },
        max_position,
        type_vocab: match v.get("type_vocab_size") {
            None => 2,
            Some(_) => field_usize(v, "type_vocab_size", file)?,
        },
        eps: field_eps(v, "layer_norm_eps", 1e-12, file)?,
        activation,
        positions,
        names: BERT_NAMES,
        prefixes,
        relative_bias: None,
        pair_types: false,
    })
}

/// config.json's activation `key`, `gelu` when absent.
pub(crate) fn activation(v: &Value, key: &str, file: &Path) -> Result<Activation, ModelError> {
    let act = field_str(v, key).unwrap_or("gelu");
    Activation::from_name(act).ok_or_else(|| {
        ModelError::new(
            file,
            format!("{key} \"{act}\" is not supported ({ACTIVATIONS} are)"),
            "use a model with a gelu or relu feed-forward",
        )
    })
}

/// config.json's head count `key`, which must divide `hidden`.
pub(crate) fn heads(v: &Value, key: &str, hidden: usize, file: &Path) -> Result<usize, ModelError> {
    let heads = field_usize(v, key, file)?;
    if !hidden.is_multiple_of(heads) {
        return Err(ModelError::new(
            file,
            format!("hidden_size {hidden} is not a multiple of {key} {heads}"),
            FIX_REEXPORT,
        ));
    }
    Ok(heads)
}

/// config.json's `_name_or_path`, when set.
pub(crate) fn name_or_path(v: &Value) -> Option<String> {
    field_str(v, "_name_or_path")
        .filter(|s| !s.is_empty())
        .map(str::to_owned)
}

impl PostNorm {
    /// Whether token type 1's row is read: pairs, and a table that has it
    /// (RoBERTa's family has one row; its pairs are all type 0).
    fn reads_type1(&self) -> bool {
        self.pair_types && self.names.token_type.is_some() && self.type_vocab >= 2
    }
}

impl Architecture for PostNorm {
    fn name(&self) -> &'static str {
        self.name
    }

    fn dims(&self) -> &Dims {
        &self.dims
    }

    fn tensors(&self) -> TensorList {
        let (h, i) = (self.dims.hidden, self.dims.intermediate);
        let n = &self.names;
        let mut t = TensorList::new(Naming {
            arch: self.name,
            anchor: n.word.into(),
            prefixes: self.prefixes,
        });
        // Token types first: when config.json's hidden size is wrong, the
        // smallest tensor names it.
        if let Some(table) = n.token_type {
            t.one_row(&type_row(table, 0), table, vec![self.type_vocab, h], 0);
            if self.reads_type1() {
                t.one_row(&type_row(table, 1), table, vec![self.type_vocab, h], 1);
            }
        }
        t.rows(n.word, vec![self.dims.vocab, h]);
        t.rows(n.position, vec![self.max_position, h]);
        t.norm(n.embed_norm, h);
        if let Some(table) = self.relative_bias {
            t.rows(table, vec![NUM_BUCKETS, self.dims.heads]);
        }
        for l in 0..self.dims.layers {
            let ln = (n.layer)(l);
            let qkv = ln.qkv_from.iter().map(|w| (w.clone(), h)).collect();
            t.dense(&ln.qkv, qkv, h);
            t.dense(&ln.attn_out, vec![(ln.attn_out.clone(), h)], h);
            t.norm(&ln.attn_norm, h);
            t.dense(&ln.ffn_in, vec![(ln.ffn_in.clone(), i)], h);
            t.dense(&ln.ffn_out, vec![(ln.ffn_out.clone(), h)], i);
            t.norm(&ln.ffn_norm, h);
        }
        t
    }

    fn encoder(&self, packed: &Packed, max_len: usize, isa: Isa) -> Box<dyn Encoder> {
        let (h, i) = (self.dims.hidden, self.dims.intermediate);
        let t = |name: &str| packed.tensor(name);
        let ln = |name: &str| LayerNorm {
            g: t(&format!("{name}.weight")),
            b: t(&format!("{name}.bias")),
            eps: self.eps,
        };
        let dense = |name: &str, k: usize, n: usize| packed.linear(name, k, n);
        let n = &self.names;
        let max_len = max_len.min(self.dims.max_tokens);
        let relative = self
            .relative_bias
            .map(|table| RelativeBias::new(&t(table), self.dims.heads, max_len));
        let layers = (0..self.dims.layers)
            .map(|l| {
                let names = (n.layer)(l);
                Layer {
                    qkv: dense(&names.qkv, h, 3 * h),
                    attn_out: dense(&names.attn_out, h, h),
                    attn_norm: ln(&names.attn_norm),
                    ffn_in: dense(&names.ffn_in, h, i),
                    ffn_out: dense(&names.ffn_out, i, h),
                    ffn_norm: ln(&names.ffn_norm),
                }
            })
            .collect();
        Box::new(PostNormEncoder {
            word: t(n.word),
            position: t(n.position),
            type0: n.token_type.map(|table| t(&type_row(table, 0))),
            type1: n
                .token_type
                .filter(|_| self.reads_type1())
                .map(|table| t(&type_row(table, 1))),
            embed_norm: ln(n.embed_norm),
            layers,
            attention: Attention {
                hidden: h,
                heads: self.dims.heads,
                isa,
            },
            hidden: h,
            intermediate: i,
            vocab: self.dims.vocab,
            max_len,
            relative,
            activation: self.activation,
            positions: self.positions,
            isa,
        })
    }
}

struct Layer {
    /// Query, key and value as one `[hidden, 3 * hidden]` product.
    qkv: Linear,
    attn_out: Linear,
    attn_norm: LayerNorm,
    ffn_in: Linear,
    ffn_out: Linear,
    ffn_norm: LayerNorm,
}

/// The post-norm forward pass over the packed cache's tensors.
struct PostNormEncoder {
    word: Tensor,
    position: Tensor,
    /// Token type 0's embedding (single-sentence inputs use no other);
    /// None for an architecture without token types.
    type0: Option<Tensor>,
    /// Token type 1's, for the second text of a pair (cross-encoders).
    type1: Option<Tensor>,
    embed_norm: LayerNorm,
    layers: Vec<Layer>,
    attention: Attention,
    hidden: usize,
    intermediate: usize,
    vocab: usize,
    max_len: usize,
    /// Every head's relative position bias (MPNet), made once at load.
    relative: Option<RelativeBias>,
    activation: Activation,
    positions: Positions,
    isa: Isa,
}

impl PostNormEncoder {
    /// x (`tokens x hidden`) = the embeddings of every token of `seqs`,
    /// tokens from `second[i]` on of type 1 when the model reads it.
    fn embed(&self, seqs: &[&[u32]], second: &[usize], x: &mut [f32]) {
        let h = self.hidden;
        let zeros;
        let ty: &[f32] = match &self.type0 {
            Some(t) => &t[..],
            None => {
                zeros = vec![0f32; h];
                &zeros[..]
            }
        };
        let mut row = 0;
        for (i, s) in seqs.iter().enumerate() {
            let mut real = 0;
            let second = match &self.type1 {
                Some(_) => second.get(i).copied().unwrap_or(usize::MAX),
                None => usize::MAX,
            };
            for (p, &id) in s.iter().enumerate() {
                let pos = match self.positions {
                    Positions::FromZero => p,
                    Positions::AfterPadding { pad } if id == pad => pad as usize,
                    Positions::AfterPadding { pad } => {
                        real += 1;
                        pad as usize + real
                    }
                };
                let id = if (id as usize) < self.vocab {
                    id as usize
                } else {
                    0
                };
                let ty = match &self.type1 {
                    Some(t1) if p >= second => &t1[..],
                    _ => ty,
                };
                self.embed_norm.embed(
                    self.isa,
                    &mut x[row * h..(row + 1) * h],
                    &self.word[id * h..(id + 1) * h],
                    &self.position[pos * h..(pos + 1) * h],
                    ty,
                );
                row += 1;
            }
        }
    }
}

impl Encoder for PostNormEncoder {
    fn dense_flops(&self, m: usize) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        2.0 * m as f64 * self.layers.len() as f64 * (4.0 * h * h + 2.0 * h * i)
    }

    fn forward(&self, seqs: &[&[u32]], second: &[usize], pass: &Pass) -> Scratch {
        self.run(seqs, second, pass, false)
    }

    fn forward_first(&self, seqs: &[&[u32]], second: &[usize], pass: &Pass) -> Option<Scratch> {
        Some(self.run(seqs, second, pass, true))
    }
}

impl PostNormEncoder {
    /// The pass: every token's last hidden state, or with `first_only` the
    /// first token's of each sequence, whose last layer then runs its
    /// attention output and feed-forward on those rows alone (a sixth of
    /// a 6-layer pass, less its keys and values).
    fn run(&self, seqs: &[&[u32]], second: &[usize], pass: &Pass, first_only: bool) -> Scratch {
        let isa = self.isa;
        let h = self.hidden;
        let seqs: Vec<&[u32]> = seqs
            .iter()
            .map(|s| &s[..s.len().min(self.max_len)])
            .collect();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let m: usize = lens.iter().sum();
        let mut x = Scratch::zeroed(m * h);
        self.embed(&seqs, second, &mut x);
        let mut qkv = Scratch::zeroed(m * 3 * h);
        let mut ctx = Scratch::zeroed(m * h);
        let mut tmp = Scratch::zeroed(m * h);
        let mut inter = Scratch::zeroed(m * self.intermediate);
        let scores = Scores {
            relative: self.relative.as_ref(),
            ..Scores::default()
        };
        let last = self.layers.len().saturating_sub(1);
        for (i, layer) in self.layers.iter().enumerate() {
            let threads = pass.threads();
            if first_only && i == last {
                let mut xs = first_rows(&x, &lens, h);
                self.first_queries(layer, &x, &xs, &lens, &mut qkv, threads);
                let b = lens.len();
                let mut firsts = Scratch::zeroed(b * h);
                self.attention
                    .forward_first(&qkv, &lens, &mut firsts, threads, scores);
                self.rest_of_layer(layer, &firsts, &mut xs, b, &mut tmp, &mut inter, threads);
                return xs;
            }
            matmul(isa, &x, m, &layer.qkv, &mut qkv, threads);
            self.attention
                .forward(&qkv, &lens, &mut ctx, threads, scores);
            self.rest_of_layer(layer, &ctx, &mut x, m, &mut tmp, &mut inter, threads);
        }
        if first_only {
            // No layers: the embeddings' first rows.
            return first_rows(&x, &lens, h);
        }
        x
    }

    /// qkv (`m x 3 hidden`) for attention of the first queries alone: keys
    /// and values of every row of x, queries of each sequence's first row
    /// (`firsts`, those rows of x) alone. Other rows' queries are left
    /// unset.
    fn first_queries(
        &self,
        layer: &Layer,
        x: &[f32],
        firsts: &[f32],
        lens: &[usize],
        qkv: &mut [f32],
        threads: usize,
    ) {
        let (isa, h) = (self.isa, self.hidden);
        let (m, b) = (lens.iter().sum::<usize>(), lens.len());
        if !whole_panels(&layer.qkv, 0, h) {
            // Queries and keys share a panel: all of it.
            matmul(isa, x, m, &layer.qkv, qkv, threads);
            return;
        }
        matmul_columns(isa, x, m, &layer.qkv, h..3 * h, qkv, threads);
        let mut q = Scratch::zeroed(b * 3 * h);
        matmul_columns(isa, firsts, b, &layer.qkv, 0..h, &mut q, threads);
        let mut start = 0;
        for (row, &len) in q.chunks_exact(3 * h).zip(lens) {
            if len > 0 {
                qkv[start * 3 * h..][..h].copy_from_slice(&row[..h]);
            }
            start += len;
        }
    }

    /// A layer after its attention: x (m rows) = norm(x + ctx's output
    /// projection), then x = norm(x + the feed-forward of x).
    #[allow(clippy::too_many_arguments)]
    fn rest_of_layer(
        &self,
        layer: &Layer,
        ctx: &[f32],
        x: &mut [f32],
        m: usize,
        tmp: &mut [f32],
        inter: &mut [f32],
        threads: usize,
    ) {
        let (isa, h, i) = (self.isa, self.hidden, self.intermediate);
        let (tmp, inter) = (&mut tmp[..m * h], &mut inter[..m * i]);
        matmul(isa, ctx, m, &layer.attn_out, tmp, threads);
        layer.attn_norm.residual(isa, x, tmp, threads);
        matmul(isa, x, m, &layer.ffn_in, inter, threads);
        self.activation.apply(isa, inter, i, threads);
        matmul(isa, inter, m, &layer.ffn_out, tmp, threads);
        layer.ffn_norm.residual(isa, x, tmp, threads);
    }
}

/// Each sequence's first row of `rows` (`h` floats a row, the sequences
/// of `lens` rows one after another, none empty).
fn first_rows(rows: &[f32], lens: &[usize], h: usize) -> Scratch {
    let mut firsts = Scratch::zeroed(lens.len() * h);
    let mut start = 0;
    for (out, &len) in firsts.chunks_exact_mut(h).zip(lens) {
        out.copy_from_slice(&rows[start * h..(start + 1) * h]);
        start += len;
    }
    firsts
}

/// BERT: positions from 0, token type 0's row, names with an optional
/// `bert.` prefix, norms' epsilon 1e-12 unless config.json says.
pub(crate) fn bert(v: &Value, file: &Path) -> Result<PostNorm, ModelError> {
    read(v, file, "bert", Positions::FromZero, &["bert."])
}
