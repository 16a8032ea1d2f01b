//! The one place where the core calls a plugin's `handle`, and its thread
//! hooks.
//!
//! Every caller (a handler thread, the event loop for inline calls, the
//! thread leading the loop for loop calls) hands over a parsed `Job`, the
//! `CallBuffers` of its thread and a `Sink` saying where bytes go when the
//! socket is full; `serve` builds the `M0Request`, calls the plugin and
//! concludes the exchange. Nothing here knows about the pool or the loop.

use std::ffi::c_void;
use std::os::fd::RawFd;
use std::sync::Arc;
use std::time::Instant;

use m0serve_abi as abi;

use super::exchange::{Exchange, Outcome, Sink};
use super::loader::Calls;
use crate::http::Span;
use crate::http::head::RequestHead;

/// The peer of a connection, as text once per connection.
#[derive(Debug)]
pub struct Peer {
    pub ip: String,
    pub port: u16,
}

/// Where the body of a dispatched request lives.
#[derive(Debug)]
pub enum Body {
    /// In the request buffer, after the head (Content-Length bodies).
    InBuffer(Span),
    /// Decoded from chunked framing.
    Decoded(Vec<u8>),
}

/// A parsed request on its way to the plugin. Owns its buffer; the loop
/// gets the allocations back with the completion and reuses them.
pub struct Job {
    pub token: usize,
    pub fd: RawFd,
    pub buf: Vec<u8>,
    pub head: RequestHead,
    pub body: Body,
    pub keep_alive: bool,
    pub peer: Arc<Peer>,
    pub queued_at: Instant,
}

/// A job whose response is complete (or cut off), for the loop.
pub struct Completion {
    pub job: Job,
    pub outcome: Outcome,
}

/// What every call of this worker shares: the plugin's entry points and
/// the server address and worker index each request carries.
pub struct Callee {
    pub calls: Calls,
    pub server_ip: String,
    pub server_port: u16,
    pub worker_index: u32,
}

/// What a thread keeps for its calls into the plugin: its thread index and
/// the buffers each call reuses.
pub struct CallBuffers {
    pub index: u32,
    /// The kernel's id of the thread these belong to.
    pub tid: i32,
    headers: Vec<abi::M0Header>,
    scratch: Vec<u8>,
}

// SAFETY: `headers` holds views into the request of the call in progress;
// `serve` refills it before each call and nothing reads it between calls, so
// the stale pointers it keeps meanwhile are never dereferenced, on any thread.
unsafe impl Send for CallBuffers {}

impl CallBuffers {
    /// On the thread that will use them.
    pub fn new(index: u32) -> CallBuffers {
        CallBuffers {
            index,
            tid: nix::unistd::gettid().as_raw(),
            headers: Vec::with_capacity(32),
            scratch: Vec::with_capacity(1024),
        }
    }
}

/// The plugin's per-thread start hook, if it has one, on the calling thread
/// (the error is the hook's code).
pub fn thread_start_hook(calls: &Calls, index: u32) -> Result<(), i32> {
    match calls.thread_start {
        // SAFETY: the plugin's state and its thread-start hook, on the thread
        // that will make its calls.
        Some(start) => match unsafe { start(calls.state, index) } {
            abi::M0_OK => Ok(()),
            code => Err(code),
        },
        None => Ok(()),
    }
}

/// The plugin's per-thread stop hook, on the thread whose start hook ran.
pub fn thread_stop_hook(calls: &Calls, index: u32) {
    if let Some(stop) = calls.thread_stop {
        // SAFETY: the plugin's state and its thread-stop hook, on the thread
        // whose start hook ran, after its last call.
        unsafe { stop(calls.state, index) };
    }
}

/// Call the plugin for one job on this thread.
pub fn serve(callee: &Callee, job: &Job, bufs: &mut CallBuffers, sink: Sink<'_>) -> Outcome {
    let flags = match sink {
        Sink::Spill(_) => abi::M0_REQ_ON_LOOP,
        Sink::Wait(_) => 0,
    };
    let buf = &job.buf;
    let head = &job.head;
    let view = |span: Span| abi::M0Str::from_bytes(span.get(buf));
    let headers = &mut bufs.headers;
    headers.clear();
    headers.extend(head.headers.iter().map(|&(n, v)| abi::M0Header {
        name: view(n),
        value: view(v),
    }));
    let body: &[u8] = match &job.body {
        Body::InBuffer(span) => span.get(buf),
        Body::Decoded(v) => v,
    };
    let mut exchange = Exchange::new(
        job.fd,
        head.http_minor,
        head.is_head_method,
        job.keep_alive,
        body,
        &mut bufs.scratch,
        sink,
    );
    let exchange_ptr: *mut Exchange<'_> = &mut exchange;
    let request = abi::M0Request {
        size: std::mem::size_of::<abi::M0Request>() as u32,
        http_minor: u32::from(head.http_minor),
        method: view(head.method),
        target: view(head.target),
        path: view(head.path),
        query: view(head.query),
        headers: headers.as_ptr(),
        header_count: headers.len(),
        content_length: body.len() as u64,
        peer: abi::M0SockAddr {
            ip: abi::M0Str::from_bytes(job.peer.ip.as_bytes()),
            port: job.peer.port,
        },
        server: abi::M0SockAddr {
            ip: abi::M0Str::from_bytes(callee.server_ip.as_bytes()),
            port: callee.server_port,
        },
        worker_index: callee.worker_index,
        thread_index: bufs.index,
        host_data: exchange_ptr.cast::<c_void>(),
        flags,
    };
    let calls = callee.calls;
    // SAFETY: every view in `request` borrows `job`, `bufs` or `callee`,
    // all alive until the call returns; the response handle is the exchange,
    // which the host functions cast back. Callers honour the plugin's
    // declared call model (the worker sizes its pool and picks inline or
    // loop calls from the declaration).
    let code = unsafe {
        (calls.handle)(
            calls.state,
            &request,
            exchange_ptr.cast::<abi::M0Response>(),
        )
    };
    exchange.conclude(code)
}
