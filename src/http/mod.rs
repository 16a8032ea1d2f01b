//! HTTP/1.1 framing: the request head, chunked bodies, the response head and
//! the Date header. Pure functions over byte slices, no I/O, so every shape of
//! bad input has a unit test here and an integration test over a real socket.

pub mod chunked;
pub mod cors;
pub mod date;
pub mod forwarded;
pub mod head;
pub mod response;

/// A request the server refuses before any plugin sees it. The connection is
/// closed after the response.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpError {
    pub status: u16,
    /// Why, in a few words; sent as the response body and logged.
    pub detail: &'static str,
}

impl HttpError {
    pub const fn new(status: u16, detail: &'static str) -> HttpError {
        HttpError { status, detail }
    }
}

/// A byte range into the connection's read buffer. The head is parsed in
/// place; spans let the buffer move between threads without copying or
/// borrowing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub start: u32,
    pub end: u32,
}

impl Span {
    pub fn of(base: &[u8], part: &[u8]) -> Span {
        let start = part.as_ptr() as usize - base.as_ptr() as usize;
        Span {
            start: start as u32,
            end: (start + part.len()) as u32,
        }
    }

    pub fn get<'a>(&self, buf: &'a [u8]) -> &'a [u8] {
        &buf[self.start as usize..self.end as usize]
    }

    pub fn len(&self) -> usize {
        (self.end - self.start) as usize
    }

    pub fn is_empty(&self) -> bool {
        self.start == self.end
    }
}
