//! The classifier heads of `*ForSequenceClassification` (cross-encoders:
//! rerankers with one label, classifiers with several), per family as
//! transformers computes them. Every head is one shape: pool the last
//! hidden state (the first token, or ModernBERT's mean), a dense layer, an
//! activation, ModernBERT's norm, the output layer:
//!
//! - BERT: the pooler (`pooler.dense` under `bert.`, tanh), `classifier`;
//! - RoBERTa, XLM-RoBERTa, CamemBERT, MPNet: `classifier.dense`, tanh,
//!   `classifier.out_proj` (their ClassificationHead; MPNet's is RoBERTa's);
//! - DistilBERT: `pre_classifier`, ReLU, `classifier`;
//! - ModernBERT: `classifier_pooling` (cls or mean), `head.dense` (bias
//!   when `classifier_bias`), `classifier_activation`, `head.norm` (bias
//!   when `norm_bias`, `norm_eps`), `classifier`.
//!
//! Dropout is the identity at inference. The weights are declared into the
//! architecture's tensor list, so they live in the same packed, shared cache.

use std::path::Path;

use serde_json::Value;

use crate::model::cache::Packed;
use crate::model::config::{Pooling, field_eps, field_str, field_usize};
use crate::model::error::ModelError;
use crate::model::kernels::Isa;
use crate::model::layers::activation::{ACTIVATIONS, Activation};
use crate::model::layers::linear::{Linear, matmul};
use crate::model::layers::norm::LayerNorm;
use crate::model::pooling;
use crate::model::tensors::TensorList;

/// The activation after the head's dense layer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Act {
    Tanh,
    Of(Activation),
}

/// A head as config.json describes it, before its weights.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Spec {
    /// config.json's id2label, in id order.
    pub labels: Vec<String>,
    pool: Pooling,
    dense: String,
    /// `dense` is named under the base model's prefix (BERT's pooler).
    dense_in_base: bool,
    dense_bias: bool,
    act: Act,
    /// ModernBERT's `head.norm`: name, has a bias, epsilon.
    norm: Option<(String, bool, f32)>,
    out: String,
}

/// The families with a head here, for refusals.
pub(crate) const FAMILIES: &str =
    "bert, roberta, xlm-roberta, camembert, distilbert, mpnet, modernbert";

/// config.json's labels: `id2label` in id order, else `num_labels`
/// generic ones (`LABEL_0`...), else transformers' default of two.
pub(crate) fn labels(v: &Value, file: &Path) -> Result<Vec<String>, ModelError> {
    if let Some(map) = v.get("id2label").and_then(Value::as_object) {
        let mut pairs = Vec::with_capacity(map.len());
        for (k, name) in map {
            let id: usize = k.parse().map_err(|_| {
                ModelError::new(
                    file,
                    format!("id2label has the key \"{k}\", not a label id"),
                    "write id2label as {\"0\": \"name\", \"1\": ...}, as transformers saves it",
                )
            })?;
            let name = name
                .as_str()
                .map_or_else(|| name.to_string(), str::to_owned);
            pairs.push((id, name));
        }
        pairs.sort();
        if pairs.is_empty() || pairs.iter().enumerate().any(|(i, (id, _))| *id != i) {
            return Err(ModelError::new(
                file,
                "id2label's ids are not 0, 1, 2... without a gap",
                "write id2label with one label per id from 0, as transformers saves it",
            ));
        }
        return Ok(pairs.into_iter().map(|(_, n)| n).collect());
    }
    let n = match v.get("num_labels") {
        None => 2,
        Some(_) => field_usize(v, "num_labels", file)?,
    };
    Ok((0..n).map(|i| format!("LABEL_{i}")).collect())
}

/// The head of a `model_type`'s `*ForSequenceClassification`, or a
/// refusal naming the family and those served.
pub(crate) fn spec(
    model_type: &str,
    architecture: &str,
    v: &Value,
    file: &Path,
) -> Result<Spec, ModelError> {
    let labels = labels(v, file)?;
    if labels.len() > 1 && field_str(v, "problem_type") == Some("multi_label_classification") {
        return Err(ModelError::new(
            file,
            format!(
                "{architecture} has problem_type \"multi_label_classification\" with {} \
                 labels: its scores are a sigmoid per label, and this server scores \
                 classifiers with a softmax over labels (single_label_classification)",
                labels.len()
            ),
            "serve a single-label classifier or a reranker (one label)",
        ));
    }
    let first = |dense: &str, dense_in_base: bool, act: Act, out: &str| Spec {
        labels: labels.clone(),
        pool: Pooling::Cls,
        dense: dense.into(),
        dense_in_base,
        dense_bias: true,
        act,
        norm: None,
        out: out.into(),
    };
    Ok(match model_type {
        "bert" => first("pooler.dense", true, Act::Tanh, "classifier"),
        "roberta" | "xlm-roberta" | "camembert" | "mpnet" => {
            first("classifier.dense", false, Act::Tanh, "classifier.out_proj")
        }
        "distilbert" => first(
            "pre_classifier",
            false,
            Act::Of(Activation::Relu),
            "classifier",
        ),
        "modernbert" => modernbert(v, file, labels)?,
        other => {
            return Err(ModelError::new(
                file,
                format!(
                    "{architecture} (model_type \"{other}\") has no classifier head here; \
                     cross-encoders are served for {FAMILIES}"
                ),
                "use a cross-encoder of a served family",
            ));
        }
    })
}

fn modernbert(v: &Value, file: &Path, labels: Vec<String>) -> Result<Spec, ModelError> {
    let pool = match field_str(v, "classifier_pooling").unwrap_or("cls") {
        "cls" => Pooling::Cls,
        "mean" => Pooling::Mean,
        other => {
            return Err(ModelError::new(
                file,
                format!("classifier_pooling is \"{other}\"; \"cls\" and \"mean\" are served"),
                "use a ModernBERT cross-encoder with cls or mean classifier pooling",
            ));
        }
    };
    let name = field_str(v, "classifier_activation").unwrap_or("gelu");
    let act = Activation::from_name(name).ok_or_else(|| {
        ModelError::new(
            file,
            format!("classifier_activation \"{name}\" is not supported ({ACTIVATIONS} are)"),
            "use a ModernBERT cross-encoder with a gelu or relu head",
        )
    })?;
    let flag = |key: &str| v.get(key).and_then(Value::as_bool).unwrap_or(false);
    Ok(Spec {
        labels,
        pool,
        dense: "head.dense".into(),
        dense_in_base: false,
        dense_bias: flag("classifier_bias"),
        act: Act::Of(act),
        norm: Some((
            "head.norm".into(),
            flag("norm_bias"),
            field_eps(v, "norm_eps", 1e-5, file)?,
        )),
        out: "classifier".into(),
    })
}

impl Spec {
    /// Declares the head's tensors after the encoder's (`hidden` wide).
    pub(crate) fn declare(&self, t: &mut TensorList, hidden: usize) {
        let dense = |t: &mut TensorList| {
            let parts = vec![(self.dense.clone(), hidden)];
            if self.dense_bias {
                t.dense(&self.dense, parts, hidden);
            } else {
                t.dense_without_bias(&self.dense, parts, hidden);
            }
        };
        if self.dense_in_base {
            dense(t);
        }
        t.at_root();
        if !self.dense_in_base {
            dense(t);
        }
        if let Some((name, bias, _)) = &self.norm {
            if *bias {
                t.norm(name, hidden);
            } else {
                t.norm_without_bias(name, hidden);
            }
        }
        let n = self.labels.len();
        t.dense(&self.out, vec![(self.out.clone(), n)], hidden);
    }

    /// The head over the packed cache's tensors.
    pub(crate) fn load(&self, packed: &Packed, hidden: usize, isa: Isa) -> Classifier {
        let t = |name: &str| packed.tensor(name);
        let linear = |name: &str, n: usize| packed.linear(name, hidden, n);
        Classifier {
            pool: self.pool,
            dense: linear(&self.dense, hidden),
            act: self.act,
            norm: self.norm.as_ref().map(|(name, _, eps)| LayerNorm {
                g: t(&format!("{name}.weight")),
                b: t(&format!("{name}.bias")),
                eps: *eps,
            }),
            out: linear(&self.out, self.labels.len()),
            hidden,
            labels: self.labels.len(),
            isa,
        }
    }
}

/// A loaded classifier head.
pub(crate) struct Classifier {
    pool: Pooling,
    dense: Linear,
    act: Act,
    norm: Option<LayerNorm>,
    out: Linear,
    hidden: usize,
    labels: usize,
    isa: Isa,
}

impl Classifier {
    /// Pools the first token alone: [`Classifier::logits`] of one row a
    /// sequence (each sequence's first) is the same as of all its rows.
    pub(crate) fn reads_first_token_only(&self) -> bool {
        self.pool == Pooling::Cls
    }

    /// The logits of each sequence (`lens[i]` rows of `states` each, one
    /// after another): `lens.len() * labels` floats. A sequence of no
    /// tokens pools to zeros.
    pub(crate) fn logits(&self, states: &[f32], lens: &[usize]) -> Vec<f32> {
        let (isa, h, b) = (self.isa, self.hidden, lens.len());
        let mut pooled = vec![0f32; b * h];
        let mut row = 0;
        for (&len, out) in lens.iter().zip(pooled.chunks_exact_mut(h)) {
            pooling::pool(isa, self.pool, &states[row * h..(row + len) * h], h, out);
            row += len;
        }
        let mut x = vec![0f32; b * h];
        matmul(isa, &pooled, b, &self.dense, &mut x, 1);
        match self.act {
            Act::Tanh => x.iter_mut().for_each(|v| *v = v.tanh()),
            Act::Of(a) => a.apply(isa, &mut x, h, 1),
        }
        if let Some(norm) = &self.norm {
            norm.to(isa, &x, &mut pooled, 1);
            std::mem::swap(&mut x, &mut pooled);
        }
        let mut logits = vec![0f32; b * self.labels];
        matmul(isa, &x, b, &self.out, &mut logits, 1);
        logits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn file() -> &'static Path {
        Path::new("config.json")
    }

    #[test]
    fn labels_in_id_order_or_generic() {
        let v = json!({"id2label": {"2": "positive", "0": "negative", "1": "neutral"}});
        assert_eq!(
            labels(&v, file()).unwrap(),
            ["negative", "neutral", "positive"]
        );
        assert_eq!(
            labels(&json!({"num_labels": 1}), file()).unwrap(),
            ["LABEL_0"]
        );
        assert_eq!(labels(&json!({}), file()).unwrap().len(), 2);
        let e = labels(&json!({"id2label": {"0": "a", "2": "b"}}), file()).unwrap_err();
        assert!(e.message.contains("without a gap"), "{e}");
        let e = labels(&json!({"id2label": {"x": "a"}}), file()).unwrap_err();
        assert!(e.message.contains("\"x\""), "{e}");
    }

    #[test]
    fn refuses_multi_label_and_unknown_heads() {
        let v =
            json!({"id2label": {"0": "a", "1": "b"}, "problem_type": "multi_label_classification"});
        let e = spec("bert", "BertForSequenceClassification", &v, file()).unwrap_err();
        assert!(e.message.contains("multi_label_classification"), "{e}");
        // One label is a sigmoid either way: served.
        let one = json!({"id2label": {"0": "a"}, "problem_type": "multi_label_classification"});
        assert!(spec("bert", "BertForSequenceClassification", &one, file()).is_ok());
        let e = spec(
            "deberta-v2",
            "DebertaV2ForSequenceClassification",
            &one,
            file(),
        )
        .unwrap_err();
        assert!(
            e.message.contains("DebertaV2ForSequenceClassification")
                && e.message.contains(FAMILIES),
            "{e}"
        );
        let e = spec(
            "modernbert",
            "M",
            &json!({"classifier_pooling": "max"}),
            file(),
        )
        .unwrap_err();
        assert!(e.message.contains("classifier_pooling"), "{e}");
    }
}
