//! SPLADE: sentence-transformers' SparseEncoder over a BERT masked-LM
//! (`BertForMaskedLM`): the MLM head's logits (`cls.predictions.transform`:
//! dense, the config's activation, LayerNorm; then the decoder, whose
//! weights are the word embeddings, tied, plus `cls.predictions.bias`), and
//! SpladePooling over each input's tokens: max (or sum) of
//! log(1 + relu(logit)) (`log1p_relu`: log1p once more), per vocabulary
//! entry. Only the nonzero entries are returned.
//!
//! The decoder runs a block of the vocabulary at a time ([`BLOCK`] rows of
//! the word table against every token of the batch), reduced over each
//! input's tokens at once, so a batch holds `tokens x BLOCK` logits, never
//! `tokens x vocabulary` (30522 wide for BERT's); blocks are spread over
//! the call's threads.

use std::path::{Path, PathBuf};

use serde_json::Value;

use crate::model::cache::Packed;
use crate::model::config::{field_eps, field_str, field_usize, read_json};
use crate::model::error::{FIX_REEXPORT, ModelError};
use crate::model::kernels::Isa;
use crate::model::layers::activation::{ACTIVATIONS, Activation};
use crate::model::layers::linear::{Linear, matmul};
use crate::model::layers::norm::LayerNorm;
use crate::model::layers::tied::product_t;
use crate::model::mmap::{Scratch, Tensor};
use crate::model::tensors::TensorList;

/// Vocabulary rows per decoder block: 256 x 4 bytes per token, so a batch
/// of 512 tokens holds 512 KiB of logits at a time.
const BLOCK: usize = 256;

const TRANSFORM: &str = "cls.predictions.transform.dense";
const TRANSFORM_NORM: &str = "cls.predictions.transform.LayerNorm";
const BIAS: &str = "cls.predictions.bias";

/// How SpladePooling reduces over tokens.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Strategy {
    Max,
    Sum,
}

/// The SPLADE head as the folder's files describe it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    strategy: Strategy,
    /// `log1p_relu`: log1p applied twice.
    twice: bool,
    act: Activation,
    eps: f32,
    vocab: usize,
    hidden: usize,
}

/// Whether modules.json of `dir` has a SpladePooling module: its path.
pub(crate) fn splade_pooling(modules: &Value) -> Option<String> {
    modules.as_array()?.iter().find_map(|m| {
        let ty = m.get("type").and_then(Value::as_str)?;
        ty.ends_with(".SpladePooling").then(|| {
            m.get("path")
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_owned()
        })
    })
}

fn refuse(file: &Path, message: String) -> ModelError {
    ModelError::new(file, message, FIX_REEXPORT)
}

/// The SPLADE head of a `BertForMaskedLM` folder whose modules.json is
/// `modules` (of `dir`): Transformer (or MLMTransformer) then
/// SpladePooling, nothing else. `v` is config.json (at `file`).
pub(crate) fn spec(
    dir: &Path,
    modules: &Value,
    v: &Value,
    file: &Path,
    hidden: usize,
    vocab: usize,
) -> Result<Spec, ModelError> {
    let modules_file = dir.join("modules.json");
    let list = modules.as_array().map(Vec::as_slice).unwrap_or_default();
    for (i, m) in list.iter().enumerate() {
        let ty = m.get("type").and_then(Value::as_str).unwrap_or("");
        let ok = match i {
            0 => ty.ends_with(".Transformer") || ty.ends_with(".MLMTransformer"),
            _ => ty.ends_with(".SpladePooling"),
        };
        if !ok {
            return Err(ModelError::new(
                &modules_file,
                format!(
                    "module {i} is \"{ty}\"; a sparse model is served as MLMTransformer (or \
                     Transformer) then SpladePooling"
                ),
                "use a SPLADE model whose pipeline is the masked-LM and SpladePooling alone",
            ));
        }
    }
    if v.get("tie_word_embeddings").and_then(Value::as_bool) == Some(false) {
        return Err(refuse(
            file,
            "tie_word_embeddings is false: the decoder has weights of its own, and the served \
             SPLADE head reads the word embeddings (tied) as its decoder"
                .into(),
        ));
    }
    let path = splade_pooling(modules).unwrap_or_default();
    let pooling_file: PathBuf = dir.join(&path).join("config.json");
    let p = read_json(&pooling_file)?;
    let strategy = match field_str(&p, "pooling_strategy").unwrap_or("max") {
        "max" => Strategy::Max,
        "sum" => Strategy::Sum,
        other => {
            return Err(ModelError::new(
                &pooling_file,
                format!("pooling_strategy is \"{other}\"; \"max\" and \"sum\" are served"),
                "use a SPLADE model with max or sum pooling, as SpladePooling saves it",
            ));
        }
    };
    let twice = match field_str(&p, "activation_function").unwrap_or("relu") {
        "relu" => false,
        "log1p_relu" => true,
        other => {
            return Err(ModelError::new(
                &pooling_file,
                format!(
                    "activation_function is \"{other}\"; \"relu\" and \"log1p_relu\" are served"
                ),
                "use a SPLADE model with the relu or log1p_relu activation",
            ));
        }
    };
    let dim_key = ["embedding_dimension", "word_embedding_dimension"]
        .into_iter()
        .find(|k| p.get(*k).is_some_and(|x| !x.is_null()));
    if let Some(k) = dim_key {
        let d = field_usize(&p, k, &pooling_file)?;
        if d != vocab {
            return Err(refuse(
                &pooling_file,
                format!("{k} is {d}, config.json's vocab_size is {vocab}"),
            ));
        }
    }
    let name = field_str(v, "hidden_act").unwrap_or("gelu");
    let act = Activation::from_name(name).ok_or_else(|| {
        ModelError::new(
            file,
            format!("hidden_act \"{name}\" is not supported ({ACTIVATIONS} are)"),
            "use a SPLADE model with a gelu or relu MLM head",
        )
    })?;
    Ok(Spec {
        strategy,
        twice,
        act,
        eps: field_eps(v, "layer_norm_eps", 1e-12, file)?,
        vocab,
        hidden,
    })
}

impl Spec {
    /// Declares the MLM head's tensors after the encoder's (the decoder's
    /// weights are the encoder's word table, declared there).
    pub(crate) fn declare(&self, t: &mut TensorList) {
        let h = self.hidden;
        t.at_root();
        t.dense(TRANSFORM, vec![(TRANSFORM.into(), h)], h);
        t.norm(TRANSFORM_NORM, h);
        t.rows(BIAS, vec![self.vocab]);
    }

    /// The head over the packed cache, with `word` the encoder's word
    /// table's name there.
    pub(crate) fn load(&self, packed: &Packed, word: &str, isa: Isa) -> Splade {
        let t = |name: &str| packed.tensor(name);
        let h = self.hidden;
        Splade {
            transform: packed.linear(TRANSFORM, h, h),
            norm: LayerNorm {
                g: t(&format!("{TRANSFORM_NORM}.weight")),
                b: t(&format!("{TRANSFORM_NORM}.bias")),
                eps: self.eps,
            },
            word: t(word),
            bias: t(BIAS),
            spec: self.clone(),
            isa,
        }
    }
}

/// A loaded SPLADE head.
pub(crate) struct Splade {
    transform: Linear,
    norm: LayerNorm,
    /// `[vocab, hidden]`: the decoder's weights, tied.
    word: Tensor,
    bias: Tensor,
    spec: Spec,
    isa: Isa,
}

impl Splade {
    /// Each sequence's sparse vector (`lens[i]` rows of `states` each, one
    /// after another): its nonzero (index, value) in ascending index, on
    /// `threads` threads (`team.rs`).
    pub(crate) fn vectors(
        &self,
        states: &[f32],
        lens: &[usize],
        threads: usize,
    ) -> Vec<Vec<(u32, f32)>> {
        let (isa, h) = (self.isa, self.spec.hidden);
        let m: usize = lens.iter().sum();
        let mut x = Scratch::zeroed(m * h);
        matmul(isa, states, m, &self.transform, &mut x, threads);
        self.spec.act.apply(isa, &mut x, h, threads);
        let mut t = Scratch::zeroed(m * h);
        self.norm.to(isa, &x, &mut t, threads);
        drop(x);
        let blocks = self.spec.vocab.div_ceil(BLOCK);
        let one = |b: usize| self.block(&t, m, lens, b);
        let parts: Vec<Vec<Vec<(u32, f32)>>> = crate::model::team::map(threads, blocks, one);
        let mut out: Vec<Vec<(u32, f32)>> = vec![Vec::new(); lens.len()];
        for part in parts {
            for (o, p) in out.iter_mut().zip(part) {
                o.extend(p);
            }
        }
        out
    }

    /// Block `b` of the vocabulary: each sequence's nonzero entries there.
    fn block(&self, t: &[f32], m: usize, lens: &[usize], b: usize) -> Vec<Vec<(u32, f32)>> {
        let h = self.spec.hidden;
        let lo = b * BLOCK;
        let hi = (lo + BLOCK).min(self.spec.vocab);
        let n = hi - lo;
        let mut logits = vec![0f32; m * n];
        product_t(t, m, &self.word, &self.bias, h, (lo, hi), &mut logits);
        let f = |x: f32| {
            let y = x.max(0.0).ln_1p();
            if self.spec.twice { y.ln_1p() } else { y }
        };
        let mut row = 0;
        let mut acc = vec![0f32; n];
        lens.iter()
            .map(|&len| {
                let rows = &logits[row * n..(row + len) * n];
                row += len;
                match self.spec.strategy {
                    // log1p(relu(x)) never decreases: the max of the
                    // logits, transformed once.
                    Strategy::Max => {
                        acc.fill(f32::NEG_INFINITY);
                        for r in rows.chunks_exact(n) {
                            acc.iter_mut().zip(r).for_each(|(a, &x)| *a = a.max(x));
                        }
                        acc.iter_mut().for_each(|a| *a = f(*a));
                    }
                    Strategy::Sum => {
                        acc.fill(0.0);
                        for r in rows.chunks_exact(n) {
                            acc.iter_mut().zip(r).for_each(|(a, &x)| *a += f(x));
                        }
                    }
                }
                acc.iter()
                    .enumerate()
                    .filter(|&(_, &v)| v > 0.0)
                    .map(|(j, &v)| ((lo + j) as u32, v))
                    .collect()
            })
            .collect()
    }
}
