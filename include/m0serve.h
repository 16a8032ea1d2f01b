/*
 * m0serve plugin ABI. GENERATED from abi/src/lib.rs by cbindgen: do not edit.
 * Refresh: M0_UPDATE_HEADER=1 cargo test -p m0serve-abi --test header
 *
 * A plugin includes this header only, exports m0_plugin_describe and
 * m0_plugin_init (mark them M0_EXPORT and build with -fvisibility=hidden),
 * and reaches the server only through the M0Host table it gets at init.
 *
 * ABI changelog
 * What each minor added; a minor only adds, and a struct grows only at
 * its end.
 * - 1.0: the first version.
 * - 1.1: M0_CAP_INLINE, M0Request.flags with M0_REQ_ON_LOOP, and the
 *   M0_DEFER return code: a plugin whose handler does not block may be
 *   called on the event-loop thread.
 * - 1.2: M0Host.fact: a plugin states facts about how it will run (its
 *   runtime's version, modules that do not survive fork()), which
 *   m0serve --doctor reports and the startup checks read.
 * - 1.3: M0PluginInfo.max_batch_bytes: with M0_CAP_BATCH, the most
 *   body bytes one handle_batch call holds (a stand-in for the work a
 *   batch costs, such as an embedding model's tokens).
 * - 1.4: M0Host.response_reason: the reason phrase of a response
 *   (a WSGI app's "299 Totally Custom"), sent as given instead of the
 *   standard phrase for its status. M0Host.set_ready: a plugin says
 *   whether its worker is ready for traffic (a model still warming up),
 *   which the server's health path (--health-path) reports.
 *   M0_REQ_HTTPS in M0Request.flags: a trusted proxy says the client
 *   used https.
 * - 1.5: M0Request.queued_ns: when the host had the whole request and
 *   queued it for the plugin, on M0Host.now_ns's clock, so a plugin can
 *   report how long a request waited before its work began.
 *   M0_CAP_ADMIT and M0PluginCalls.admit: the plugin sees each
 *   request on the event-loop thread before it is queued, says what it
 *   costs (an embedding model: its inputs) and may refuse it at once (a
 *   429) instead of letting it wait; the host holds each admitted cost
 *   until that request's response is done. M0_THREAD_NONE is the
 *   thread_index of those calls.
 */

#ifndef M0SERVE_H
#define M0SERVE_H

#include <stddef.h>
#include <stdint.h>
#if defined(_WIN32)
#define M0_EXPORT __declspec(dllexport)
#else
#define M0_EXPORT __attribute__((visibility("default")))
#endif

#define M0_DESCRIBE_SYMBOL "m0_plugin_describe"
#define M0_INIT_SYMBOL "m0_plugin_init"

typedef struct M0PluginInfo M0PluginInfo;
typedef struct M0Host M0Host;
typedef struct M0InitArgs M0InitArgs;
typedef struct M0PluginCalls M0PluginCalls;
typedef struct M0Error M0Error;

#ifdef __cplusplus
extern "C" {
#endif
/* The two entry points every plugin exports (definitions below). */
M0_EXPORT const M0PluginInfo *m0_plugin_describe(void);
M0_EXPORT int32_t m0_plugin_init(const M0Host *host, const M0InitArgs *args,
                                 const M0PluginCalls **calls, void **state,
                                 M0Error *error);
#ifdef __cplusplus
}  /* extern "C" */
#endif


// Major ABI version: a plugin built for another major is refused.
#define M0_ABI_MAJOR 1

// Minor ABI version: grows with additive changes.
#define M0_ABI_MINOR 6

// Success.
#define M0_OK 0

// From a call made with `M0_REQ_ON_LOOP`, before any response: "this one
// may block; call me again on a handler thread". An error anywhere else.
#define M0_DEFER 1

// Internal error in the plugin (500).
#define M0_ERR_INTERNAL -1

// The request is invalid for this handler (400).
#define M0_ERR_BAD_REQUEST -2

// Nothing is served here (404).
#define M0_ERR_NOT_FOUND -3

// The plugin is overloaded or not ready (503).
#define M0_ERR_UNAVAILABLE -4

// A backend the plugin waited on timed out (504).
#define M0_ERR_TIMEOUT -5

// The request body is too large for this handler (413).
#define M0_ERR_TOO_LARGE -6

// The input was understood but cannot be processed (422).
#define M0_ERR_UNPROCESSABLE -7

// The client went away; returned by host functions, not an HTTP status.
#define M0_ERR_DISCONNECTED -100

// A host function was called out of order (write before start, start twice).
#define M0_ERR_STATE -101

// An argument was invalid (a header with CR, LF or NUL, a status out of range).
#define M0_ERR_INVALID -102

// A write did not complete within the server's write timeout.
#define M0_ERR_WRITE_TIMEOUT -103

// `m0_plugin_init` status: the plugin refuses this configuration; the worker
// exits 78 (EX_CONFIG) and is not respawned.
#define M0_INIT_REFUSED 78

// `m0_plugin_init` status: the plugin failed to start; the worker exits 1.
#define M0_INIT_FAILED 1

// Undeclared: read as `M0_CALL_PINNED`.
#define M0_CALL_UNDECLARED 0

// Every call happens on one and the same host thread.
#define M0_CALL_PINNED 1

// One call at a time, from any handler thread.
#define M0_CALL_SERIALIZED 2

// Any number of concurrent calls from any handler threads.
#define M0_CALL_REENTRANT 3

// Undeclared: read as `M0_LOCK_HELD`.
#define M0_LOCK_UNDECLARED 0

// A process-wide lock (an interpreter's GIL) is held for the whole call.
#define M0_LOCK_HELD 1

// A process-wide lock exists but calls release it while they wait or compute
// natively, so concurrent calls overlap.
#define M0_LOCK_RELEASED 2

// No process-wide lock.
#define M0_LOCK_NONE 3

// Undeclared: read as `M0_START_NEEDS_EXEC`.
#define M0_START_UNDECLARED 0

// The plugin may be opened in a forked copy of the supervisor.
#define M0_START_FORK_SAFE 1

// The plugin must be opened in a freshly exec'd process (a runtime that does
// not survive `fork()`: CUDA, Core ML, libdispatch).
#define M0_START_NEEDS_EXEC 2

// Capability bit: `handle_batch` may be called with several requests.
// A handler thread that takes work takes every request already queued,
// up to `max_batch` requests and `max_batch_bytes` body bytes, and hands
// them over in one call; it never waits for more to arrive. Every request
// in a batch has its whole body; each belongs to another connection.
#define M0_CAP_BATCH 1

// Capability bit: the plugin reports lock wait with `M0_COUNTER_LOCK_WAIT_NS`.
#define M0_CAP_REPORTS_LOCK_WAIT 2

// Capability bit (1.1): `handle` answers without blocking (no sleeps, no
// waits on locks or other processes), so the host may call it on the
// event-loop thread, saving the hand-off to a handler thread. Such calls
// carry `M0_REQ_ON_LOOP`; a request that would block returns `M0_DEFER`
// and is called again on a handler thread. Honoured for reentrant plugins
// with no concurrency cap, whose thread hooks then also run on the loop.
#define M0_CAP_INLINE 4

// Capability bit (1.5): the host calls `M0PluginCalls.admit` for every
// request before the request is queued for `handle` or `handle_batch`
// (see `M0AdmitFn`). Honoured only with a calls table that has `admit`.
#define M0_CAP_ADMIT 8

// `M0Request::thread_index` of an `admit` call (1.5): it runs on the
// event loop's thread, which may have no index of its own and on which
// `thread_start` may not have run.
#define M0_THREAD_NONE UINT32_MAX

// `M0Request::flags` bit (1.1): this call is on the event-loop thread.
#define M0_REQ_ON_LOOP 1

// 1.4, in `M0Request.flags`: the client used https, as a proxy the
// operator trusts says (`--forwarded-allow-ips`); `peer` is then the
// client that proxy names.
#define M0_REQ_HTTPS 2

// Log levels for `M0Host::log`.
#define M0_LOG_ERROR 1

#define M0_LOG_WARN 2

#define M0_LOG_INFO 3

#define M0_LOG_DEBUG 4

// Counter: nanoseconds a handler thread waited to take the plugin's
// process-wide lock (the WSGI plugin: the GIL). Feeds the adaptive pool.
#define M0_COUNTER_LOCK_WAIT_NS 1

// Counter: times a handler thread waited for the process-wide lock.
#define M0_COUNTER_LOCK_WAITS 2

// 1.6: the most models one process registers (`M0Host.model_register`).
#define M0_MODELS_MAX 16

// 1.6: the longest model name, in bytes.
#define M0_MODEL_NAME_MAX 128

// 1.6, `M0Host.metric_define`'s `kind`: a counter, which only grows.
#define M0_METRIC_COUNTER 1

// 1.6, `M0Host.metric_define`'s `kind`: a histogram over fixed bounds.
#define M0_METRIC_HISTOGRAM 2

// 1.6: the most metrics one process defines.
#define M0_METRICS_MAX 32

// 1.6: the longest metric name, in bytes.
#define M0_METRIC_NAME_MAX 64

// 1.6: the most bucket bounds of one histogram.
#define M0_METRIC_BOUNDS_MAX 16

// 1.6: the most labels on one `metric_record` call.
#define M0_METRIC_LABELS_MAX 4

// `content_length` value for `response_start`: length unknown, the body is
// sent chunked (HTTP/1.1) or delimited by close (HTTP/1.0).
#define M0_LENGTH_UNKNOWN -1

// Size of the message buffer in `M0Error`.
#define M0_ERROR_MESSAGE_LEN 512

// The longest reason phrase `response_reason` takes.
#define M0_REASON_MAX 256

// The response under construction; opaque to plugins.
typedef struct M0Response M0Response;

// A borrowed byte string: `len` bytes at `ptr`, not NUL-terminated.
// `ptr` may be NULL only when `len` is 0.
typedef struct M0Str {
  const uint8_t *ptr;
  size_t len;
} M0Str;

// One header: name and value as they arrived (names keep their case).
typedef struct M0Header {
  struct M0Str name;
  struct M0Str value;
} M0Header;

// A socket address in text form, ready for logs and `REMOTE_ADDR`.
typedef struct M0SockAddr {
  // The IP address as text ("127.0.0.1", "::1").
  struct M0Str ip;
  uint16_t port;
} M0SockAddr;

// What a plugin is and how it may be called. Returned by
// `m0_plugin_describe`, which must have no side effects: `m0serve --doctor`
// calls it in a throwaway process.
typedef struct M0PluginInfo {
  // `sizeof(M0PluginInfo)` as the plugin was compiled.
  uint32_t size;
  // `M0_ABI_MAJOR` the plugin was built against.
  uint32_t abi_major;
  // `M0_ABI_MINOR` the plugin was built against.
  uint32_t abi_minor;
  // One of `M0_CALL_*`.
  uint32_t call_model;
  // Plugin name, NUL-terminated, static.
  const char *name;
  // Plugin version, NUL-terminated, static.
  const char *version;
  // Most calls in flight at once in one worker; 0 means no limit.
  uint32_t max_concurrency;
  // One of `M0_LOCK_*`.
  uint32_t process_lock;
  // One of `M0_START_*`.
  uint32_t start;
  // Threads one call computes with itself (a BLAS pool); 0 means 1.
  uint32_t compute_threads;
  // `M0_CAP_*` bits.
  uint32_t caps;
  // With `M0_CAP_BATCH`: the most requests in one `handle_batch` call;
  // 0 means no limit.
  uint32_t max_batch;
  // 1.3, with `M0_CAP_BATCH`: the most body bytes in one `handle_batch`
  // call, summed over its requests; 0 means no limit. Body bytes stand
  // for the work a request costs (an embedding model's tokens). A request
  // larger than this on its own is still served, in a batch of one. Read
  // only when `size` covers it (`PLUGIN_INFO_BATCH_BYTES_END`).
  uint32_t max_batch_bytes;
} M0PluginInfo;

// A request as the plugin sees it. Every view is borrowed from the host and
// valid until `handle` returns.
typedef struct M0Request {
  // `sizeof(M0Request)` as the host was compiled.
  uint32_t size;
  // 0 for HTTP/1.0, 1 for HTTP/1.1.
  uint32_t http_minor;
  struct M0Str method;
  // The request-target exactly as sent.
  struct M0Str target;
  // The path part of the target, still percent-encoded.
  struct M0Str path;
  // The query without the `?`; empty when there is none.
  struct M0Str query;
  const struct M0Header *headers;
  size_t header_count;
  // Body length in bytes (the host has framed it; chunked bodies are
  // decoded), or 0 when there is none.
  uint64_t content_length;
  struct M0SockAddr peer;
  struct M0SockAddr server;
  // Index of the worker process serving this request.
  uint32_t worker_index;
  // Index of the thread making this call, for per-thread state kept in
  // an array: always below `M0InitArgs::max_handler_threads + 1` (the
  // one more is the event loop's thread, for inline and loop calls, or,
  // where the loop never calls the plugin, a handler thread started for
  // a model with nothing running while every other thread is busy).
  // Indices are reused: a thread's index is free again once its
  // `thread_stop` has returned, never while two threads could hold it.
  // An `admit` call (1.5) has `M0_THREAD_NONE` here.
  uint32_t thread_index;
  // The host's own data; plugins pass the request back, never this.
  void *host_data;
  // 1.1: `M0_REQ_*` bits. Read it only when `size` covers it (a plugin
  // that declares minor 1 or later always gets it).
  uint32_t flags;
  // 1.5: when the host had the request's head and body and queued it
  // for the plugin, in `M0Host.now_ns`'s nanoseconds; 0 when unknown.
  // Read it only when `size` covers it (`REQUEST_QUEUED_END`).
  uint64_t queued_ns;
} M0Request;

// Error detail written by `m0_plugin_init` on failure; the buffer belongs to
// the host, so nothing is freed across allocators.
typedef struct M0Error {
  // `sizeof(M0Error)` as the host was compiled.
  uint32_t size;
  // The length of the message written into `message`.
  uint32_t message_len;
  uint8_t message[M0_ERROR_MESSAGE_LEN];
} M0Error;

// Host functions handed to the plugin at init. Valid for the life of the
// process; every function is safe to call from any handler thread.
typedef struct M0Host {
  // `sizeof(M0Host)` as the host was compiled.
  uint32_t size;
  uint32_t abi_major;
  uint32_t abi_minor;
  // Write a line to the server log (`M0_LOG_*` level).
  void (*log)(uint32_t level, const uint8_t *message, size_t len);
  // Begin the response. `content_length` is the exact body length, or
  // `M0_LENGTH_UNKNOWN` to stream it chunked. Headers the host owns
  // (Content-Length, Transfer-Encoding, Connection, Date) are refused with
  // `M0_ERR_INVALID`; a name or value with CR, LF or NUL too.
  int32_t (*response_start)(struct M0Response *response, uint16_t status, const struct M0Header *headers, size_t header_count, int64_t content_length);
  // Append body bytes. With an unknown length each call is sent as one
  // chunk; bytes are on the wire (or the socket buffer) when it returns.
  int32_t (*response_write)(struct M0Response *response, const uint8_t *data, size_t len);
  // End the response. A sized response that received fewer bytes than it
  // declared is cut off and its connection closed.
  int32_t (*response_finish)(struct M0Response *response);
  // Start, write and finish in one call: the common case, one `writev`.
  int32_t (*response_send)(struct M0Response *response, uint16_t status, const struct M0Header *headers, size_t header_count, const uint8_t *body, size_t body_len);
  // Read up to `len` body bytes into `buf`. Returns the count, 0 at the
  // end of the body, or a negative `M0_ERR_*`.
  ptrdiff_t (*body_read)(const struct M0Request *request, uint8_t *buf, size_t len);
  // Monotonic clock in nanoseconds.
  uint64_t (*now_ns)(void);
  // Add `value` to one of the `M0_COUNTER_*` counters of this worker.
  void (*counter_add)(uint32_t counter, uint64_t value);
  // 1.2: State a fact about how the plugin will run, for `m0serve
  // --doctor` and the startup checks. `key` is a dotted lowercase name
  // (`a-z`, `0-9` and `_` in parts joined by dots, beginning with a
  // letter, at most 64 bytes), named after the plugin or its runtime:
  // `python.version`, `python.fork_unsafe_modules`. `value` is text
  // (bytes that are not UTF-8 are replaced). A later fact with the same
  // key replaces the earlier one. Returns `M0_OK`, or `M0_ERR_INVALID`
  // for a malformed key or a NULL pointer with a non-zero length.
  // Usually called during init; callable from any thread. Present only
  // when `size` covers it: a host older than 1.2 has no `fact` (in C,
  // check `host->size >= offsetof(M0Host, fact) + sizeof host->fact`).
  int32_t (*fact)(const uint8_t *key, size_t key_len, const uint8_t *value, size_t value_len);
  // 1.4: Set the reason phrase of a response not yet started, sent in
  // place of the standard one for its status (`OK`, `Not Found`; none
  // for a status without one). Call it before `response_start` or
  // `response_send`; the status line is written then. `reason` is at
  // most 256 bytes of tab, space, visible ASCII or bytes from 0x80
  // (RFC 9112's reason-phrase); anything else, a response already
  // started or a NULL pointer with a non-zero length is
  // `M0_ERR_INVALID` / `M0_ERR_STATE`, and the standard phrase stays.
  // Present only when `size` covers it (`HOST_REASON_END`).
  int32_t (*response_reason)(struct M0Response *response, const uint8_t *reason, size_t len);
  // 1.4: Say whether this worker is ready for traffic: `ready` 0 while
  // the plugin cannot serve yet (a model loading in the background
  // after init returned, a cache being rebuilt), non-zero once it can.
  // A worker starts ready. While not ready, the server's health path
  // (`--health-path`) answers 503, so a load balancer or Kubernetes
  // sends it nothing; requests that do arrive still reach the plugin.
  // Callable from any thread, at init or later; returns `M0_OK`.
  // Present only when `size` covers it (`HOST_READY_END`).
  int32_t (*set_ready)(uint32_t ready);
  // 1.6: Name a model this worker serves: 1 to `M0_MODEL_NAME_MAX`
  // bytes of visible ASCII, without `"` or `\`. Returns the model's id
  // (>= 0; the same name gives the same id; at most `M0_MODELS_MAX` per
  // process), or `M0_ERR_INVALID`. Call it at init. Present only when
  // `size` covers it (`HOST_MODEL_REGISTER_END`).
  int32_t (*model_register)(const uint8_t *name, size_t len);
  // 1.6: Say which model `request` is for; only from `admit`, before
  // it returns (`M0_ERR_STATE` from anywhere else). The host then
  // batches it only with requests of the same model (requests with no
  // model form a class of their own), choosing the next batch in turn
  // among the models with requests queued, so a flood on one model
  // delays another by at most the calls already running; counts its
  // admitted cost in that model's `model_in_flight`; and labels its
  // `m0serve_*` request and batch series with `model="NAME"` and its
  // access log line with `"model"`. Returns `M0_OK`, or
  // `M0_ERR_INVALID` for an id `model_register` did not return.
  // Present only when `size` covers it (`HOST_REQUEST_MODEL_END`).
  int32_t (*request_model)(const struct M0Request *request, uint32_t model);
  // 1.6: The sum of the costs admitted for `model` whose responses are
  // not complete (0 for an unknown id). Callable from any thread.
  // Present only when `size` covers it (`HOST_MODEL_IN_FLIGHT_END`).
  uint64_t (*model_in_flight)(uint32_t model);
  // 1.6: Define one of the plugin's own metrics, shown on the
  // `--metrics` page summed over the workers. `kind` is
  // `M0_METRIC_COUNTER` or `M0_METRIC_HISTOGRAM` (with `bound_count`
  // ascending finite `bounds`, at most `M0_METRIC_BOUNDS_MAX`; `bounds`
  // is ignored for a counter); `name` a Prometheus metric name
  // (`[a-zA-Z_:][a-zA-Z0-9_:]*`, at most `M0_METRIC_NAME_MAX` bytes, not
  // beginning `m0serve_`); `help` its one-line description (no line
  // breaks, at most 512 bytes). Returns the metric's id (>= 0; the same name with the same
  // definition gives the same id; at most `M0_METRICS_MAX`), or
  // `M0_ERR_INVALID`. Call it at init. Present only when `size` covers
  // it (`HOST_METRIC_DEFINE_END`).
  int32_t (*metric_define)(uint32_t kind, const uint8_t *name, size_t name_len, const uint8_t *help, size_t help_len, const double *bounds, size_t bound_count);
  // 1.6: Record `value` on metric `metric`: a counter adds it (>= 0),
  // a histogram observes it. `labels` are (name, value) pairs, at most
  // `M0_METRIC_LABELS_MAX`, names `[a-zA-Z_][a-zA-Z0-9_]*` (not `le`,
  // each once), values at most 128 bytes of UTF-8, the metric's name
  // and its labels at most 256 bytes together; each distinct set of
  // labels is a series of its own. A worker holds 256 series, all its
  // metrics together: past them, `M0_ERR_UNAVAILABLE` (and one warning
  // in the log). Callable from any thread without blocking;
  // returns `M0_OK`, or `M0_ERR_INVALID` for an unknown metric, a
  // malformed label or a value a counter cannot add. Present only when
  // `size` covers it (`HOST_METRIC_RECORD_END`).
  int32_t (*metric_record)(uint32_t metric, const struct M0Header *labels, size_t label_count, double value);
} M0Host;

// What the host tells the plugin at init.
typedef struct M0InitArgs {
  // `sizeof(M0InitArgs)` as the host was compiled.
  uint32_t size;
  uint32_t worker_index;
  // Number of worker processes.
  uint32_t workers;
  // Handler threads this worker starts with.
  uint32_t handler_threads;
  // Most handler threads this worker may grow to (the adaptive pool).
  uint32_t max_handler_threads;
  // 1 when the worker was started by fork+exec.
  uint32_t spawned;
  // The first ARG given after `--plugin` on the command line (may be
  // empty); 1.6 hands every one of them in `args`.
  struct M0Str arg;
  // `--app-dir` (defaults to ".").
  struct M0Str app_dir;
  // `--venv` (may be empty).
  struct M0Str venv;
  // The listener's host and port.
  struct M0SockAddr server;
  // 1.6: every ARG given after `--plugin`, in order (`arg` is the first
  // of them); `arg_count` views at `args`, NULL when there are none.
  // Read only when `size` covers them (`INIT_ARGS_ARGS_END`).
  const struct M0Str *args;
  size_t arg_count;
} M0InitArgs;

// The plugin's entry points, returned by `m0_plugin_init`. Static or living
// as long as the process.
typedef struct M0PluginCalls {
  // `sizeof(M0PluginCalls)` as the plugin was compiled.
  uint32_t size;
  // Required: see `M0HandleFn`.
  int32_t (*handle)(void *state, const struct M0Request *request, struct M0Response *response);
  // Optional: see `M0ThreadStartFn`.
  int32_t (*thread_start)(void *state, uint32_t thread_index);
  // Optional: see `M0ThreadStopFn`.
  void (*thread_stop)(void *state, uint32_t thread_index);
  // Optional, with `M0_CAP_BATCH`: see `M0HandleBatchFn`.
  int32_t (*handle_batch)(void *state, const struct M0Request *const *requests, struct M0Response *const *responses, size_t count);
  // Optional: see `M0ShutdownFn`.
  void (*shutdown)(void *state);
  // 1.5, optional, with `M0_CAP_ADMIT`: see `M0AdmitFn`. Read only when
  // `size` covers it (`PLUGIN_CALLS_ADMIT_END`).
  int32_t (*admit)(void *state, const struct M0Request *request, struct M0Response *response, uint64_t in_flight, uint64_t *cost);
} M0PluginCalls;

// Handle one request. Return `M0_OK` once the response is finished, or a
// negative `M0_ERR_*`: before `response_start` it becomes that HTTP status;
// after it, the response is cut off and the connection closed.
//
// The worker catches its stop and reload signals with `SA_RESTART`
// handlers, and the kernel may run them on any thread, this one included:
// a call waiting in a system call that `SA_RESTART` does not restart
// (`nanosleep`, `poll`, `epoll_wait`) must retry it on `EINTR`.
typedef int32_t (*M0HandleFn)(void *state, const struct M0Request *request, struct M0Response *response);

// Called on each handler thread when it starts, before its first `handle`.
// A non-zero return stops the worker.
typedef int32_t (*M0ThreadStartFn)(void *state, uint32_t thread_index);

// Called on each handler thread before it exits.
typedef void (*M0ThreadStopFn)(void *state, uint32_t thread_index);

// Handle `count` requests at once (with `M0_CAP_BATCH`); each must be
// answered through its own response. A request the call leaves unanswered
// gets the status of the returned code (500 for `M0_OK`), so one failing
// request fails alone and a failing call fails only its own requests.
typedef int32_t (*M0HandleBatchFn)(void *state, const struct M0Request *const *requests, struct M0Response *const *responses, size_t count);

// 1.5, with `M0_CAP_ADMIT`: decide whether one request may wait for
// `handle` or `handle_batch`. Called on the event-loop thread once the
// request's whole body has arrived (read it with `body_read`), before
// it is queued, at any time relative to the plugin's other calls, whatever
// its call model: it must not block, and `thread_index` is
// `M0_THREAD_NONE`. `in_flight` is the sum of the costs this worker has
// admitted whose responses are not yet complete.
//
// To admit the request, write its cost (in the plugin's own unit, such as
// inputs to embed; 0 is free) to `*cost` and return `M0_OK` without
// starting the response: the host adds it to `in_flight` and takes it off
// again exactly once, when the request's response is complete or cut
// off, or the host answers it itself (its queue full: 503), whatever the
// plugin's call returned. To refuse it, answer it through `response` as
// `handle` would (a 429 with `Retry-After`), without blocking: it is
// never queued, and its cost is not counted. A negative `M0_ERR_*` before
// the response began is answered with that code's status. The plugin
// keeps no count of its own, so none can leak.
typedef int32_t (*M0AdmitFn)(void *state, const struct M0Request *request, struct M0Response *response, uint64_t in_flight, uint64_t *cost);

// Called once when the worker drains, after the last request.
typedef void (*M0ShutdownFn)(void *state);

// `m0_plugin_describe`: return the static descriptor. No side effects.
typedef const struct M0PluginInfo *(*M0DescribeFn)(void);

// `m0_plugin_init`: start the plugin in this worker. On success write the
// calls table and the state pointer handed to every call, and return `M0_OK`.
// On failure write `error` and return `M0_INIT_FAILED` or `M0_INIT_REFUSED`.
typedef int32_t (*M0InitFn)(const struct M0Host *host, const struct M0InitArgs *args, const struct M0PluginCalls **calls, void **state, struct M0Error *error);

#endif  /* M0SERVE_H */
