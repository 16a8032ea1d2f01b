//! TEI's `POST /embed_sparse` reply: a SPLADE model's nonzero entries per
//! input (the request is `/embed_all`'s, [`super::parse_embed_all`]).

use super::error::{ApiError, Flavor};
use super::json::{write_f32, write_usize};

/// Writes `[[{"index", "value"}, ...], ...]`: per input, its nonzero
/// entries in ascending index, as the model gives them.
pub fn write_sparse(vectors: &[Vec<(u32, f32)>], out: &mut Vec<u8>) -> Result<(), ApiError> {
    let mut buf = ryu::Buffer::new();
    out.push(b'[');
    for (n, v) in vectors.iter().enumerate() {
        if n > 0 {
            out.push(b',');
        }
        out.push(b'[');
        for (k, &(index, value)) in v.iter().enumerate() {
            if !value.is_finite() {
                return Err(ApiError::internal(
                    Flavor::Tei,
                    &format!("the model gave {value} at index {index} of input {n}"),
                ));
            }
            if k > 0 {
                out.push(b',');
            }
            out.extend_from_slice(b"{\"index\":");
            write_usize(index as usize, out);
            out.extend_from_slice(b",\"value\":");
            write_f32(value, &mut buf, out);
            out.push(b'}');
        }
        out.push(b']');
    }
    out.push(b']');
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_per_input() {
        let mut out = Vec::new();
        write_sparse(&[vec![(3, 0.5), (70, 1.25)], vec![]], &mut out).unwrap();
        assert_eq!(
            String::from_utf8(out).unwrap(),
            r#"[[{"index":3,"value":0.5},{"index":70,"value":1.25}],[]]"#
        );
        let mut out = Vec::new();
        assert_eq!(
            write_sparse(&[vec![(1, f32::NAN)]], &mut out)
                .unwrap_err()
                .status,
            500
        );
    }
}
