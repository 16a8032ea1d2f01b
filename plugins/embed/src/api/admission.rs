//! Admission by inputs, as TEI counts it: a request costs the inputs it
//! asks to embed, a worker holds at most its limit of them in flight, and
//! a request that would go over is refused at once with a 429 (TEI's
//! `Overloaded`, OpenAI's `rate_limit_error`), not queued.
//!
//! The count comes from a scan of the body, not a parse: the host asks on
//! its event loop, before the request is queued, and the handler parses
//! the body anyway. The scan walks the top-level object, skipping every
//! value but the inputs field (the last one, as the parser keeps the last
//! of duplicate keys) and counts that array's elements, allocating
//! nothing. Where it cannot be sure (a key written with escapes, a body
//! that is not an object) it says so, and the caller parses instead: the
//! count is exact either way.

use super::cohere::parse_cohere;
use super::error::{ApiError, Flavor};
use super::predict::parse_predict;
use super::request::{Limits, parse_openai, parse_tei};
use super::rerank::parse_rerank;
use super::route::Route;
use super::similarity::parse_similarity;
use super::tokens::parse_embed_all;
use crate::settings::ENV_MAX_CONCURRENT_INPUTS;

/// Seconds a refused client is told to wait (`Retry-After`): about the
/// time a worker takes to compute the batches in flight at the default
/// limit.
pub const RETRY_AFTER: &str = "1";

/// The inputs a request to `route` asks the model for (a rerank's
/// (query, text) pairs, a similarity's sentences and its source): the
/// scan's count, or the parser's where the scan cannot be sure or the
/// route's inputs are not one list; 1 for a body neither reads (the
/// handler refuses it at once).
pub fn count_inputs(body: &[u8], route: Route, limits: &Limits) -> usize {
    let key: Option<&[u8]> = match route {
        Route::Embed | Route::EmbedAll | Route::EmbedSparse => Some(b"inputs"),
        Route::OpenAiEmbeddings => Some(b"input"),
        Route::Rerank => Some(b"texts"),
        Route::CohereRerank(_) => Some(b"documents"),
        // `["a", "b"]` is one pair to /predict, and /similarity's inputs
        // are an object: their parsers count.
        _ => None,
    };
    let n = key
        .and_then(|k| scan_inputs(body, k))
        .or_else(|| match route {
            Route::Embed => parse_tei(body, limits).ok().map(|c| c.inputs.len()),
            Route::EmbedAll | Route::EmbedSparse => {
                parse_embed_all(body, limits).ok().map(|c| c.inputs.len())
            }
            Route::OpenAiEmbeddings => parse_openai(body, limits).ok().map(|c| c.inputs.len()),
            Route::Rerank => parse_rerank(body, limits).ok().map(|c| c.texts.len()),
            Route::CohereRerank(v) => parse_cohere(body, limits, v).ok().map(|c| c.texts.len()),
            Route::Predict => parse_predict(body, limits).ok().map(|c| c.inputs.len()),
            Route::Similarity => parse_similarity(body, limits).ok().map(|c| c.texts.len()),
            _ => None,
        });
    // An empty list is refused by the handler; it still counts one.
    n.unwrap_or(1).max(1)
}

/// Admits `inputs` with `in_flight` already admitted, under `limit`; a
/// request over the limit on its own is admitted when nothing else is in
/// flight, so it is served (alone) rather than refused forever. The cost
/// to hold, or the 429 to answer.
pub fn admit(flavor: Flavor, inputs: usize, in_flight: u64, limit: usize) -> Result<u64, ApiError> {
    let cost = inputs as u64;
    if in_flight == 0 || in_flight.saturating_add(cost) <= limit as u64 {
        return Ok(cost);
    }
    Err(ApiError::overloaded(
        flavor,
        &format!(
            "this worker has {in_flight} input(s) in flight and the request's {inputs} would take \
             it over its limit of {limit} ({ENV_MAX_CONCURRENT_INPUTS}); wait Retry-After \
             seconds, or serve with more workers or a higher {ENV_MAX_CONCURRENT_INPUTS}"
        ),
    ))
}

/// The elements of the array under `key` in the top-level object of
/// `body` (1 for a string, or for an array of numbers: one input of token
/// ids), or None when the scan cannot be sure.
fn scan_inputs(body: &[u8], key: &[u8]) -> Option<usize> {
    scan_member(body, key, |s| s.count_value().map(Some)).flatten()
}

/// The body's top-level `model`, when it is a string: what picks the model
/// on OpenAI's and Cohere's routes. A scan as [`count_inputs`]' (nothing
/// allocated but the name), the parser's where the scan cannot be sure; a
/// `model` that is not a string is `None` (the route's parser refuses it).
pub fn body_model(body: &[u8]) -> Option<String> {
    match scan_string(body, b"model") {
        Some(found) => found.map(|b| String::from_utf8_lossy(b).into_owned()),
        None => serde_json::from_slice::<serde_json::Value>(body)
            .ok()?
            .get("model")?
            .as_str()
            .map(str::to_string),
    }
}

/// The top-level `key`'s string value: `Some(None)` when the object has no
/// such string, `None` when the scan cannot be sure (escapes, not an
/// object).
fn scan_string<'a>(body: &'a [u8], key: &[u8]) -> Option<Option<&'a [u8]>> {
    scan_member(body, key, |s| match s.peek() {
        Some(b'"') => s.plain_string().map(Some),
        _ => s.skip_value().map(|()| None),
    })
}

/// Walks the top-level object of `body`: each member named `key` is read
/// by `read` (which consumes its value: `Some(None)` for a value not of
/// the shape it wants), the others skipped. The last such member's
/// reading, as a parser keeps the last of a repeated key; `Some(None)`
/// when there is none; `None` when the scan cannot be sure (not an object,
/// escapes, malformed).
fn scan_member<'a, T>(
    body: &'a [u8],
    key: &[u8],
    mut read: impl FnMut(&mut Scan<'a>) -> Option<Option<T>>,
) -> Option<Option<T>> {
    let mut s = Scan { b: body, i: 0 };
    s.ws();
    s.eat(b'{')?;
    let mut found = None;
    s.ws();
    if s.peek() == Some(b'}') {
        return Some(None);
    }
    loop {
        s.ws();
        let name = s.plain_string()?;
        s.ws();
        s.eat(b':')?;
        s.ws();
        if name == key {
            found = read(&mut s)?;
        } else {
            s.skip_value()?;
        }
        s.ws();
        match s.next()? {
            b',' => continue,
            b'}' => break,
            _ => return None,
        }
    }
    Some(found)
}

struct Scan<'a> {
    b: &'a [u8],
    i: usize,
}

impl<'a> Scan<'a> {
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    fn next(&mut self) -> Option<u8> {
        let c = self.peek()?;
        self.i += 1;
        Some(c)
    }

    fn eat(&mut self, c: u8) -> Option<()> {
        (self.next()? == c).then_some(())
    }

    fn ws(&mut self) {
        while matches!(self.peek(), Some(b' ' | b'\t' | b'\n' | b'\r')) {
            self.i += 1;
        }
    }

    /// A string with no escapes, its bytes between the quotes; None for
    /// one with escapes (its text is not its bytes).
    fn plain_string(&mut self) -> Option<&'a [u8]> {
        self.eat(b'"')?;
        let start = self.i;
        loop {
            match self.next()? {
                b'"' => return Some(&self.b[start..self.i - 1]),
                b'\\' => return None,
                _ => {}
            }
        }
    }

    fn skip_string(&mut self) -> Option<()> {
        self.eat(b'"')?;
        loop {
            match self.next()? {
                b'"' => return Some(()),
                b'\\' => {
                    self.next()?;
                }
                _ => {}
            }
        }
    }

    /// Any value: strings by their quotes, arrays and objects by their
    /// brackets (nested ones counted), anything else up to its end.
    fn skip_value(&mut self) -> Option<()> {
        match self.peek()? {
            b'"' => self.skip_string(),
            b'[' | b'{' => {
                let mut depth = 0usize;
                loop {
                    match self.peek()? {
                        b'"' => self.skip_string()?,
                        b'[' | b'{' => {
                            depth += 1;
                            self.i += 1;
                        }
                        b']' | b'}' => {
                            depth -= 1;
                            self.i += 1;
                            if depth == 0 {
                                return Some(());
                            }
                        }
                        _ => self.i += 1,
                    }
                }
            }
            _ => {
                let start = self.i;
                while !matches!(
                    self.peek(),
                    None | Some(b',' | b'}' | b']' | b' ' | b'\t' | b'\n' | b'\r')
                ) {
                    self.i += 1;
                }
                (self.i > start).then_some(())
            }
        }
    }

    /// The inputs in the value at hand.
    fn count_value(&mut self) -> Option<usize> {
        if self.peek()? != b'[' {
            self.skip_value()?;
            return Some(1);
        }
        self.i += 1;
        self.ws();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(0);
        }
        // `[1, 2, 3]` is one input of token ids.
        let ids = matches!(self.peek()?, b'-' | b'0'..=b'9');
        let mut n = 0;
        loop {
            self.ws();
            self.skip_value()?;
            n += 1;
            self.ws();
            match self.next()? {
                b',' => continue,
                b']' => return Some(if ids { 1 } else { n }),
                _ => return None,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tei(body: &str) -> usize {
        count_inputs(body.as_bytes(), Route::Embed, &Limits::default())
    }

    #[test]
    fn the_scan_counts_what_the_parser_would_embed() {
        assert_eq!(tei(r#"{"inputs": "one"}"#), 1);
        assert_eq!(tei(r#"{"inputs": ["a", "b,c", "d]\"e"]}"#), 3);
        assert_eq!(
            tei(r#"{"normalize": [{"x": "]"}], "inputs": ["a", "b"], "truncate": true}"#),
            2
        );
        assert_eq!(tei(r#"{"inputs": [1, 2, 3]}"#), 1);
        assert_eq!(tei(r#"{"inputs": [[1, 2], [3]]}"#), 2);
        // The parser keeps the last of duplicate keys; so does the scan.
        assert_eq!(tei(r#"{"inputs": ["a"], "inputs": ["a", "b", "c"]}"#), 3);
        assert_eq!(scan_inputs(br#"{"inputs": []}"#, b"inputs"), Some(0));
        assert_eq!(tei(r#"{"inputs": []}"#), 1);
        let openai = br#"{"model": "m", "input": ["x", "y"], "encoding_format": "float"}"#;
        assert_eq!(
            count_inputs(openai, Route::OpenAiEmbeddings, &Limits::default()),
            2
        );
    }

    #[test]
    fn where_the_scan_is_unsure_the_parser_counts() {
        // A key spelled with an escape is still "inputs".
        let escaped = r#"{"inp\u0075ts": ["a", "b"]}"#;
        assert_eq!(scan_inputs(escaped.as_bytes(), b"inputs"), None);
        assert_eq!(tei(escaped), 2);
        // Not JSON at all: one, and the handler refuses it.
        assert_eq!(tei("not json"), 1);
        assert_eq!(tei(r#"{"inputs": ["a", "b""#), 1);
        assert_eq!(scan_inputs(b"[1]", b"inputs"), None);
    }

    #[test]
    fn over_the_limit_is_a_429_unless_nothing_is_in_flight() {
        assert_eq!(admit(Flavor::Tei, 32, 32, 64).ok(), Some(32));
        let e = admit(Flavor::Tei, 32, 33, 64).unwrap_err();
        assert_eq!(e.status, 429);
        assert!(
            e.message.contains(ENV_MAX_CONCURRENT_INPUTS),
            "{}",
            e.message
        );
        assert_eq!(admit(Flavor::OpenAi, 33, 32, 64).unwrap_err().status, 429);
        // Alone, a request larger than the limit is served.
        assert_eq!(admit(Flavor::OpenAi, 2048, 0, 64).ok(), Some(2048));
    }

    #[test]
    fn every_pair_and_sentence_counts_one() {
        let n = |body: &str, route| count_inputs(body.as_bytes(), route, &Limits::default());
        assert_eq!(
            n(r#"{"query": "q", "texts": ["a", "b", "c"]}"#, Route::Rerank),
            3
        );
        let cohere = Route::CohereRerank(super::super::CohereVersion::V2);
        assert_eq!(
            n(
                r#"{"query": "q", "documents": [{"text": "a"}, "b"]}"#,
                cohere
            ),
            2
        );
        assert_eq!(n(r#"{"inputs": ["a", "b"]}"#, Route::Predict), 1);
        assert_eq!(n(r#"{"inputs": [["a", "b"], ["c"]]}"#, Route::Predict), 2);
        let sim = r#"{"inputs": {"source_sentence": "s", "sentences": ["a", "b"]}}"#;
        assert_eq!(n(sim, Route::Similarity), 3);
        assert_eq!(n(r#"{"inputs": ["a", "b"]}"#, Route::EmbedSparse), 2);
    }

    #[test]
    fn the_body_model_is_scanned_or_parsed() {
        assert_eq!(
            body_model(br#"{"input": ["a", {"x": "}"}], "model": "bge"}"#).as_deref(),
            Some("bge")
        );
        assert_eq!(body_model(br#"{"input": "a"}"#), None);
        assert_eq!(body_model(br#"{"model": 5, "input": "a"}"#), None);
        assert_eq!(body_model(br#"{"model": "a", "model": 5}"#), None);
        // Escapes: the parser reads it.
        assert_eq!(
            body_model(br#"{"model": "a\u0062c"}"#).as_deref(),
            Some("abc")
        );
        assert_eq!(body_model(b"not json"), None);
    }
}
