//! TEI's token routes: `POST /tokenize` (a text's tokens with their byte
//! offsets), `POST /decode` (token ids back to text) and `POST
//! /embed_all` (every token's vector, before pooling): their request
//! bodies and replies.

use serde_json::Value;

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_str, write_usize};
use super::request::{
    EmbedCall, Encoding, Inputs, Limits, describe, opt_bool, parse_object, prompt_name,
    take_inputs, truncation_direction, whole,
};

/// A `/tokenize` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizeCall {
    /// The texts, at most [`Limits::max_client_batch_size`].
    pub inputs: Vec<String>,
    /// Add the model's special tokens (`[CLS]`, `[SEP]`); default true.
    pub add_special_tokens: bool,
    /// Prepend this prompt of the model's (as `/embed` would).
    pub prompt_name: Option<String>,
}

/// A `/decode` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DecodeCall {
    /// Token-id sequences, each id in the vocabulary.
    pub ids: Vec<Vec<u32>>,
    /// Leave special tokens out of the text; default true.
    pub skip_special_tokens: bool,
}

/// Parses `POST /tokenize`: `{"inputs": str | [str], "add_special_tokens"?:
/// bool, "prompt_name"?: str}`.
pub fn parse_tokenize(body: &[u8], limits: &Limits) -> Result<TokenizeCall, ApiError> {
    let flavor = Flavor::Tei;
    let mut obj = parse_object(body, limits, flavor)?;
    // Texts only: ids are what this route gives, not what it takes.
    let texts = Limits {
        accept_token_ids: false,
        ..limits.clone()
    };
    let inputs = match take_inputs(obj.remove("inputs"), "inputs", &texts, flavor)? {
        Inputs::Texts(t) => t,
        Inputs::Ids(_) => return Err(ApiError::token_ids(flavor)),
    };
    let add_special_tokens =
        opt_bool(obj.get("add_special_tokens"), "add_special_tokens", flavor)?.unwrap_or(true);
    Ok(TokenizeCall {
        inputs,
        add_special_tokens,
        prompt_name: prompt_name(obj.get("prompt_name"), flavor)?,
    })
}

/// Parses `POST /decode`: `{"ids": [int] | [[int]], "skip_special_tokens"?:
/// bool}`; every id below [`Limits::vocab`].
pub fn parse_decode(body: &[u8], limits: &Limits) -> Result<DecodeCall, ApiError> {
    let flavor = Flavor::Tei;
    let obj = parse_object(body, limits, flavor)?;
    let shape = "a list of token ids or a list of such lists";
    let items = match obj.get("ids") {
        None | Some(Value::Null) => {
            return Err(ApiError::invalid(
                flavor,
                "ids",
                format!("missing field `ids`: send {shape} to decode"),
            ));
        }
        Some(Value::Array(items)) if !items.is_empty() => items,
        Some(Value::Array(_)) => return Err(empty_ids()),
        Some(v) => {
            return Err(ApiError::invalid(
                flavor,
                "ids",
                format!("`ids` must be {shape}, got {}", describe(v)),
            ));
        }
    };
    let lists: Vec<&[Value]> = if items.iter().all(Value::is_number) {
        vec![items.as_slice()]
    } else {
        let mut lists = Vec::with_capacity(items.len());
        for (i, item) in items.iter().enumerate() {
            match item {
                Value::Array(ids) if !ids.is_empty() && ids.iter().all(Value::is_number) => {
                    lists.push(ids.as_slice())
                }
                Value::Array(ids) if ids.is_empty() => return Err(empty_ids()),
                v => {
                    return Err(ApiError::invalid(
                        flavor,
                        "ids",
                        format!(
                            "`ids` item {i} must be a list of token ids, got {}; send {shape}",
                            describe(v)
                        ),
                    ));
                }
            }
        }
        lists
    };
    if lists.len() > limits.max_client_batch_size {
        return Err(ApiError::too_many(
            flavor,
            lists.len(),
            limits.max_client_batch_size,
        ));
    }
    let mut ids = Vec::with_capacity(lists.len());
    for (index, list) in lists.into_iter().enumerate() {
        let mut seq = Vec::with_capacity(list.len());
        for (position, v) in list.iter().enumerate() {
            let id = match v {
                Value::Number(n) => whole(n).filter(|&id| id < limits.vocab as u64),
                _ => None,
            };
            match id {
                Some(id) => seq.push(id as u32),
                None => {
                    return Err(ApiError::token_id_out_of_vocabulary(
                        flavor,
                        index,
                        position,
                        &v.to_string(),
                        limits.vocab,
                    )
                    .with_param("ids"));
                }
            }
        }
        ids.push(seq);
    }
    let skip_special_tokens = opt_bool(
        obj.get("skip_special_tokens"),
        "skip_special_tokens",
        flavor,
    )?
    .unwrap_or(true);
    Ok(DecodeCall {
        ids,
        skip_special_tokens,
    })
}

fn empty_ids() -> ApiError {
    let mut e = ApiError::empty_input(Flavor::Tei);
    e.message = "`ids` is empty: send a non-empty list of token ids".into();
    e.with_param("ids")
}

/// Parses `POST /embed_all`: `{"inputs": ..., "truncate"?: bool,
/// "truncation_direction"?: "Right" | "Left", "prompt_name"?: str}`, as
/// `/embed` takes them; the vectors are the tokens' own, never normalized.
pub fn parse_embed_all(body: &[u8], limits: &Limits) -> Result<EmbedCall, ApiError> {
    let flavor = Flavor::Tei;
    let mut obj = parse_object(body, limits, flavor)?;
    let inputs = take_inputs(obj.remove("inputs"), "inputs", limits, flavor)?;
    let truncate =
        opt_bool(obj.get("truncate"), "truncate", flavor)?.unwrap_or(limits.auto_truncate);
    Ok(EmbedCall {
        inputs,
        normalize: false,
        truncate,
        truncation_direction: truncation_direction(obj.get("truncation_direction"), flavor)?,
        encoding: Encoding::Float,
        model: None,
        flavor,
        dimensions: None,
        prompt_name: prompt_name(obj.get("prompt_name"), flavor)?,
    })
}

/// One token of `/tokenize`'s reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenOut<'a> {
    pub id: u32,
    pub text: &'a str,
    pub special: bool,
    /// Byte offsets in the input; `null` for a special token.
    pub span: Option<(usize, usize)>,
}

/// Writes `/tokenize`'s reply: per input, a list of `{"id", "text",
/// "special", "start", "stop"}`.
pub fn write_tokens<'a>(inputs: impl IntoIterator<Item = Vec<TokenOut<'a>>>, out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, tokens) in inputs.into_iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (j, t) in tokens.iter().enumerate() {
            if j > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"id\":");
            write_usize(t.id as usize, out);
            out.extend_from_slice(b",\"text\":");
            write_str(t.text, out);
            out.extend_from_slice(if t.special {
                b",\"special\":true"
            } else {
                b",\"special\":false"
            });
            match t.span {
                Some((start, stop)) => {
                    out.extend_from_slice(b",\"start\":");
                    write_usize(start, out);
                    out.extend_from_slice(b",\"stop\":");
                    write_usize(stop, out);
                }
                None => out.extend_from_slice(b",\"start\":null,\"stop\":null"),
            }
            out.push(b'}');
        }
        out.push(b']');
    }
    out.push(b']');
}

/// Writes `/decode`'s reply: a list of strings.
pub fn write_decoded(texts: &[String], out: &mut Vec<u8>) {
    out.push(b'[');
    for (i, t) in texts.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_str(t, out);
    }
    out.push(b']');
}

/// Writes `/embed_all`'s reply, `[inputs][tokens][dim]`: `states` holds
/// every input's token vectors one after another, `lens[i]` tokens of
/// input `i`, `dim` floats each. A NaN or infinity is an
/// [`ApiError::internal`], `out` left as it was.
pub fn write_embed_all(
    states: &[f32],
    lens: &[usize],
    dim: usize,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    let total: usize = lens.iter().sum();
    if dim == 0 || states.len() != total * dim {
        return Err(ApiError::internal(
            Flavor::Tei,
            &format!("{} floats are not {total} tokens of {dim}", states.len()),
        ));
    }
    if let Some(i) = states.iter().position(|x| !x.is_finite()) {
        return Err(ApiError::internal(
            Flavor::Tei,
            &format!("the model produced {} in a token vector", states[i]),
        ));
    }
    let mut buf = ryu::Buffer::new();
    let mut rows = states.chunks_exact(dim);
    out.reserve(states.len() * 12 + 2);
    out.push(b'[');
    for (i, &n) in lens.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for j in 0..n {
            if j > 0 {
                out.push(b',');
            }
            out.push(b'[');
            let row = rows.next().unwrap_or_default();
            for (k, &x) in row.iter().enumerate() {
                if k > 0 {
                    out.push(b',');
                }
                write_f32(x, &mut buf, out);
            }
            out.push(b']');
        }
        out.push(b']');
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn limits() -> Limits {
        Limits {
            vocab: 100,
            ..Limits::default()
        }
    }

    #[test]
    fn tokenize_takes_tei_fields() {
        let c = parse_tokenize(br#"{"inputs": "a b"}"#, &limits()).unwrap();
        assert_eq!(c.inputs, ["a b"]);
        assert!(c.add_special_tokens);
        let c = parse_tokenize(
            br#"{"inputs": ["x", "y"], "add_special_tokens": false, "prompt_name": "query"}"#,
            &limits(),
        )
        .unwrap();
        assert_eq!(c.inputs, ["x", "y"]);
        assert!(!c.add_special_tokens);
        assert_eq!(c.prompt_name.as_deref(), Some("query"));
        let e = parse_tokenize(br#"{"inputs": [1, 2]}"#, &limits()).unwrap_err();
        assert_eq!(e.status, 422);
        let e =
            parse_tokenize(br#"{"inputs": "x", "add_special_tokens": 1}"#, &limits()).unwrap_err();
        assert_eq!((e.status, e.param), (422, Some("add_special_tokens")));
    }

    #[test]
    fn decode_takes_one_or_many_id_lists_in_the_vocabulary() {
        let c = parse_decode(br#"{"ids": [1, 2, 3]}"#, &limits()).unwrap();
        assert_eq!(c.ids, [vec![1, 2, 3]]);
        assert!(c.skip_special_tokens);
        let c = parse_decode(
            br#"{"ids": [[1], [4.0, 5]], "skip_special_tokens": false}"#,
            &limits(),
        )
        .unwrap();
        assert_eq!(c.ids, [vec![1], vec![4, 5]]);
        assert!(!c.skip_special_tokens);
        let e = parse_decode(br#"{"ids": [1, 100]}"#, &limits()).unwrap_err();
        assert_eq!(e.status, 422);
        assert!(e.message.contains("token id 100") && e.message.contains("0 to 99"));
        for body in [&br#"{"ids": []}"#[..], br#"{"ids": [[]]}"#] {
            assert_eq!(parse_decode(body, &limits()).unwrap_err().status, 400);
        }
        for body in [&br#"{"ids": "1"}"#[..], br#"{}"#, br#"{"ids": [[1], "a"]}"#] {
            assert_eq!(parse_decode(body, &limits()).unwrap_err().status, 422);
        }
        let many = format!(r#"{{"ids": [{}]}}"#, vec!["[1]"; 33].join(","));
        let e = parse_decode(many.as_bytes(), &limits()).unwrap_err();
        assert_eq!(e.status, 413);
    }

    #[test]
    fn replies_are_teis_shapes() {
        let mut out = Vec::new();
        write_tokens(
            [vec![
                TokenOut {
                    id: 101,
                    text: "[CLS]",
                    special: true,
                    span: None,
                },
                TokenOut {
                    id: 7,
                    text: "h\"i",
                    special: false,
                    span: Some((0, 3)),
                },
            ]],
            &mut out,
        );
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(
            v,
            serde_json::json!([[
                {"id": 101, "text": "[CLS]", "special": true, "start": null, "stop": null},
                {"id": 7, "text": "h\"i", "special": false, "start": 0, "stop": 3}
            ]])
        );
        let mut out = Vec::new();
        write_decoded(&["a".into(), "b c".into()], &mut out);
        assert_eq!(out, br#"["a","b c"]"#);
        let mut out = Vec::new();
        write_embed_all(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], &[2, 1], 2, &mut out).unwrap();
        assert_eq!(out, b"[[[1.0,2.0],[3.0,4.0]],[[5.0,6.0]]]");
        assert!(write_embed_all(&[1.0], &[1], 2, &mut Vec::new()).is_err());
        assert!(write_embed_all(&[f32::NAN, 0.0], &[1], 2, &mut Vec::new()).is_err());
    }
}
