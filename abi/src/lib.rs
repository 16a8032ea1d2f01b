//! The m0serve plugin ABI, version 1.
//!
//! This crate is the single source of the C ABI between the `m0serve` core and
//! its plugins. `include/m0serve.h` is generated from it by cbindgen and checked
//! in; `abi/tests/header.rs` fails when the two disagree. It has no
//! dependencies, so a Rust plugin that uses these types pulls in nothing of the
//! server.
//!
//! # Conventions (read these before writing a plugin)
//! - Every struct that crosses the boundary begins with `size`, its own
//!   `sizeof` as its writer knows it. Structs only grow at the end. A reader
//!   uses a field only when `size` covers it.
//! - `M0Str` is a borrowed byte view, not NUL-terminated, valid only for the
//!   duration of the call that handed it out.
//! - Out-parameters are written only on success.
//! - Functions return `int32_t`: `M0_OK` (0) or a negative `M0_ERR_*` code.
//!   Codes are never reused.
//! - The plugin reaches the host only through the `M0Host` table it receives
//!   at init; it links no symbol of the server binary.
//! - A plugin exports exactly two functions, `m0_plugin_describe` and
//!   `m0_plugin_init`. It is opened `RTLD_NOW | RTLD_LOCAL` in each worker
//!   process (never in the supervisor) and never unloaded.
//!
//! # Versioning
//! `M0_ABI_MAJOR` must match exactly. `M0_ABI_MINOR` only grows: the host
//! accepts a plugin built for the same or an older minor, and refuses a newer
//! one (it may call host functions this host does not have).
//!
//! # Changelog
//! What each minor added; a minor only adds, and a struct grows only at
//! its end.
//! - 1.0: the first version.
//! - 1.1: `M0_CAP_INLINE`, `M0Request.flags` with `M0_REQ_ON_LOOP`, and the
//!   `M0_DEFER` return code: a plugin whose handler does not block may be
//!   called on the event-loop thread.
//! - 1.2: `M0Host.fact`: a plugin states facts about how it will run (its
//!   runtime's version, modules that do not survive `fork()`), which
//!   `m0serve --doctor` reports and the startup checks read.
//! - 1.3: `M0PluginInfo.max_batch_bytes`: with `M0_CAP_BATCH`, the most
//!   body bytes one `handle_batch` call holds (a stand-in for the work a
//!   batch costs, such as an embedding model's tokens).
//! - 1.4: `M0Host.response_reason`: the reason phrase of a response
//!   (a WSGI app's `"299 Totally Custom"`), sent as given instead of the
//!   standard phrase for its status. `M0Host.set_ready`: a plugin says
//!   whether its worker is ready for traffic (a model still warming up),
//!   which the server's health path (`--health-path`) reports.
//!   `M0_REQ_HTTPS` in `M0Request.flags`: a trusted proxy says the client
//!   used https.
//! - 1.5: `M0Request.queued_ns`: when the host had the whole request and
//!   queued it for the plugin, on `M0Host.now_ns`'s clock, so a plugin can
//!   report how long a request waited before its work began.
//!   `M0_CAP_ADMIT` and `M0PluginCalls.admit`: the plugin sees each
//!   request on the event-loop thread before it is queued, says what it
//!   costs (an embedding model: its inputs) and may refuse it at once (a
//!   429) instead of letting it wait; the host holds each admitted cost
//!   until that request's response is done. `M0_THREAD_NONE` is the
//!   `thread_index` of those calls.
//!
//! This section is the only copy: `abi/tests/header.rs` puts it at the top
//! of `include/m0serve.h`.
#![no_std]

use core::ffi::{c_char, c_void};

/// Major ABI version: a plugin built for another major is refused.
pub const M0_ABI_MAJOR: u32 = 1;
/// Minor ABI version: grows with additive changes.
pub const M0_ABI_MINOR: u32 = 6;

// ---------------------------------------------------------------------------
// Return codes. Stable, never reused. Negative codes from `handle` map to an
// HTTP status when no response has been started yet.
// ---------------------------------------------------------------------------

/// Success.
pub const M0_OK: i32 = 0;
/// From a call made with `M0_REQ_ON_LOOP`, before any response: "this one
/// may block; call me again on a handler thread". An error anywhere else.
pub const M0_DEFER: i32 = 1;
/// Internal error in the plugin (500).
pub const M0_ERR_INTERNAL: i32 = -1;
/// The request is invalid for this handler (400).
pub const M0_ERR_BAD_REQUEST: i32 = -2;
/// Nothing is served here (404).
pub const M0_ERR_NOT_FOUND: i32 = -3;
/// The plugin is overloaded or not ready (503).
pub const M0_ERR_UNAVAILABLE: i32 = -4;
/// A backend the plugin waited on timed out (504).
pub const M0_ERR_TIMEOUT: i32 = -5;
/// The request body is too large for this handler (413).
pub const M0_ERR_TOO_LARGE: i32 = -6;
/// The input was understood but cannot be processed (422).
pub const M0_ERR_UNPROCESSABLE: i32 = -7;
/// The client went away; returned by host functions, not an HTTP status.
pub const M0_ERR_DISCONNECTED: i32 = -100;
/// A host function was called out of order (write before start, start twice).
pub const M0_ERR_STATE: i32 = -101;
/// An argument was invalid (a header with CR, LF or NUL, a status out of range).
pub const M0_ERR_INVALID: i32 = -102;
/// A write did not complete within the server's write timeout.
pub const M0_ERR_WRITE_TIMEOUT: i32 = -103;

/// `m0_plugin_init` status: the plugin refuses this configuration; the worker
/// exits 78 (EX_CONFIG) and is not respawned.
pub const M0_INIT_REFUSED: i32 = 78;
/// `m0_plugin_init` status: the plugin failed to start; the worker exits 1.
pub const M0_INIT_FAILED: i32 = 1;

// ---------------------------------------------------------------------------
// How a plugin may be called. Zero is "undeclared" in every field and is read
// as the safest choice.
// ---------------------------------------------------------------------------

/// Undeclared: read as `M0_CALL_PINNED`.
pub const M0_CALL_UNDECLARED: u32 = 0;
/// Every call happens on one and the same host thread.
pub const M0_CALL_PINNED: u32 = 1;
/// One call at a time, from any handler thread.
pub const M0_CALL_SERIALIZED: u32 = 2;
/// Any number of concurrent calls from any handler threads.
pub const M0_CALL_REENTRANT: u32 = 3;

/// Undeclared: read as `M0_LOCK_HELD`.
pub const M0_LOCK_UNDECLARED: u32 = 0;
/// A process-wide lock (an interpreter's GIL) is held for the whole call.
pub const M0_LOCK_HELD: u32 = 1;
/// A process-wide lock exists but calls release it while they wait or compute
/// natively, so concurrent calls overlap.
pub const M0_LOCK_RELEASED: u32 = 2;
/// No process-wide lock.
pub const M0_LOCK_NONE: u32 = 3;

/// Undeclared: read as `M0_START_NEEDS_EXEC`.
pub const M0_START_UNDECLARED: u32 = 0;
/// The plugin may be opened in a forked copy of the supervisor.
pub const M0_START_FORK_SAFE: u32 = 1;
/// The plugin must be opened in a freshly exec'd process (a runtime that does
/// not survive `fork()`: CUDA, Core ML, libdispatch).
pub const M0_START_NEEDS_EXEC: u32 = 2;

/// Capability bit: `handle_batch` may be called with several requests.
/// A handler thread that takes work takes every request already queued,
/// up to `max_batch` requests and `max_batch_bytes` body bytes, and hands
/// them over in one call; it never waits for more to arrive. Every request
/// in a batch has its whole body; each belongs to another connection.
pub const M0_CAP_BATCH: u32 = 1;
/// Capability bit: the plugin reports lock wait with `M0_COUNTER_LOCK_WAIT_NS`.
pub const M0_CAP_REPORTS_LOCK_WAIT: u32 = 2;
/// Capability bit (1.1): `handle` answers without blocking (no sleeps, no
/// waits on locks or other processes), so the host may call it on the
/// event-loop thread, saving the hand-off to a handler thread. Such calls
/// carry `M0_REQ_ON_LOOP`; a request that would block returns `M0_DEFER`
/// and is called again on a handler thread. Honoured for reentrant plugins
/// with no concurrency cap, whose thread hooks then also run on the loop.
pub const M0_CAP_INLINE: u32 = 4;
/// Capability bit (1.5): the host calls `M0PluginCalls.admit` for every
/// request before the request is queued for `handle` or `handle_batch`
/// (see `M0AdmitFn`). Honoured only with a calls table that has `admit`.
pub const M0_CAP_ADMIT: u32 = 8;

/// `M0Request::thread_index` of an `admit` call (1.5): it runs on the
/// event loop's thread, which may have no index of its own and on which
/// `thread_start` may not have run.
pub const M0_THREAD_NONE: u32 = u32::MAX;

/// `M0Request::flags` bit (1.1): this call is on the event-loop thread.
pub const M0_REQ_ON_LOOP: u32 = 1;
/// 1.4, in `M0Request.flags`: the client used https, as a proxy the
/// operator trusts says (`--forwarded-allow-ips`); `peer` is then the
/// client that proxy names.
pub const M0_REQ_HTTPS: u32 = 2;

/// Log levels for `M0Host::log`.
pub const M0_LOG_ERROR: u32 = 1;
pub const M0_LOG_WARN: u32 = 2;
pub const M0_LOG_INFO: u32 = 3;
pub const M0_LOG_DEBUG: u32 = 4;

/// Counter: nanoseconds a handler thread waited to take the plugin's
/// process-wide lock (the WSGI plugin: the GIL). Feeds the adaptive pool.
pub const M0_COUNTER_LOCK_WAIT_NS: u32 = 1;
/// Counter: times a handler thread waited for the process-wide lock.
pub const M0_COUNTER_LOCK_WAITS: u32 = 2;

/// 1.6: the most models one process registers (`M0Host.model_register`).
pub const M0_MODELS_MAX: usize = 16;
/// 1.6: the longest model name, in bytes.
pub const M0_MODEL_NAME_MAX: usize = 128;

/// 1.6, `M0Host.metric_define`'s `kind`: a counter, which only grows.
pub const M0_METRIC_COUNTER: u32 = 1;
/// 1.6, `M0Host.metric_define`'s `kind`: a histogram over fixed bounds.
pub const M0_METRIC_HISTOGRAM: u32 = 2;
/// 1.6: the most metrics one process defines.
pub const M0_METRICS_MAX: usize = 32;
/// 1.6: the longest metric name, in bytes.
pub const M0_METRIC_NAME_MAX: usize = 64;
/// 1.6: the most bucket bounds of one histogram.
pub const M0_METRIC_BOUNDS_MAX: usize = 16;
/// 1.6: the most labels on one `metric_record` call.
pub const M0_METRIC_LABELS_MAX: usize = 4;

/// `content_length` value for `response_start`: length unknown, the body is
/// sent chunked (HTTP/1.1) or delimited by close (HTTP/1.0).
pub const M0_LENGTH_UNKNOWN: i64 = -1;

/// Size of the message buffer in `M0Error`.
pub const M0_ERROR_MESSAGE_LEN: usize = 512;

// ---------------------------------------------------------------------------
// Structs.
// ---------------------------------------------------------------------------

/// A borrowed byte string: `len` bytes at `ptr`, not NUL-terminated.
/// `ptr` may be NULL only when `len` is 0.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0Str {
    pub ptr: *const u8,
    pub len: usize,
}

impl M0Str {
    /// An empty view.
    pub const EMPTY: M0Str = M0Str {
        ptr: core::ptr::null(),
        len: 0,
    };

    /// A view of `bytes`; the caller keeps `bytes` alive while the view is used.
    pub const fn from_bytes(bytes: &[u8]) -> M0Str {
        M0Str {
            ptr: bytes.as_ptr(),
            len: bytes.len(),
        }
    }

    /// The viewed bytes.
    ///
    /// # Safety
    /// `ptr` must point to `len` readable bytes that outlive `'a`, as the host
    /// guarantees for every view it hands out during a call.
    pub unsafe fn as_bytes<'a>(&self) -> &'a [u8] {
        if self.len == 0 {
            &[]
        } else {
            // SAFETY: non-empty views point to `len` bytes (caller's contract).
            unsafe { core::slice::from_raw_parts(self.ptr, self.len) }
        }
    }
}

/// One header: name and value as they arrived (names keep their case).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0Header {
    pub name: M0Str,
    pub value: M0Str,
}

/// A socket address in text form, ready for logs and `REMOTE_ADDR`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0SockAddr {
    /// The IP address as text ("127.0.0.1", "::1").
    pub ip: M0Str,
    pub port: u16,
}

/// What a plugin is and how it may be called. Returned by
/// `m0_plugin_describe`, which must have no side effects: `m0serve --doctor`
/// calls it in a throwaway process.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0PluginInfo {
    /// `sizeof(M0PluginInfo)` as the plugin was compiled.
    pub size: u32,
    /// `M0_ABI_MAJOR` the plugin was built against.
    pub abi_major: u32,
    /// `M0_ABI_MINOR` the plugin was built against.
    pub abi_minor: u32,
    /// One of `M0_CALL_*`.
    pub call_model: u32,
    /// Plugin name, NUL-terminated, static.
    pub name: *const c_char,
    /// Plugin version, NUL-terminated, static.
    pub version: *const c_char,
    /// Most calls in flight at once in one worker; 0 means no limit.
    pub max_concurrency: u32,
    /// One of `M0_LOCK_*`.
    pub process_lock: u32,
    /// One of `M0_START_*`.
    pub start: u32,
    /// Threads one call computes with itself (a BLAS pool); 0 means 1.
    pub compute_threads: u32,
    /// `M0_CAP_*` bits.
    pub caps: u32,
    /// With `M0_CAP_BATCH`: the most requests in one `handle_batch` call;
    /// 0 means no limit.
    pub max_batch: u32,
    /// 1.3, with `M0_CAP_BATCH`: the most body bytes in one `handle_batch`
    /// call, summed over its requests; 0 means no limit. Body bytes stand
    /// for the work a request costs (an embedding model's tokens). A request
    /// larger than this on its own is still served, in a batch of one. Read
    /// only when `size` covers it (`PLUGIN_INFO_BATCH_BYTES_END`).
    pub max_batch_bytes: u32,
}

// SAFETY: the pointers in a descriptor point to static, immutable strings.
unsafe impl Sync for M0PluginInfo {}

/// A request as the plugin sees it. Every view is borrowed from the host and
/// valid until `handle` returns.
#[repr(C)]
#[derive(Debug)]
pub struct M0Request {
    /// `sizeof(M0Request)` as the host was compiled.
    pub size: u32,
    /// 0 for HTTP/1.0, 1 for HTTP/1.1.
    pub http_minor: u32,
    pub method: M0Str,
    /// The request-target exactly as sent.
    pub target: M0Str,
    /// The path part of the target, still percent-encoded.
    pub path: M0Str,
    /// The query without the `?`; empty when there is none.
    pub query: M0Str,
    pub headers: *const M0Header,
    pub header_count: usize,
    /// Body length in bytes (the host has framed it; chunked bodies are
    /// decoded), or 0 when there is none.
    pub content_length: u64,
    pub peer: M0SockAddr,
    pub server: M0SockAddr,
    /// Index of the worker process serving this request.
    pub worker_index: u32,
    /// Index of the thread making this call, for per-thread state kept in
    /// an array: always below `M0InitArgs::max_handler_threads + 1` (the
    /// one more is the event loop's thread, for inline and loop calls, or,
    /// where the loop never calls the plugin, a handler thread started for
    /// a model with nothing running while every other thread is busy).
    /// Indices are reused: a thread's index is free again once its
    /// `thread_stop` has returned, never while two threads could hold it.
    /// An `admit` call (1.5) has `M0_THREAD_NONE` here.
    pub thread_index: u32,
    /// The host's own data; plugins pass the request back, never this.
    pub host_data: *mut c_void,
    /// 1.1: `M0_REQ_*` bits. Read it only when `size` covers it (a plugin
    /// that declares minor 1 or later always gets it).
    pub flags: u32,
    /// 1.5: when the host had the request's head and body and queued it
    /// for the plugin, in `M0Host.now_ns`'s nanoseconds; 0 when unknown.
    /// Read it only when `size` covers it (`REQUEST_QUEUED_END`).
    pub queued_ns: u64,
}

/// The response under construction; opaque to plugins.
pub struct M0Response {
    _private: [u8; 0],
}

/// Error detail written by `m0_plugin_init` on failure; the buffer belongs to
/// the host, so nothing is freed across allocators.
#[repr(C)]
pub struct M0Error {
    /// `sizeof(M0Error)` as the host was compiled.
    pub size: u32,
    /// The length of the message written into `message`.
    pub message_len: u32,
    pub message: [u8; M0_ERROR_MESSAGE_LEN],
}

/// Host functions handed to the plugin at init. Valid for the life of the
/// process; every function is safe to call from any handler thread.
#[repr(C)]
pub struct M0Host {
    /// `sizeof(M0Host)` as the host was compiled.
    pub size: u32,
    pub abi_major: u32,
    pub abi_minor: u32,
    /// Write a line to the server log (`M0_LOG_*` level).
    pub log: unsafe extern "C" fn(level: u32, message: *const u8, len: usize),
    /// Begin the response. `content_length` is the exact body length, or
    /// `M0_LENGTH_UNKNOWN` to stream it chunked. Headers the host owns
    /// (Content-Length, Transfer-Encoding, Connection, Date) are refused with
    /// `M0_ERR_INVALID`; a name or value with CR, LF or NUL too.
    pub response_start: unsafe extern "C" fn(
        response: *mut M0Response,
        status: u16,
        headers: *const M0Header,
        header_count: usize,
        content_length: i64,
    ) -> i32,
    /// Append body bytes. With an unknown length each call is sent as one
    /// chunk; bytes are on the wire (or the socket buffer) when it returns.
    pub response_write:
        unsafe extern "C" fn(response: *mut M0Response, data: *const u8, len: usize) -> i32,
    /// End the response. A sized response that received fewer bytes than it
    /// declared is cut off and its connection closed.
    pub response_finish: unsafe extern "C" fn(response: *mut M0Response) -> i32,
    /// Start, write and finish in one call: the common case, one `writev`.
    pub response_send: unsafe extern "C" fn(
        response: *mut M0Response,
        status: u16,
        headers: *const M0Header,
        header_count: usize,
        body: *const u8,
        body_len: usize,
    ) -> i32,
    /// Read up to `len` body bytes into `buf`. Returns the count, 0 at the
    /// end of the body, or a negative `M0_ERR_*`.
    pub body_read:
        unsafe extern "C" fn(request: *const M0Request, buf: *mut u8, len: usize) -> isize,
    /// Monotonic clock in nanoseconds.
    pub now_ns: unsafe extern "C" fn() -> u64,
    /// Add `value` to one of the `M0_COUNTER_*` counters of this worker.
    pub counter_add: unsafe extern "C" fn(counter: u32, value: u64),
    /// 1.2: State a fact about how the plugin will run, for `m0serve
    /// --doctor` and the startup checks. `key` is a dotted lowercase name
    /// (`a-z`, `0-9` and `_` in parts joined by dots, beginning with a
    /// letter, at most 64 bytes), named after the plugin or its runtime:
    /// `python.version`, `python.fork_unsafe_modules`. `value` is text
    /// (bytes that are not UTF-8 are replaced). A later fact with the same
    /// key replaces the earlier one. Returns `M0_OK`, or `M0_ERR_INVALID`
    /// for a malformed key or a NULL pointer with a non-zero length.
    /// Usually called during init; callable from any thread. Present only
    /// when `size` covers it: a host older than 1.2 has no `fact` (in C,
    /// check `host->size >= offsetof(M0Host, fact) + sizeof host->fact`).
    pub fact: unsafe extern "C" fn(
        key: *const u8,
        key_len: usize,
        value: *const u8,
        value_len: usize,
    ) -> i32,
    /// 1.4: Set the reason phrase of a response not yet started, sent in
    /// place of the standard one for its status (`OK`, `Not Found`; none
    /// for a status without one). Call it before `response_start` or
    /// `response_send`; the status line is written then. `reason` is at
    /// most 256 bytes of tab, space, visible ASCII or bytes from 0x80
    /// (RFC 9112's reason-phrase); anything else, a response already
    /// started or a NULL pointer with a non-zero length is
    /// `M0_ERR_INVALID` / `M0_ERR_STATE`, and the standard phrase stays.
    /// Present only when `size` covers it (`HOST_REASON_END`).
    pub response_reason:
        unsafe extern "C" fn(response: *mut M0Response, reason: *const u8, len: usize) -> i32,
    /// 1.4: Say whether this worker is ready for traffic: `ready` 0 while
    /// the plugin cannot serve yet (a model loading in the background
    /// after init returned, a cache being rebuilt), non-zero once it can.
    /// A worker starts ready. While not ready, the server's health path
    /// (`--health-path`) answers 503, so a load balancer or Kubernetes
    /// sends it nothing; requests that do arrive still reach the plugin.
    /// Callable from any thread, at init or later; returns `M0_OK`.
    /// Present only when `size` covers it (`HOST_READY_END`).
    pub set_ready: unsafe extern "C" fn(ready: u32) -> i32,
    /// 1.6: Name a model this worker serves: 1 to `M0_MODEL_NAME_MAX`
    /// bytes of visible ASCII, without `"` or `\`. Returns the model's id
    /// (>= 0; the same name gives the same id; at most `M0_MODELS_MAX` per
    /// process), or `M0_ERR_INVALID`. Call it at init. Present only when
    /// `size` covers it (`HOST_MODEL_REGISTER_END`).
    pub model_register: unsafe extern "C" fn(name: *const u8, len: usize) -> i32,
    /// 1.6: Say which model `request` is for; only from `admit`, before
    /// it returns (`M0_ERR_STATE` from anywhere else). The host then
    /// batches it only with requests of the same model (requests with no
    /// model form a class of their own), choosing the next batch in turn
    /// among the models with requests queued, so a flood on one model
    /// delays another by at most the calls already running; counts its
    /// admitted cost in that model's `model_in_flight`; and labels its
    /// `m0serve_*` request and batch series with `model="NAME"` and its
    /// access log line with `"model"`. Returns `M0_OK`, or
    /// `M0_ERR_INVALID` for an id `model_register` did not return.
    /// Present only when `size` covers it (`HOST_REQUEST_MODEL_END`).
    pub request_model: unsafe extern "C" fn(request: *const M0Request, model: u32) -> i32,
    /// 1.6: The sum of the costs admitted for `model` whose responses are
    /// not complete (0 for an unknown id). Callable from any thread.
    /// Present only when `size` covers it (`HOST_MODEL_IN_FLIGHT_END`).
    pub model_in_flight: unsafe extern "C" fn(model: u32) -> u64,
    /// 1.6: Define one of the plugin's own metrics, shown on the
    /// `--metrics` page summed over the workers. `kind` is
    /// `M0_METRIC_COUNTER` or `M0_METRIC_HISTOGRAM` (with `bound_count`
    /// ascending finite `bounds`, at most `M0_METRIC_BOUNDS_MAX`; `bounds`
    /// is ignored for a counter); `name` a Prometheus metric name
    /// (`[a-zA-Z_:][a-zA-Z0-9_:]*`, at most `M0_METRIC_NAME_MAX` bytes, not
    /// beginning `m0serve_`); `help` its one-line description (no line
    /// breaks, at most 512 bytes). Returns the metric's id (>= 0; the same name with the same
    /// definition gives the same id; at most `M0_METRICS_MAX`), or
    /// `M0_ERR_INVALID`. Call it at init. Present only when `size` covers
    /// it (`HOST_METRIC_DEFINE_END`).
    pub metric_define: unsafe extern "C" fn(
        kind: u32,
        name: *const u8,
        name_len: usize,
        help: *const u8,
        help_len: usize,
        bounds: *const f64,
        bound_count: usize,
    ) -> i32,
    /// 1.6: Record `value` on metric `metric`: a counter adds it (>= 0),
    /// a histogram observes it. `labels` are (name, value) pairs, at most
    /// `M0_METRIC_LABELS_MAX`, names `[a-zA-Z_][a-zA-Z0-9_]*` (not `le`,
    /// each once), values at most 128 bytes of UTF-8, the metric's name
    /// and its labels at most 256 bytes together; each distinct set of
    /// labels is a series of its own. A worker holds 256 series, all its
    /// metrics together: past them, `M0_ERR_UNAVAILABLE` (and one warning
    /// in the log). Callable from any thread without blocking;
    /// returns `M0_OK`, or `M0_ERR_INVALID` for an unknown metric, a
    /// malformed label or a value a counter cannot add. Present only when
    /// `size` covers it (`HOST_METRIC_RECORD_END`).
    pub metric_record: unsafe extern "C" fn(
        metric: u32,
        labels: *const M0Header,
        label_count: usize,
        value: f64,
    ) -> i32,
}

/// What the host tells the plugin at init.
#[repr(C)]
pub struct M0InitArgs {
    /// `sizeof(M0InitArgs)` as the host was compiled.
    pub size: u32,
    pub worker_index: u32,
    /// Number of worker processes.
    pub workers: u32,
    /// Handler threads this worker starts with.
    pub handler_threads: u32,
    /// Most handler threads this worker may grow to (the adaptive pool).
    pub max_handler_threads: u32,
    /// 1 when the worker was started by fork+exec.
    pub spawned: u32,
    /// The first ARG given after `--plugin` on the command line (may be
    /// empty); 1.6 hands every one of them in `args`.
    pub arg: M0Str,
    /// `--app-dir` (defaults to ".").
    pub app_dir: M0Str,
    /// `--venv` (may be empty).
    pub venv: M0Str,
    /// The listener's host and port.
    pub server: M0SockAddr,
    /// 1.6: every ARG given after `--plugin`, in order (`arg` is the first
    /// of them); `arg_count` views at `args`, NULL when there are none.
    /// Read only when `size` covers them (`INIT_ARGS_ARGS_END`).
    pub args: *const M0Str,
    pub arg_count: usize,
}

/// Handle one request. Return `M0_OK` once the response is finished, or a
/// negative `M0_ERR_*`: before `response_start` it becomes that HTTP status;
/// after it, the response is cut off and the connection closed.
///
/// The worker catches its stop and reload signals with `SA_RESTART`
/// handlers, and the kernel may run them on any thread, this one included:
/// a call waiting in a system call that `SA_RESTART` does not restart
/// (`nanosleep`, `poll`, `epoll_wait`) must retry it on `EINTR`.
pub type M0HandleFn = unsafe extern "C" fn(
    state: *mut c_void,
    request: *const M0Request,
    response: *mut M0Response,
) -> i32;
/// Called on each handler thread when it starts, before its first `handle`.
/// A non-zero return stops the worker.
pub type M0ThreadStartFn = unsafe extern "C" fn(state: *mut c_void, thread_index: u32) -> i32;
/// Called on each handler thread before it exits.
pub type M0ThreadStopFn = unsafe extern "C" fn(state: *mut c_void, thread_index: u32);
/// Handle `count` requests at once (with `M0_CAP_BATCH`); each must be
/// answered through its own response. A request the call leaves unanswered
/// gets the status of the returned code (500 for `M0_OK`), so one failing
/// request fails alone and a failing call fails only its own requests.
pub type M0HandleBatchFn = unsafe extern "C" fn(
    state: *mut c_void,
    requests: *const *const M0Request,
    responses: *const *mut M0Response,
    count: usize,
) -> i32;
/// 1.5, with `M0_CAP_ADMIT`: decide whether one request may wait for
/// `handle` or `handle_batch`. Called on the event-loop thread once the
/// request's whole body has arrived (read it with `body_read`), before
/// it is queued, at any time relative to the plugin's other calls, whatever
/// its call model: it must not block, and `thread_index` is
/// `M0_THREAD_NONE`. `in_flight` is the sum of the costs this worker has
/// admitted whose responses are not yet complete.
///
/// To admit the request, write its cost (in the plugin's own unit, such as
/// inputs to embed; 0 is free) to `*cost` and return `M0_OK` without
/// starting the response: the host adds it to `in_flight` and takes it off
/// again exactly once, when the request's response is complete or cut
/// off, or the host answers it itself (its queue full: 503), whatever the
/// plugin's call returned. To refuse it, answer it through `response` as
/// `handle` would (a 429 with `Retry-After`), without blocking: it is
/// never queued, and its cost is not counted. A negative `M0_ERR_*` before
/// the response began is answered with that code's status. The plugin
/// keeps no count of its own, so none can leak.
pub type M0AdmitFn = unsafe extern "C" fn(
    state: *mut c_void,
    request: *const M0Request,
    response: *mut M0Response,
    in_flight: u64,
    cost: *mut u64,
) -> i32;
/// Called once when the worker drains, after the last request.
pub type M0ShutdownFn = unsafe extern "C" fn(state: *mut c_void);

/// The plugin's entry points, returned by `m0_plugin_init`. Static or living
/// as long as the process.
#[repr(C)]
pub struct M0PluginCalls {
    /// `sizeof(M0PluginCalls)` as the plugin was compiled.
    pub size: u32,
    /// Required: see `M0HandleFn`.
    pub handle: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            request: *const M0Request,
            response: *mut M0Response,
        ) -> i32,
    >,
    /// Optional: see `M0ThreadStartFn`.
    pub thread_start: Option<unsafe extern "C" fn(state: *mut c_void, thread_index: u32) -> i32>,
    /// Optional: see `M0ThreadStopFn`.
    pub thread_stop: Option<unsafe extern "C" fn(state: *mut c_void, thread_index: u32)>,
    /// Optional, with `M0_CAP_BATCH`: see `M0HandleBatchFn`.
    pub handle_batch: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            requests: *const *const M0Request,
            responses: *const *mut M0Response,
            count: usize,
        ) -> i32,
    >,
    /// Optional: see `M0ShutdownFn`.
    pub shutdown: Option<unsafe extern "C" fn(state: *mut c_void)>,
    /// 1.5, optional, with `M0_CAP_ADMIT`: see `M0AdmitFn`. Read only when
    /// `size` covers it (`PLUGIN_CALLS_ADMIT_END`).
    pub admit: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            request: *const M0Request,
            response: *mut M0Response,
            in_flight: u64,
            cost: *mut u64,
        ) -> i32,
    >,
}

// SAFETY: a calls table holds only function pointers.
unsafe impl Sync for M0PluginCalls {}

/// `m0_plugin_describe`: return the static descriptor. No side effects.
pub type M0DescribeFn = unsafe extern "C" fn() -> *const M0PluginInfo;

/// `m0_plugin_init`: start the plugin in this worker. On success write the
/// calls table and the state pointer handed to every call, and return `M0_OK`.
/// On failure write `error` and return `M0_INIT_FAILED` or `M0_INIT_REFUSED`.
pub type M0InitFn = unsafe extern "C" fn(
    host: *const M0Host,
    args: *const M0InitArgs,
    calls: *mut *const M0PluginCalls,
    state: *mut *mut c_void,
    error: *mut M0Error,
) -> i32;

/// Exported symbol names, without the NUL (the header has them as macros).
pub const DESCRIBE_SYMBOL: &str = "m0_plugin_describe";
pub const INIT_SYMBOL: &str = "m0_plugin_init";

// ---------------------------------------------------------------------------
// Sizes. A struct only grows at the end, so the 1.0 end of each struct is the
// least a reader may be handed, and is frozen: a minimum that followed the
// current size would refuse every plugin (or host) built before the newest
// field. Past the 1.0 end a reader checks each field with `covers`.
// ---------------------------------------------------------------------------

/// Whether a struct whose writer declared `size` bytes holds a field that
/// ends at byte `end` (its `offset_of!` plus its `size_of`). A reader uses a
/// field added after 1.0 only when this holds; fields up to the 1.0 end are
/// covered by the minimum sizes below.
pub const fn covers(size: u32, end: usize) -> bool {
    size as usize >= end
}

/// The smallest `M0PluginInfo` accepted: the end of `max_batch`, its last
/// 1.0 field (56 bytes on 64-bit targets).
pub const MIN_PLUGIN_INFO_SIZE: u32 =
    (core::mem::offset_of!(M0PluginInfo, max_batch) + size_of::<u32>()) as u32;
/// The smallest `M0PluginCalls` accepted: the end of `shutdown`, its last
/// 1.0 field (48 bytes on 64-bit targets).
pub const MIN_PLUGIN_CALLS_SIZE: u32 =
    (core::mem::offset_of!(M0PluginCalls, shutdown) + size_of::<Option<M0ShutdownFn>>()) as u32;
/// The smallest `M0Host` a plugin may be handed: the end of `counter_add`,
/// its last 1.0 function (80 bytes on 64-bit targets). A plugin needs no
/// more than this unless it uses a later function, which it checks with
/// `covers`.
pub const MIN_HOST_SIZE: u32 = (core::mem::offset_of!(M0Host, counter_add)
    + size_of::<unsafe extern "C" fn(u32, u64)>()) as u32;

/// The end of `M0PluginInfo::max_batch_bytes` (1.3): the host reads the
/// field only when `covers(info.size, PLUGIN_INFO_BATCH_BYTES_END)`.
pub const PLUGIN_INFO_BATCH_BYTES_END: usize =
    core::mem::offset_of!(M0PluginInfo, max_batch_bytes) + size_of::<u32>();

/// The end of `M0PluginCalls::admit` (1.5): the host calls it only when
/// `covers(calls.size, PLUGIN_CALLS_ADMIT_END)`.
pub const PLUGIN_CALLS_ADMIT_END: usize =
    core::mem::offset_of!(M0PluginCalls, admit) + size_of::<Option<M0AdmitFn>>();

/// The end of `M0Host::fact` (1.2): a plugin calls `fact` only when
/// `covers(host.size, HOST_FACT_END)`.
pub const HOST_FACT_END: usize = core::mem::offset_of!(M0Host, fact)
    + size_of::<unsafe extern "C" fn(*const u8, usize, *const u8, usize) -> i32>();

/// The end of `M0Host::response_reason` (1.4): a plugin calls it only when
/// `covers(host.size, HOST_REASON_END)`.
pub const HOST_REASON_END: usize = core::mem::offset_of!(M0Host, response_reason)
    + size_of::<unsafe extern "C" fn(*mut M0Response, *const u8, usize) -> i32>();

/// The end of `M0Host::set_ready` (1.4): a plugin calls it only when
/// `covers(host.size, HOST_READY_END)`.
pub const HOST_READY_END: usize =
    core::mem::offset_of!(M0Host, set_ready) + size_of::<unsafe extern "C" fn(u32) -> i32>();

/// The end of `M0Request::queued_ns` (1.5): a plugin reads the field only
/// when `covers(request.size, REQUEST_QUEUED_END)`.
pub const REQUEST_QUEUED_END: usize =
    core::mem::offset_of!(M0Request, queued_ns) + size_of::<u64>();

/// The end of `M0InitArgs::arg_count` (1.6): a plugin reads `args` and
/// `arg_count` only when `covers(args.size, INIT_ARGS_ARGS_END)`.
pub const INIT_ARGS_ARGS_END: usize =
    core::mem::offset_of!(M0InitArgs, arg_count) + size_of::<usize>();

/// The end of `M0Host::model_register` (1.6).
pub const HOST_MODEL_REGISTER_END: usize = core::mem::offset_of!(M0Host, model_register)
    + size_of::<unsafe extern "C" fn(*const u8, usize) -> i32>();
/// The end of `M0Host::request_model` (1.6).
pub const HOST_REQUEST_MODEL_END: usize = core::mem::offset_of!(M0Host, request_model)
    + size_of::<unsafe extern "C" fn(*const M0Request, u32) -> i32>();
/// The end of `M0Host::model_in_flight` (1.6).
pub const HOST_MODEL_IN_FLIGHT_END: usize =
    core::mem::offset_of!(M0Host, model_in_flight) + size_of::<unsafe extern "C" fn(u32) -> u64>();
/// The end of `M0Host::metric_define` (1.6).
pub const HOST_METRIC_DEFINE_END: usize = core::mem::offset_of!(M0Host, metric_define)
    + size_of::<
        unsafe extern "C" fn(u32, *const u8, usize, *const u8, usize, *const f64, usize) -> i32,
    >();
/// The end of `M0Host::metric_record` (1.6).
pub const HOST_METRIC_RECORD_END: usize = core::mem::offset_of!(M0Host, metric_record)
    + size_of::<unsafe extern "C" fn(u32, *const M0Header, usize, f64) -> i32>();

/// The longest reason phrase `response_reason` takes.
pub const M0_REASON_MAX: usize = 256;

// The minimums are the 1.0 layouts, whatever is added after them.
#[cfg(target_pointer_width = "64")]
const _: () =
    assert!(MIN_PLUGIN_INFO_SIZE == 56 && MIN_PLUGIN_CALLS_SIZE == 48 && MIN_HOST_SIZE == 80);
#[cfg(target_pointer_width = "32")]
const _: () =
    assert!(MIN_PLUGIN_INFO_SIZE == 48 && MIN_PLUGIN_CALLS_SIZE == 24 && MIN_HOST_SIZE == 44);
const _: () = assert!(MIN_PLUGIN_INFO_SIZE as usize <= size_of::<M0PluginInfo>());
const _: () = assert!(MIN_PLUGIN_CALLS_SIZE as usize <= size_of::<M0PluginCalls>());
const _: () = assert!(MIN_HOST_SIZE as usize <= size_of::<M0Host>());
// The field types the sizes above are computed with: a field whose type
// changes fails to compile here instead of moving a minimum silently.
const _: fn(&M0PluginInfo) -> &u32 = |info| &info.max_batch;
const _: fn(&M0PluginCalls) -> &Option<M0ShutdownFn> = |calls| &calls.shutdown;
const _: fn(&M0Host) -> &unsafe extern "C" fn(u32, u64) = |host| &host.counter_add;
const _: fn(&M0Host) -> &unsafe extern "C" fn(*const u8, usize, *const u8, usize) -> i32 =
    |host| &host.fact;
// Fields added after 1.0 lie past the 1.0 end, so a 1.0 reader never sees them.
const _: () = assert!(HOST_FACT_END > MIN_HOST_SIZE as usize);
const _: () = assert!(HOST_REASON_END > HOST_FACT_END);
const _: () = assert!(HOST_READY_END > HOST_REASON_END);
const _: () = assert!(HOST_MODEL_REGISTER_END > HOST_READY_END);
const _: () = assert!(HOST_REQUEST_MODEL_END > HOST_MODEL_REGISTER_END);
const _: () = assert!(HOST_MODEL_IN_FLIGHT_END > HOST_REQUEST_MODEL_END);
const _: () = assert!(HOST_METRIC_DEFINE_END > HOST_MODEL_IN_FLIGHT_END);
const _: () = assert!(HOST_METRIC_RECORD_END > HOST_METRIC_DEFINE_END);
const _: () = assert!(HOST_METRIC_RECORD_END == size_of::<M0Host>());
const _: () = assert!(INIT_ARGS_ARGS_END == size_of::<M0InitArgs>());
const _: () = assert!(
    core::mem::offset_of!(M0InitArgs, args)
        >= core::mem::offset_of!(M0InitArgs, server) + size_of::<M0SockAddr>()
);
const _: fn(&M0Host) -> &unsafe extern "C" fn(*const M0Request, u32) -> i32 =
    |host| &host.request_model;
const _: fn(&M0Host) -> &unsafe extern "C" fn(u32, *const M0Header, usize, f64) -> i32 =
    |host| &host.metric_record;
const _: fn(&M0Host) -> &unsafe extern "C" fn(*mut M0Response, *const u8, usize) -> i32 =
    |host| &host.response_reason;
const _: () = assert!(PLUGIN_INFO_BATCH_BYTES_END > MIN_PLUGIN_INFO_SIZE as usize);
const _: () = assert!(PLUGIN_CALLS_ADMIT_END > MIN_PLUGIN_CALLS_SIZE as usize);
const _: fn(&M0PluginCalls) -> &Option<M0AdmitFn> = |calls| &calls.admit;
