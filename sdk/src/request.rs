//! The request of a call: borrowed views of what the host parsed, and the
//! body as a reader.

use std::io;

use m0serve_abi::{
    M0_REQ_HTTPS, M0_REQ_ON_LOOP, M0Header, M0Request, M0SockAddr, M0Str, REQUEST_QUEUED_END,
    covers,
};

use crate::{Error, Host};

/// The request being handled. Every view borrows from the host and lives
/// as long as the call.
pub struct Request<'a> {
    raw: &'a M0Request,
    pub(crate) host: &'static Host,
}

/// A socket address as text.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Addr<'a> {
    /// "127.0.0.1", "::1".
    pub ip: &'a str,
    pub port: u16,
}

fn view<'a>(s: &M0Str) -> &'a [u8] {
    // SAFETY: every view in a request points to `len` bytes that the host
    // keeps alive until the call returns, which outlives 'a (the request's
    // borrow of the call); a NULL view has length 0.
    unsafe { s.as_bytes() }
}

fn text<'a>(s: &M0Str) -> &'a str {
    // The host wrote these from a parsed address, so they are ASCII.
    std::str::from_utf8(view(s)).unwrap_or("")
}

impl<'a> Request<'a> {
    /// # Safety
    /// `raw` is the host's request for the call in progress.
    pub(crate) unsafe fn new(raw: &'a M0Request, host: &'static Host) -> Request<'a> {
        Request { raw, host }
    }

    /// The raw request, for a bridge that hands views to another runtime.
    pub fn raw(&self) -> &'a M0Request {
        self.raw
    }

    /// The method, as sent ("GET").
    pub fn method(&self) -> &'a [u8] {
        view(&self.raw.method)
    }

    /// The request-target exactly as sent ("/a%20b?x=1").
    pub fn target(&self) -> &'a [u8] {
        view(&self.raw.target)
    }

    /// The path part of the target, still percent-encoded.
    pub fn path(&self) -> &'a [u8] {
        view(&self.raw.path)
    }

    /// The path as text, or `None` when it is not UTF-8.
    pub fn path_str(&self) -> Option<&'a str> {
        std::str::from_utf8(self.path()).ok()
    }

    /// The query without the `?` (empty when there is none).
    pub fn query(&self) -> &'a [u8] {
        view(&self.raw.query)
    }

    /// The value of `key` in the query (`a=1&b=2`), undecoded; the first
    /// when it repeats.
    pub fn query_param(&self, key: &str) -> Option<&'a [u8]> {
        self.query().split(|&b| b == b'&').find_map(|pair| {
            let (k, v) = match pair.iter().position(|&b| b == b'=') {
                Some(at) => (&pair[..at], &pair[at + 1..]),
                None => (pair, &pair[pair.len()..]),
            };
            (k == key.as_bytes()).then_some(v)
        })
    }

    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub fn http_minor(&self) -> u32 {
        self.raw.http_minor
    }

    /// The headers in the order they arrived, names as sent.
    pub fn headers(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + 'a {
        let all: &'a [M0Header] = if self.raw.header_count == 0 || self.raw.headers.is_null() {
            &[]
        } else {
            // SAFETY: the host hands `header_count` headers at `headers`,
            // alive for the call.
            unsafe { std::slice::from_raw_parts(self.raw.headers, self.raw.header_count) }
        };
        all.iter().map(|h| (view(&h.name), view(&h.value)))
    }

    /// The first header named `name`, compared without regard to ASCII case.
    pub fn header(&self, name: &str) -> Option<&'a [u8]> {
        self.headers()
            .find(|(n, _)| n.eq_ignore_ascii_case(name.as_bytes()))
            .map(|(_, v)| v)
    }

    /// The header as text, when it is UTF-8.
    pub fn header_str(&self, name: &str) -> Option<&'a str> {
        self.header(name).and_then(|v| std::str::from_utf8(v).ok())
    }

    /// The body's length in bytes (the host has framed and de-chunked it).
    pub fn content_length(&self) -> u64 {
        self.raw.content_length
    }

    pub fn peer(&self) -> Addr<'a> {
        addr(&self.raw.peer)
    }

    /// The address the connection arrived on.
    pub fn server(&self) -> Addr<'a> {
        addr(&self.raw.server)
    }

    /// The worker process serving the call.
    pub fn worker_index(&self) -> u32 {
        self.raw.worker_index
    }

    /// The calling thread's index: below the host's `max_handler_threads + 1`,
    /// for per-thread state kept in an array.
    pub fn thread_index(&self) -> u32 {
        self.raw.thread_index
    }

    /// Whether this call runs on the event loop (see
    /// [`Description::inline`](crate::Description::inline)): a request that
    /// would block then returns [`Error::DEFER`].
    pub fn on_loop(&self) -> bool {
        let end = core::mem::offset_of!(M0Request, flags) + size_of::<u32>();
        covers(self.raw.size, end) && self.raw.flags & M0_REQ_ON_LOOP != 0
    }

    /// Whether the client used https, as a proxy the server trusts says
    /// (`--forwarded-allow-ips`; ABI 1.4). `peer` is then that client.
    pub fn https(&self) -> bool {
        let end = core::mem::offset_of!(M0Request, flags) + size_of::<u32>();
        covers(self.raw.size, end) && self.raw.flags & M0_REQ_HTTPS != 0
    }

    /// When the host had this request whole and queued it for the plugin,
    /// on [`Host::now_ns`]'s clock (ABI 1.5); `None` from an older host.
    /// `host.now_ns() - queued_ns` is how long it has waited.
    pub fn queued_ns(&self) -> Option<u64> {
        if covers(self.raw.size, REQUEST_QUEUED_END) && self.raw.queued_ns != 0 {
            Some(self.raw.queued_ns)
        } else {
            None
        }
    }

    /// The body, as a reader. Reading is sequential: two readers share one
    /// position.
    pub fn body(&self) -> Body<'a> {
        Body {
            raw: self.raw,
            host: self.host,
        }
    }

    /// The whole body, up to `limit` bytes; `Err(Error::TOO_LARGE)` past it,
    /// before reading anything.
    pub fn read_body(&self, limit: usize) -> Result<Vec<u8>, Error> {
        if self.content_length() > limit as u64 {
            return Err(Error::TOO_LARGE);
        }
        let mut out = vec![0; self.content_length() as usize];
        let mut at = 0;
        let mut body = self.body();
        while at < out.len() {
            match body.read_some(&mut out[at..])? {
                0 => break,
                n => at += n,
            }
        }
        out.truncate(at);
        Ok(out)
    }
}

fn addr<'a>(a: &M0SockAddr) -> Addr<'a> {
    Addr {
        ip: text(&a.ip),
        port: a.port,
    }
}

/// The request body; reading returns 0 at its end.
pub struct Body<'a> {
    raw: &'a M0Request,
    host: &'static Host,
}

impl Body<'_> {
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize, Error> {
        // SAFETY: `raw` is the request of the call in progress (the borrow
        // says so).
        unsafe { read_body(self.host, self.raw, buf) }
    }
}

/// One `body_read` into `buf`: the count, 0 at the end.
///
/// # Safety
/// `raw` is the request of the call in progress.
unsafe fn read_body(host: &Host, raw: *const M0Request, buf: &mut [u8]) -> Result<usize, Error> {
    if buf.is_empty() {
        return Ok(0);
    }
    // SAFETY: the caller's request; `buf` is writable for its length.
    let n = unsafe { (host.body_read)(raw, buf.as_mut_ptr(), buf.len()) };
    if n >= 0 {
        Ok((n as usize).min(buf.len()))
    } else {
        Err(Error::from_code(n as i32).unwrap_or(Error::INTERNAL))
    }
}

impl io::Read for Body<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        Ok(self.read_some(buf)?)
    }
}

impl<'a> Request<'a> {
    /// The body as a handle without a lifetime, for a bridge whose runtime
    /// keeps the reader in its own objects (the WSGI plugin's `wsgi.input`).
    ///
    /// # Safety
    /// The handle must not be used after this call has returned: drop it or
    /// [`RawBody::invalidate`] it first.
    pub unsafe fn detach_body(&self) -> RawBody {
        RawBody {
            raw: self.raw,
            host: self.host,
        }
    }
}

/// The body without a lifetime (see [`Request::detach_body`]); reads after
/// [`RawBody::invalidate`] are refused with [`Error::STATE`].
pub struct RawBody {
    raw: *const M0Request,
    host: &'static Host,
}

// SAFETY: `body_read` may be called from any thread; the handle is valid
// only during its call, which `detach_body`'s caller ensures.
unsafe impl Send for RawBody {}
// SAFETY: as for Send; `&self` methods change nothing.
unsafe impl Sync for RawBody {}

impl RawBody {
    /// Reads up to `buf.len()` bytes; 0 at the end of the body.
    pub fn read(&self, buf: &mut [u8]) -> Result<usize, Error> {
        if self.raw.is_null() {
            return Err(Error::STATE);
        }
        // SAFETY: a live request of the call in progress (detach_body's
        // contract).
        unsafe { read_body(self.host, self.raw, buf) }
    }

    /// Every later read is refused.
    pub fn invalidate(&mut self) {
        self.raw = std::ptr::null();
    }

    pub fn is_valid(&self) -> bool {
        !self.raw.is_null()
    }
}
