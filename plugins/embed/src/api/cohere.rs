//! Cohere's rerank API, `POST /v1/rerank` and `POST /v2/rerank`, as the
//! `cohere` package's `Client.rerank` and `ClientV2.rerank` (and
//! LangChain's and LlamaIndex's Cohere rerankers over them) call it.
//!
//! Request: `{"model"?, "query", "documents": [str | {"text": str, ...}],
//! "top_n"?, "return_documents"?}`; `model` is taken whatever it names (one
//! model is served), `max_chunks_per_doc`, `max_tokens_per_doc` and
//! `rank_fields` are ignored: a document over the model's limit is cut, as
//! Cohere's API cuts one (never refused), and an object's `text` is what
//! is ranked. `return_documents` is false unless sent, on both versions.
//! Reply: `{"id", "results": [{"index", "relevance_score", "document"?:
//! {"text"}}], "meta": {"api_version": {"version"}, "billed_units":
//! {"search_units": 1}}}`, highest first, cut to `top_n`; the score is the
//! sigmoid of the logit. Errors are `{"message"}` ([`Flavor::Cohere`]).

use serde_json::Value;

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_str, write_usize};
use super::request::{Limits, describe, opt_bool, parse_object};
use super::rerank::{RerankCall, finite, how_many, query, texts};
use super::route::CohereVersion;

/// Parses a Cohere rerank request of `version`.
pub fn parse_cohere(
    body: &[u8],
    limits: &Limits,
    version: CohereVersion,
) -> Result<RerankCall, ApiError> {
    let flavor = Flavor::Cohere;
    let obj = parse_object(body, limits, flavor)?;
    match obj.get("model") {
        None | Some(Value::Null | Value::String(_)) => {}
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "model",
                format!("`model` must be a string, got {}", describe(v)),
            ));
        }
    }
    let query = query(obj.get("query"), flavor)?;
    let texts = texts(
        obj.get("documents"),
        "documents",
        limits,
        flavor,
        |v| match v {
            Value::String(s) => Some(s.clone()),
            Value::Object(o) => o.get("text").and_then(Value::as_str).map(str::to_string),
            _ => None,
        },
    )?;
    let top_n = how_many(obj.get("top_n"), "top_n", "top_n", flavor)?;
    Ok(RerankCall {
        query,
        texts,
        truncate: true,
        raw_scores: false,
        return_text: opt_bool(obj.get("return_documents"), "return_documents", flavor)?
            .unwrap_or(false),
        top_n,
        cohere: Some(version),
    })
}

/// A request id in a UUID's form (Cohere's `id`), from the time the
/// request arrived and a count of this worker's requests: unique per
/// worker and process, which is what a client logs it for.
pub fn request_id(arrived_ns: u64, count: u64, pid: u32) -> String {
    let a = arrived_ns;
    format!(
        "{:08x}-{:04x}-4{:03x}-8{:03x}-{:012x}",
        (a >> 32) as u32,
        (a >> 16) as u16,
        (a & 0xfff) as u16,
        (count & 0xfff) as u16,
        (u64::from(pid) << 24 | (count >> 12) & 0xff_ffff) & 0xffff_ffff_ffff
    )
}

/// Writes Cohere's rerank reply for `logits` (one a document).
pub fn write_cohere(
    call: &RerankCall,
    logits: &[f32],
    id: &str,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let (scores, order) = call.ranked(logits);
    finite(&scores, Flavor::Cohere)?;
    let mut buf = ryu::Buffer::new();
    out.extend_from_slice(b"{\"id\":");
    write_str(id, out);
    out.extend_from_slice(b",\"results\":[");
    for (n, &i) in order.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"index\":");
        write_usize(i, out);
        out.extend_from_slice(b",\"relevance_score\":");
        write_f32(scores[i], &mut buf, out);
        if call.return_text {
            out.extend_from_slice(b",\"document\":{\"text\":");
            write_str(&call.texts[i], out);
            out.push(b'}');
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"meta\":{\"api_version\":{\"version\":");
    write_str(
        match call.cohere {
            Some(CohereVersion::V1) => "1",
            _ => "2",
        },
        out,
    );
    // One search unit a request of up to 100 documents, as Cohere bills.
    out.extend_from_slice(b"},\"billed_units\":{\"search_units\":");
    write_usize(call.texts.len().div_ceil(100), out);
    out.extend_from_slice(b"}}}");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(body: &str) -> Result<RerankCall, ApiError> {
        parse_cohere(body.as_bytes(), &Limits::default(), CohereVersion::V2)
    }

    #[test]
    fn documents_are_strings_or_objects_with_text() {
        let c = parse(
            r#"{"model": "rerank-v3.5", "query": "q", "documents": ["a", {"text": "b", "x": 1}],
                "top_n": 1, "max_chunks_per_doc": 10}"#,
        )
        .unwrap();
        assert_eq!(c.texts, ["a", "b"]);
        assert_eq!(c.top_n, Some(1));
        assert!(c.truncate && !c.return_text && !c.raw_scores);
        assert_eq!(c.flavor(), Flavor::Cohere);
    }

    #[test]
    fn mistakes_are_400_in_cohere_shape() {
        for body in [
            r#"{"query": "q", "documents": []}"#,
            r#"{"query": "q", "documents": [{"title": "no text"}]}"#,
            r#"{"query": "q", "documents": ["a"], "top_n": 0}"#,
            r#"{"query": "q", "documents": ["a"], "top_n": "2"}"#,
            r#"{"documents": ["a"]}"#,
            r#"{"query": "q", "documents": ["a"], "model": 5}"#,
            "not json",
        ] {
            let e = parse(body).unwrap_err();
            assert_eq!(e.status, 400, "{body}: {e}");
            let v: Value = serde_json::from_slice(&e.body()).unwrap();
            assert_eq!(v.as_object().unwrap().len(), 1, "{v}");
            assert!(v["message"].is_string());
        }
    }

    #[test]
    fn the_reply_is_cut_to_top_n_with_documents_when_asked() {
        let mut c = parse(r#"{"query": "q", "documents": ["a", "b", "c"], "top_n": 2}"#).unwrap();
        let mut out = Vec::new();
        write_cohere(&c, &[0.0, 3.0, -2.0], "id-1", &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["id"], "id-1");
        let r = v["results"].as_array().unwrap();
        assert_eq!(r.len(), 2);
        assert_eq!(
            (r[0]["index"].as_u64(), r[1]["index"].as_u64()),
            (Some(1), Some(0))
        );
        assert_eq!(r[1]["relevance_score"], 0.5);
        assert!(r[0].get("document").is_none());
        assert_eq!(v["meta"]["api_version"]["version"], "2");
        assert_eq!(v["meta"]["billed_units"]["search_units"], 1);
        c.return_text = true;
        c.top_n = Some(10);
        out.clear();
        write_cohere(&c, &[0.0, 3.0, -2.0], "id-2", &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["results"].as_array().unwrap().len(), 3);
        assert_eq!(v["results"][0]["document"]["text"], "b");
    }

    #[test]
    fn ids_look_like_uuids_and_differ() {
        let a = request_id(1_733_400_000_123_456_789, 1, 4242);
        let b = request_id(1_733_400_000_123_456_789, 2, 4242);
        assert_ne!(a, b);
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
    }
}
