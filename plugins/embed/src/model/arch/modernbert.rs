//! ModernBERT (`model_type` `modernbert`: modernbert-embed, gte-modernbert,
//! nomic's and Alibaba's ModernBERT embedders), as transformers'
//! ModernBertModel runs it; not BERT's encoder, so its own pass:
//!
//! - embeddings: the token row only (no position table, no token types),
//!   then `embeddings.norm`;
//! - pre-norm layers: `x += Wo(attention(attn_norm(x)))`, `x +=
//!   mlp.Wo(geglu(mlp.Wi(mlp_norm(x))))`; layer 0's attn_norm is the
//!   identity (the file has none); `final_norm` after the last layer;
//! - query, key and value as one fused `attn.Wqkv`; rotary position
//!   embeddings on queries and keys (layers/rotary.rs), positions 0..n-1
//!   per sequence, with two thetas: global layers' and sliding layers';
//! - a layer is global when config.json's `layer_types` says
//!   `full_attention` (transformers 5), or, without it, when `l %
//!   global_attn_every_n_layers == 0` (4.x configs); sliding layers see
//!   keys `|i - j| <= local_attention / 2` (layers/window.rs, through the
//!   attention's window rule);
//! - thetas from `rope_parameters.{full_attention,sliding_attention}.rope_theta`
//!   (transformers 5) or `global_rope_theta` / `local_rope_theta` (4.x; a
//!   null local theta is the global one);
//! - GeGLU feed-forward (layers/geglu.rs, exact-erf GELU: every checkpoint
//!   says `hidden_activation: gelu`);
//! - no biases (`attention_bias`, `mlp_bias`, `norm_bias` false: zeros are
//!   packed, so the kernels keep one form; a config that sets them reads
//!   the file's); names prefixed `model.` when saved from a task model.
//!
//! The tokenizer is tokenizer.json's (byte-level BPE, `[CLS]`/`[SEP]`),
//! read like every other family's.

use std::path::Path;

use serde_json::Value;

use super::bert::{heads, name_or_path};
use super::{Architecture, Dims, Encoder};
use crate::model::cache::Packed;
use crate::model::config::{field_eps, field_str, field_usize};
use crate::model::error::{FIX_REEXPORT, ModelError};
use crate::model::kernels::Isa;
use crate::model::layers::attention::{Attention, Scores};
use crate::model::layers::for_rows;
use crate::model::layers::geglu::geglu;
use crate::model::layers::linear::{Linear, matmul};
use crate::model::layers::norm::{LayerNorm, residual_add};
use crate::model::layers::rotary::{Rotary, positions};
use crate::model::mmap::{Scratch, Tensor};
use crate::model::team::Pass;
use crate::model::tensors::{Naming, TensorList};

const WORD: &str = "embeddings.tok_embeddings.weight";
const EMBED_NORM: &str = "embeddings.norm";
const FINAL_NORM: &str = "final_norm";

/// ModernBERT as config.json describes it.
pub(crate) struct ModernBert {
    dims: Dims,
    eps: f32,
    /// Per layer: global attention (else sliding).
    global: Vec<bool>,
    /// Sliding layers' keys on either side of the query.
    half_window: usize,
    global_theta: f64,
    local_theta: f64,
    attention_bias: bool,
    mlp_bias: bool,
    norm_bias: bool,
}

fn refuse(file: &Path, message: String) -> ModelError {
    ModelError::new(file, message, FIX_REEXPORT)
}

/// config.json's `key` as a bool, `default` when absent.
fn flag(v: &Value, key: &str, default: bool, file: &Path) -> Result<bool, ModelError> {
    match v.get(key) {
        None | Some(Value::Null) => Ok(default),
        Some(x) => x
            .as_bool()
            .ok_or_else(|| refuse(file, format!("\"{key}\" is {x}, not true or false"))),
    }
}

/// A positive theta at `x`, named `what` in a refusal.
fn theta(x: &Value, what: &str, file: &Path) -> Result<f64, ModelError> {
    x.as_f64()
        .filter(|t| *t > 1.0 && t.is_finite())
        .ok_or_else(|| refuse(file, format!("{what} is {x}, not a rotary base above 1")))
}

/// The global and local rotary thetas.
fn thetas(v: &Value, file: &Path) -> Result<(f64, f64), ModelError> {
    if let Some(rope) = v.get("rope_parameters").filter(|r| r.is_object()) {
        let one = |kind: &str| -> Result<f64, ModelError> {
            let p = &rope[kind];
            if let Some(t) = p.get("rope_type").and_then(Value::as_str)
                && t != "default"
            {
                return Err(ModelError::new(
                    file,
                    format!(
                        "rope_parameters.{kind}.rope_type is \"{t}\"; only \"default\" is supported"
                    ),
                    "use a ModernBERT model with the default rotary embeddings",
                ));
            }
            theta(
                &p["rope_theta"],
                &format!("rope_parameters.{kind}.rope_theta"),
                file,
            )
        };
        return Ok((one("full_attention")?, one("sliding_attention")?));
    }
    let global = match v.get("global_rope_theta") {
        None => 160_000.0,
        Some(x) => theta(x, "global_rope_theta", file)?,
    };
    let local = match v.get("local_rope_theta") {
        None => 10_000.0,
        Some(Value::Null) => global,
        Some(x) => theta(x, "local_rope_theta", file)?,
    };
    Ok((global, local))
}

pub(crate) fn modernbert(v: &Value, file: &Path) -> Result<ModernBert, ModelError> {
    if let Some(act) = field_str(v, "hidden_activation")
        && act != "gelu"
    {
        return Err(ModelError::new(
            file,
            format!("hidden_activation \"{act}\" is not supported (gelu is)"),
            "use a ModernBERT model with the gelu GeGLU feed-forward",
        ));
    }
    let hidden = field_usize(v, "hidden_size", file)?;
    let heads = heads(v, "num_attention_heads", hidden, file)?;
    if !(hidden / heads).is_multiple_of(2) {
        return Err(refuse(
            file,
            format!("head size {} is odd: rotary needs pairs", hidden / heads),
        ));
    }
    let layers = field_usize(v, "num_hidden_layers", file)?;
    let global = match v.get("layer_types").and_then(Value::as_array) {
        Some(types) => {
            if types.len() != layers {
                return Err(refuse(
                    file,
                    format!(
                        "layer_types has {} entries for {layers} layers",
                        types.len()
                    ),
                ));
            }
            types
                .iter()
                .map(|t| match t.as_str() {
                    Some("full_attention") => Ok(true),
                    Some("sliding_attention") => Ok(false),
                    _ => Err(refuse(
                        file,
                        format!(
                            "layer_types holds {t}, not \"full_attention\" or \"sliding_attention\""
                        ),
                    )),
                })
                .collect::<Result<Vec<bool>, _>>()?
        }
        None => {
            let every = match v.get("global_attn_every_n_layers") {
                None => 3,
                Some(_) => field_usize(v, "global_attn_every_n_layers", file)?,
            };
            (0..layers).map(|l| l % every == 0).collect()
        }
    };
    let local_attention = match v.get("local_attention") {
        None => 128,
        Some(_) => field_usize(v, "local_attention", file)?,
    };
    let (global_theta, local_theta) = thetas(v, file)?;
    Ok(ModernBert {
        dims: Dims {
            hidden,
            layers,
            heads,
            intermediate: field_usize(v, "intermediate_size", file)?,
            vocab: field_usize(v, "vocab_size", file)?,
            max_tokens: field_usize(v, "max_position_embeddings", file)?,
            name_or_path: name_or_path(v),
        },
        eps: field_eps(v, "norm_eps", 1e-5, file)?,
        global,
        half_window: local_attention / 2,
        global_theta,
        local_theta,
        attention_bias: flag(v, "attention_bias", false, file)?,
        mlp_bias: flag(v, "mlp_bias", false, file)?,
        norm_bias: flag(v, "norm_bias", false, file)?,
    })
}

/// Layer l's tensor names.
fn layer_name(l: usize, part: &str) -> String {
    format!("layers.{l}.{part}")
}

impl ModernBert {
    fn dense(&self, t: &mut TensorList, name: &str, n: usize, k: usize, bias: bool) {
        let parts = vec![(name.to_owned(), n)];
        if bias {
            t.dense(name, parts, k);
        } else {
            t.dense_without_bias(name, parts, k);
        }
    }

    fn norm(&self, t: &mut TensorList, name: &str) {
        if self.norm_bias {
            t.norm(name, self.dims.hidden);
        } else {
            t.norm_without_bias(name, self.dims.hidden);
        }
    }
}

impl Architecture for ModernBert {
    fn name(&self) -> &'static str {
        "modernbert"
    }

    fn dims(&self) -> &Dims {
        &self.dims
    }

    fn tensors(&self) -> TensorList {
        let (h, i) = (self.dims.hidden, self.dims.intermediate);
        let mut t = TensorList::new(Naming {
            arch: "modernbert",
            anchor: WORD.into(),
            prefixes: &["model."],
        });
        t.rows(WORD, vec![self.dims.vocab, h]);
        self.norm(&mut t, EMBED_NORM);
        for l in 0..self.dims.layers {
            if l > 0 {
                self.norm(&mut t, &layer_name(l, "attn_norm"));
            }
            let ab = self.attention_bias;
            self.dense(&mut t, &layer_name(l, "attn.Wqkv"), 3 * h, h, ab);
            self.dense(&mut t, &layer_name(l, "attn.Wo"), h, h, ab);
            self.norm(&mut t, &layer_name(l, "mlp_norm"));
            let mb = self.mlp_bias;
            self.dense(&mut t, &layer_name(l, "mlp.Wi"), 2 * i, h, mb);
            self.dense(&mut t, &layer_name(l, "mlp.Wo"), h, i, mb);
        }
        self.norm(&mut t, FINAL_NORM);
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
        let layers = (0..self.dims.layers)
            .map(|l| Layer {
                attn_norm: (l > 0).then(|| ln(&layer_name(l, "attn_norm"))),
                qkv: dense(&layer_name(l, "attn.Wqkv"), h, 3 * h),
                attn_out: dense(&layer_name(l, "attn.Wo"), h, h),
                mlp_norm: ln(&layer_name(l, "mlp_norm")),
                wi: dense(&layer_name(l, "mlp.Wi"), h, 2 * i),
                wo: dense(&layer_name(l, "mlp.Wo"), i, h),
                global: self.global[l],
            })
            .collect();
        let max_len = max_len.min(self.dims.max_tokens);
        let dh = h / self.dims.heads;
        Box::new(ModernBertEncoder {
            word: t(WORD),
            embed_norm: ln(EMBED_NORM),
            final_norm: ln(FINAL_NORM),
            layers,
            attention: Attention {
                hidden: h,
                heads: self.dims.heads,
                isa,
            },
            global_rope: Rotary::new(self.global_theta, dh, max_len.max(1)),
            local_rope: Rotary::new(self.local_theta, dh, max_len.max(1)),
            half_window: self.half_window,
            hidden: h,
            intermediate: i,
            vocab: self.dims.vocab,
            max_len,
            isa,
        })
    }
}

struct Layer {
    /// None in layer 0 (the identity).
    attn_norm: Option<LayerNorm>,
    /// Wqkv: query, key and value, `[hidden, 3 * hidden]`.
    qkv: Linear,
    attn_out: Linear,
    mlp_norm: LayerNorm,
    /// `[hidden, 2 * intermediate]`: GeGLU's input half, then its gate.
    wi: Linear,
    wo: Linear,
    global: bool,
}

/// ModernBERT's pre-norm forward pass over the packed cache's tensors.
struct ModernBertEncoder {
    word: Tensor,
    embed_norm: LayerNorm,
    final_norm: LayerNorm,
    layers: Vec<Layer>,
    attention: Attention,
    global_rope: Rotary,
    local_rope: Rotary,
    half_window: usize,
    hidden: usize,
    intermediate: usize,
    vocab: usize,
    max_len: usize,
    isa: Isa,
}

impl Encoder for ModernBertEncoder {
    fn dense_flops(&self, m: usize) -> f64 {
        let (h, i) = (self.hidden as f64, self.intermediate as f64);
        2.0 * m as f64 * self.layers.len() as f64 * (4.0 * h * h + 3.0 * h * i)
    }

    fn forward(&self, seqs: &[&[u32]], _second: &[usize], pass: &Pass) -> Scratch {
        let isa = self.isa;
        let (h, inter) = (self.hidden, self.intermediate);
        let seqs: Vec<&[u32]> = seqs
            .iter()
            .map(|s| &s[..s.len().min(self.max_len)])
            .collect();
        let lens: Vec<usize> = seqs.iter().map(|s| s.len()).collect();
        let m: usize = lens.iter().sum();
        let pos = positions(&lens);
        let mut x = Scratch::zeroed(m * h);
        let zeros = vec![0f32; h];
        for (row, &id) in x
            .chunks_exact_mut(h)
            .zip(seqs.iter().flat_map(|s| s.iter()))
        {
            let id = if (id as usize) < self.vocab {
                id as usize
            } else {
                0
            };
            let word = &self.word[id * h..(id + 1) * h];
            self.embed_norm.embed(isa, row, word, &zeros, &zeros);
        }
        let mut normed = Scratch::zeroed(m * h);
        let mut qkv = Scratch::zeroed(m * 3 * h);
        let mut ctx = Scratch::zeroed(m * h);
        let mut tmp = Scratch::zeroed(m * h);
        let mut wi = Scratch::zeroed(m * 2 * inter);
        let mut act = Scratch::zeroed(m * inter);
        for layer in &self.layers {
            let threads = pass.threads();
            let input: &[f32] = match &layer.attn_norm {
                Some(norm) => {
                    norm.to(isa, &x, &mut normed, threads);
                    &normed
                }
                None => &x,
            };
            matmul(isa, input, m, &layer.qkv, &mut qkv, threads);
            let (rope, window) = if layer.global {
                (&self.global_rope, None)
            } else {
                (&self.local_rope, Some(self.half_window))
            };
            for_rows(threads, &mut qkv, 3 * h, |rows, first| {
                let n = rows.len() / (3 * h);
                rope.apply(isa, rows, 3 * h, 2 * h, &pos[first..first + n]);
            });
            let scores = Scores {
                window,
                ..Scores::default()
            };
            self.attention
                .forward(&qkv, &lens, &mut ctx, threads, scores);
            matmul(isa, &ctx, m, &layer.attn_out, &mut tmp, threads);
            residual_add(isa, &mut x, &tmp, h, threads);
            layer.mlp_norm.to(isa, &x, &mut normed, threads);
            matmul(isa, &normed, m, &layer.wi, &mut wi, threads);
            for_rows(threads, &mut act, inter, |rows, first| {
                let n = rows.len() / inter;
                geglu(
                    isa,
                    &wi[first * 2 * inter..(first + n) * 2 * inter],
                    rows,
                    inter,
                );
            });
            matmul(isa, &act, m, &layer.wo, &mut tmp, threads);
            residual_add(isa, &mut x, &tmp, h, threads);
        }
        self.final_norm.to(isa, &x, &mut normed, pass.threads());
        normed
    }
}
