//! `start_response`, `write()` and sending the application's iterable.
//!
//! Sized bodies (a Content-Length from the app, or a list/tuple of bytes) go
//! out in one `response_send` when they are one piece; other iterables are
//! streamed chunked as they are produced. `close()` is always called.

use m0serve_abi::{M0_ERR_DISCONNECTED, M0_ERR_INTERNAL, M0_LENGTH_UNKNOWN, M0_OK};
use m0serve_plugin::{Error, Header, Length, RawResponse};
use pyo3::exceptions::{PyOSError, PyRuntimeError, PyTypeError, PyValueError};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyIterator, PyList, PyString, PyTuple};

use crate::host;
use m0_pyhost::gil;

/// Writes at least this large release the GIL while the host sends them,
/// so a slow client does not stall the other handler threads.
const DETACH_WRITE_MIN: usize = 64 * 1024;
/// A list of several small pieces is joined and sent in one call up to this.
const JOIN_MAX: usize = 64 * 1024;
/// Headers kept on the stack when calling the host.
const INLINE_HEADERS: usize = 24;

/// The ABI code of a host call's result.
fn code(result: Result<(), Error>) -> i32 {
    result.err().map_or(M0_OK, Error::code)
}

/// Header buffers kept by a handler thread between requests, so a request
/// allocates none: (latin-1 bytes, offsets).
pub type HeaderBuffers = (Vec<u8>, Vec<[u32; 4]>);

/// Buffers grown past this (an app with huge headers) are not kept.
const RECYCLE_MAX: usize = 16 * 1024;

/// Outcome of a host write.
enum Wrote {
    Ok,
    /// The declared Content-Length is reached: nothing more can be sent.
    Full,
    Err(i32),
}

/// The `start_response` callable handed to the application; also holds the
/// response state shared with the `write()` callable and the body sender.
#[pyclass(module = "m0serve", name = "StartResponse", freelist = 64)]
pub struct StartResponse {
    /// The response of the `handle` call in progress; invalidated before it
    /// returns.
    resp: RawResponse,
    /// 0 until `start_response` is called.
    status: u16,
    /// The app's reason phrase ("Totally Custom" of "299 Totally Custom"),
    /// sent as given; the buffer is kept from request to request.
    reason: String,
    /// Latin-1 bytes of header names and values...
    hbuf: Vec<u8>,
    /// ...and (name start, name len, value start, value len) into `hbuf`.
    hdrs: Vec<[u32; 4]>,
    /// The application's Content-Length, passed to the host as the length.
    declared: Option<u64>,
    head_sent: bool,
    finished: bool,
    sent: u64,
    /// Set when a host call failed (the client went away, a timeout).
    host_error: Option<i32>,
    warned_overflow: bool,
    /// A HEAD request: the head goes out with the length the body would
    /// have, and no body bytes are written.
    head_request: bool,
}

fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// Hop-by-hop headers (RFC 9110 7.6.1) a WSGI app must not send, and the
/// ones the host frames itself.
fn host_owned(name: &[u8]) -> bool {
    const NAMES: [&str; 10] = [
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
        "date",
    ];
    NAMES
        .iter()
        .any(|n| name.eq_ignore_ascii_case(n.as_bytes()))
}

/// Appends the latin-1 bytes of `s` to `out`.
fn push_latin1(s: &Bound<'_, PyString>, out: &mut Vec<u8>, what: &str) -> PyResult<()> {
    if let Ok(text) = s.to_str()
        && text.is_ascii()
    {
        out.extend_from_slice(text.as_bytes());
        return Ok(());
    }
    let encoded = s
        .call_method1(intern!(s.py(), "encode"), (intern!(s.py(), "latin-1"),))
        .map_err(|_| {
            PyValueError::new_err(format!(
                "{what} {:?} is not latin-1: encode it per PEP 3333",
                s.to_string()
            ))
        })?;
    out.extend_from_slice(encoded.cast::<PyBytes>()?.as_bytes());
    Ok(())
}

/// Parses "200 OK" (a reason phrase is optional) into the code, and the
/// phrase into `reason`.
fn parse_status(status: &Bound<'_, PyAny>, reason: &mut String) -> PyResult<u16> {
    let s = status.cast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "start_response(): status must be str, not {}",
            status
                .get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        ))
    })?;
    let text = s.to_cow()?;
    let b = text.as_bytes();
    let bad = || PyValueError::new_err(format!("start_response(): malformed status {text:?}"));
    if b.len() < 3 || !b[..3].iter().all(u8::is_ascii_digit) {
        return Err(bad());
    }
    if b.len() > 3 && b[3] != b' ' {
        return Err(bad());
    }
    if b.iter().any(|&c| c < 0x20 && c != b'\t' || c == 0x7f) {
        return Err(bad());
    }
    let code = u16::from(b[0] - b'0') * 100 + u16::from(b[1] - b'0') * 10 + u16::from(b[2] - b'0');
    if !(100..=599).contains(&code) {
        return Err(bad());
    }
    reason.clear();
    reason.push_str(text.get(4..).unwrap_or(""));
    Ok(code)
}

fn parse_content_length(v: &[u8]) -> Option<u64> {
    let v = v.trim_ascii();
    if v.is_empty() || v.len() > 19 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(v).ok()?.parse().ok()
}

/// Validated headers, ready to replace the current ones.
struct ParsedHeaders {
    hbuf: Vec<u8>,
    hdrs: Vec<[u32; 4]>,
    declared: Option<u64>,
}

fn parse_headers(
    headers: &Bound<'_, PyAny>,
    reuse: (Vec<u8>, Vec<[u32; 4]>),
) -> PyResult<ParsedHeaders> {
    let (mut hbuf, mut hdrs) = reuse;
    hbuf.clear();
    hdrs.clear();
    let mut declared = None;
    let items: Vec<Bound<'_, PyAny>> = if let Ok(l) = headers.cast::<PyList>() {
        l.iter().collect()
    } else if let Ok(t) = headers.cast::<PyTuple>() {
        t.iter().collect()
    } else {
        return Err(PyTypeError::new_err(format!(
            "start_response(): headers must be a list of (name, value) tuples, not {}",
            headers.get_type().name()?
        )));
    };
    for item in &items {
        let pair = item.cast::<PyTuple>().ok().filter(|t| t.len() == 2);
        let (name, value) = match pair {
            Some(t) => (t.get_item(0)?, t.get_item(1)?),
            None => {
                return Err(PyTypeError::new_err(format!(
                    "start_response(): each header must be a (name, value) tuple, got {}",
                    item.repr()?
                )));
            }
        };
        let (Ok(name), Ok(value)) = (name.cast::<PyString>(), value.cast::<PyString>()) else {
            return Err(PyTypeError::new_err(format!(
                "start_response(): header names and values must be str, got {}",
                item.repr()?
            )));
        };
        let ns = hbuf.len();
        push_latin1(name, &mut hbuf, "header name")?;
        let ne = hbuf.len();
        if ns == ne || !hbuf[ns..ne].iter().copied().all(is_tchar) {
            return Err(PyValueError::new_err(format!(
                "start_response(): invalid header name {:?} (CR, LF, NUL, spaces and \
                 separators are not allowed)",
                name.to_string()
            )));
        }
        let vs = hbuf.len();
        push_latin1(value, &mut hbuf, "header value")?;
        let ve = hbuf.len();
        if hbuf[vs..ve]
            .iter()
            .any(|&c| c < 0x20 && c != b'\t' || c == 0x7f)
        {
            return Err(PyValueError::new_err(format!(
                "start_response(): header {:?} has a control character (CR, LF, NUL...) \
                 in its value {:?}",
                name.to_string(),
                value.to_string()
            )));
        }
        // Optional whitespace around a field value is not part of it (RFC
        // 9110 5.5); Django's Set-Cookie values start with a space.
        let is_ows = |c: &&u8| **c == b' ' || **c == b'\t';
        let lead = hbuf[vs..ve].iter().take_while(is_ows).count();
        let trail = hbuf[vs + lead..ve].iter().rev().take_while(is_ows).count();
        let (vs, ve) = (vs + lead, ve - trail);
        let nm = &hbuf[ns..ne];
        if nm.eq_ignore_ascii_case(b"content-length") {
            let n = parse_content_length(&hbuf[vs..ve]).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "start_response(): invalid Content-Length {:?}",
                    value.to_string()
                ))
            })?;
            if declared.is_some_and(|d| d != n) {
                return Err(PyValueError::new_err(
                    "start_response(): two different Content-Length headers",
                ));
            }
            declared = Some(n);
            hbuf.truncate(ns);
            continue;
        }
        if host_owned(nm) {
            hbuf.truncate(ns);
            continue;
        }
        hdrs.push([ns as u32, (ne - ns) as u32, vs as u32, (ve - vs) as u32]);
    }
    Ok(ParsedHeaders {
        hbuf,
        hdrs,
        declared,
    })
}

/// Calls `f` with the headers in `hbuf` at the offsets `hdrs`, as the
/// host's array (on the stack when there are few).
fn with_headers<R>(hbuf: &[u8], hdrs: &[[u32; 4]], f: impl FnOnce(&[Header<'_>]) -> R) -> R {
    let mk = |h: &[u32; 4]| {
        let [no, nl, vo, vl] = h.map(|x| x as usize);
        Header::bytes(&hbuf[no..no + nl], &hbuf[vo..vo + vl])
    };
    if hdrs.len() <= INLINE_HEADERS {
        let mut arr = [Header::bytes(b"", b""); INLINE_HEADERS];
        for (slot, h) in arr.iter_mut().zip(hdrs) {
            *slot = mk(h);
        }
        f(&arr[..hdrs.len()])
    } else {
        let v: Vec<Header<'_>> = hdrs.iter().map(mk).collect();
        f(&v)
    }
}

impl StartResponse {
    /// A fresh `start_response` for one request; `buffers` are header
    /// buffers recycled from an earlier request (see `take_buffers`).
    pub fn new(resp: RawResponse, buffers: HeaderBuffers, head_request: bool) -> Self {
        let (hbuf, hdrs) = buffers;
        StartResponse {
            resp,
            status: 0,
            reason: String::new(),
            hbuf,
            hdrs,
            declared: None,
            head_sent: false,
            finished: false,
            sent: 0,
            host_error: None,
            warned_overflow: false,
            head_request,
        }
    }

    /// Called when `handle` returns: later calls fail cleanly. Returns the
    /// header buffers for the next request.
    pub fn invalidate(&mut self) -> HeaderBuffers {
        self.resp.invalidate();
        self.status = 0;
        let mut hbuf = std::mem::take(&mut self.hbuf);
        let mut hdrs = std::mem::take(&mut self.hdrs);
        if hbuf.capacity() > RECYCLE_MAX || hdrs.capacity() > RECYCLE_MAX / 16 {
            return HeaderBuffers::default();
        }
        hbuf.clear();
        hdrs.clear();
        (hbuf, hdrs)
    }

    pub fn head_sent(&self) -> bool {
        self.head_sent
    }

    pub fn started(&self) -> bool {
        self.status != 0
    }

    pub fn client_gone(&self) -> bool {
        self.host_error == Some(M0_ERR_DISCONNECTED)
    }

    /// The proof that the response was finished, if it was.
    pub fn sent(&self) -> Option<m0serve_plugin::Sent> {
        self.resp.sent()
    }

    fn record(&mut self, rc: i32) -> i32 {
        if rc < 0 && self.host_error.is_none() {
            self.host_error = Some(rc);
        }
        rc
    }

    fn warn_overflow(&mut self, py: Python<'_>) {
        if !self.warned_overflow {
            self.warned_overflow = true;
            let _ = py;
            host::get().warn(&format!(
                "wsgi: the application sent more than its Content-Length ({}): the rest \
                 was dropped",
                self.declared.unwrap_or(0)
            ));
        }
    }

    fn start_head(&mut self, length: i64) -> i32 {
        if !self.resp.is_valid() {
            return M0_ERR_INTERNAL;
        }
        let length = if length == M0_LENGTH_UNKNOWN {
            Length::Unknown
        } else {
            Length::Exact(length as u64)
        };
        self.send_reason();
        let status = self.status;
        let resp = &mut self.resp;
        let rc = code(with_headers(&self.hbuf, &self.hdrs, |h| {
            resp.start(status, h, length)
        }));
        if rc == M0_OK {
            self.head_sent = true;
        }
        self.record(rc)
    }

    /// Sends body bytes, starting the head first when needed.
    fn write_body(&mut self, py: Python<'_>, data: &[u8]) -> Wrote {
        if let Some(e) = self.host_error {
            return Wrote::Err(e);
        }
        if self.finished {
            if !self.head_request {
                self.warn_overflow(py);
            }
            return Wrote::Full;
        }
        if !self.head_sent {
            let len = self
                .declared
                .map_or(M0_LENGTH_UNKNOWN, |d| d.min(i64::MAX as u64) as i64);
            let rc = self.start_head(len);
            if rc < 0 {
                return Wrote::Err(rc);
            }
        }
        if self.head_request {
            // The head is out; a HEAD response has no body, so stop the
            // iterable here (close() is still called).
            return match self.finish() {
                rc if rc < 0 => Wrote::Err(rc),
                _ => Wrote::Full,
            };
        }
        let mut data = data;
        let mut full = false;
        if let Some(d) = self.declared {
            let room = d.saturating_sub(self.sent);
            if (data.len() as u64) >= room {
                if (data.len() as u64) > room {
                    self.warn_overflow(py);
                }
                data = &data[..room as usize];
                full = true;
            }
        }
        if !data.is_empty() {
            if !self.resp.is_valid() {
                return Wrote::Err(M0_ERR_INTERNAL);
            }
            let resp = &self.resp;
            let send = move || code(resp.write(data));
            let rc = if data.len() >= DETACH_WRITE_MIN {
                gil::without_gil(py, send)
            } else {
                send()
            };
            if rc < 0 {
                return Wrote::Err(self.record(rc));
            }
            self.sent += data.len() as u64;
        }
        if full {
            let rc = self.finish();
            if rc < 0 {
                return Wrote::Err(rc);
            }
            return Wrote::Full;
        }
        Wrote::Ok
    }

    fn finish(&mut self) -> i32 {
        if self.finished {
            return M0_OK;
        }
        self.finished = true;
        if !self.resp.is_valid() {
            return M0_ERR_INTERNAL;
        }
        let rc = code(self.resp.finish());
        self.record(rc)
    }

    /// Hands the app's reason phrase to the host for the head about to be
    /// written. A host older than ABI 1.4 sends the standard phrase; one
    /// the host refuses (over 256 bytes) it logs, and sends the standard
    /// phrase too: the response itself is not at fault.
    fn send_reason(&mut self) {
        if !self.reason.is_empty() {
            let _ = self.resp.reason(&self.reason);
        }
    }

    /// Sends the whole response in one piece: status, headers, body.
    fn send_whole(&mut self, py: Python<'_>, data: &[u8]) -> i32 {
        debug_assert!(!self.head_sent);
        if self.head_request {
            // The length a GET would have had, no body bytes.
            let len = self.declared.unwrap_or(data.len() as u64);
            let rc = self.start_head(len.min(i64::MAX as u64) as i64);
            if rc < 0 {
                return rc;
            }
            return self.finish();
        }
        match self.declared {
            Some(d) if d != data.len() as u64 => {
                // The app's Content-Length disagrees with its body: send what
                // it declared (the host cuts a short body off).
                match self.write_body(py, data) {
                    Wrote::Err(e) => e,
                    Wrote::Full => M0_OK,
                    Wrote::Ok => self.finish(),
                }
            }
            _ => {
                if !self.resp.is_valid() {
                    return M0_ERR_INTERNAL;
                }
                self.send_reason();
                let status = self.status;
                let resp = &mut self.resp;
                let rc = with_headers(&self.hbuf, &self.hdrs, |h| {
                    let mut send = move || code(resp.send(status, h, data));
                    if data.len() >= DETACH_WRITE_MIN {
                        gil::without_gil(py, send)
                    } else {
                        send()
                    }
                });
                self.head_sent = true;
                self.finished = true;
                self.sent = data.len() as u64;
                self.record(rc)
            }
        }
    }
}

#[pymethods]
impl StartResponse {
    #[pyo3(signature = (status, headers, exc_info = None))]
    fn __call__<'py>(
        slf: &Bound<'py, Self>,
        status: &Bound<'py, PyAny>,
        headers: &Bound<'py, PyAny>,
        exc_info: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        let exc_info = exc_info.filter(|e| !e.is_none());
        {
            let this = slf.borrow();
            if !this.resp.is_valid() {
                return Err(PyRuntimeError::new_err(
                    "start_response() called after the request ended",
                ));
            }
            match exc_info {
                Some(ei) if this.head_sent => {
                    // PEP 3333: too late to change the head; re-raise.
                    let value = ei.get_item(1)?;
                    return Err(PyErr::from_value(value));
                }
                None if this.status != 0 => {
                    return Err(PyRuntimeError::new_err(
                        "start_response() called a second time without exc_info",
                    ));
                }
                _ => {}
            }
        }
        let code = {
            let mut this = slf.borrow_mut();
            parse_status(status, &mut this.reason)?
        };
        let reuse = {
            let mut this = slf.borrow_mut();
            (
                std::mem::take(&mut this.hbuf),
                std::mem::take(&mut this.hdrs),
            )
        };
        let parsed = parse_headers(headers, reuse)?;
        {
            let mut this = slf.borrow_mut();
            this.status = code;
            this.hbuf = parsed.hbuf;
            this.hdrs = parsed.hdrs;
            this.declared = parsed.declared;
        }
        slf.getattr(intern!(py, "write"))
    }

    /// The legacy `write()` callable returned by `start_response`.
    fn write(&mut self, py: Python<'_>, data: &Bound<'_, PyAny>) -> PyResult<()> {
        if !self.resp.is_valid() {
            return Err(PyRuntimeError::new_err(
                "write() called after the request ended",
            ));
        }
        if self.status == 0 {
            return Err(PyRuntimeError::new_err(
                "write() called before start_response()",
            ));
        }
        let bytes = data.cast::<PyBytes>().map_err(|_| {
            PyTypeError::new_err(format!(
                "write() argument must be bytes, not {}",
                data.get_type()
                    .name()
                    .map(|n| n.to_string())
                    .unwrap_or_default()
            ))
        })?;
        match self.write_body(py, bytes.as_bytes()) {
            Wrote::Ok | Wrote::Full => Ok(()),
            Wrote::Err(M0_ERR_DISCONNECTED) => {
                Err(PyOSError::new_err("write(): the client disconnected"))
            }
            Wrote::Err(e) => Err(PyOSError::new_err(format!(
                "write(): sending the response failed (m0serve error {e})"
            ))),
        }
    }
}

/// What went wrong while producing the body.
pub enum BodyError {
    /// A Python exception from the application or its iterable.
    App(PyErr),
    /// A host call failed (client gone, write timeout): stop quietly.
    Host(i32),
}

/// Sends the application's return value and calls its `close()`.
/// Returns the `handle` status and the error to log, if any.
pub fn send_body<'py>(
    py: Python<'py>,
    sr: &Bound<'py, StartResponse>,
    body: &Bound<'py, PyAny>,
) -> (i32, Option<BodyError>) {
    let mut outcome = drive(py, sr, body);
    // PEP 3333: close() is called whatever happened, client gone included.
    // (A plain list or tuple has none: skip the failing attribute lookup.)
    let plain = body.is_exact_instance_of::<PyList>() || body.is_exact_instance_of::<PyTuple>();
    if !plain
        && let Ok(Some(close)) = body.getattr_opt(intern!(py, "close"))
        && let Err(e) = close.call0()
        && outcome.is_ok()
    {
        outcome = Err(BodyError::App(e));
    }
    match outcome {
        Ok(rc) => (rc, None),
        Err(BodyError::Host(rc)) => (rc, Some(BodyError::Host(rc))),
        Err(e) => {
            let rc = if sr.borrow().finished {
                // Only close() failed, after a complete response.
                M0_OK
            } else {
                M0_ERR_INTERNAL
            };
            (rc, Some(e))
        }
    }
}

fn not_started() -> BodyError {
    BodyError::App(PyRuntimeError::new_err(
        "the application produced a body without calling start_response()",
    ))
}

fn drive<'py>(
    py: Python<'py>,
    sr: &Bound<'py, StartResponse>,
    body: &Bound<'py, PyAny>,
) -> Result<i32, BodyError> {
    if body.is_instance_of::<PyString>() || body.is_instance_of::<PyBytes>() {
        return Err(BodyError::App(PyTypeError::new_err(format!(
            "the application returned {}: a WSGI application must return an iterable of \
             bytes (for example [body])",
            body.get_type().name().map_err(BodyError::App)?
        ))));
    }
    if let Ok(list) = body.cast_exact::<PyList>() {
        if list.len() == 1 {
            // The common case, `return [body]`: no collecting.
            let item = list.get_item(0).map_err(BodyError::App)?;
            let data = as_bytes(&item)?.as_bytes();
            let mut this = sr.borrow_mut();
            if this.status == 0 {
                return Err(not_started());
            }
            if !this.head_sent {
                let rc = this.send_whole(py, data);
                return if rc < 0 {
                    Err(BodyError::Host(rc))
                } else {
                    Ok(rc)
                };
            }
        }
        let items: Vec<Bound<'py, PyAny>> = list.iter().collect();
        return send_sequence(py, sr, &items);
    }
    if let Ok(tuple) = body.cast_exact::<PyTuple>() {
        let items: Vec<Bound<'py, PyAny>> = tuple.iter().collect();
        return send_sequence(py, sr, &items);
    }
    let iter = body.try_iter().map_err(BodyError::App)?;
    if in_memory(&iter) {
        // `iter()` of a list or tuple (Django's HttpResponse returns one):
        // every piece is already in memory, so taking them all delays
        // nothing and lets the body go out sized, in one call.
        let items = iter.collect::<PyResult<Vec<_>>>().map_err(BodyError::App)?;
        return send_sequence(py, sr, &items);
    }
    for item in iter {
        let item = item.map_err(BodyError::App)?;
        let chunk = as_bytes(&item)?;
        let data = chunk.as_bytes();
        if data.is_empty() {
            continue;
        }
        let mut this = sr.borrow_mut();
        if this.status == 0 {
            return Err(not_started());
        }
        if !this.head_sent && this.declared == Some(data.len() as u64) {
            // Sized and complete in its first piece: one call.
            let rc = this.send_whole(py, data);
            if rc < 0 {
                return Err(BodyError::Host(rc));
            }
            continue;
        }
        match this.write_body(py, data) {
            Wrote::Ok => {}
            Wrote::Full => return Ok(M0_OK),
            Wrote::Err(e) => return Err(BodyError::Host(e)),
        }
    }
    finish_empty_or_open(py, sr)
}

/// After the iterable ended: send a head that never went out, or end the body.
fn finish_empty_or_open<'py>(
    py: Python<'py>,
    sr: &Bound<'py, StartResponse>,
) -> Result<i32, BodyError> {
    let mut this = sr.borrow_mut();
    if this.status == 0 {
        return Err(BodyError::App(PyRuntimeError::new_err(
            "the application returned without calling start_response()",
        )));
    }
    let rc = if !this.head_sent {
        this.send_whole(py, b"")
    } else {
        this.finish()
    };
    if rc < 0 {
        Err(BodyError::Host(rc))
    } else {
        Ok(rc)
    }
}

/// Whether `iter` is a list or tuple iterator (exact types: nothing of the
/// application runs while it is drained).
fn in_memory(iter: &Bound<'_, PyIterator>) -> bool {
    let ty = iter.get_type().as_type_ptr();
    // Only the addresses of CPython's static type objects are taken.
    ty == &raw mut ffi::PyListIter_Type || ty == &raw mut ffi::PyTupleIter_Type
}

fn as_bytes<'a, 'py>(item: &'a Bound<'py, PyAny>) -> Result<&'a Bound<'py, PyBytes>, BodyError> {
    item.cast::<PyBytes>().map_err(|_| {
        BodyError::App(PyTypeError::new_err(format!(
            "the application's iterable yielded {}, not bytes",
            item.get_type()
                .name()
                .map(|n| n.to_string())
                .unwrap_or_default()
        )))
    })
}

/// A list or tuple: the whole body is in hand, so it is sent sized.
fn send_sequence<'py>(
    py: Python<'py>,
    sr: &Bound<'py, StartResponse>,
    items: &[Bound<'py, PyAny>],
) -> Result<i32, BodyError> {
    let mut chunks = Vec::with_capacity(items.len());
    let mut total = 0usize;
    for item in items {
        let b = as_bytes(item)?.as_bytes();
        total += b.len();
        if !b.is_empty() {
            chunks.push(b);
        }
    }
    let mut this = sr.borrow_mut();
    if this.status == 0 {
        return Err(not_started());
    }
    if this.head_sent {
        // write() already started a streamed body: continue it.
        for c in &chunks {
            match this.write_body(py, c) {
                Wrote::Ok => {}
                Wrote::Full => return Ok(M0_OK),
                Wrote::Err(e) => return Err(BodyError::Host(e)),
            }
        }
        drop(this);
        return finish_empty_or_open(py, sr);
    }
    let rc = match chunks.len() {
        0 => this.send_whole(py, b""),
        1 => this.send_whole(py, chunks[0]),
        _ if total <= JOIN_MAX => {
            let joined = chunks.concat();
            this.send_whole(py, &joined)
        }
        _ => {
            if this.declared.is_none() {
                this.declared = Some(total as u64);
            }
            for c in &chunks {
                match this.write_body(py, c) {
                    Wrote::Ok => {}
                    Wrote::Full => return Ok(M0_OK),
                    Wrote::Err(e) => return Err(BodyError::Host(e)),
                }
            }
            this.finish()
        }
    };
    if rc < 0 {
        Err(BodyError::Host(rc))
    } else {
        Ok(rc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_length_values() {
        assert_eq!(parse_content_length(b" 42 "), Some(42));
        assert_eq!(parse_content_length(b"0"), Some(0));
        assert_eq!(parse_content_length(b"-1"), None);
        assert_eq!(parse_content_length(b"4 2"), None);
        assert_eq!(parse_content_length(b""), None);
    }

    #[test]
    fn owned_headers() {
        assert!(host_owned(b"Transfer-Encoding"));
        assert!(host_owned(b"connection"));
        assert!(!host_owned(b"Content-Type"));
    }
}
