//! One request/response exchange: the request body the plugin reads, and
//! the response it writes.
//!
//! On a handler thread the response goes to the socket from the plugin's
//! own thread, with one vectored `sendmsg` per plugin write: no copy of the
//! body, no hop back to the event loop. While a request is dispatched the
//! loop does not touch the connection, so the two never write the same
//! socket. When the socket is full the thread waits for it (bounded by the
//! idle timeout): the plugin is producing the response on this thread
//! anyway.
//!
//! On the event-loop thread (a plugin that declares `M0_CAP_INLINE`) the
//! exchange must never wait: what the socket does not take is spilled into
//! a buffer, in order, which the loop flushes when the socket is writable.
//! There the writes are also corked: they gather in that buffer, up to
//! `CORK_BYTES`, and go in one `sendmsg` when the call returns. The loop
//! is busy with the call until then anyway, so holding them delays no
//! byte, and a streamed response of five chunks costs one send rather than
//! six (a client pipelining such requests cost the loop six sends each,
//! and a pass over sixteen of them held every other connection for 6-10 ms).

use std::io::IoSlice;
use std::os::fd::RawFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use m0serve_abi as abi;
use nix::sys::socket::MsgFlags;

use crate::http::response::{self, BodyLength};

static DRAINING: AtomicBool = AtomicBool::new(false);

/// True once this worker has begun its graceful stop: responses started
/// after it say `Connection: close`.
pub fn is_draining() -> bool {
    DRAINING.load(Ordering::Relaxed)
}

/// The worker begins its graceful stop (once, from the event loop).
pub fn set_draining() {
    DRAINING.store(true, Ordering::Relaxed);
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Nothing sent yet.
    Idle,
    /// Head written into `scratch` or sent; body in progress.
    Open { length: BodyLength, remaining: u64 },
    /// Complete on the wire.
    Done,
    /// Cut off: the connection must close.
    Broken,
}

/// Inline writes gather up to this many bytes before they are sent.
const CORK_BYTES: usize = 16 * 1024;

/// Where bytes go when the socket is full.
pub enum Sink<'a> {
    /// Wait for the socket, up to a deadline (handler threads).
    Wait(Option<Duration>),
    /// Keep them for the event loop to flush (inline calls); the buffer
    /// also holds the corked writes until the call concludes.
    Spill(&'a mut Vec<u8>),
}

pub struct Exchange<'a> {
    fd: RawFd,
    http_minor: u8,
    is_head: bool,
    keep_alive: bool,
    body: &'a [u8],
    body_pos: usize,
    state: State,
    /// Head and chunk framing waiting to go out with the next bytes.
    scratch: &'a mut Vec<u8>,
    sink: Sink<'a>,
    /// The socket refused bytes during this call (inline): everything
    /// after goes to the spill buffer, in order, without another try.
    socket_full: bool,
    /// The length of a reason phrase the plugin set in place of the
    /// standard one, kept at the start of `scratch` until the head is
    /// written (so it costs no allocation).
    reason_len: Option<usize>,
    /// `Access-Control-Allow-Origin` to add to the head (`http/cors.rs`),
    /// unless the plugin writes its own.
    pub cors: Option<&'a [u8]>,
    /// Set for the plugin's `admit` call: `M0Host.request_model` may name
    /// the request's model then, and only then (1.6).
    pub admitting: bool,
    /// The model `request_model` named (`models::NO_MODEL` when none).
    pub model: u32,
    pub status: u16,
    pub bytes_sent: u64,
    /// Of `bytes_sent`, the body's (the access log's "bytes").
    pub body_sent: u64,
}

/// What the connection does after the exchange.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Outcome {
    pub keep_alive: bool,
    pub status: u16,
    /// An inline call answered `M0_DEFER`: nothing was sent; the request
    /// goes to the handler pool.
    pub deferred: bool,
    /// Body bytes sent.
    pub body_bytes: u64,
    /// Requests in the `handle_batch` call that answered this one; 0 for a
    /// call of its own.
    pub batch: u16,
}

impl<'a> Exchange<'a> {
    pub fn new(
        fd: RawFd,
        http_minor: u8,
        is_head: bool,
        keep_alive: bool,
        body: &'a [u8],
        scratch: &'a mut Vec<u8>,
        sink: Sink<'a>,
    ) -> Exchange<'a> {
        scratch.clear();
        Exchange {
            fd,
            http_minor,
            is_head,
            keep_alive,
            body,
            body_pos: 0,
            state: State::Idle,
            scratch,
            sink,
            socket_full: false,
            reason_len: None,
            cors: None,
            admitting: false,
            model: super::models::NO_MODEL,
            status: 0,
            bytes_sent: 0,
            body_sent: 0,
        }
    }

    pub fn read_body(&mut self, buf: &mut [u8]) -> usize {
        let rest = &self.body[self.body_pos..];
        let n = rest.len().min(buf.len());
        buf[..n].copy_from_slice(&rest[..n]);
        self.body_pos += n;
        n
    }

    /// The plugin's reason phrase for the response it is about to start.
    pub fn set_reason(&mut self, reason: &[u8]) -> i32 {
        if self.state != State::Idle {
            return abi::M0_ERR_STATE;
        }
        if !response::is_valid_reason(reason) {
            crate::log::warn(format_args!(
                "the plugin's reason phrase {:?} is refused (M0_ERR_INVALID): at most {} bytes of tab, space, visible ASCII or bytes from 0x80",
                String::from_utf8_lossy(reason),
                abi::M0_REASON_MAX
            ));
            return abi::M0_ERR_INVALID;
        }
        self.scratch.clear();
        self.scratch.extend_from_slice(reason);
        self.reason_len = Some(reason.len());
        abi::M0_OK
    }

    pub fn start<'h>(
        &mut self,
        status: u16,
        headers: impl Iterator<Item = (&'h [u8], &'h [u8])> + Clone,
        declared: i64,
    ) -> i32 {
        if self.state != State::Idle {
            return abi::M0_ERR_STATE;
        }
        // The phrase is for this start only: a start refused below (and
        // the error response a plugin may send instead) goes out with the
        // standard phrase.
        let mut phrase = [0u8; abi::M0_REASON_MAX];
        let reason = self.reason_len.take().map(|n| {
            phrase[..n].copy_from_slice(&self.scratch[..n]);
            &phrase[..n]
        });
        if !(200..=999).contains(&status) {
            crate::log::warn(format_args!(
                "the plugin's response status {status} is refused (M0_ERR_INVALID): a final status is 200 to 999"
            ));
            return abi::M0_ERR_INVALID;
        }
        for (name, value) in headers.clone() {
            let why = if !response::is_valid_field(name, value) {
                "a header name must be a token and neither may hold CR, LF or NUL"
            } else if response::is_hop_or_framing_header(name) {
                "the server writes that header itself"
            } else {
                continue;
            };
            crate::log::warn(format_args!(
                "the plugin's response header {:?} is refused (M0_ERR_INVALID): {why}",
                String::from_utf8_lossy(name)
            ));
            return abi::M0_ERR_INVALID;
        }
        let length = BodyLength::choose(status, declared, self.http_minor);
        if length == BodyLength::UntilClose || is_draining() {
            self.keep_alive = false;
        }
        let cors = self.cors.filter(|_| {
            !headers
                .clone()
                .any(|(name, _)| name.eq_ignore_ascii_case(b"access-control-allow-origin"))
        });
        let added: [(&[u8], &[u8]); 2] = [
            (b"Access-Control-Allow-Origin", cors.unwrap_or_default()),
            (b"Vary", b"Origin"),
        ];
        let added = &added[..if cors.is_some() { 2 } else { 0 }];
        self.scratch.clear();
        response::write_head(
            self.scratch,
            self.http_minor,
            status,
            reason,
            length,
            self.keep_alive,
            headers
                .map(|(n, v)| (n as &[u8], v as &[u8]))
                .chain(added.iter().copied()),
        );
        let remaining = match length {
            BodyLength::Sized(n) => n,
            _ => 0,
        };
        self.status = status;
        self.state = State::Open { length, remaining };
        abi::M0_OK
    }

    pub fn write(&mut self, data: &[u8]) -> i32 {
        let State::Open { length, remaining } = self.state else {
            return abi::M0_ERR_STATE;
        };
        let discard = self.is_head || length == BodyLength::NoBody;
        let result = match length {
            _ if discard || data.is_empty() => Ok(()),
            BodyLength::Sized(_) => {
                // Never send more than was declared; the rest is dropped and
                // the connection closed, so the next response is not garbled.
                let take = (data.len() as u64).min(remaining) as usize;
                if take < data.len() {
                    if remaining > 0 || self.keep_alive {
                        // Once per response: the write that crosses the
                        // length, or the first past it.
                        crate::log::warn(format_args!(
                            "the plugin wrote past the Content-Length it declared; {} bytes dropped and the connection closed",
                            data.len() - take
                        ));
                    }
                    self.keep_alive = false;
                }
                self.state = State::Open {
                    length,
                    remaining: remaining - take as u64,
                };
                self.send(&data[..take], b"")
            }
            BodyLength::Chunked => {
                let mut size = [0u8; 18];
                let hex = hex_len(data.len(), &mut size);
                self.scratch.extend_from_slice(hex);
                self.scratch.extend_from_slice(b"\r\n");
                self.send(data, b"\r\n")
            }
            BodyLength::UntilClose => self.send(data, b""),
            BodyLength::NoBody => Ok(()),
        };
        self.settle(result)
    }

    pub fn finish(&mut self) -> i32 {
        let State::Open { length, remaining } = self.state else {
            return if self.state == State::Done {
                abi::M0_OK
            } else {
                abi::M0_ERR_STATE
            };
        };
        let cut_short = matches!(length, BodyLength::Sized(_)) && remaining > 0 && !self.is_head;
        let result = if length == BodyLength::Chunked && !self.is_head {
            self.send(b"0\r\n\r\n", b"")
        } else {
            self.send(b"", b"")
        };
        let code = self.settle(result);
        if code != abi::M0_OK {
            return code;
        }
        if cut_short {
            // The client will see a short body and a closed connection.
            self.state = State::Broken;
            return abi::M0_ERR_STATE;
        }
        self.state = State::Done;
        abi::M0_OK
    }

    /// Whether the plugin has begun the response (or the host answered it).
    pub fn started(&self) -> bool {
        self.state != State::Idle
    }

    /// The plugin's call returned `code`: complete or cut the response.
    pub fn conclude(&mut self, code: i32) -> Outcome {
        let inline = matches!(self.sink, Sink::Spill(_));
        match (self.state, code) {
            (State::Idle, abi::M0_DEFER) if inline => {
                return Outcome {
                    keep_alive: self.keep_alive,
                    status: 0,
                    deferred: true,
                    body_bytes: 0,
                    batch: 0,
                };
            }
            (State::Idle, abi::M0_DEFER) => {
                crate::log::warn(format_args!(
                    "the plugin returned M0_DEFER from a handler thread (only inline calls may); answering 500"
                ));
                self.send_error(500, "the application sent no response");
            }
            (State::Idle, abi::M0_OK) => {
                crate::log::warn(format_args!(
                    "the plugin returned without responding; answering 500"
                ));
                self.send_error(500, "the application sent no response");
            }
            (State::Idle, _) => {
                let status = status_for_error(code);
                self.send_error(status, response::reason(status));
            }
            (State::Open { .. }, abi::M0_OK) => {
                self.finish();
            }
            (State::Open { .. }, _) => self.state = State::Broken,
            (State::Done | State::Broken, _) => {}
        }
        if self.uncork().is_err() {
            self.state = State::Broken;
        }
        Outcome {
            keep_alive: self.keep_alive && self.state == State::Done,
            status: self.status,
            deferred: false,
            body_bytes: self.body_sent,
            batch: 0,
        }
    }

    fn send_error(&mut self, status: u16, text: &str) {
        self.scratch.clear();
        let keep_alive = self.keep_alive && !is_draining();
        self.keep_alive = keep_alive;
        response::simple(self.scratch, self.http_minor, status, text, keep_alive, &[]);
        if self.is_head {
            // HEAD: the same head, no body.
            let head_end = self
                .scratch
                .windows(4)
                .position(|w| w == b"\r\n\r\n")
                .map_or(0, |p| p + 4);
            self.scratch.truncate(head_end);
        }
        self.status = status;
        let result = self.send(b"", b"");
        self.state = if result.is_ok() {
            if !self.is_head {
                // The text and the newline `simple` adds.
                self.body_sent += text.len() as u64 + 1;
            }
            State::Done
        } else {
            State::Broken
        };
    }

    fn settle(&mut self, result: Result<(), i32>) -> i32 {
        match result {
            Ok(()) => abi::M0_OK,
            Err(code) => {
                self.state = State::Broken;
                code
            }
        }
    }

    /// Send `scratch` (cleared after), then `data`, then `tail`, in one
    /// vectored write when the socket takes it.
    fn send(&mut self, data: &[u8], tail: &[u8]) -> Result<(), i32> {
        let scratch = std::mem::take(self.scratch);
        let mut slices = [
            IoSlice::new(&scratch),
            IoSlice::new(data),
            IoSlice::new(tail),
        ];
        let total = (scratch.len() + data.len() + tail.len()) as u64;
        let result = match &mut self.sink {
            Sink::Wait(timeout) => write_all(self.fd, &mut slices, *timeout),
            Sink::Spill(spilled) => {
                write_or_spill(self.fd, &slices, spilled, &mut self.socket_full)
            }
        };
        *self.scratch = scratch;
        self.scratch.clear();
        if result.is_ok() {
            self.bytes_sent += total;
            self.body_sent += data.len() as u64;
        }
        result
    }
}

impl Exchange<'_> {
    /// Send the corked writes of an inline call (what the socket does not
    /// take stays in the spill buffer for the loop).
    fn uncork(&mut self) -> Result<(), i32> {
        let Sink::Spill(spilled) = &mut self.sink else {
            return Ok(());
        };
        if self.socket_full || spilled.is_empty() {
            return Ok(());
        }
        let mut sent = 0;
        let all = flush_spilled(self.fd, spilled, &mut sent)?;
        if all {
            spilled.clear();
        } else {
            spilled.drain(..sent);
            self.socket_full = true;
        }
        Ok(())
    }
}

fn status_for_error(code: i32) -> u16 {
    match code {
        abi::M0_ERR_BAD_REQUEST => 400,
        abi::M0_ERR_NOT_FOUND => 404,
        abi::M0_ERR_TOO_LARGE => 413,
        abi::M0_ERR_UNPROCESSABLE => 422,
        abi::M0_ERR_UNAVAILABLE => 503,
        abi::M0_ERR_TIMEOUT => 504,
        _ => 500,
    }
}

fn hex_len(mut n: usize, buf: &mut [u8; 18]) -> &[u8] {
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b"0123456789abcdef"[n & 15];
        n >>= 4;
        if n == 0 {
            break;
        }
    }
    &buf[i..]
}

/// Send from `slices` (advancing them) until every byte went, `Ok(true)`,
/// or the socket is full, `Ok(false)`.
fn send_until_full(fd: RawFd, slices: &mut &mut [IoSlice<'_>]) -> Result<bool, i32> {
    IoSlice::advance_slices(slices, 0);
    while !slices.is_empty() {
        match nix::sys::socket::sendmsg::<()>(fd, slices, &[], MsgFlags::MSG_NOSIGNAL, None) {
            Ok(n) => IoSlice::advance_slices(slices, n),
            Err(nix::errno::Errno::EINTR) => {}
            Err(nix::errno::Errno::EAGAIN) => return Ok(false),
            Err(_) => return Err(abi::M0_ERR_DISCONNECTED),
        }
    }
    Ok(true)
}

/// Write every slice, waiting for the socket when it is full.
pub fn write_all(
    fd: RawFd,
    mut slices: &mut [IoSlice<'_>],
    timeout: Option<Duration>,
) -> Result<(), i32> {
    // Reckoned from the first time the socket is full: no clock read for
    // a write that goes at once.
    let mut deadline = None;
    while !send_until_full(fd, &mut slices)? {
        let deadline = *deadline.get_or_insert_with(|| timeout.map(|t| Instant::now() + t));
        wait_writable(fd, deadline)?;
    }
    Ok(())
}

/// Inline: gather the slices behind what `spilled` holds while the two
/// stay within `CORK_BYTES`; past that, send both in one vectored write and
/// keep what the socket does not take, in order, in `spilled`. Once the
/// socket is full (`socket_full`), everything is kept without another try.
fn write_or_spill(
    fd: RawFd,
    slices: &[IoSlice<'_>; 3],
    spilled: &mut Vec<u8>,
    socket_full: &mut bool,
) -> Result<(), i32> {
    let total: usize = slices.iter().map(|s| s.len()).sum();
    if *socket_full || spilled.len() + total <= CORK_BYTES {
        for slice in slices {
            spilled.extend_from_slice(slice);
        }
        return Ok(());
    }
    let held = spilled.len();
    // On the stack: this runs for every large inline write.
    let mut all = [IoSlice::new(spilled), slices[0], slices[1], slices[2]];
    let mut rest = &mut all[..];
    let done = send_until_full(fd, &mut rest)?;
    let unsent: usize = rest.iter().map(|s| s.len()).sum();
    if done {
        spilled.clear();
        return Ok(());
    }
    *socket_full = true;
    // Keep the unsent tail: of the held bytes first, then of the slices.
    let sent = held + total - unsent;
    spilled.drain(..sent.min(held));
    let mut skip = sent.saturating_sub(held);
    for slice in slices {
        let take = skip.min(slice.len());
        spilled.extend_from_slice(&slice[take..]);
        skip -= take;
    }
    Ok(())
}

/// Send what the socket takes of `out[*pos..]`; true once all of it went.
pub fn flush_spilled(fd: RawFd, out: &[u8], pos: &mut usize) -> Result<bool, i32> {
    let mut one = [IoSlice::new(&out[*pos..])];
    let mut slices = &mut one[..];
    let all_sent = send_until_full(fd, &mut slices);
    *pos = out.len() - slices.iter().map(|s| s.len()).sum::<usize>();
    all_sent
}

fn wait_writable(fd: RawFd, deadline: Option<Instant>) -> Result<(), i32> {
    use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
    use std::os::fd::BorrowedFd;
    loop {
        let wait = match deadline {
            None => PollTimeout::NONE,
            Some(d) => {
                let left = d.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(abi::M0_ERR_WRITE_TIMEOUT);
                }
                PollTimeout::try_from(left.as_millis().min(60_000) as i32 + 1)
                    .unwrap_or(PollTimeout::MAX)
            }
        };
        // SAFETY: fd is the connection's socket, kept open by the loop while
        // this request is dispatched.
        let borrowed = unsafe { BorrowedFd::borrow_raw(fd) };
        let mut fds = [PollFd::new(borrowed, PollFlags::POLLOUT)];
        match poll(&mut fds, wait) {
            Ok(0) => continue,
            Ok(_) => {
                let revents = fds[0].revents().unwrap_or(PollFlags::empty());
                if revents.intersects(PollFlags::POLLERR | PollFlags::POLLHUP | PollFlags::POLLNVAL)
                {
                    return Err(abi::M0_ERR_DISCONNECTED);
                }
                return Ok(());
            }
            Err(nix::errno::Errno::EINTR) => continue,
            Err(_) => return Err(abi::M0_ERR_DISCONNECTED),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_lengths() {
        let mut b = [0; 18];
        assert_eq!(hex_len(0, &mut b), b"0");
        assert_eq!(hex_len(255, &mut b), b"ff");
        assert_eq!(hex_len(4096, &mut b), b"1000");
    }

    #[test]
    fn error_codes_map_to_statuses() {
        assert_eq!(status_for_error(abi::M0_ERR_INTERNAL), 500);
        assert_eq!(status_for_error(abi::M0_ERR_UNAVAILABLE), 503);
        assert_eq!(status_for_error(-9999), 500);
    }
}
