//! While the plugin's init runs (a model loading, a graph compiling) the
//! worker cannot serve requests, yet a probe of `--health-path` must hear
//! "not yet" instead of waiting in the listener's backlog until its own
//! timeout. So a thread of its own watches the listener during init:
//!
//! - a probe gets 503 `loading` and `Connection: close`;
//! - any other request is held with the bytes read of it and handed to the
//!   event loop once init returns, so nothing a client sent is lost; if
//!   init fails, each held request gets a 503 before the worker exits;
//! - it accepts only while no other worker serves the listener: when one
//!   does (a reload's predecessor, a ready sibling), connections stay in the
//!   backlog for it, so a worker that is loading never takes traffic a
//!   ready one could answer.
//!
//! The thread parses heads with the loop's own parser and limits, so a
//! probe is recognised exactly as the loop would recognise it.

use std::io::{self, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::poll::{PollFd, PollFlags, PollTimeout, poll};

use crate::http::head::{self, Limits, RequestHead};
use crate::http::response::{self, BodyLength};
use crate::shared_page::{LEAVING, SharedPage};

/// Connections watched at most; past it the rest wait in the backlog.
const MAX_WATCHED: usize = 1024;
/// How often the thread looks again for a worker that serves.
const RECHECK: Duration = Duration::from_millis(100);

/// A connection accepted while init ran, with what it sent so far.
pub struct Held {
    pub stream: TcpStream,
    pub peer: SocketAddr,
    pub bytes: Vec<u8>,
}

/// Who else may be serving the listener while this worker loads.
pub struct Others<'a> {
    /// The supervisor saw another worker ready when it started this one.
    pub served_at_start: bool,
    /// The shared page: its lines say which siblings serve now.
    pub page: Option<&'a SharedPage>,
}

impl Others<'_> {
    fn serve(&self) -> bool {
        self.served_at_start || self.page.is_some_and(page_shows_a_server)
    }
}

/// A line names a live process other than this one that is not leaving:
/// a worker that has finished its init (its pid is written then) and still
/// serves. Its own slot's line may name its predecessor: that counts.
fn page_shows_a_server(page: &SharedPage) -> bool {
    let me = u64::from(std::process::id());
    (0..page.workers()).any(|i| {
        let line = page.line(i);
        let pid = line.pid.load(Ordering::SeqCst);
        pid != 0
            && pid != me
            && line.state.load(Ordering::SeqCst) != LEAVING
            && i32::try_from(pid)
                .is_ok_and(|p| nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), None).is_ok())
    })
}

/// Run `init` on this thread; meanwhile, with a health path, answer its
/// probes from another. Returns what `init` returned and the connections
/// held for the event loop.
pub fn during<T>(
    listener: &TcpListener,
    health_path: Option<&str>,
    limits: &Limits,
    others: Others<'_>,
    init: impl FnOnce() -> T,
) -> (T, Vec<Held>) {
    let Some(path) = health_path else {
        return (init(), Vec::new());
    };
    let Ok((stop_read, stop_write)) = nix::unistd::pipe() else {
        // Without the pipe there is no way to stop the thread: probes wait
        // in the backlog, as they would with no health path.
        return (init(), Vec::new());
    };
    std::thread::scope(|scope| {
        let watcher = std::thread::Builder::new()
            .name("m0-loading".into())
            .spawn_scoped(scope, || watch(listener, path, limits, &others, &stop_read));
        let out = init();
        drop(stop_write);
        let held = match watcher {
            Ok(handle) => handle.join().unwrap_or_default(),
            Err(_) => Vec::new(),
        };
        (out, held)
    })
}

/// Init failed: each held request hears why instead of a reset.
pub fn refuse_held(held: Vec<Held>) {
    for h in held {
        let minor = minor_version(&h.bytes);
        answer(h.stream, minor, false, b"the plugin failed to start\n");
    }
}

/// A connection whose head has not all arrived.
struct Reading {
    stream: TcpStream,
    peer: SocketAddr,
    bytes: Vec<u8>,
}

fn watch(
    listener: &TcpListener,
    path: &str,
    limits: &Limits,
    others: &Others<'_>,
    stop: &OwnedFd,
) -> Vec<Held> {
    let mut reading: Vec<Reading> = Vec::new();
    let mut held: Vec<Held> = Vec::new();
    let mut head = RequestHead::default();
    let recheck = PollTimeout::try_from(RECHECK).unwrap_or(PollTimeout::NONE);
    // After a failed accept (out of descriptors), the listener, which poll
    // reports level-triggered, is left alone until the next recheck.
    let mut listen_after: Option<std::time::Instant> = None;
    loop {
        let rested = listen_after.is_none_or(|t| std::time::Instant::now() >= t);
        let accepting = rested && reading.len() + held.len() < MAX_WATCHED && !others.serve();
        let (stopped, listener_ready, readable) = {
            let mut fds = vec![PollFd::new(stop.as_fd(), PollFlags::POLLIN)];
            if accepting {
                fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
            }
            fds.extend(
                reading
                    .iter()
                    .map(|r| PollFd::new(r.stream.as_fd(), PollFlags::POLLIN)),
            );
            match poll(&mut fds, recheck) {
                Ok(_) => {}
                Err(nix::errno::Errno::EINTR) => continue,
                // Nothing to watch with: leave the rest to the event loop.
                Err(_) => break,
            }
            let fired = |fd: &PollFd| fd.revents().is_some_and(|r| !r.is_empty());
            let first = 1 + usize::from(accepting);
            (
                fired(&fds[0]),
                accepting && fired(&fds[1]),
                fds[first..].iter().map(fired).collect::<Vec<_>>(),
            )
        };
        if stopped {
            break;
        }
        // Readable ones in reverse, so removing one keeps the others' places.
        for i in (0..readable.len()).rev() {
            if readable[i] {
                let r = reading.swap_remove(i);
                if let Some(r) = read_more(r, path, limits, &mut head, &mut held) {
                    reading.push(r);
                }
            }
        }
        if listener_ready && !accept_some(listener, &mut reading) {
            listen_after = Some(std::time::Instant::now() + RECHECK);
        }
    }
    held.extend(reading.into_iter().map(|r| Held {
        stream: r.stream,
        peer: r.peer,
        bytes: r.bytes,
    }));
    held
}

/// False when accept failed for another reason than an empty backlog.
fn accept_some(listener: &TcpListener, reading: &mut Vec<Reading>) -> bool {
    for _ in 0..64 {
        match listener.accept() {
            Ok((stream, peer)) => {
                if stream.set_nonblocking(true).is_ok() {
                    reading.push(Reading {
                        stream,
                        peer,
                        bytes: Vec::new(),
                    });
                }
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            // Taken by another worker, or none left.
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return true,
            // EMFILE and the like: the event loop reports it once it runs.
            Err(_) => return false,
        }
    }
    true
}

/// Read what arrived. The connection comes back while its head is still
/// incomplete; a probe is answered and closed; anything else is held.
fn read_more(
    mut r: Reading,
    path: &str,
    limits: &Limits,
    head: &mut RequestHead,
    held: &mut Vec<Held>,
) -> Option<Reading> {
    let mut chunk = [0u8; 4096];
    loop {
        match r.stream.read(&mut chunk) {
            // The client left before its request was whole.
            Ok(0) => return None,
            Ok(n) => r.bytes.extend_from_slice(&chunk[..n]),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => return None,
        }
        if r.bytes.len() > limits.max_head_bytes {
            break;
        }
    }
    match head::parse(&r.bytes, limits, head) {
        Ok(false) if r.bytes.len() <= limits.max_head_bytes => Some(r),
        Ok(true) if head.path.get(&r.bytes) == path.as_bytes() => {
            answer(r.stream, head.http_minor, head.is_head_method, b"loading\n");
            None
        }
        // A request for the plugin, or one the loop will refuse with its
        // precise status: both are the event loop's.
        _ => {
            held.push(Held {
                stream: r.stream,
                peer: r.peer,
                bytes: r.bytes,
            });
            None
        }
    }
}

/// `HTTP/1.0` heads get a 1.0 answer; anything else 1.1.
fn minor_version(bytes: &[u8]) -> u8 {
    let line = bytes.split(|&b| b == b'\n').next().unwrap_or_default();
    u8::from(!line.trim_ascii_end().ends_with(b"HTTP/1.0"))
}

/// A 503 with `text`, then close. The socket is fresh and the answer small:
/// it fits the send buffer, so a short blocking write is enough.
fn answer(mut stream: TcpStream, http_minor: u8, head_only: bool, text: &[u8]) {
    let mut out = Vec::with_capacity(256);
    response::write_head(
        &mut out,
        http_minor,
        503,
        None,
        BodyLength::Sized(text.len() as u64),
        false,
        [
            (&b"Content-Type"[..], &b"text/plain; charset=utf-8"[..]),
            (&b"Cache-Control"[..], &b"no-store"[..]),
        ]
        .into_iter(),
    );
    if !head_only {
        out.extend_from_slice(text);
    }
    let _ = stream.set_nonblocking(false);
    let _ = stream.set_write_timeout(Some(Duration::from_secs(1)));
    let _ = stream.write_all(&out);
    let _ = stream.shutdown(std::net::Shutdown::Write);
}

#[cfg(test)]
mod tests {
    use super::minor_version;

    #[test]
    fn the_answer_keeps_a_10_clients_version() {
        assert_eq!(minor_version(b"GET / HTTP/1.0\r\nHost: x\r\n"), 0);
        assert_eq!(minor_version(b"GET / HTTP/1.1\r\n"), 1);
        assert_eq!(minor_version(b"GET / HTT"), 1);
    }
}
