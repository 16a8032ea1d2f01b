//! One client connection as the event loop sees it: bytes in, requests out.
//!
//! A connection moves Head -> (Body) -> Dispatched -> Head ... and ends in
//! Linger (after an error or a `Connection: close`) or is dropped. While it is
//! Dispatched a handler thread owns the socket's write side and the loop does
//! not read: pipelined bytes wait in the kernel or the buffer, and are parsed
//! when the response is complete, so responses go out in request order.
//!
//! An inline call (a plugin that declares `M0_CAP_INLINE`) answers on the
//! loop; what the socket did not take waits in `out` and the connection is
//! Flushing until it is sent, then goes back to Head.
//!
//! Sockets are edge-triggered: `may_read` remembers that the kernel may hold
//! bytes we have not read, because an edge is announced once.

use std::io;
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::time::Instant;

use mio::net::TcpStream;

use crate::http::chunked::ChunkedDecoder;
use crate::http::head::{self, BodyFraming, Limits, RequestHead};
use crate::http::{HttpError, Span};
use crate::plugin::call::{Body, Peer};
use crate::plugin::exchange;

pub enum Phase {
    /// Waiting for, or reading, a request head.
    Head,
    /// Head parsed; body arriving.
    Body {
        head: RequestHead,
        progress: BodyProgress,
    },
    /// A handler thread is answering.
    Dispatched,
    /// An inline response is in `out`, waiting for the socket; what follows
    /// depends on `keep_alive`.
    Flushing { keep_alive: bool },
    /// Our side is shut for writing; reading and discarding until the client
    /// closes, so an error response is not lost to a reset.
    Linger,
}

pub enum BodyProgress {
    /// The body ends at this index of the buffer.
    Length { end: usize },
    /// Chunked: raw bytes from `head_len` on are decoded into `out`.
    Chunked {
        decoder: ChunkedDecoder,
        out: Vec<u8>,
    },
}

pub struct Conn {
    pub stream: TcpStream,
    pub peer: Arc<Peer>,
    pub rbuf: Vec<u8>,
    /// Spilled response bytes (Flushing), sent from `out_pos` on.
    pub out: Vec<u8>,
    pub out_pos: usize,
    pub phase: Phase,
    /// Requests answered on this connection.
    pub served: u32,
    pub may_read: bool,
    pub read_closed: bool,
    /// The socket reported the client's end closed (EPOLLRDHUP or HUP):
    /// it sends no more requests, whatever is still buffered or computing.
    pub hung_up: bool,
    /// `100 Continue` went out for the current request.
    continue_sent: bool,
    /// From the metrics listener: its requests are scrapes.
    pub scraper: bool,
    /// Bytes read from the socket since the connection opened.
    pub read_total: u64,
    /// When the current request's body began and `read_total` then: what
    /// the body's minimum rate is reckoned from.
    pub body_began: Option<(Instant, u64)>,
}

/// A request ready for the pool.
pub struct Ready {
    pub head: RequestHead,
    pub body: Body,
    /// Bytes of the buffer the request occupies.
    pub consumed: usize,
}

/// What `advance` found.
pub enum Step {
    /// Nothing more to do until the socket is readable again.
    Wait,
    Dispatch(Ready),
    Refuse(HttpError),
    /// The client closed or the socket failed: drop the connection.
    Close,
}

pub enum Fill {
    Data,
    Eof,
    Blocked,
}

impl Conn {
    pub fn new(stream: TcpStream, peer: Arc<Peer>, rbuf: Vec<u8>) -> Conn {
        Conn {
            stream,
            peer,
            rbuf,
            out: Vec::new(),
            out_pos: 0,
            phase: Phase::Head,
            served: 0,
            may_read: true,
            read_closed: false,
            hung_up: false,
            continue_sent: false,
            scraper: false,
            read_total: 0,
            body_began: None,
        }
    }

    /// Send what the loop owes the client ahead of the response (a `100
    /// Continue`) without waiting: what the socket does not take stays in
    /// `out` and is sent when the socket is writable (`interim_pending`).
    fn send_interim(&mut self, bytes: &[u8]) {
        self.out.extend_from_slice(bytes);
        let fd = self.stream.as_raw_fd();
        // A failed send means the client is gone; the next read says so.
        if let Ok(true) | Err(_) = exchange::flush_spilled(fd, &self.out, &mut self.out_pos) {
            self.out.clear();
            self.out_pos = 0;
        }
    }

    /// Interim bytes wait for the socket (never while a response is
    /// flushing: those bytes are the response's).
    pub fn interim_pending(&self) -> bool {
        !self.out.is_empty() && matches!(self.phase, Phase::Head | Phase::Body { .. })
    }

    /// Reading or parsing may go on: the state `drive` continues from.
    pub fn may_drive(&self) -> bool {
        matches!(self.phase, Phase::Head | Phase::Body { .. })
    }

    pub fn is_idle(&self) -> bool {
        matches!(self.phase, Phase::Head) && self.rbuf.is_empty()
    }

    /// Parse what is buffered, reading more while the socket has it, until a
    /// request is complete, refused, or the socket runs dry.
    pub fn advance(&mut self, limits: &Limits, head_scratch: &mut RequestHead) -> Step {
        loop {
            match self.parse_buffered(limits, head_scratch) {
                Ok(Some(ready)) => return Step::Dispatch(ready),
                Ok(None) => {}
                Err(e) => return Step::Refuse(e),
            }
            if !self.may_read {
                return Step::Wait;
            }
            let cap = self.read_cap(limits);
            match self.fill(cap) {
                Ok(Fill::Data) => continue,
                Ok(Fill::Blocked) => return Step::Wait,
                Ok(Fill::Eof) => {
                    self.read_closed = true;
                    return Step::Close;
                }
                Err(_) => return Step::Close,
            }
        }
    }

    /// How far the buffer may grow in this phase: a little past the head
    /// limit (so an oversized head is seen and refused), or to the end of a
    /// Content-Length body.
    fn read_cap(&self, limits: &Limits) -> usize {
        match &self.phase {
            Phase::Body {
                progress: BodyProgress::Length { end },
                ..
            } => (*end).max(self.rbuf.len() + 16 * 1024),
            Phase::Body { head, .. } => head.head_len + 256 * 1024,
            _ => limits.max_head_bytes + 4096,
        }
    }

    fn parse_buffered(
        &mut self,
        limits: &Limits,
        head_scratch: &mut RequestHead,
    ) -> Result<Option<Ready>, HttpError> {
        if let Phase::Head = self.phase {
            if self.rbuf.is_empty() || !head::parse(&self.rbuf, limits, head_scratch)? {
                return Ok(None);
            }
            let head = std::mem::take(head_scratch);
            let head_len = head.head_len;
            let progress = match head.body.0 {
                BodyFraming::None => {
                    let body = Body::InBuffer(Span {
                        start: head_len as u32,
                        end: head_len as u32,
                    });
                    return Ok(Some(Ready {
                        head,
                        body,
                        consumed: head_len,
                    }));
                }
                BodyFraming::Length(n) => {
                    let end = head_len + n as usize;
                    presize(&mut self.rbuf, end);
                    BodyProgress::Length { end }
                }
                BodyFraming::Chunked => BodyProgress::Chunked {
                    decoder: ChunkedDecoder::new(limits.max_body),
                    out: Vec::new(),
                },
            };
            self.continue_sent = false;
            self.phase = Phase::Body { head, progress };
        }
        let Phase::Body { head, progress } = &mut self.phase else {
            return Ok(None);
        };
        let head_len = head.head_len;
        let done_at = match progress {
            BodyProgress::Length { end } => (self.rbuf.len() >= *end).then_some(*end),
            BodyProgress::Chunked { decoder, out } => {
                let consumed = decoder.decode(&self.rbuf[head_len..], out)?;
                // Drop the framing we decoded; the head stays at the front.
                self.rbuf.drain(head_len..head_len + consumed);
                decoder.is_done().then_some(head_len)
            }
        };
        let Some(consumed) = done_at else {
            if head.expect_continue && !self.continue_sent {
                self.continue_sent = true;
                self.send_interim(b"HTTP/1.1 100 Continue\r\n\r\n");
            }
            return Ok(None);
        };
        let Phase::Body { head, progress } = std::mem::replace(&mut self.phase, Phase::Head) else {
            unreachable!("matched above")
        };
        let body = match progress {
            BodyProgress::Length { end } => Body::InBuffer(Span {
                start: head_len as u32,
                end: end as u32,
            }),
            BodyProgress::Chunked { out, .. } => Body::Decoded(out),
        };
        Ok(Some(Ready {
            head,
            body,
            consumed,
        }))
    }

    /// Read until the socket is dry, the buffer reaches `cap`, or EOF.
    pub fn fill(&mut self, cap: usize) -> io::Result<Fill> {
        let mut got = false;
        loop {
            if self.rbuf.len() >= cap {
                return Ok(if got { Fill::Data } else { Fill::Blocked });
            }
            if self.rbuf.capacity() - self.rbuf.len() < 4096 {
                self.rbuf.reserve(16 * 1024);
            }
            let room = cap - self.rbuf.len();
            let spare = self.rbuf.spare_capacity_mut();
            let want = spare.len().min(room).max(1);
            // SAFETY: recv writes at most `want` bytes into the vector's
            // spare capacity, which is at least that long.
            let n =
                unsafe { libc::recv(self.stream.as_raw_fd(), spare.as_mut_ptr().cast(), want, 0) };
            if n > 0 {
                let n = n as usize;
                // SAFETY: recv initialised the first n bytes of the spare capacity.
                unsafe { self.rbuf.set_len(self.rbuf.len() + n) };
                self.read_total += n as u64;
                got = true;
                if n < want {
                    // A short read drained the socket; the next arrival is
                    // a new edge.
                    self.may_read = false;
                    return Ok(Fill::Data);
                }
                continue;
            }
            if n == 0 {
                return Ok(if got { Fill::Data } else { Fill::Eof });
            }
            let err = io::Error::last_os_error();
            match err.kind() {
                io::ErrorKind::WouldBlock => {
                    self.may_read = false;
                    return Ok(if got { Fill::Data } else { Fill::Blocked });
                }
                io::ErrorKind::Interrupted => continue,
                _ => return Err(err),
            }
        }
    }

    /// Lingering: discard whatever arrives. True when the client closed.
    pub fn discard_input(&mut self) -> bool {
        loop {
            self.rbuf.clear();
            match self.fill(64 * 1024) {
                Ok(Fill::Data) => continue,
                Ok(Fill::Blocked) => return false,
                Ok(Fill::Eof) | Err(_) => return true,
            }
        }
    }
}

/// A Content-Length body is read into one buffer sized for it up front, up
/// to this much; past it the buffer grows as it fills. Bounded so that a
/// client announcing a large body it never sends does not get that much
/// reserved.
pub const PRESIZE_MAX: usize = 1 << 20;
/// Room past the body's end, for the head of a pipelined request (a fill
/// with less room than 4 KiB would grow the buffer again, doubling it).
const PRESIZE_SLACK: usize = 16 * 1024;

/// Makes room for a body that ends at `end` in one allocation, instead of
/// the doubling reallocations of a buffer grown 16 KiB at a time (a 1 MiB
/// body went through seven, and ended in a 2 MiB buffer).
fn presize(rbuf: &mut Vec<u8>, end: usize) {
    let want = end.min(rbuf.len() + PRESIZE_MAX) + PRESIZE_SLACK;
    if want > rbuf.capacity() {
        rbuf.reserve_exact(want - rbuf.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_body_gets_one_buffer_of_its_size_up_to_the_bound() {
        let mut buf = vec![0u8; 300];
        presize(&mut buf, 300 + (1 << 20));
        let cap = buf.capacity();
        assert!(
            (300 + (1 << 20) + PRESIZE_SLACK..300 + (1 << 20) + 2 * PRESIZE_SLACK).contains(&cap)
        );
        // Filled to the end, the buffer has its slack: no reallocation.
        buf.resize(300 + (1 << 20), 0);
        assert_eq!(buf.capacity(), cap);
        // A claim of 100 MiB reserves the bound, not the claim.
        let mut buf = vec![0u8; 300];
        presize(&mut buf, 300 + (100 << 20));
        assert!(buf.capacity() < 300 + PRESIZE_MAX + 2 * PRESIZE_SLACK);
        // A small body in a buffer already big enough: untouched.
        let mut buf = Vec::with_capacity(64 * 1024);
        buf.extend_from_slice(&[0u8; 200]);
        presize(&mut buf, 1200);
        assert_eq!(buf.capacity(), 64 * 1024);
    }
}
