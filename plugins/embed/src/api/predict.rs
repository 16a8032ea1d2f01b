//! TEI's `POST /predict`: a classifier's (or a reranker's) labels for a
//! text or a pair of texts, or for a batch of them, each one input of the
//! cross-encoder.

use serde_json::Value;

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_str};
use super::request::{Limits, describe, opt_bool, parse_object, truncation_direction};
use super::rerank::{finite, how_many};
use super::scores::{activate, ranked};

/// One input of `/predict`: a text, or a pair the model reads as one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Sequence {
    Single(String),
    Pair(String, String),
}

/// One `/predict` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PredictCall {
    pub inputs: Vec<Sequence>,
    /// Sent as a batch (`[[a], [a, b], ...]`): the reply is a list per
    /// input; else the one input's list.
    pub batch: bool,
    pub truncate: bool,
    /// Logits as they are, not through the softmax (sigmoid for one label).
    pub raw_scores: bool,
    /// Sent in the Hugging Face Inference API's envelope (`"parameters"`,
    /// as huggingface_hub's `text_classification` posts it): answered as
    /// that API answers, a list per input even for one, each cut to
    /// `parameters.top_k` labels.
    pub top_k: Option<usize>,
}

const SHAPE: &str = "a string, a pair of strings [string, string] or a batch of single strings \
                     and pairs [[string], [string, string], ...]";

/// Parses `POST /predict`: `{"inputs": str | [str, str] | [[str] | [str,
/// str], ...], "truncate"?: bool, "truncation_direction"?: "Right" |
/// "Left", "raw_scores"?: bool}`, as TEI reads `inputs`: a list whose
/// first item is a string is one input (one text, or a pair), a list of
/// lists a batch of at most [`Limits::max_client_batch_size`].
pub fn parse_predict(body: &[u8], limits: &Limits) -> Result<PredictCall, ApiError> {
    let flavor = Flavor::Tei;
    let obj = parse_object(body, limits, flavor)?;
    let (inputs, batch) = match obj.get("inputs") {
        Some(Value::String(s)) => (vec![Sequence::Single(s.clone())], false),
        Some(Value::Array(items)) if items.first().is_some_and(Value::is_string) => {
            (vec![sequence(items, None)?], false)
        }
        Some(Value::Array(items)) if items.is_empty() => {
            return Err(ApiError::empty_input(flavor));
        }
        Some(Value::Array(items)) => {
            if items.len() > limits.max_client_batch_size {
                return Err(ApiError::too_many(
                    flavor,
                    items.len(),
                    limits.max_client_batch_size,
                ));
            }
            let seqs = items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::Array(inner) => sequence(inner, Some(i)),
                    v => Err(wrong(Some(i), v)),
                })
                .collect::<Result<_, _>>()?;
            (seqs, true)
        }
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                flavor,
                "inputs",
                format!("missing field `inputs`: send {SHAPE}"),
            ));
        }
        Some(v) => return Err(wrong(None, v)),
    };
    truncation_direction(obj.get("truncation_direction"), flavor)?;
    let (batch, top_k) = match obj.get("parameters") {
        Some(Value::Object(p)) => {
            let top_k = how_many(p.get("top_k"), "parameters", "parameters.top_k", flavor)?;
            (true, top_k)
        }
        _ => (batch, None),
    };
    Ok(PredictCall {
        inputs,
        batch,
        top_k,
        truncate: opt_bool(obj.get("truncate"), "truncate", flavor)?
            .unwrap_or(limits.auto_truncate),
        raw_scores: opt_bool(obj.get("raw_scores"), "raw_scores", flavor)?.unwrap_or(false),
    })
}

/// One text or a pair from a list of one or two strings (item `index` of
/// a batch, or the whole `inputs`).
fn sequence(items: &[Value], index: Option<usize>) -> Result<Sequence, ApiError> {
    match items {
        [Value::String(a)] => Ok(Sequence::Single(a.clone())),
        [Value::String(a), Value::String(b)] => Ok(Sequence::Pair(a.clone(), b.clone())),
        _ => Err(wrong(index, &Value::Array(items.to_vec()))),
    }
}

fn wrong(index: Option<usize>, v: &Value) -> ApiError {
    let what = match index {
        Some(i) => format!("`inputs` item {i}"),
        None => "`inputs`".into(),
    };
    ApiError::invalid(
        Flavor::Tei,
        "inputs",
        format!("{what} must be {SHAPE}, got {}", describe(v)),
    )
}

/// Writes `/predict`'s reply for `logits` (`labels.len()` per input):
/// per input, `[{"score", "label"}]` over every label, highest first.
pub fn write_predict(
    call: &PredictCall,
    logits: &[f32],
    labels: &[String],
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let mut buf = ryu::Buffer::new();
    if call.batch {
        out.push(b'[');
    }
    for (n, row) in logits.chunks(labels.len().max(1)).enumerate() {
        if n > 0 {
            out.push(b',');
        }
        let scores = activate(row, call.raw_scores);
        finite(&scores, Flavor::Tei)?;
        out.push(b'[');
        let mut order = ranked(&scores);
        order.truncate(call.top_k.unwrap_or(order.len()));
        for (k, i) in order.into_iter().enumerate() {
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"score\":");
            write_f32(scores[i], &mut buf, out);
            out.extend_from_slice(b",\"label\":");
            write_str(&labels[i], out);
            out.push(b'}');
        }
        out.push(b']');
    }
    if call.batch {
        out.push(b']');
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<PredictCall, ApiError> {
        parse_predict(body.as_bytes(), &Limits::default())
    }

    fn single(s: &str) -> Sequence {
        Sequence::Single(s.into())
    }

    #[test]
    fn inputs_are_read_as_tei_reads_them() {
        let c = parse(r#"{"inputs": "a"}"#).unwrap();
        assert_eq!((c.inputs, c.batch), (vec![single("a")], false));
        let c = parse(r#"{"inputs": ["a", "b"]}"#).unwrap();
        assert_eq!(c.inputs, [Sequence::Pair("a".into(), "b".into())]);
        assert!(!c.batch);
        let c = parse(r#"{"inputs": [["a"], ["b", "c"]], "raw_scores": true}"#).unwrap();
        assert_eq!(c.inputs.len(), 2);
        assert!(c.batch && c.raw_scores);
        // huggingface_hub's envelope: a list per input, even for one.
        let c = parse(r#"{"inputs": "a", "parameters": {"top_k": 2}}"#).unwrap();
        assert!(c.batch);
        assert_eq!(c.top_k, Some(2));
        assert!(parse(r#"{"inputs": "a", "parameters": {}}"#).unwrap().batch);
        assert_eq!(
            parse(r#"{"inputs": "a", "parameters": {"top_k": 0}}"#)
                .unwrap_err()
                .status,
            422
        );
    }

    #[test]
    fn other_shapes_are_refused_naming_them() {
        for (body, status) in [
            (r#"{"inputs": ["a", "b", "c"]}"#, 422),
            (r#"{"inputs": [["a", "b", "c"]]}"#, 422),
            (r#"{"inputs": [["a"], "b"]}"#, 422),
            (r#"{"inputs": [[]]}"#, 422),
            (r#"{"inputs": 3}"#, 422),
            (r#"{}"#, 422),
            (r#"{"inputs": []}"#, 400),
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.status, status, "{body}: {e}");
        }
        let many = format!(r#"{{"inputs": {:?}}}"#, vec![vec!["a"]; 33]);
        assert_eq!(parse(&many).unwrap_err().status, 413);
    }

    #[test]
    fn each_input_lists_every_label_highest_first() {
        let labels = ["neg".to_string(), "neu".into(), "pos".into()];
        let c = parse(r#"{"inputs": [["a"], ["b"]]}"#).unwrap();
        let mut out = Vec::new();
        write_predict(&c, &[0.0, 1.0, 2.0, 2.0, 0.0, 0.0], &labels, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v[0][0]["label"], "pos");
        assert_eq!(v[1][0]["label"], "neg");
        let sum: f64 = v[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| p["score"].as_f64().unwrap())
            .sum();
        assert!((sum - 1.0).abs() < 1e-6);
        let c = parse(r#"{"inputs": "a"}"#).unwrap();
        out.clear();
        write_predict(&c, &[0.0], &labels[..1], &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[{"score":0.5,"label":"neg"}]"#
        );
    }
}
