//! TEI's `POST /rerank`: a query against texts, each (query, text) pair
//! one input of the cross-encoder; the reply lists each text's score,
//! highest first. Cohere's routes (`cohere.rs`) parse into the same
//! [`RerankCall`] and are scored the same way.

use serde_json::Value;

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_str, write_usize};
use super::request::{Limits, describe, opt_bool, parse_object, truncation_direction, whole};
use super::route::CohereVersion;
use super::scores::{activate, ranked};

/// One rerank request, from TEI's route or Cohere's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RerankCall {
    pub query: String,
    /// The texts (Cohere's documents) to score against the query, in the
    /// request's order: the reply's `index`.
    pub texts: Vec<String>,
    /// Cut pairs over the model's limit (longest text first, as
    /// sentence-transformers' CrossEncoder does) instead of refusing them.
    pub truncate: bool,
    /// Logits as they are, not through the sigmoid (TEI's `raw_scores`).
    pub raw_scores: bool,
    /// Echo each text in its result (TEI's `return_text`, Cohere's
    /// `return_documents`).
    pub return_text: bool,
    /// Cohere's `top_n`: list only this many, the best.
    pub top_n: Option<usize>,
    /// Which API it came in on: TEI's, or Cohere's of this version.
    pub cohere: Option<CohereVersion>,
}

impl RerankCall {
    pub fn flavor(&self) -> Flavor {
        match self.cohere {
            Some(_) => Flavor::Cohere,
            None => Flavor::Tei,
        }
    }

    /// The (query, text) pairs, in order.
    pub fn pairs(&self) -> Vec<(&str, &str)> {
        self.texts
            .iter()
            .map(|t| (self.query.as_str(), t.as_str()))
            .collect()
    }

    /// The texts' scores (one logit each, through the sigmoid unless
    /// `raw_scores`) and the order to list them in, cut to `top_n`.
    pub fn ranked(&self, logits: &[f32]) -> (Vec<f32>, Vec<usize>) {
        let scores: Vec<f32> = logits
            .iter()
            .map(|&l| activate(&[l], self.raw_scores)[0])
            .collect();
        let mut order = ranked(&scores);
        order.truncate(self.top_n.unwrap_or(order.len()));
        (scores, order)
    }
}

/// Parses `POST /rerank`: `{"query": str, "texts": [str], "truncate"?:
/// bool, "truncation_direction"?: "Right" | "Left", "raw_scores"?: bool,
/// "return_text"?: bool}`. `truncate` defaults to
/// [`Limits::auto_truncate`]; a pair is cut longest first whatever the
/// direction (the direction is checked, as TEI takes it, and otherwise
/// unused: a pair has two ends).
pub fn parse_rerank(body: &[u8], limits: &Limits) -> Result<RerankCall, ApiError> {
    let flavor = Flavor::Tei;
    let obj = parse_object(body, limits, flavor)?;
    let query = query(obj.get("query"), flavor)?;
    let texts = texts(obj.get("texts"), "texts", limits, flavor, |v| match v {
        Value::String(s) => Some(s.clone()),
        _ => None,
    })?;
    truncation_direction(obj.get("truncation_direction"), flavor)?;
    Ok(RerankCall {
        query,
        texts,
        truncate: opt_bool(obj.get("truncate"), "truncate", flavor)?
            .unwrap_or(limits.auto_truncate),
        raw_scores: opt_bool(obj.get("raw_scores"), "raw_scores", flavor)?.unwrap_or(false),
        return_text: opt_bool(obj.get("return_text"), "return_text", flavor)?.unwrap_or(false),
        top_n: None,
        cohere: None,
    })
}

/// `query`: a string, empty or not (TEI scores the pair of an empty query,
/// as sentence-transformers' CrossEncoder does).
pub(super) fn query(v: Option<&Value>, flavor: Flavor) -> Result<String, ApiError> {
    match v {
        Some(Value::String(s)) => Ok(s.clone()),
        None | Some(Value::Null) => Err(ApiError::invalid(
            flavor,
            "query",
            "missing field `query`: send the text to rank the others against".into(),
        )),
        Some(v) => Err(ApiError::invalid(
            flavor,
            "query",
            format!("`query` must be a string, got {}", describe(v)),
        )),
    }
}

/// A count that cuts a reply (Cohere's `top_n`, huggingface_hub's
/// `top_k`): a whole number of at least 1, or absent/null; `name` is how
/// the request spells it.
pub(super) fn how_many(
    v: Option<&Value>,
    field: &'static str,
    name: &str,
    flavor: Flavor,
) -> Result<Option<usize>, ApiError> {
    match v {
        None | Some(Value::Null) => Ok(None),
        Some(Value::Number(n)) if whole(n).is_some_and(|k| k >= 1) => {
            Ok(whole(n).map(|k| usize::try_from(k).unwrap_or(usize::MAX)))
        }
        Some(v) => Err(ApiError::invalid(
            flavor,
            field,
            format!(
                "`{name}` must be a whole number of at least 1, got {}",
                describe(v)
            ),
        )),
    }
}

/// A non-empty list under `field` of at most
/// [`Limits::max_client_batch_size`] items, each made a text by `text`
/// (None: not one). An empty text is kept: a pair of a query and nothing
/// has a score.
pub(super) fn texts(
    v: Option<&Value>,
    field: &'static str,
    limits: &Limits,
    flavor: Flavor,
    text: impl Fn(&Value) -> Option<String>,
) -> Result<Vec<String>, ApiError> {
    let items = match v {
        Some(Value::Array(items)) => items,
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("missing field `{field}`: send a list of strings"),
            ));
        }
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                field,
                format!("`{field}` must be a list of strings, got {}", describe(v)),
            ));
        }
    };
    if items.is_empty() {
        return Err(ApiError::empty_field(
            flavor,
            field,
            format!("`{field}` cannot be empty: send at least one text"),
        ));
    }
    let max = match flavor {
        Flavor::Cohere => limits.max_cohere_documents,
        _ => limits.max_client_batch_size,
    };
    if items.len() > max {
        return Err(ApiError::too_many_in(flavor, field, items.len(), max));
    }
    items
        .iter()
        .enumerate()
        .map(|(i, v)| {
            text(v).ok_or_else(|| {
                ApiError::invalid(
                    flavor,
                    field,
                    format!("`{field}` item {i} must be a string, got {}", describe(v)),
                )
            })
        })
        .collect()
}

/// Writes TEI's rerank reply for `logits` (one a text):
/// `[{"index", "text"?, "score"}]`, highest score first.
pub fn write_rerank(call: &RerankCall, logits: &[f32], out: &mut Vec<u8>) -> Result<(), ApiError> {
    let (scores, order) = call.ranked(logits);
    finite(&scores, call.flavor())?;
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (n, &i) in order.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"index\":");
        write_usize(i, out);
        if call.return_text {
            out.extend_from_slice(b",\"text\":");
            write_str(&call.texts[i], out);
        }
        out.extend_from_slice(b",\"score\":");
        write_f32(scores[i], &mut buf, out);
        out.push(b'}');
    }
    out.push(b']');
    Ok(())
}

/// Scores are finite, or the model went wrong: a 500 rather than JSON
/// that is not JSON (NaN has no spelling).
pub(super) fn finite(scores: &[f32], flavor: Flavor) -> Result<(), ApiError> {
    match scores.iter().position(|s| !s.is_finite()) {
        None => Ok(()),
        Some(i) => Err(ApiError::internal(
            flavor,
            &format!("the model gave a score of {} for input {i}", scores[i]),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<RerankCall, ApiError> {
        parse_rerank(body.as_bytes(), &Limits::default())
    }

    #[test]
    fn defaults_and_fields() {
        let c = parse(r#"{"query": "q", "texts": ["a", ""]}"#).unwrap();
        assert_eq!(c.pairs(), [("q", "a"), ("q", "")]);
        assert!(!c.truncate && !c.raw_scores && !c.return_text);
        let c = parse(
            r#"{"query": "q", "texts": ["a"], "truncate": true, "raw_scores": true,
                "return_text": true, "truncation_direction": "Left"}"#,
        )
        .unwrap();
        assert!(c.truncate && c.raw_scores && c.return_text);
    }

    #[test]
    fn mistakes_get_their_status_and_field() {
        let status = |b: &str| parse(b).unwrap_err();
        assert_eq!(status(r#"{"query": "q", "texts": []}"#).status, 400);
        assert!(parse(r#"{"query": "", "texts": ["a"]}"#).is_ok());
        assert_eq!(status(r#"{"texts": ["a"]}"#).status, 422);
        assert_eq!(status(r#"{"query": "q", "texts": "a"}"#).status, 422);
        let e = status(r#"{"query": "q", "texts": ["a", 3]}"#);
        assert_eq!((e.status, e.param), (422, Some("texts")));
        assert!(e.message.contains("item 1"), "{}", e.message);
        let many = format!(r#"{{"query": "q", "texts": {:?}}}"#, vec!["a"; 33]);
        let e = status(&many);
        assert_eq!(e.status, 413);
        assert!(e.message.contains("`texts`"), "{}", e.message);
        assert_eq!(
            status(r#"{"query": "q", "texts": ["a"], "raw_scores": 1}"#).status,
            422
        );
        assert_eq!(status("[").status, 400);
    }

    #[test]
    fn the_reply_is_highest_first_with_text_when_asked() {
        let mut c = parse(r#"{"query": "q", "texts": ["a", "b", "c"]}"#).unwrap();
        let mut out = Vec::new();
        write_rerank(&c, &[-1.0, 2.0, 0.0], &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        let order: Vec<u64> = v
            .as_array()
            .unwrap()
            .iter()
            .map(|r| r["index"].as_u64().unwrap())
            .collect();
        assert_eq!(order, [1, 2, 0]);
        assert_eq!(v[1]["score"], 0.5);
        assert!(v[0].get("text").is_none());
        c.return_text = true;
        c.raw_scores = true;
        out.clear();
        write_rerank(&c, &[-1.0, 2.0, 0.0], &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            (v[0]["text"].as_str(), v[0]["score"].as_f64()),
            (Some("b"), Some(2.0))
        );
        assert_eq!(
            write_rerank(&c, &[f32::NAN, 0.0, 0.0], &mut out)
                .unwrap_err()
                .status,
            500
        );
    }
}
