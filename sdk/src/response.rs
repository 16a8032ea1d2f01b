//! The response of a call, in typed states: a [`Response`] is answered
//! once, by [`Response::send`] or by [`Response::start`], which gives the
//! [`BodyWriter`] that alone can write and finish. Each step consumes the
//! one before, so a response cannot be started twice or written before it
//! starts; [`Sent`], the proof that it was finished, is what
//! [`Plugin::handle`](crate::Plugin::handle) returns.

use std::io;
use std::marker::PhantomData;

use m0serve_abi::{M0_LENGTH_UNKNOWN, M0Header, M0Response, M0Str};

use crate::{Error, Host};

/// One response header. Names and values must not hold CR, LF or NUL; the
/// host owns Content-Length, Transfer-Encoding, Connection and Date and
/// refuses them ([`Error::INVALID`]).
#[repr(transparent)]
#[derive(Clone, Copy)]
pub struct Header<'a>(M0Header, PhantomData<&'a [u8]>);

impl<'a> Header<'a> {
    pub const fn new(name: &'a str, value: &'a str) -> Header<'a> {
        Header::bytes(name.as_bytes(), value.as_bytes())
    }

    pub const fn bytes(name: &'a [u8], value: &'a [u8]) -> Header<'a> {
        Header(
            M0Header {
                name: M0Str::from_bytes(name),
                value: M0Str::from_bytes(value),
            },
            PhantomData,
        )
    }

    /// The headers as the ABI's array: `Header` is transparent over it.
    fn raw(headers: &[Header<'_>]) -> *const M0Header {
        headers.as_ptr().cast()
    }
}

/// How long the body of a started response is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Length {
    /// Exactly this many bytes. Fewer cut the response off (its connection
    /// closes); bytes past it are dropped, and the connection closes too.
    Exact(u64),
    /// Unknown: sent chunked (HTTP/1.1) or delimited by close (HTTP/1.0).
    Unknown,
}

impl Length {
    /// The ABI's `content_length` argument.
    fn declared(self) -> Result<i64, Error> {
        match self {
            Length::Exact(n) => i64::try_from(n).map_err(|_| Error::INVALID),
            Length::Unknown => Ok(M0_LENGTH_UNKNOWN),
        }
    }
}

/// Proof that a response was finished: only [`Response::send`],
/// [`BodyWriter::finish`] and [`RawResponse::sent`] make one.
#[must_use]
#[derive(Debug)]
pub struct Sent(());

/// The response, not yet begun. Its calls go through the same
/// [`RawResponse`] as a detached one's, with the order made by the types.
pub struct Response<'a> {
    inner: RawResponse,
    call: PhantomData<&'a mut M0Response>,
}

impl<'a> Response<'a> {
    /// # Safety
    /// `raw` is the host's response for the call in progress.
    pub(crate) unsafe fn new(raw: *mut M0Response, host: &'static Host) -> Response<'a> {
        Response {
            inner: RawResponse {
                raw,
                host,
                finished: false,
            },
            call: PhantomData,
        }
    }

    /// Sends `reason` in the status line instead of the standard phrase
    /// for the status (call it before `send` or `start`). `Ok(false)` from
    /// a host older than ABI 1.4, which sends the standard phrase;
    /// [`Error::INVALID`] for a phrase with a control character or over
    /// `M0_REASON_MAX` bytes.
    pub fn reason(&mut self, reason: &str) -> Result<bool, Error> {
        self.inner.reason(reason)
    }

    /// Status, headers and the whole body in one call (one `writev`).
    pub fn send(mut self, status: u16, headers: &[Header<'_>], body: &[u8]) -> Result<Sent, Error> {
        self.inner.send(status, headers, body)?;
        Ok(Sent(()))
    }

    /// A `text/plain; charset=utf-8` response.
    pub fn text(self, status: u16, body: &str) -> Result<Sent, Error> {
        const TYPE: [Header<'static>; 1] =
            [Header::new("Content-Type", "text/plain; charset=utf-8")];
        self.send(status, &TYPE, body.as_bytes())
    }

    /// Begins the response; its body is then written with the writer.
    pub fn start(
        mut self,
        status: u16,
        headers: &[Header<'_>],
        length: Length,
    ) -> Result<BodyWriter<'a>, Error> {
        self.inner.start(status, headers, length)?;
        Ok(BodyWriter {
            inner: self.inner,
            call: PhantomData,
        })
    }

    /// A handle without typed states, for a bridge that answers from
    /// another runtime's callbacks (the WSGI plugin's `start_response`),
    /// where the order of calls is the application's. The host still
    /// refuses calls out of order with [`Error::STATE`].
    ///
    /// # Safety
    /// The handle must not be used after the call that handed out this
    /// response has returned: drop it or [`RawResponse::invalidate`] it
    /// first.
    pub unsafe fn detach(self) -> RawResponse {
        self.inner
    }
}

/// A started response's body.
pub struct BodyWriter<'a> {
    inner: RawResponse,
    call: PhantomData<&'a mut M0Response>,
}

impl BodyWriter<'_> {
    /// Appends body bytes: with an unknown length each call is one chunk.
    /// They are on the wire (or in the socket buffer) when this returns.
    pub fn write(&mut self, data: &[u8]) -> Result<(), Error> {
        self.inner.write(data)
    }

    /// Ends the response. A sized response that got fewer bytes than it
    /// declared is cut off: [`Error::STATE`].
    pub fn finish(mut self) -> Result<Sent, Error> {
        self.inner.finish()?;
        Ok(Sent(()))
    }
}

impl io::Write for BodyWriter<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        BodyWriter::write(self, buf)?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// A response without typed states (see [`Response::detach`]): `Send`, so
/// another runtime's objects may hold it, and checked by the host, which
/// answers a call out of order with [`Error::STATE`].
pub struct RawResponse {
    raw: *mut M0Response,
    host: &'static Host,
    finished: bool,
}

// SAFETY: the host's response functions may be called from any thread; the
// handle is only valid during its call, which `detach`'s caller ensures.
unsafe impl Send for RawResponse {}
// SAFETY: as for Send: `&self` methods read no host state.
unsafe impl Sync for RawResponse {}

impl RawResponse {
    fn live(&self) -> Result<*mut M0Response, Error> {
        if self.raw.is_null() {
            Err(Error::STATE)
        } else {
            Ok(self.raw)
        }
    }

    /// Ends the handle's use: every later call is refused with
    /// [`Error::STATE`].
    pub fn invalidate(&mut self) {
        self.raw = std::ptr::null_mut();
    }

    pub fn is_valid(&self) -> bool {
        !self.raw.is_null()
    }

    /// As [`Response::reason`].
    pub fn reason(&mut self, reason: &str) -> Result<bool, Error> {
        let raw = self.live()?;
        let Some(set) = self.host.response_reason else {
            return Ok(false);
        };
        // SAFETY: as in `start`; `reason` is alive for the call.
        Error::check(unsafe { set(raw, reason.as_ptr(), reason.len()) })?;
        Ok(true)
    }

    /// As [`Response::start`].
    pub fn start(
        &mut self,
        status: u16,
        headers: &[Header<'_>],
        length: Length,
    ) -> Result<(), Error> {
        let raw = self.live()?;
        let declared = length.declared()?;
        // SAFETY: `raw` is the live response of the call (detach's contract).
        Error::check(unsafe {
            (self.host.response_start)(raw, status, Header::raw(headers), headers.len(), declared)
        })
    }

    /// As [`BodyWriter::write`].
    pub fn write(&self, data: &[u8]) -> Result<(), Error> {
        let raw = self.live()?;
        // SAFETY: as in `start`; `data` is alive for the call.
        Error::check(unsafe { (self.host.response_write)(raw, data.as_ptr(), data.len()) })
    }

    /// As [`BodyWriter::finish`].
    pub fn finish(&mut self) -> Result<(), Error> {
        let raw = self.live()?;
        // SAFETY: as in `start`.
        Error::check(unsafe { (self.host.response_finish)(raw) })?;
        self.finished = true;
        Ok(())
    }

    /// As [`Response::send`].
    pub fn send(&mut self, status: u16, headers: &[Header<'_>], body: &[u8]) -> Result<(), Error> {
        let raw = self.live()?;
        // SAFETY: as in `start`; headers and body are alive for the call.
        Error::check(unsafe {
            (self.host.response_send)(
                raw,
                status,
                Header::raw(headers),
                headers.len(),
                body.as_ptr(),
                body.len(),
            )
        })?;
        self.finished = true;
        Ok(())
    }

    /// The proof, once `finish` or `send` succeeded.
    pub fn sent(&self) -> Option<Sent> {
        self.finished.then_some(Sent(()))
    }
}
