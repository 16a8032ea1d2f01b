//! The few JSON writing primitives the renderers share: strings, floats,
//! integers, appended to a caller's buffer without allocating.

/// Appends `s` as a JSON string literal (quotes included).
pub(crate) fn write_str(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.reserve(s.len() + 2);
    out.push(b'"');
    let bytes = s.as_bytes();
    let mut start = 0;
    for (i, &b) in bytes.iter().enumerate() {
        let esc: &[u8] = match b {
            b'"' => b"\\\"",
            b'\\' => b"\\\\",
            b'\n' => b"\\n",
            b'\r' => b"\\r",
            b'\t' => b"\\t",
            0x00..=0x1f => b"",
            _ => continue,
        };
        out.extend_from_slice(&bytes[start..i]);
        if esc.is_empty() {
            out.extend_from_slice(b"\\u00");
            out.push(HEX[(b >> 4) as usize]);
            out.push(HEX[(b & 0xf) as usize]);
        } else {
            out.extend_from_slice(esc);
        }
        start = i + 1;
    }
    out.extend_from_slice(&bytes[start..]);
    out.push(b'"');
}

/// Appends the shortest decimal that parses back to exactly `x`. The caller
/// has checked that `x` is finite.
#[inline]
pub(crate) fn write_f32(x: f32, buf: &mut ryu::Buffer, out: &mut Vec<u8>) {
    out.extend_from_slice(buf.format_finite(x).as_bytes());
}

/// Appends `n` in decimal.
pub(crate) fn write_usize(n: usize, out: &mut Vec<u8>) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut n = n;
    loop {
        i -= 1;
        digits[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    out.extend_from_slice(&digits[i..]);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_escape_to_valid_json() {
        for s in [
            "",
            "plain",
            "quo\"te",
            "back\\slash",
            "ctl\u{1}\u{1f}\n\r\t",
            "unicode é 日本 🦀",
        ] {
            let mut out = Vec::new();
            write_str(s, &mut out);
            let back: String = serde_json::from_slice(&out).unwrap();
            assert_eq!(back, s);
        }
    }

    #[test]
    fn usize_digits() {
        for n in [0usize, 7, 10, 512, usize::MAX] {
            let mut out = Vec::new();
            write_usize(n, &mut out);
            assert_eq!(out, n.to_string().as_bytes());
        }
    }
}
