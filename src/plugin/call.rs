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

/// The peer of a connection, as text once per connection (or the client a
/// trusted proxy names, for one request).
#[derive(Debug)]
pub struct Peer {
    pub addr: std::net::IpAddr,
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
    /// A trusted proxy says the client used https (`M0_REQ_HTTPS`).
    pub https: bool,
    /// `--cors-allow-origin` allows the request's `Origin` (its span in
    /// `buf`): the response says so.
    pub cors: Option<(crate::http::cors::Allow, Span)>,
    pub queued_at: Instant,
    /// What the plugin's `admit` said the request costs (0 without one):
    /// the loop holds it in its in-flight sum until the job comes back.
    pub cost: u64,
    /// The model the plugin's `admit` named (`M0Host.request_model`), or
    /// `models::NO_MODEL`: the pool batches only jobs of one model
    /// together, and the metrics and access log name it.
    pub model: u32,
}

impl Job {
    /// The request body, framing removed.
    pub fn body(&self) -> &[u8] {
        match &self.body {
            Body::InBuffer(span) => span.get(&self.buf),
            Body::Decoded(v) => v,
        }
    }

    pub fn body_len(&self) -> usize {
        match &self.body {
            Body::InBuffer(span) => span.len(),
            Body::Decoded(v) => v.len(),
        }
    }
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
    /// For batch calls: empty (no allocation) until the first one.
    batch: BatchBuffers,
}

/// What a batch call reuses: each request's headers and response scratch,
/// the requests, and the two pointer arrays `handle_batch` takes.
#[derive(Default)]
struct BatchBuffers {
    headers: Vec<Vec<abi::M0Header>>,
    scratch: Vec<Vec<u8>>,
    requests: Vec<abi::M0Request>,
    request_ptrs: Vec<*const abi::M0Request>,
    response_ptrs: Vec<*mut abi::M0Response>,
}

// SAFETY: `headers` and every vector of `batch` hold views into the requests
// of the call in progress (and pointers to its exchanges); `serve` and
// `serve_batch` refill them before each call and nothing reads them between
// calls, so the stale pointers they keep meanwhile are never dereferenced,
// on any thread.
unsafe impl Send for CallBuffers {}

impl CallBuffers {
    /// On the thread that will use them.
    pub fn new(index: u32) -> CallBuffers {
        CallBuffers {
            index,
            tid: nix::unistd::gettid().as_raw(),
            headers: Vec::with_capacity(32),
            scratch: Vec::with_capacity(1024),
            batch: BatchBuffers::default(),
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
    fill_headers(&mut bufs.headers, job);
    let mut exchange = exchange_for(job, &mut bufs.scratch, sink);
    let exchange_ptr: *mut Exchange<'_> = &mut exchange;
    let request = request_for(callee, job, &bufs.headers, bufs.index, flags, exchange_ptr);
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

/// What the plugin's `admit` made of a request.
pub enum Admission {
    /// Queue it; it holds this cost until its response is done, and is a
    /// request for this model (`models::NO_MODEL` when none was named).
    Admitted { cost: u64, model: u32 },
    /// The plugin refused it and answered it on the loop (or failed,
    /// and the host answered with the code's status).
    Answered(Outcome),
}

/// Ask the plugin's `admit` (1.5) about `job`, on the event loop's thread:
/// `in_flight` is the cost admitted and not yet done. A response it writes
/// goes out as an inline call's would (what the socket does not take lands
/// in `spilled`). A plugin without `admit` admits everything for free.
pub fn admit(
    callee: &Callee,
    job: &Job,
    bufs: &mut CallBuffers,
    spilled: &mut Vec<u8>,
    in_flight: u64,
) -> Admission {
    let Some(admit) = callee.calls.admit else {
        return Admission::Admitted {
            cost: 0,
            model: super::models::NO_MODEL,
        };
    };
    fill_headers(&mut bufs.headers, job);
    let mut exchange = exchange_for(job, &mut bufs.scratch, Sink::Spill(spilled));
    exchange.admitting = true;
    let exchange_ptr: *mut Exchange<'_> = &mut exchange;
    let request = request_for(
        callee,
        job,
        &bufs.headers,
        abi::M0_THREAD_NONE,
        abi::M0_REQ_ON_LOOP,
        exchange_ptr,
    );
    let mut cost = 0u64;
    let calls = callee.calls;
    // SAFETY: as in `serve`: every view borrows `job`, `bufs` or `callee`,
    // alive until the call returns, the response handle is the exchange,
    // and `cost` is a local the plugin may write. The plugin declared
    // `M0_CAP_ADMIT`, so it takes this call beside its others, on this
    // thread, without blocking.
    let code = unsafe {
        admit(
            calls.state,
            &request,
            exchange_ptr.cast::<abi::M0Response>(),
            in_flight,
            &mut cost,
        )
    };
    exchange.admitting = false;
    if code == abi::M0_OK && !exchange.started() {
        return Admission::Admitted {
            cost,
            model: exchange.model,
        };
    }
    // A started response is the answer whatever the code; an error code
    // with none is answered with its status.
    let code = if exchange.started() || code < 0 {
        code
    } else {
        abi::M0_ERR_INTERNAL
    };
    Admission::Answered(exchange.conclude(code))
}

/// Call the plugin's `handle_batch` once for `jobs` on this handler thread
/// and push each job's outcome, in order, onto `outcomes`. A request the
/// call left unanswered is answered with the status of the call's code, so
/// one bad request fails alone and a failed call fails only its own.
pub fn serve_batch(
    callee: &Callee,
    jobs: &[Job],
    bufs: &mut CallBuffers,
    write_timeout: Option<std::time::Duration>,
    outcomes: &mut Vec<Outcome>,
) {
    let Some(handle_batch) = callee.calls.handle_batch else {
        // The worker batches only with the entry point; never reached.
        for job in jobs {
            outcomes.push(serve(callee, job, bufs, Sink::Wait(write_timeout)));
        }
        return;
    };
    let b = &mut bufs.batch;
    if b.headers.len() < jobs.len() {
        b.headers.resize_with(jobs.len(), Vec::new);
        b.scratch.resize_with(jobs.len(), Vec::new);
    }
    for (headers, job) in b.headers.iter_mut().zip(jobs) {
        fill_headers(headers, job);
    }
    // Built in full before any pointer to them is taken: the vector never
    // moves its elements while the plugin holds them.
    let mut exchanges: Vec<Exchange<'_>> = jobs
        .iter()
        .zip(b.scratch.iter_mut())
        .map(|(job, scratch)| exchange_for(job, scratch, Sink::Wait(write_timeout)))
        .collect();
    let base = exchanges.as_mut_ptr();
    b.requests.clear();
    b.request_ptrs.clear();
    b.response_ptrs.clear();
    for (i, (job, headers)) in jobs.iter().zip(&b.headers).enumerate() {
        // SAFETY: `i` is below `exchanges.len()`, which equals `jobs.len()`.
        let exchange = unsafe { base.add(i) };
        b.requests
            .push(request_for(callee, job, headers, bufs.index, 0, exchange));
        b.response_ptrs.push(exchange.cast::<abi::M0Response>());
    }
    b.request_ptrs
        .extend(b.requests.iter().map(|r| r as *const abi::M0Request));
    let calls = callee.calls;
    // SAFETY: `jobs.len()` requests and responses, each request's views
    // borrowing its job, `bufs` or `callee`, and each response handle one
    // distinct exchange, all alive until the call returns (as in `serve`).
    // A batch is made only on a handler thread, as the call model allows.
    let code = unsafe {
        handle_batch(
            calls.state,
            b.request_ptrs.as_ptr(),
            b.response_ptrs.as_ptr(),
            jobs.len(),
        )
    };
    let size = u16::try_from(jobs.len()).unwrap_or(u16::MAX);
    outcomes.extend(exchanges.iter_mut().map(|exchange| Outcome {
        batch: size,
        ..exchange.conclude(code)
    }));
}

/// The request's headers as views into its buffer.
fn fill_headers(headers: &mut Vec<abi::M0Header>, job: &Job) {
    let view = |span: Span| abi::M0Str::from_bytes(span.get(&job.buf));
    headers.clear();
    headers.extend(job.head.headers.iter().map(|&(n, v)| abi::M0Header {
        name: view(n),
        value: view(v),
    }));
}

fn exchange_for<'a>(job: &'a Job, scratch: &'a mut Vec<u8>, sink: Sink<'a>) -> Exchange<'a> {
    let head = &job.head;
    let mut exchange = Exchange::new(
        job.fd,
        head.http_minor,
        head.is_head_method,
        job.keep_alive,
        job.body(),
        scratch,
        sink,
    );
    exchange.cors = job
        .cors
        .map(|(allow, origin)| allow.value(origin, &job.buf));
    exchange
}

/// The `M0Request` for `job`, its views borrowing `job`, `headers` and
/// `callee`, and its response handle `exchange`.
fn request_for(
    callee: &Callee,
    job: &Job,
    headers: &[abi::M0Header],
    thread_index: u32,
    flags: u32,
    exchange: *mut Exchange<'_>,
) -> abi::M0Request {
    let head = &job.head;
    let view = |span: Span| abi::M0Str::from_bytes(span.get(&job.buf));
    abi::M0Request {
        size: std::mem::size_of::<abi::M0Request>() as u32,
        http_minor: u32::from(head.http_minor),
        method: view(head.method),
        target: view(head.target),
        path: view(head.path),
        query: view(head.query),
        headers: headers.as_ptr(),
        header_count: headers.len(),
        content_length: job.body_len() as u64,
        peer: abi::M0SockAddr {
            ip: abi::M0Str::from_bytes(job.peer.ip.as_bytes()),
            port: job.peer.port,
        },
        server: abi::M0SockAddr {
            ip: abi::M0Str::from_bytes(callee.server_ip.as_bytes()),
            port: callee.server_port,
        },
        worker_index: callee.worker_index,
        thread_index,
        host_data: exchange.cast::<c_void>(),
        flags: if job.https {
            flags | abi::M0_REQ_HTTPS
        } else {
            flags
        },
        // `now_ns`'s clock (CLOCK_MONOTONIC), which `Instant` also reads:
        // now, less how long ago the job was queued.
        queued_ns: super::host::monotonic_ns()
            .saturating_sub(u64::try_from(job.queued_at.elapsed().as_nanos()).unwrap_or(u64::MAX)),
    }
}
