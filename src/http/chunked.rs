//! Incremental decoder for `Transfer-Encoding: chunked` request bodies.
//!
//! Bytes arrive in arbitrary pieces; the decoder keeps its place between
//! calls. It is strict where leniency enables smuggling: CRLF only (no bare
//! CR or LF), hex digits only, sizes that overflow are refused, and the
//! decoded total is held to the body limit. Chunk extensions and trailer
//! fields are consumed and discarded; a trailer line must be a field line
//! (`name: value`), as in the head.

use super::HttpError;

const BAD_SIZE: HttpError = HttpError::new(400, "malformed chunk size");
const BAD_LINE: HttpError = HttpError::new(400, "malformed chunk line ending");
const BAD_TRAILER: HttpError = HttpError::new(400, "malformed trailer field");
const TOO_LARGE: HttpError = HttpError::new(413, "request body too large");
/// A chunk-size line (extensions included) or trailer line longer than this
/// is an attack, not a request.
const MAX_LINE: u32 = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Reading hex digits of a chunk size.
    Size {
        digits: u32,
    },
    /// After `;`: an extension, skipped up to CR.
    Extension,
    /// Saw CR ending the size line, expecting LF.
    SizeLf,
    /// Inside chunk data.
    Data,
    /// After chunk data, expecting CR then LF.
    DataCr,
    DataLf,
    /// At the start of a trailer line (or the final empty line).
    TrailerStart,
    /// Inside a trailer field's name, up to its colon.
    TrailerName,
    /// Inside a trailer field's value.
    Trailer,
    /// Saw CR ending a trailer line.
    TrailerLf,
    /// Saw CR on an empty line: the body ends at the LF.
    EndLf,
    Done,
}

#[derive(Debug, Clone)]
pub struct ChunkedDecoder {
    state: State,
    /// Size of the current chunk, then bytes of it still to come.
    remaining: u64,
    line_len: u32,
    decoded: u64,
    max_body: u64,
}

impl ChunkedDecoder {
    pub fn new(max_body: u64) -> ChunkedDecoder {
        ChunkedDecoder {
            state: State::Size { digits: 0 },
            remaining: 0,
            line_len: 0,
            decoded: 0,
            max_body,
        }
    }

    pub fn is_done(&self) -> bool {
        self.state == State::Done
    }

    /// Decode from `input`, appending data to `out`. Returns how many input
    /// bytes were consumed; stops at the end of the body, so bytes after it
    /// (a pipelined request) are left in `input`.
    pub fn decode(&mut self, input: &[u8], out: &mut Vec<u8>) -> Result<usize, HttpError> {
        let mut i = 0;
        while i < input.len() && self.state != State::Done {
            if self.state == State::Data {
                let take = (self.remaining as usize).min(input.len() - i);
                out.extend_from_slice(&input[i..i + take]);
                i += take;
                self.remaining -= take as u64;
                if self.remaining == 0 {
                    self.state = State::DataCr;
                }
                continue;
            }
            let b = input[i];
            i += 1;
            self.step(b)?;
        }
        Ok(i)
    }

    fn step(&mut self, b: u8) -> Result<(), HttpError> {
        self.state = match self.state {
            State::Size { digits } => match b {
                b'0'..=b'9' | b'a'..=b'f' | b'A'..=b'F' => {
                    let value = (b as char).to_digit(16).unwrap_or(0) as u64;
                    if digits >= 16 || self.remaining > (u64::MAX >> 4) {
                        return Err(BAD_SIZE);
                    }
                    self.remaining = (self.remaining << 4) | value;
                    State::Size { digits: digits + 1 }
                }
                b';' if digits > 0 => {
                    self.line_len = digits;
                    State::Extension
                }
                b'\r' if digits > 0 => State::SizeLf,
                _ => return Err(BAD_SIZE),
            },
            State::Extension => match b {
                b'\r' => State::SizeLf,
                b'\n' => return Err(BAD_LINE),
                // Tab and visible characters; other controls are refused.
                b'\t' | 0x20..=0x7e | 0x80..=0xff => {
                    self.line_len += 1;
                    if self.line_len > MAX_LINE {
                        return Err(BAD_SIZE);
                    }
                    State::Extension
                }
                _ => return Err(BAD_SIZE),
            },
            State::SizeLf => {
                if b != b'\n' {
                    return Err(BAD_LINE);
                }
                if self.remaining == 0 {
                    self.line_len = 0;
                    State::TrailerStart
                } else {
                    self.decoded = self.decoded.saturating_add(self.remaining);
                    if self.decoded > self.max_body {
                        return Err(TOO_LARGE);
                    }
                    State::Data
                }
            }
            State::Data => unreachable!("data is copied in bulk by decode()"),
            State::DataCr => match b {
                b'\r' => State::DataLf,
                _ => return Err(BAD_LINE),
            },
            State::DataLf => match b {
                b'\n' => State::Size { digits: 0 },
                _ => return Err(BAD_LINE),
            },
            State::TrailerStart => match b {
                b'\r' => State::EndLf,
                b'\n' => return Err(BAD_LINE),
                // A trailer is a field line, as in the head: a token, a
                // colon, a value. Anything else is not one.
                _ if crate::http::response::is_tchar(b) => {
                    self.line_len = 1;
                    State::TrailerName
                }
                _ => return Err(BAD_TRAILER),
            },
            State::TrailerName => match b {
                b':' => State::Trailer,
                _ if crate::http::response::is_tchar(b) => {
                    self.line_len += 1;
                    if self.line_len > MAX_LINE {
                        return Err(HttpError::new(431, "trailer field too large"));
                    }
                    State::TrailerName
                }
                _ => return Err(BAD_TRAILER),
            },
            State::Trailer => match b {
                b'\r' => State::TrailerLf,
                b'\n' | 0 => return Err(BAD_LINE),
                b'\t' => State::Trailer,
                0..0x20 | 0x7f => return Err(BAD_TRAILER),
                _ => {
                    self.line_len += 1;
                    if self.line_len > MAX_LINE {
                        return Err(HttpError::new(431, "trailer field too large"));
                    }
                    State::Trailer
                }
            },
            State::TrailerLf => match b {
                b'\n' => State::TrailerStart,
                _ => return Err(BAD_LINE),
            },
            State::EndLf => match b {
                b'\n' => State::Done,
                _ => return Err(BAD_LINE),
            },
            State::Done => State::Done,
        };
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decode_all(pieces: &[&[u8]], max: u64) -> Result<(Vec<u8>, usize, bool), HttpError> {
        let mut d = ChunkedDecoder::new(max);
        let mut out = Vec::new();
        let mut consumed = 0;
        for p in pieces {
            consumed += d.decode(p, &mut out)?;
        }
        Ok((out, consumed, d.is_done()))
    }

    #[test]
    fn decodes_whole_and_leaves_the_next_request() {
        let body = b"5\r\nhello\r\n6;ext=1\r\n world\r\n0\r\n\r\nGET / HTTP/1.1";
        let (out, consumed, done) = decode_all(&[body], 100).unwrap();
        assert_eq!(out, b"hello world");
        assert!(done);
        assert_eq!(&body[consumed..], b"GET / HTTP/1.1");
    }

    #[test]
    fn decodes_one_byte_at_a_time() {
        let body = b"a\r\n0123456789\r\n1\r\nX\r\n0\r\nTrailer: v\r\n\r\n";
        let pieces: Vec<&[u8]> = body.chunks(1).collect();
        let (out, consumed, done) = decode_all(&pieces, 100).unwrap();
        assert_eq!(out, b"0123456789X");
        assert_eq!(consumed, body.len());
        assert!(done);
    }

    #[test]
    fn trailers_are_consumed_and_discarded() {
        let (out, _, done) = decode_all(&[b"3\r\nabc\r\n0\r\nA: 1\r\nB: 2\r\n\r\n"], 100).unwrap();
        assert_eq!(out, b"abc");
        assert!(done);
    }

    #[test]
    fn incomplete_is_not_done() {
        let (_, _, done) = decode_all(&[b"3\r\nabc\r\n0\r\n"], 100).unwrap();
        assert!(!done);
    }

    #[test]
    fn refuses_bad_shapes() {
        let bad: &[&[u8]] = &[
            b"ffffffffffffffffff\r\n", // overflow
            b"10000000000000000\r\n",  // 17 digits
            b"\r\n",                   // no digits
            b" 5\r\nhello\r\n",        // leading space
            b"5 \r\nhello\r\n",        // trailing space
            b"-5\r\n",                 // sign
            b"0x5\r\nhello\r\n",       // prefix
            b"5\nhello\r\n",           // bare LF after size
            b"5\rhello\r\n",           // bare CR after size
            b"5\r\nhelloXX",           // data not followed by CRLF
            b"5\r\nhello\n0\r\n\r\n",  // bare LF after data
            b"0\r\n\n",                // bare LF ending the body
            b"0\r\nA: 1\n\r\n",        // bare LF in a trailer
            b"5;a\nb\r\nhello\r\n",    // LF in an extension
            // Found by tests/fuzz_http.rs: trailer lines that are not
            // field lines.
            b"0\r\n0\r\n\r\n",            // no colon
            b"0\r\nTrailer-Aa 1\r\n\r\n", // a space in the name
            b"0\r\n: v\r\n\r\n",          // no name
            b"0\r\nA: b\x01c\r\n\r\n",    // a control byte in the value
        ];
        for shape in bad {
            assert!(
                decode_all(&[shape], 1 << 40).is_err(),
                "accepted {:?}",
                String::from_utf8_lossy(shape)
            );
        }
    }

    #[test]
    fn body_limit_counts_decoded_bytes() {
        let err = decode_all(&[b"6\r\n"], 5).unwrap_err();
        assert_eq!(err.status, 413);
        assert!(decode_all(&[b"5\r\nhello\r\n0\r\n\r\n"], 5).is_ok());
        let err = decode_all(&[b"3\r\nabc\r\n3\r\n"], 5).unwrap_err();
        assert_eq!(err.status, 413);
    }
}
