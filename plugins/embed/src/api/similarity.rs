//! TEI's `POST /similarity` (huggingface_hub's `sentence_similarity`):
//! the cosine of a source sentence's embedding with each other sentence's,
//! all embedded in the same passes as `/embed`'s inputs.

use serde_json::{Map, Value};

use super::error::{ApiError, Flavor};
use super::json::write_f32;
use super::request::{
    Limits, TruncationDirection, describe, opt_bool, parse_object, prompt_name,
    truncation_direction,
};
use super::rerank::{finite, texts};

/// One `/similarity` request: its sentences, the source first.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimilarityCall {
    pub texts: Vec<String>,
    pub truncate: bool,
    pub truncation_direction: TruncationDirection,
    pub prompt_name: Option<String>,
}

/// Parses `POST /similarity`: `{"inputs": {"source_sentence": str,
/// "sentences": [str]}, "parameters"?: {"truncate"?, "truncation_direction"?,
/// "prompt_name"?}}`, TEI's `SimilarityRequest`; `sentences` holds at most
/// [`Limits::max_client_batch_size`].
pub fn parse_similarity(body: &[u8], limits: &Limits) -> Result<SimilarityCall, ApiError> {
    let flavor = Flavor::Tei;
    let obj = parse_object(body, limits, flavor)?;
    let inputs = object(obj.get("inputs"), "inputs")?;
    let source = match inputs.get("source_sentence") {
        Some(Value::String(s)) if !s.is_empty() => s.clone(),
        Some(Value::String(_)) => {
            return Err(ApiError::empty_field(
                flavor,
                "inputs",
                "`inputs.source_sentence` is empty: send the sentence to compare the others with"
                    .into(),
            ));
        }
        v => {
            return Err(ApiError::invalid(
                flavor,
                "inputs",
                format!(
                    "`inputs.source_sentence` must be a string, got {}",
                    v.map_or("nothing".into(), describe)
                ),
            ));
        }
    };
    let sentences = texts(inputs.get("sentences"), "sentences", limits, flavor, |v| {
        v.as_str().filter(|s| !s.is_empty()).map(str::to_string)
    })?;
    let empty = Map::new();
    let params = match obj.get("parameters") {
        None | Some(Value::Null) => &empty,
        v => object(v, "parameters")?,
    };
    let mut texts = Vec::with_capacity(sentences.len() + 1);
    texts.push(source);
    texts.extend(sentences);
    Ok(SimilarityCall {
        texts,
        truncate: opt_bool(params.get("truncate"), "truncate", flavor)?
            .unwrap_or(limits.auto_truncate),
        truncation_direction: truncation_direction(params.get("truncation_direction"), flavor)?,
        prompt_name: prompt_name(params.get("prompt_name"), flavor)?,
    })
}

fn object<'a>(
    v: Option<&'a Value>,
    field: &'static str,
) -> Result<&'a Map<String, Value>, ApiError> {
    match v {
        Some(Value::Object(o)) => Ok(o),
        v => Err(ApiError::invalid(
            Flavor::Tei,
            field,
            format!(
                "`{field}` must be an object{}, got {}",
                if field == "inputs" {
                    " {\"source_sentence\": str, \"sentences\": [str]}"
                } else {
                    ""
                },
                v.map_or("nothing".into(), describe)
            ),
        )),
    }
}

/// Writes the cosines of the first of `rows` (`dim` floats each) with each
/// other one: `[f32, ...]`.
pub fn write_similarity(rows: &[f32], dim: usize, out: &mut Vec<u8>) -> Result<(), ApiError> {
    let mut rows = rows.chunks_exact(dim.max(1));
    let source = rows.next().unwrap_or(&[]);
    let norm = |r: &[f32]| r.iter().map(|x| x * x).sum::<f32>().sqrt();
    let cosines: Vec<f32> = rows
        .map(|r| {
            let dot: f32 = source.iter().zip(r).map(|(a, b)| a * b).sum();
            // A zero vector has no direction: its cosine is 0, not NaN.
            let n = norm(source) * norm(r);
            if n > 0.0 { dot / n } else { 0.0 }
        })
        .collect();
    finite(&cosines, Flavor::Tei)?;
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (i, c) in cosines.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_f32(*c, &mut buf, out);
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<SimilarityCall, ApiError> {
        parse_similarity(body.as_bytes(), &Limits::default())
    }

    #[test]
    fn the_source_comes_first_and_parameters_are_optional() {
        let c = parse(r#"{"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}}"#).unwrap();
        assert_eq!(c.texts, ["s", "a", "b"]);
        let c = parse(
            r#"{"inputs": {"source_sentence": "s", "sentences": ["a"]},
                "parameters": {"truncate": true, "prompt_name": "query"}}"#,
        )
        .unwrap();
        assert!(c.truncate);
        assert_eq!(c.prompt_name.as_deref(), Some("query"));
    }

    #[test]
    fn mistakes_are_refused() {
        for (body, status) in [
            (r#"{"inputs": "s"}"#, 422),
            (r#"{"inputs": {"sentences": ["a"]}}"#, 422),
            (
                r#"{"inputs": {"source_sentence": "s", "sentences": []}}"#,
                400,
            ),
            (
                r#"{"inputs": {"source_sentence": "", "sentences": ["a"]}}"#,
                400,
            ),
            (
                r#"{"inputs": {"source_sentence": "s", "sentences": [""]}}"#,
                422,
            ),
            (
                r#"{"inputs": {"source_sentence": "s", "sentences": ["a"]}, "parameters": 1}"#,
                422,
            ),
        ] {
            assert_eq!(parse(body).unwrap_err().status, status, "{body}");
        }
    }

    #[test]
    fn cosines_of_the_source_with_each_other_row() {
        let mut out = Vec::new();
        write_similarity(&[1.0, 0.0, 2.0, 0.0, 0.0, 3.0, 0.0, 0.0], 2, &mut out).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "[1.0,0.0,0.0]");
    }
}
