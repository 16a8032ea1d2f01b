/* A plugin as it was written for ABI 1.0, for the tests that a later host
 * still loads and serves it. It does not include m0serve.h: it declares the
 * 1.0 types itself, as the 1.0 header had them, so it knows nothing added
 * since (M0Request.flags, M0_CAP_INLINE, M0_DEFER, M0Host.fact) and is
 * handed structs longer than it knows.
 *
 *   GET /        "served by a 1.0 plugin"
 *   GET /sizes   what it was handed: "host=N host_known=N host_minor=N
 *                request=N request_known=N on_loop=N"
 *   anything else: M0_ERR_NOT_FOUND (404)
 *
 * -DCAPS=N sets M0PluginInfo.caps (default 0): N=4 is a bit 1.0 did not
 * define, which 1.1 made M0_CAP_INLINE.
 *
 * -DBATCH declares M0_CAP_BATCH with max_batch 4 and a handle_batch that
 * answers each request as handle does: its 1.0 descriptor ends before
 * max_batch_bytes (1.3), so a later host must read that limit as absent.
 *
 * -DMINOR_1 builds it as its author would have for ABI 1.1 instead: the
 * 1.1 header's M0Request ends with `flags`, its minor is 1 and it declares
 * M0_CAP_INLINE, so a later host calls it on the event loop; its host table
 * is still the one without `fact` (1.2). Its answers say "1.1".
 */
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#define M0_EXPORT __attribute__((visibility("default")))

#ifndef CAPS
#define CAPS 0
#endif

/* ---- The 1.0 ABI: constants and types ---------------------------------- */

#define M0_ABI_MAJOR 1
#ifdef MINOR_1
#define M0_ABI_MINOR 1
#define M0_CAP_INLINE 4
#define M0_REQ_ON_LOOP 1
#define FIXTURE_NAME "abi_1_1"
#define FIXTURE_VERSION "1.1"
#else
#define M0_ABI_MINOR 0
#define FIXTURE_NAME "abi_1_0"
#define FIXTURE_VERSION "1.0"
#endif
#define M0_OK 0
#define M0_ERR_NOT_FOUND -3
#define M0_INIT_REFUSED 78
#define M0_ERROR_MESSAGE_LEN 512
#define M0_CALL_REENTRANT 3
#define M0_LOCK_NONE 3
#define M0_START_FORK_SAFE 1
#define M0_LOG_INFO 3

typedef struct M0Str {
    const uint8_t *ptr;
    size_t len;
} M0Str;

typedef struct M0Header {
    M0Str name;
    M0Str value;
} M0Header;

typedef struct M0SockAddr {
    M0Str ip;
    uint16_t port;
} M0SockAddr;

typedef struct M0PluginInfo {
    uint32_t size;
    uint32_t abi_major;
    uint32_t abi_minor;
    uint32_t call_model;
    const char *name;
    const char *version;
    uint32_t max_concurrency;
    uint32_t process_lock;
    uint32_t start;
    uint32_t compute_threads;
    uint32_t caps;
    uint32_t max_batch;
} M0PluginInfo;

/* 1.0's request ends with host_data; 1.1 added flags. */
typedef struct M0Request {
    uint32_t size;
    uint32_t http_minor;
    M0Str method;
    M0Str target;
    M0Str path;
    M0Str query;
    const M0Header *headers;
    size_t header_count;
    uint64_t content_length;
    M0SockAddr peer;
    M0SockAddr server;
    uint32_t worker_index;
    uint32_t thread_index;
    void *host_data;
#ifdef MINOR_1
    uint32_t flags;
#endif
} M0Request;

typedef struct M0Response M0Response;

typedef struct M0Error {
    uint32_t size;
    uint32_t message_len;
    uint8_t message[M0_ERROR_MESSAGE_LEN];
} M0Error;

/* 1.0's host table ends with counter_add. */
typedef struct M0Host {
    uint32_t size;
    uint32_t abi_major;
    uint32_t abi_minor;
    void (*log)(uint32_t level, const uint8_t *message, size_t len);
    int32_t (*response_start)(M0Response *response, uint16_t status, const M0Header *headers, size_t header_count,
                              int64_t content_length);
    int32_t (*response_write)(M0Response *response, const uint8_t *data, size_t len);
    int32_t (*response_finish)(M0Response *response);
    int32_t (*response_send)(M0Response *response, uint16_t status, const M0Header *headers, size_t header_count,
                             const uint8_t *body, size_t body_len);
    ptrdiff_t (*body_read)(const M0Request *request, uint8_t *buf, size_t len);
    uint64_t (*now_ns)(void);
    void (*counter_add)(uint32_t counter, uint64_t value);
} M0Host;

typedef struct M0InitArgs {
    uint32_t size;
    uint32_t worker_index;
    uint32_t workers;
    uint32_t handler_threads;
    uint32_t max_handler_threads;
    uint32_t spawned;
    M0Str arg;
    M0Str app_dir;
    M0Str venv;
    M0SockAddr server;
} M0InitArgs;

typedef struct M0PluginCalls {
    uint32_t size;
    int32_t (*handle)(void *state, const M0Request *request, M0Response *response);
    int32_t (*thread_start)(void *state, uint32_t thread_index);
    void (*thread_stop)(void *state, uint32_t thread_index);
    int32_t (*handle_batch)(void *state, const M0Request *const *requests, M0Response *const *responses,
                            size_t count);
    void (*shutdown)(void *state);
} M0PluginCalls;

/* ---- The plugin --------------------------------------------------------- */

static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = M0_ABI_MINOR,
    .call_model = M0_CALL_REENTRANT,
    .name = FIXTURE_NAME,
    .version = FIXTURE_VERSION ".0",
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
    .compute_threads = 1,
#ifdef MINOR_1
    .caps = CAPS | M0_CAP_INLINE,
#elif defined(BATCH)
    .caps = CAPS | 1 /* M0_CAP_BATCH */,
    .max_batch = 4,
#else
    .caps = CAPS,
#endif
};

static const M0Host *host;
static atomic_uint on_loop_calls;

static int path_is(const M0Request *req, const char *lit) {
    size_t n = strlen(lit);
    return req->path.len == n && memcmp(req->path.ptr, lit, n) == 0;
}

static int32_t text(M0Response *resp, const char *body, size_t len) {
    M0Header type = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    return host->response_send(resp, 200, &type, 1, (const uint8_t *)body, len);
}

static int32_t handle(void *state, const M0Request *req, M0Response *resp) {
    (void)state;
    /* Not something a 1.0 plugin would do: the word after the 1.0 request,
     * read only where the host's size says it exists, is where 1.1 put
     * M0Request.flags. Counting its M0_REQ_ON_LOOP bit (1) lets the tests
     * see that this plugin is never called on the event loop. */
#ifdef MINOR_1
    if (req->flags & M0_REQ_ON_LOOP) {
        atomic_fetch_add(&on_loop_calls, 1);
    }
#else
    if (req->size >= sizeof(M0Request) + sizeof(uint32_t)) {
        uint32_t later;
        memcpy(&later, (const uint8_t *)req + sizeof(M0Request), sizeof later);
        if (later & 1u) {
            atomic_fetch_add(&on_loop_calls, 1);
        }
    }
#endif
    if (path_is(req, "/")) {
        const char body[] = "served by a " FIXTURE_VERSION " plugin\n";
        return text(resp, body, sizeof body - 1);
    }
    if (path_is(req, "/sizes")) {
        char body[160];
        int n = snprintf(body, sizeof body, "host=%u host_known=%zu host_minor=%u request=%u request_known=%zu on_loop=%u\n",
                         host->size, sizeof(M0Host), host->abi_minor, req->size, sizeof(M0Request),
                         atomic_load(&on_loop_calls));
        return text(resp, body, (size_t)n);
    }
    return M0_ERR_NOT_FOUND;
}

#ifdef BATCH
static int32_t handle_batch(void *state, const M0Request *const *requests, M0Response *const *responses,
                            size_t count) {
    for (size_t i = 0; i < count; i++) {
        int32_t code = handle(state, requests[i], responses[i]);
        if (code != M0_OK) {
            return code;
        }
    }
    return M0_OK;
}
static const M0PluginCalls calls = {.size = sizeof(M0PluginCalls), .handle = handle, .handle_batch = handle_batch};
#else
static const M0PluginCalls calls = {.size = sizeof(M0PluginCalls), .handle = handle};
#endif

static void refuse(M0Error *error, const char *msg) {
    if (error != NULL && error->size >= sizeof(M0Error)) {
        error->message_len = (uint32_t)strlen(msg);
        memcpy(error->message, msg, error->message_len);
    }
}

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *h, const M0InitArgs *args, const M0PluginCalls **out, void **state,
                                 M0Error *error) {
    (void)args;
    /* The 1.0 rules: the same major, and a table at least as long as ours. */
    if (h == NULL || h->abi_major != M0_ABI_MAJOR || h->size < sizeof(M0Host)) {
        refuse(error, FIXTURE_NAME ": the host's table is not ABI 1 or shorter than 1.0's");
        return M0_INIT_REFUSED;
    }
    host = h;
    const char hello[] = FIXTURE_NAME ": started";
    host->log(M0_LOG_INFO, (const uint8_t *)hello, sizeof hello - 1);
    *out = &calls;
    *state = NULL;
    return M0_OK;
}
