//! The response head. Written into a reusable buffer and sent with the body
//! in one vectored write.

use std::io::Write;

/// How the response body is delimited on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyLength {
    /// `Content-Length: n`.
    Sized(u64),
    /// `Transfer-Encoding: chunked` (HTTP/1.1 only).
    Chunked,
    /// HTTP/1.0 with an unknown length: the body ends when the connection
    /// closes.
    UntilClose,
    /// 1xx, 204 and 304 carry no body and no length.
    NoBody,
}

impl BodyLength {
    /// The framing for `status`, a declared length (negative: unknown), and
    /// the request's HTTP minor version.
    pub fn choose(status: u16, declared: i64, http_minor: u8) -> BodyLength {
        if status < 200 || status == 204 || status == 304 {
            BodyLength::NoBody
        } else if declared >= 0 {
            BodyLength::Sized(declared as u64)
        } else if http_minor >= 1 {
            BodyLength::Chunked
        } else {
            BodyLength::UntilClose
        }
    }
}

/// Headers the server writes itself; a plugin may not set them.
pub fn is_hop_or_framing_header(name: &[u8]) -> bool {
    [
        &b"content-length"[..],
        b"transfer-encoding",
        b"connection",
        b"date",
        b"keep-alive",
        b"upgrade",
    ]
    .iter()
    .any(|h| name.eq_ignore_ascii_case(h))
}

/// A field name is a token; a value has no CR, LF or NUL.
pub fn is_valid_field(name: &[u8], value: &[u8]) -> bool {
    !name.is_empty()
        && name.iter().all(|&b| is_tchar(b))
        && value.iter().all(|&b| b != b'\r' && b != b'\n' && b != 0)
}

pub fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

pub fn reason(status: u16) -> &'static str {
    match status {
        100 => "Continue",
        101 => "Switching Protocols",
        200 => "OK",
        201 => "Created",
        202 => "Accepted",
        204 => "No Content",
        206 => "Partial Content",
        301 => "Moved Permanently",
        302 => "Found",
        303 => "See Other",
        304 => "Not Modified",
        307 => "Temporary Redirect",
        308 => "Permanent Redirect",
        400 => "Bad Request",
        401 => "Unauthorized",
        403 => "Forbidden",
        404 => "Not Found",
        405 => "Method Not Allowed",
        408 => "Request Timeout",
        409 => "Conflict",
        410 => "Gone",
        411 => "Length Required",
        413 => "Content Too Large",
        414 => "URI Too Long",
        415 => "Unsupported Media Type",
        417 => "Expectation Failed",
        418 => "I'm a teapot",
        422 => "Unprocessable Content",
        429 => "Too Many Requests",
        431 => "Request Header Fields Too Large",
        500 => "Internal Server Error",
        501 => "Not Implemented",
        502 => "Bad Gateway",
        503 => "Service Unavailable",
        504 => "Gateway Timeout",
        505 => "HTTP Version Not Supported",
        _ => "",
    }
}

/// A reason phrase as RFC 9112 allows it (tab, space, visible ASCII,
/// obs-text), at most `M0_REASON_MAX` bytes.
pub fn is_valid_reason(reason: &[u8]) -> bool {
    reason.len() <= m0serve_abi::M0_REASON_MAX
        && reason
            .iter()
            .all(|&b| b == b'\t' || b == b' ' || b.is_ascii_graphic() || b >= 0x80)
}

/// Write the status line and the server's own headers, then the plugin's.
/// The caller has validated `headers` with `is_valid_field`, and `reason`
/// (the standard phrase when `None`) with `is_valid_reason`.
pub fn write_head<'h>(
    out: &mut Vec<u8>,
    http_minor: u8,
    status: u16,
    reason_phrase: Option<&[u8]>,
    length: BodyLength,
    keep_alive: bool,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) {
    out.extend_from_slice(if http_minor == 0 {
        b"HTTP/1.0 "
    } else {
        b"HTTP/1.1 "
    });
    let mut code = [b'0'; 3];
    code[0] += (status / 100 % 10) as u8;
    code[1] += (status / 10 % 10) as u8;
    code[2] += (status % 10) as u8;
    out.extend_from_slice(&code);
    out.push(b' ');
    out.extend_from_slice(reason_phrase.unwrap_or(reason(status).as_bytes()));
    out.extend_from_slice(b"\r\nServer: m0serve\r\nDate: ");
    super::date::with_now(|d| out.extend_from_slice(d));
    out.extend_from_slice(b"\r\n");
    match length {
        BodyLength::Sized(n) => {
            let _ = write!(out, "Content-Length: {n}\r\n");
        }
        BodyLength::Chunked => out.extend_from_slice(b"Transfer-Encoding: chunked\r\n"),
        BodyLength::UntilClose | BodyLength::NoBody => {}
    }
    let keep_alive = keep_alive && length != BodyLength::UntilClose;
    if !keep_alive {
        out.extend_from_slice(b"Connection: close\r\n");
    } else if http_minor == 0 {
        out.extend_from_slice(b"Connection: keep-alive\r\n");
    }
    for (name, value) in headers {
        out.extend_from_slice(name);
        out.extend_from_slice(b": ");
        out.extend_from_slice(value);
        out.extend_from_slice(b"\r\n");
    }
    out.extend_from_slice(b"\r\n");
}

/// A complete plain-text response the server sends itself (errors, 503).
pub fn simple(
    out: &mut Vec<u8>,
    http_minor: u8,
    status: u16,
    body: &str,
    keep_alive: bool,
    extra: &[(&[u8], &[u8])],
) {
    let mut text = String::with_capacity(body.len() + 1);
    text.push_str(body);
    text.push('\n');
    write_head(
        out,
        http_minor,
        status,
        None,
        BodyLength::Sized(text.len() as u64),
        keep_alive,
        [(&b"Content-Type"[..], &b"text/plain; charset=utf-8"[..])]
            .into_iter()
            .chain(extra.iter().copied()),
    );
    out.extend_from_slice(text.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn head(http_minor: u8, status: u16, len: BodyLength, ka: bool) -> String {
        let mut out = Vec::new();
        write_head(
            &mut out,
            http_minor,
            status,
            None,
            len,
            ka,
            [(&b"X-A"[..], &b"1"[..])].into_iter(),
        );
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn a_reason_phrase_given_replaces_the_standard_one() {
        let mut out = Vec::new();
        let reason = Some(&b"Totally Custom"[..]);
        write_head(
            &mut out,
            1,
            299,
            reason,
            BodyLength::Sized(0),
            true,
            [].into_iter(),
        );
        assert!(out.starts_with(b"HTTP/1.1 299 Totally Custom\r\nServer: m0serve\r\n"));
    }

    #[test]
    fn a_reason_phrase_holds_no_line_breaks_or_controls() {
        assert!(is_valid_reason(b"Totally Custom"));
        assert!(is_valid_reason("Ça va\t!".as_bytes()));
        assert!(is_valid_reason(b""));
        assert!(!is_valid_reason(b"OK\r\nX-Injected: 1"));
        assert!(!is_valid_reason(b"OK\0"));
        assert!(!is_valid_reason(&[b'a'; 257]));
        assert!(is_valid_reason(&[b'a'; 256]));
    }

    #[test]
    fn sized_keep_alive_11() {
        let h = head(1, 200, BodyLength::Sized(5), true);
        assert!(h.starts_with("HTTP/1.1 200 OK\r\nServer: m0serve\r\nDate: "));
        assert!(h.contains("\r\nContent-Length: 5\r\n"));
        assert!(!h.contains("Connection"));
        assert!(h.ends_with("X-A: 1\r\n\r\n"));
    }

    #[test]
    fn chunked_and_close() {
        let h = head(1, 200, BodyLength::Chunked, false);
        assert!(h.contains("Transfer-Encoding: chunked\r\n"));
        assert!(h.contains("Connection: close\r\n"));
    }

    #[test]
    fn http10_keep_alive_and_until_close() {
        assert!(head(0, 200, BodyLength::Sized(1), true).contains("Connection: keep-alive\r\n"));
        let h = head(0, 200, BodyLength::UntilClose, true);
        assert!(h.starts_with("HTTP/1.0 200 OK"));
        assert!(h.contains("Connection: close\r\n"));
        assert!(!h.contains("Content-Length"));
    }

    #[test]
    fn framing_choice() {
        assert_eq!(BodyLength::choose(204, 10, 1), BodyLength::NoBody);
        assert_eq!(BodyLength::choose(304, -1, 1), BodyLength::NoBody);
        assert_eq!(BodyLength::choose(200, -1, 1), BodyLength::Chunked);
        assert_eq!(BodyLength::choose(200, -1, 0), BodyLength::UntilClose);
        assert_eq!(BodyLength::choose(200, 0, 1), BodyLength::Sized(0));
    }

    #[test]
    fn field_validation() {
        assert!(is_valid_field(b"X-Ok", b"a b\tc"));
        assert!(!is_valid_field(b"X-Bad", b"a\r\nInjected: 1"));
        assert!(!is_valid_field(b"X Bad", b"v"));
        assert!(!is_valid_field(b"", b"v"));
        assert!(!is_valid_field(b"X", b"a\0"));
        assert!(is_hop_or_framing_header(b"Content-LENGTH"));
    }
}
