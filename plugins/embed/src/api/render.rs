//! Response bodies for embeddings, written into a reused buffer.
//!
//! Embeddings come in as one flat row-major `&[f32]`, `dim` floats per
//! input. Floats are written as the shortest decimal that parses back to the
//! same f32 (ryu), with no allocation per float. A NaN or infinity, which
//! JSON cannot carry, makes the whole reply an [`ApiError::internal`] and
//! leaves `out` as it was.

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_str, write_usize};
use super::request::Encoding;

/// Writes TEI's `/embed` reply, `[[f32; dim], ...]`, appending to `out`.
///
/// `embeddings.len()` must be a multiple of `dim` (`dim` > 0).
pub fn write_tei(embeddings: &[f32], dim: usize, out: &mut Vec<u8>) -> Result<(), ApiError> {
    check(embeddings, dim, Flavor::Tei)?;
    out.reserve(embeddings.len() * 12 + 2);
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (i, row) in embeddings.chunks_exact(dim).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        write_row(row, &mut buf, out);
    }
    out.push(b']');
    Ok(())
}

/// Writes OpenAI's `/v1/embeddings` reply, appending to `out`:
/// `{"object":"list","data":[{"object":"embedding","index":i,"embedding":...}],
/// "model":model,"usage":{"prompt_tokens":n,"total_tokens":n}}`.
///
/// `model` is what to echo: the request's `model` if it sent one, else the
/// served model's id. `embedding` is an array of numbers, or with
/// [`Encoding::Base64`] a base64 string (standard alphabet, padded) of the
/// little-endian f32 bytes, which is what openai-python decodes
/// (`np.frombuffer(base64.b64decode(s), dtype="float32")`).
pub fn write_openai(
    embeddings: &[f32],
    dim: usize,
    encoding: Encoding,
    model: &str,
    prompt_tokens: usize,
    out: &mut Vec<u8>,
) -> Result<(), ApiError> {
    check(embeddings, dim, Flavor::OpenAi)?;
    let per_float = match encoding {
        Encoding::Float => 12,
        Encoding::Base64 => 6,
    };
    out.reserve(embeddings.len() * per_float + 128 + model.len());
    let mut buf = ryu::Buffer::new();
    out.extend_from_slice(b"{\"object\":\"list\",\"data\":[");
    for (i, row) in embeddings.chunks_exact(dim).enumerate() {
        if i > 0 {
            out.push(b',');
        }
        out.extend_from_slice(b"{\"object\":\"embedding\",\"index\":");
        write_usize(i, out);
        out.extend_from_slice(b",\"embedding\":");
        match encoding {
            Encoding::Float => write_row(row, &mut buf, out),
            Encoding::Base64 => {
                out.push(b'"');
                write_base64_f32le(row, out);
                out.push(b'"');
            }
        }
        out.push(b'}');
    }
    out.extend_from_slice(b"],\"model\":");
    write_str(model, out);
    out.extend_from_slice(b",\"usage\":{\"prompt_tokens\":");
    write_usize(prompt_tokens, out);
    out.extend_from_slice(b",\"total_tokens\":");
    write_usize(prompt_tokens, out);
    out.extend_from_slice(b"}}");
    Ok(())
}

/// Applies OpenAI's `dimensions`: keeps the first `keep` of each `dim`-wide
/// row, in place, and with `renormalize` scales each shortened row to unit
/// L2 length (as TEI does). Returns the new row width. `keep` >= `dim`
/// changes nothing.
pub fn shrink_rows(embeddings: &mut Vec<f32>, dim: usize, keep: usize, renormalize: bool) -> usize {
    if dim == 0 || keep >= dim || keep == 0 {
        return dim;
    }
    let rows = embeddings.len() / dim;
    for r in 0..rows {
        embeddings.copy_within(r * dim..r * dim + keep, r * keep);
    }
    embeddings.truncate(rows * keep);
    if renormalize {
        for row in embeddings.chunks_exact_mut(keep) {
            let norm = row.iter().map(|x| x * x).sum::<f32>().sqrt();
            if norm > 0.0 {
                row.iter_mut().for_each(|x| *x /= norm);
            }
        }
    }
    keep
}

fn check(embeddings: &[f32], dim: usize, flavor: Flavor) -> Result<(), ApiError> {
    if dim == 0 || !embeddings.len().is_multiple_of(dim) {
        return Err(ApiError::internal(
            flavor,
            &format!(
                "{} floats do not split into rows of {dim}",
                embeddings.len()
            ),
        ));
    }
    if let Some(i) = embeddings.iter().position(|x| !x.is_finite()) {
        return Err(ApiError::internal(
            flavor,
            &format!(
                "the model produced {} at component {} of embedding {}",
                embeddings[i],
                i % dim,
                i / dim
            ),
        ));
    }
    Ok(())
}

fn write_row(row: &[f32], buf: &mut ryu::Buffer, out: &mut Vec<u8>) {
    out.push(b'[');
    for (j, &x) in row.iter().enumerate() {
        if j > 0 {
            out.push(b',');
        }
        write_f32(x, buf, out);
    }
    out.push(b']');
}

const B64: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

/// Appends standard padded base64 of the little-endian bytes of `row`.
fn write_base64_f32le(row: &[f32], out: &mut Vec<u8>) {
    // 3 floats = 12 bytes = 16 base64 characters, with no carry between
    // groups; the tail (1 or 2 floats) goes through the general path.
    let mut groups = row.chunks_exact(3);
    for g in &mut groups {
        let mut bytes = [0u8; 12];
        for (k, x) in g.iter().enumerate() {
            bytes[k * 4..k * 4 + 4].copy_from_slice(&x.to_le_bytes());
        }
        encode_base64(&bytes, out);
    }
    let tail = groups.remainder();
    let mut bytes = [0u8; 8];
    for (k, x) in tail.iter().enumerate() {
        bytes[k * 4..k * 4 + 4].copy_from_slice(&x.to_le_bytes());
    }
    encode_base64(&bytes[..tail.len() * 4], out);
}

fn encode_base64(bytes: &[u8], out: &mut Vec<u8>) {
    let mut chunks = bytes.chunks_exact(3);
    for c in &mut chunks {
        let n = (c[0] as u32) << 16 | (c[1] as u32) << 8 | c[2] as u32;
        out.extend_from_slice(&[
            B64[(n >> 18) as usize & 63],
            B64[(n >> 12) as usize & 63],
            B64[(n >> 6) as usize & 63],
            B64[n as usize & 63],
        ]);
    }
    match *chunks.remainder() {
        [a] => {
            let n = (a as u32) << 16;
            out.extend_from_slice(&[
                B64[(n >> 18) as usize & 63],
                B64[(n >> 12) as usize & 63],
                b'=',
                b'=',
            ]);
        }
        [a, b] => {
            let n = (a as u32) << 16 | (b as u32) << 8;
            out.extend_from_slice(&[
                B64[(n >> 18) as usize & 63],
                B64[(n >> 12) as usize & 63],
                B64[(n >> 6) as usize & 63],
                b'=',
            ]);
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    fn decode_base64(s: &str) -> Vec<u8> {
        let val = |c: u8| B64.iter().position(|&b| b == c).unwrap() as u32;
        let s = s.as_bytes();
        assert_eq!(s.len() % 4, 0, "padded");
        let mut out = Vec::new();
        for q in s.chunks(4) {
            let pad = q.iter().filter(|&&c| c == b'=').count();
            let mut n = 0u32;
            for &c in &q[..4 - pad] {
                n = n << 6 | val(c);
            }
            n <<= 6 * pad as u32;
            let b = [(n >> 16) as u8, (n >> 8) as u8, n as u8];
            out.extend_from_slice(&b[..3 - pad]);
        }
        out
    }

    #[test]
    fn tei_shape_and_exact_round_trip() {
        let e = [
            0.1f32,
            -0.0,
            1.0,
            f32::MIN_POSITIVE,
            f32::MAX,
            -f32::MAX,
            1e-45,
            0.333_333_34,
            123_456_790.0,
            -2.5e-7,
        ];
        let mut out = b"keep".to_vec();
        write_tei(&e, 5, &mut out).unwrap();
        assert!(out.starts_with(b"keep["));
        let v: Vec<Vec<f64>> = serde_json::from_slice(&out[4..]).unwrap();
        assert_eq!(v.len(), 2);
        let flat: Vec<f32> = v.into_iter().flatten().map(|x| x as f32).collect();
        for (a, b) in flat.iter().zip(e.iter()) {
            assert_eq!(a.to_bits() & 0x7fff_ffff, b.to_bits() & 0x7fff_ffff);
        }
        // Text round trip as f32 directly, for every float.
        let text = std::str::from_utf8(&out[5..out.len() - 1]).unwrap();
        let nums: Vec<f32> = text
            .split([',', '[', ']'])
            .filter(|s| !s.is_empty())
            .map(|s| s.parse().unwrap())
            .collect();
        assert_eq!(nums.len(), e.len());
        for (a, b) in nums.iter().zip(e.iter()) {
            assert_eq!(a.to_bits(), b.to_bits());
        }
    }

    #[test]
    fn shortest_repr_for_common_values() {
        let mut out = Vec::new();
        write_tei(&[0.1, 0.5, 1.0, -0.25], 4, &mut out).unwrap();
        assert_eq!(out, b"[[0.1,0.5,1.0,-0.25]]");
    }

    #[test]
    fn nan_and_inf_are_internal_errors_and_leave_out_untouched() {
        for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
            let mut out = b"prefix".to_vec();
            let e = write_tei(&[0.0, bad], 2, &mut out).unwrap_err();
            assert_eq!(e.status, 500);
            assert_eq!(e.flavor, Flavor::Tei);
            assert!(e.message.contains("component 1 of embedding 0"));
            assert_eq!(out, b"prefix");
            let e = write_openai(&[bad, 0.0], 1, Encoding::Base64, "m", 1, &mut out).unwrap_err();
            assert_eq!(e.status, 500);
            assert_eq!(e.flavor, Flavor::OpenAi);
            assert!(e.message.contains("embedding 0"));
            assert_eq!(out, b"prefix");
        }
    }

    #[test]
    fn ragged_input_is_internal_error() {
        let mut out = Vec::new();
        assert_eq!(
            write_tei(&[1.0, 2.0, 3.0], 2, &mut out).unwrap_err().status,
            500
        );
        assert_eq!(write_tei(&[], 0, &mut out).unwrap_err().status, 500);
        assert!(out.is_empty());
    }

    #[test]
    fn openai_float_shape() {
        let mut out = Vec::new();
        write_openai(
            &[0.5, -1.0, 0.25, 2.0],
            2,
            Encoding::Float,
            "all-MiniLM-L6-v2",
            7,
            &mut out,
        )
        .unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["object"], "list");
        assert_eq!(v["model"], "all-MiniLM-L6-v2");
        assert_eq!(v["usage"]["prompt_tokens"], 7);
        assert_eq!(v["usage"]["total_tokens"], 7);
        let data = v["data"].as_array().unwrap();
        assert_eq!(data.len(), 2);
        assert_eq!(data[1]["object"], "embedding");
        assert_eq!(data[1]["index"], 1);
        assert_eq!(data[1]["embedding"], serde_json::json!([0.25, 2.0]));
    }

    #[test]
    fn openai_base64_round_trip_of_known_floats() {
        // 1.0f32 is 00 00 80 3f little-endian: "AACAPw==".
        let mut out = Vec::new();
        write_openai(&[1.0], 1, Encoding::Base64, "m", 1, &mut out).unwrap();
        let v: Value = serde_json::from_slice(&out).unwrap();
        assert_eq!(v["data"][0]["embedding"], "AACAPw==");
        // Every tail length (dim % 3 == 0, 1, 2) and odd values.
        let vals = [
            1.0f32,
            -2.0,
            0.1,
            f32::MIN_POSITIVE,
            -0.0,
            3.402_823_5e38,
            1e-45,
        ];
        for dim in 1..=vals.len() {
            let rows: Vec<f32> = vals[..dim]
                .iter()
                .chain(vals[..dim].iter().rev())
                .copied()
                .collect();
            let mut out = Vec::new();
            write_openai(&rows, dim, Encoding::Base64, "m\"x", 3, &mut out).unwrap();
            let v: Value = serde_json::from_slice(&out).unwrap();
            assert_eq!(v["model"], "m\"x");
            for (r, item) in v["data"].as_array().unwrap().iter().enumerate() {
                let bytes = decode_base64(item["embedding"].as_str().unwrap());
                assert_eq!(bytes.len(), dim * 4);
                let back: Vec<f32> = bytes
                    .chunks_exact(4)
                    .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
                    .collect();
                let want = &rows[r * dim..(r + 1) * dim];
                assert!(
                    back.iter()
                        .zip(want)
                        .all(|(a, b)| a.to_bits() == b.to_bits())
                );
            }
        }
    }

    #[test]
    fn base64_matches_rfc4648_vectors() {
        for (input, want) in [
            (&b""[..], ""),
            (b"f", "Zg=="),
            (b"fo", "Zm8="),
            (b"foo", "Zm9v"),
            (b"foob", "Zm9vYg=="),
            (b"fooba", "Zm9vYmE="),
            (b"foobar", "Zm9vYmFy"),
        ] {
            let mut out = Vec::new();
            encode_base64(input, &mut out);
            assert_eq!(out, want.as_bytes());
        }
    }

    #[test]
    fn shrink_rows_keeps_prefix_and_renormalizes() {
        let mut e = vec![3.0, 4.0, 9.0, 0.0, 2.0, 9.0];
        assert_eq!(shrink_rows(&mut e, 3, 2, true), 2);
        assert_eq!(e, [0.6, 0.8, 0.0, 1.0]);
        let mut e = vec![3.0, 4.0, 9.0];
        assert_eq!(shrink_rows(&mut e, 3, 2, false), 2);
        assert_eq!(e, [3.0, 4.0]);
        let mut e = vec![1.0, 2.0];
        assert_eq!(shrink_rows(&mut e, 2, 5, true), 2);
        assert_eq!(e, [1.0, 2.0]);
    }

    #[test]
    fn big_batch_renders_valid_json() {
        let dim = 384;
        let rows = 32;
        let e: Vec<f32> = (0..dim * rows).map(|i| (i as f32 * 0.37).sin()).collect();
        let mut out = Vec::new();
        write_tei(&e, dim, &mut out).unwrap();
        let v: Vec<Vec<f32>> = serde_json::from_slice(&out).unwrap();
        assert_eq!(v.len(), rows);
        assert!(
            v.iter()
                .flatten()
                .zip(&e)
                .all(|(a, b)| a.to_bits() == b.to_bits())
        );
        // Reuse: a second render into a cleared buffer does not grow it.
        let cap = out.capacity();
        out.clear();
        write_tei(&e, dim, &mut out).unwrap();
        assert_eq!(out.capacity(), cap);
    }
}
