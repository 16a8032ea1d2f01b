//! The request head: request line and header fields, parsed in place with
//! httparse and then judged against RFC 9110/9112 and the server's limits.
//!
//! Every refusal is precise (400, 413, 414, 417, 431, 501, 505) and closes the
//! connection: a request whose framing is in doubt must never be answered on a
//! connection that may carry a smuggled second request.

use super::{HttpError, Span};

/// Hard ceiling on header fields: the parser's array lives on the stack.
pub const MAX_HEADERS_CEILING: usize = 256;

/// Limits on a request, each with a flag (see `config.rs`).
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    /// Bytes in the request line and header fields together (431).
    pub max_head_bytes: usize,
    /// Header fields (431).
    pub max_headers: usize,
    /// Bytes in the request-target (414).
    pub max_uri: usize,
    /// Bytes in the body, after chunked decoding (413).
    pub max_body: u64,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_head_bytes: 16 * 1024,
            max_headers: 100,
            max_uri: 8 * 1024,
            max_body: 100 * 1024 * 1024,
        }
    }
}

/// How the body is delimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BodyFraming {
    None,
    Length(u64),
    Chunked,
}

/// A parsed head. Spans point into the buffer it was parsed from.
#[derive(Debug, Clone, Default)]
pub struct RequestHead {
    /// Bytes of the buffer the head occupies, blank line included.
    pub head_len: usize,
    pub method: Span,
    pub target: Span,
    pub path: Span,
    pub query: Span,
    pub http_minor: u8,
    pub headers: Vec<(Span, Span)>,
    pub body: BodyFramingField,
    /// The client asked to keep the connection open (or did not ask to close).
    pub keep_alive: bool,
    pub expect_continue: bool,
    pub is_head_method: bool,
}

impl RequestHead {
    /// The value of the first header field called `name` (any case), as a
    /// span of `buf`, the buffer the head was parsed from.
    pub fn field(&self, buf: &[u8], name: &[u8]) -> Option<Span> {
        self.headers
            .iter()
            .find(|(n, _)| n.get(buf).eq_ignore_ascii_case(name))
            .map(|&(_, v)| v)
    }
}

/// `BodyFraming` with a default, so a `RequestHead` can be reused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyFramingField(pub BodyFraming);

impl Default for BodyFramingField {
    fn default() -> Self {
        BodyFramingField(BodyFraming::None)
    }
}

/// Parse the head at the start of `buf`. `Ok(false)` means more bytes are
/// needed. `out` is overwritten (its header vector is reused).
pub fn parse(buf: &[u8], limits: &Limits, out: &mut RequestHead) -> Result<bool, HttpError> {
    // Left uninitialised: zeroing 256 fields (8 KiB) per request was the
    // largest cost of parsing a small head.
    let mut fields =
        [const { std::mem::MaybeUninit::<httparse::Header<'_>>::uninit() }; MAX_HEADERS_CEILING];
    let field_cap = limits.max_headers.clamp(1, MAX_HEADERS_CEILING);
    let mut req = httparse::Request::new(&mut []);
    let head_len = match req.parse_with_uninit_headers(buf, &mut fields[..field_cap]) {
        Ok(httparse::Status::Complete(n)) => n,
        Ok(httparse::Status::Partial) => {
            check_partial(buf, limits)?;
            return Ok(false);
        }
        Err(e) => return Err(map_parse_error(e, buf)),
    };
    if head_len > limits.max_head_bytes {
        return Err(HttpError::new(431, "request header fields too large"));
    }
    let method = req.method.unwrap_or("");
    let target = req.path.unwrap_or("");
    if target.len() > limits.max_uri {
        return Err(HttpError::new(414, "request-target too long"));
    }
    // A URI is ASCII: raw bytes above 0x7e are a client's mistake (or an
    // attempt to make two parsers read the target differently); a real
    // client percent-encodes them.
    if !target.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(HttpError::new(400, "malformed request-target"));
    }
    out.head_len = head_len;
    out.http_minor = req.version.unwrap_or(1);
    out.method = Span::of(buf, method.as_bytes());
    out.target = Span::of(buf, target.as_bytes());
    out.is_head_method = method == "HEAD";
    split_target(buf, method, target, out)?;

    out.headers.clear();
    let mut framing = Framing::default();
    for field in req.headers.iter() {
        let name = field.name.as_bytes();
        let value = field.value;
        out.headers
            .push((Span::of(buf, name), Span::of(buf, value)));
        framing.note(name, value)?;
    }
    framing.finish(out, limits)
}

/// A head still arriving: refuse it as soon as it can no longer fit.
fn check_partial(buf: &[u8], limits: &Limits) -> Result<(), HttpError> {
    // "METHOD SP target SP HTTP/1.1 CRLF" with room for the method.
    let line_room = limits.max_uri + 32;
    if buf.len() > line_room && !buf[..line_room].contains(&b'\n') {
        return Err(HttpError::new(414, "request-target too long"));
    }
    if buf.len() > limits.max_head_bytes {
        return Err(HttpError::new(431, "request header fields too large"));
    }
    Ok(())
}

fn map_parse_error(e: httparse::Error, buf: &[u8]) -> HttpError {
    match e {
        httparse::Error::TooManyHeaders => HttpError::new(431, "too many header fields"),
        httparse::Error::Version if looks_like_other_version(buf) => {
            HttpError::new(505, "HTTP version not supported")
        }
        httparse::Error::HeaderName => HttpError::new(400, "malformed header field name"),
        httparse::Error::HeaderValue => HttpError::new(400, "malformed header field value"),
        httparse::Error::NewLine => HttpError::new(400, "malformed line ending"),
        httparse::Error::Token => HttpError::new(400, "malformed method"),
        _ => HttpError::new(400, "malformed request line"),
    }
}

/// "HTTP/2.0", "HTTP/1.2", "HTTP/3": a well-formed version we do not speak.
fn looks_like_other_version(buf: &[u8]) -> bool {
    // Empty lines before the request line are skipped, as the parser does.
    let start = buf
        .iter()
        .position(|&b| b != b'\r' && b != b'\n')
        .unwrap_or(buf.len());
    let buf = &buf[start..];
    let line_end = buf
        .iter()
        .position(|&b| b == b'\r' || b == b'\n')
        .unwrap_or(buf.len());
    let line = &buf[..line_end];
    // Method SP target SP version, single spaces: anything else is a
    // malformed line (400), not a version we do not speak.
    let parts: Vec<&[u8]> = line.split(|&b| b == b' ').collect();
    let [method, target, version] = parts[..] else {
        return false;
    };
    if method.is_empty() || target.is_empty() {
        return false;
    }
    let Some(rest) = version.strip_prefix(b"HTTP/") else {
        return false;
    };
    match rest {
        [major] => major.is_ascii_digit(),
        [major, b'.', minor] => major.is_ascii_digit() && minor.is_ascii_digit(),
        _ => false,
    }
}

/// RFC 9112 section 3.2 and RFC 3986: `uri-host [ ":" port ]`, where the
/// host is an IP literal in brackets, or a reg-name / IPv4 address made of
/// unreserved characters, percent-encodings and sub-delims. Empty is valid
/// (a target without an authority).
fn is_host_value(value: &[u8]) -> bool {
    let (host, port) = if let Some(rest) = value.strip_prefix(b"[") {
        let Some(end) = rest.iter().position(|&b| b == b']') else {
            return false;
        };
        let literal = &rest[..end];
        let ip_ok = std::str::from_utf8(literal).is_ok_and(|t| {
            t.parse::<std::net::Ipv6Addr>().is_ok()
                || (t.starts_with(['v', 'V'])
                    && t.len() > 3
                    && t.bytes()
                        .all(|b| is_unreserved(b) || is_sub_delim(b) || b == b':'))
        });
        if !ip_ok {
            return false;
        }
        (&b""[..], &rest[end + 1..])
    } else {
        match value.iter().position(|&b| b == b':') {
            Some(i) => (&value[..i], &value[i..]),
            None => (value, &b""[..]),
        }
    };
    let port_ok = match port.split_first() {
        None => true,
        Some((b':', digits)) => digits.iter().all(u8::is_ascii_digit),
        Some(_) => false,
    };
    port_ok && is_reg_name(host)
}

fn is_reg_name(host: &[u8]) -> bool {
    let mut i = 0;
    while i < host.len() {
        match host[i] {
            b'%' => {
                let hex = host.get(i + 1..i + 3);
                if !hex.is_some_and(|h| h.iter().all(u8::is_ascii_hexdigit)) {
                    return false;
                }
                i += 3;
            }
            b if is_unreserved(b) || is_sub_delim(b) => i += 1,
            _ => return false,
        }
    }
    true
}

fn is_unreserved(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~')
}

fn is_sub_delim(b: u8) -> bool {
    matches!(
        b,
        b'!' | b'$' | b'&' | b'\'' | b'(' | b')' | b'*' | b'+' | b',' | b';' | b'='
    )
}

/// Split the target into path and query (origin-form, absolute-form, `*`).
fn split_target(
    buf: &[u8],
    method: &str,
    target: &str,
    out: &mut RequestHead,
) -> Result<(), HttpError> {
    let path_and_query = if target.starts_with('/') {
        target
    } else if target == "*" {
        if method != "OPTIONS" {
            return Err(HttpError::new(400, "asterisk-form is only for OPTIONS"));
        }
        target
    } else if let Some(rest) = strip_scheme(target) {
        // absolute-form: the path starts after the authority.
        match rest.find('/') {
            Some(i) => &rest[i..],
            None => &rest[rest.len()..],
        }
    } else if method == "CONNECT" {
        return Err(HttpError::new(501, "CONNECT is not implemented"));
    } else {
        return Err(HttpError::new(400, "malformed request-target"));
    };
    let (path, query) = match path_and_query.find('?') {
        Some(i) => (&path_and_query[..i], &path_and_query[i + 1..]),
        None => (path_and_query, &path_and_query[path_and_query.len()..]),
    };
    out.path = Span::of(buf, path.as_bytes());
    out.query = Span::of(buf, query.as_bytes());
    Ok(())
}

fn strip_scheme(target: &str) -> Option<&str> {
    let lower = |p: &str| target.len() >= p.len() && target[..p.len()].eq_ignore_ascii_case(p);
    if lower("http://") {
        Some(&target[7..])
    } else if lower("https://") {
        Some(&target[8..])
    } else {
        None
    }
}

/// What the header fields say about framing and the connection.
#[derive(Default)]
struct Framing {
    hosts: u32,
    content_length: Option<u64>,
    content_length_fields: u32,
    transfer_encoding: bool,
    chunked_last: bool,
    unknown_coding: bool,
    chunked_not_last: bool,
    close: bool,
    keep_alive: bool,
    expect_continue: bool,
    expect_other: bool,
}

impl Framing {
    fn note(&mut self, name: &[u8], value: &[u8]) -> Result<(), HttpError> {
        if name.eq_ignore_ascii_case(b"host") {
            self.hosts += 1;
            if !is_host_value(value) {
                return Err(HttpError::new(400, "malformed Host header"));
            }
        } else if name.eq_ignore_ascii_case(b"content-length") {
            self.content_length_fields += 1;
            if self.content_length_fields > 1 {
                return Err(HttpError::new(400, "repeated Content-Length"));
            }
            self.content_length = Some(parse_content_length(value)?);
        } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
            self.transfer_encoding = true;
            // An empty element (`chunked,`, `, chunked`) is where parsers
            // part ways on framing: refused rather than skipped.
            if value.split(|&b| b == b',').any(|t| trim(t).is_empty()) {
                return Err(HttpError::new(400, "malformed Transfer-Encoding"));
            }
            for coding in tokens(value) {
                if self.chunked_last {
                    // Anything after chunked means chunked was not last.
                    self.chunked_not_last = true;
                }
                if coding.eq_ignore_ascii_case(b"chunked") {
                    self.chunked_last = true;
                } else {
                    // `identity` too: RFC 9112 no longer registers it, and
                    // a parser that skips it while another does not frames
                    // the body differently.
                    self.chunked_last = false;
                    self.unknown_coding = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"connection") {
            for option in tokens(value) {
                if option.eq_ignore_ascii_case(b"close") {
                    self.close = true;
                } else if option.eq_ignore_ascii_case(b"keep-alive") {
                    self.keep_alive = true;
                }
            }
        } else if name.eq_ignore_ascii_case(b"expect") {
            if trim(value).eq_ignore_ascii_case(b"100-continue") {
                self.expect_continue = true;
            } else {
                self.expect_other = true;
            }
        }
        Ok(())
    }

    fn finish(self, out: &mut RequestHead, limits: &Limits) -> Result<bool, HttpError> {
        let http11 = out.http_minor == 1;
        if http11 && self.hosts == 0 {
            return Err(HttpError::new(400, "missing Host header"));
        }
        if self.hosts > 1 {
            return Err(HttpError::new(400, "repeated Host header"));
        }
        let framing = if self.transfer_encoding {
            if self.content_length_fields > 0 {
                return Err(HttpError::new(
                    400,
                    "both Content-Length and Transfer-Encoding",
                ));
            }
            if !http11 {
                return Err(HttpError::new(
                    400,
                    "Transfer-Encoding in an HTTP/1.0 request",
                ));
            }
            if self.chunked_not_last || !self.chunked_last {
                return Err(HttpError::new(
                    400,
                    "Transfer-Encoding does not end in chunked",
                ));
            }
            if self.unknown_coding {
                return Err(HttpError::new(501, "transfer coding not implemented"));
            }
            BodyFraming::Chunked
        } else {
            match self.content_length {
                Some(0) | None => BodyFraming::None,
                Some(n) if n > limits.max_body => {
                    return Err(HttpError::new(413, "request body too large"));
                }
                Some(n) => BodyFraming::Length(n),
            }
        };
        if http11 && self.expect_other {
            return Err(HttpError::new(417, "unsupported expectation"));
        }
        out.body = BodyFramingField(framing);
        out.keep_alive = if http11 {
            !self.close
        } else {
            self.keep_alive && !self.close
        };
        out.expect_continue = http11 && self.expect_continue && framing != BodyFraming::None;
        Ok(true)
    }
}

/// Content-Length is 1*DIGIT and nothing else: no sign, no list, no spaces
/// inside, no overflow.
fn parse_content_length(value: &[u8]) -> Result<u64, HttpError> {
    const BAD: HttpError = HttpError::new(400, "malformed Content-Length");
    let digits = trim(value);
    if digits.is_empty() || digits.len() > 19 {
        return Err(BAD);
    }
    let mut n: u64 = 0;
    for &b in digits {
        if !b.is_ascii_digit() {
            return Err(BAD);
        }
        n = n * 10 + u64::from(b - b'0');
    }
    Ok(n)
}

/// Comma-separated list elements, trimmed of optional whitespace, empty
/// elements skipped (RFC 9110 section 5.6.1).
fn tokens(value: &[u8]) -> impl Iterator<Item = &[u8]> {
    value
        .split(|&b| b == b',')
        .map(trim)
        .filter(|t| !t.is_empty())
}

fn trim(mut s: &[u8]) -> &[u8] {
    while let [b' ' | b'\t', rest @ ..] = s {
        s = rest;
    }
    while let [rest @ .., b' ' | b'\t'] = s {
        s = rest;
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Result<Option<RequestHead>, HttpError> {
        let mut head = RequestHead::default();
        parse(s.as_bytes(), &Limits::default(), &mut head).map(|done| done.then_some(head))
    }

    fn status_of(s: &str) -> u16 {
        match parse_str(s) {
            Err(e) => e.status,
            Ok(Some(_)) => 200,
            Ok(None) => 0,
        }
    }

    #[test]
    fn simple_get_is_parsed_in_place() {
        let raw = "GET /a/b?x=1&y HTTP/1.1\r\nHost: h\r\nX-A: 1\r\n\r\nrest";
        let head = parse_str(raw).unwrap().unwrap();
        let b = raw.as_bytes();
        assert_eq!(head.method.get(b), b"GET");
        assert_eq!(head.target.get(b), b"/a/b?x=1&y");
        assert_eq!(head.path.get(b), b"/a/b");
        assert_eq!(head.query.get(b), b"x=1&y");
        assert_eq!(head.head_len, raw.len() - 4);
        assert_eq!(head.headers.len(), 2);
        assert!(head.keep_alive);
        assert_eq!(head.body.0, BodyFraming::None);
    }

    #[test]
    fn partial_head_asks_for_more() {
        assert_eq!(status_of("GET / HTTP/1.1\r\nHost: h\r\n"), 0);
    }

    #[test]
    fn absolute_form_and_asterisk() {
        let raw = "GET http://example.com/p?q HTTP/1.1\r\nHost: example.com\r\n\r\n";
        let head = parse_str(raw).unwrap().unwrap();
        assert_eq!(head.path.get(raw.as_bytes()), b"/p");
        assert_eq!(head.query.get(raw.as_bytes()), b"q");
        assert_eq!(status_of("OPTIONS * HTTP/1.1\r\nHost: h\r\n\r\n"), 200);
        assert_eq!(status_of("GET * HTTP/1.1\r\nHost: h\r\n\r\n"), 400);
        assert_eq!(status_of("CONNECT h:443 HTTP/1.1\r\nHost: h\r\n\r\n"), 501);
    }

    #[test]
    fn content_length_and_chunked_framing() {
        let head = parse_str("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 5\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.body.0, BodyFraming::Length(5));
        let head = parse_str("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.body.0, BodyFraming::Chunked);
        let head = parse_str("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: Chunked\r\n\r\n")
            .unwrap()
            .unwrap();
        assert_eq!(head.body.0, BodyFraming::Chunked);
        // Found by tests/fuzz_http.rs: `identity` is no coding any more
        // (h11 refuses it too).
        assert_eq!(
            status_of("POST / HTTP/1.1\r\nHost: h\r\nTransfer-Encoding: identity, chunked\r\n\r\n"),
            501
        );
    }

    #[test]
    fn smuggling_shapes_are_refused() {
        let h = "POST / HTTP/1.1\r\nHost: h\r\n";
        // Content-Length with Transfer-Encoding.
        assert_eq!(
            status_of(&format!(
                "{h}Content-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n"
            )),
            400
        );
        // Duplicate Content-Length, even when equal, and a list.
        assert_eq!(
            status_of(&format!(
                "{h}Content-Length: 3\r\nContent-Length: 3\r\n\r\n"
            )),
            400
        );
        assert_eq!(status_of(&format!("{h}Content-Length: 3, 3\r\n\r\n")), 400);
        // Malformed Content-Length.
        for bad in ["+3", "-1", "0x10", "3 3", "", "99999999999999999999", "1e3"] {
            assert_eq!(
                status_of(&format!("{h}Content-Length: {bad}\r\n\r\n")),
                400,
                "CL {bad:?}"
            );
        }
        // Transfer-Encoding whose last coding is not chunked.
        assert_eq!(
            status_of(&format!("{h}Transfer-Encoding: chunked, gzip\r\n\r\n")),
            400
        );
        assert_eq!(
            status_of(&format!("{h}Transfer-Encoding: gzip\r\n\r\n")),
            400
        );
        assert_eq!(
            status_of(&format!(
                "{h}Transfer-Encoding: chunked\r\nTransfer-Encoding: identity\r\n\r\n"
            )),
            400
        );
        // Found by tests/fuzz_http.rs: empty list elements.
        for te in ["chunked,", ", chunked", "gzip,,chunked", ""] {
            assert_eq!(
                status_of(&format!("{h}Transfer-Encoding: {te}\r\n\r\n")),
                400,
                "{te:?}"
            );
        }
        // A coding we do not implement, chunked last.
        assert_eq!(
            status_of(&format!("{h}Transfer-Encoding: gzip, chunked\r\n\r\n")),
            501
        );
        // Transfer-Encoding on HTTP/1.0.
        assert_eq!(
            status_of("POST / HTTP/1.0\r\nTransfer-Encoding: chunked\r\n\r\n"),
            400
        );
        // Bare CR, whitespace before the colon, obs-fold.
        assert_eq!(status_of("GET / HTTP/1.1\r\nHost: h\rX: y\r\n\r\n"), 400);
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A : y\r\n\r\n"),
            400
        );
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: y\r\n  folded\r\n\r\n"),
            400
        );
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: h\r\nX-A: a\0b\r\n\r\n"),
            400
        );
    }

    #[test]
    fn host_rules() {
        assert_eq!(status_of("GET / HTTP/1.1\r\n\r\n"), 400);
        assert_eq!(
            status_of("GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n"),
            400
        );
        assert_eq!(status_of("GET / HTTP/1.0\r\n\r\n"), 200);
    }

    #[test]
    fn versions() {
        assert_eq!(status_of("GET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505);
        assert_eq!(status_of("GET / HTTP/1.2\r\nHost: h\r\n\r\n"), 505);
        assert_eq!(status_of("GET / HTTP/3\r\nHost: h\r\n\r\n"), 505);
        assert_eq!(status_of("GET / FTP/1.1\r\nHost: h\r\n\r\n"), 400);
        assert_eq!(status_of("GET / HTTP/1.1 extra\r\nHost: h\r\n\r\n"), 400);
    }

    #[test]
    fn keep_alive_defaults_by_version() {
        let ka = |s: &str| parse_str(s).unwrap().unwrap().keep_alive;
        assert!(ka("GET / HTTP/1.1\r\nHost: h\r\n\r\n"));
        assert!(!ka(
            "GET / HTTP/1.1\r\nHost: h\r\nConnection: close\r\n\r\n"
        ));
        assert!(!ka("GET / HTTP/1.0\r\n\r\n"));
        assert!(ka("GET / HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n"));
    }

    #[test]
    fn expectations() {
        let h = parse_str(
            "POST / HTTP/1.1\r\nHost: h\r\nExpect: 100-continue\r\nContent-Length: 2\r\n\r\n",
        )
        .unwrap()
        .unwrap();
        assert!(h.expect_continue);
        assert_eq!(
            status_of("POST / HTTP/1.1\r\nHost: h\r\nExpect: teapot\r\nContent-Length: 2\r\n\r\n"),
            417
        );
    }

    #[test]
    fn limits() {
        let limits = Limits {
            max_head_bytes: 200,
            max_headers: 4,
            max_uri: 50,
            max_body: 10,
        };
        let run = |s: &str| {
            let mut head = RequestHead::default();
            match parse(s.as_bytes(), &limits, &mut head) {
                Err(e) => e.status,
                Ok(true) => 200,
                Ok(false) => 0,
            }
        };
        assert_eq!(
            run(&format!(
                "GET /{} HTTP/1.1\r\nHost: h\r\n\r\n",
                "a".repeat(60)
            )),
            414
        );
        // Still arriving, but already longer than any allowed request line.
        assert_eq!(run(&format!("GET /{}", "a".repeat(100))), 414);
        assert_eq!(
            run(&format!(
                "GET / HTTP/1.1\r\nHost: h\r\nX: {}\r\n",
                "v".repeat(300)
            )),
            431
        );
        assert_eq!(
            run("GET / HTTP/1.1\r\nHost: h\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\n\r\n"),
            431
        );
        assert_eq!(
            run("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 11\r\n\r\n"),
            413
        );
        assert_eq!(
            run("POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 10\r\n\r\n"),
            200
        );
    }

    #[test]
    fn reused_head_inherits_nothing() {
        let mut head = RequestHead::default();
        let limits = Limits::default();
        let first = b"POST / HTTP/1.1\r\nHost: h\r\nContent-Length: 3\r\nExpect: 100-continue\r\nConnection: close\r\n\r\n";
        assert!(parse(first, &limits, &mut head).unwrap());
        let second = b"GET /x HTTP/1.1\r\nHost: h\r\n\r\n";
        assert!(parse(second, &limits, &mut head).unwrap());
        assert_eq!(head.body.0, BodyFraming::None);
        assert!(!head.expect_continue);
        assert!(head.keep_alive);
        assert_eq!(head.headers.len(), 1);
    }

    #[test]
    fn the_request_line_is_three_parts_with_single_spaces() {
        for bad in [
            "GET  / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /  HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/1.1 \r\nHost: h\r\n\r\n",
            "GET\t/ HTTP/1.1\r\nHost: h\r\n\r\n",
            " GET / HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / http/1.1\r\nHost: h\r\n\r\n",
            "GET /\u{e9} HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET /\x7f HTTP/1.1\r\nHost: h\r\n\r\n",
            "GET / HTTP/2.0 x\r\nHost: h\r\n\r\n",
        ] {
            assert_eq!(status_of(bad), 400, "{bad:?}");
        }
        // Empty lines before it are skipped (RFC 9112 section 2.2).
        assert_eq!(status_of("\r\nGET / HTTP/1.1\r\nHost: h\r\n\r\n"), 200);
        assert_eq!(status_of("\r\nGET / HTTP/2.0\r\nHost: h\r\n\r\n"), 505);
        // Visible ASCII the URI grammar leaves out is still one target.
        assert_eq!(status_of("GET /a\"b{c} HTTP/1.1\r\nHost: h\r\n\r\n"), 200);
    }

    #[test]
    fn host_is_uri_host_and_an_optional_port() {
        for good in [
            "h",
            "",
            "example.com:8080",
            "h:",
            "127.0.0.1",
            "[::1]:8080",
            "[v1.fe80::a+en1]",
            "xn--caf-dma.example",
            "a%2Db",
            "!$&'()*+,;=",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {good}\r\n\r\n");
            assert_eq!(status_of(&raw), 200, "{good:?}");
        }
        for bad in [
            "a b", "a/b", "h:80:80", "h:8o", "[::1", "[::g]", "[::1]x", "a%2", "a%zz", "user@h",
            "h?x",
        ] {
            let raw = format!("GET / HTTP/1.1\r\nHost: {bad}\r\n\r\n");
            assert_eq!(status_of(&raw), 400, "{bad:?}");
        }
    }
}
