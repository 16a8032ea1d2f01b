/*
 * hello_c: the example native plugin. Plain C against include/m0serve.h and
 * nothing else; copy it to start a backend of your own.
 *
 *   GET  /              "hello, world"
 *   POST /echo          the request body back
 *   GET  /headers       the request headers, one "name: value" per line
 *   GET  /status/NNN    an empty response with that status
 *   GET  /stream        several chunks with no declared length (chunked)
 *   GET  /sleep?ms=N    blocks a handler thread N ms, then answers
 *   GET  /pid           the worker's process id (which worker served you)
 *   GET  /crash         kills its own process (for the supervisor's tests)
 *
 * It serves one thing, so it uses none of ABI 1.6's calls for several models
 * (model_register, request_model, model_in_flight) or for metrics of its own
 * (metric_define, metric_record): tests/c/models_plugin.c shows each.
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden
 *        -Iinclude plugins/hello_c/hello.c -o libhello_c.so
 */
#define _POSIX_C_SOURCE 200809L
#include "m0serve.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The host's function table, saved at init. */
static const M0Host *host;

/* Every handler thread may call us at once: we keep no mutable state. And
 * no route blocks except /sleep, which defers when called on the event loop,
 * so we declare M0_CAP_INLINE: the loop answers the rest itself, with no
 * hand-off to a handler thread. */
static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = M0_ABI_MINOR,
    .call_model = M0_CALL_REENTRANT,
    .name = "hello_c",
    .version = "1.0.0",
    .max_concurrency = 0,
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
    .compute_threads = 1,
    .caps = M0_CAP_INLINE,
    .max_batch = 0,
    .max_batch_bytes = 0,
};

static int str_eq(M0Str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len == n && memcmp(s.ptr, lit, n) == 0;
}

static int starts_with(M0Str s, const char *lit) {
    size_t n = strlen(lit);
    return s.len >= n && memcmp(s.ptr, lit, n) == 0;
}

/* Respond with a text body in one call. */
static int32_t text(M0Response *resp, uint16_t status, const char *body, size_t len) {
    M0Header type = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    return host->response_send(resp, status, &type, 1, (const uint8_t *)body, len);
}

/* The value of `key` in a query string, as a number, or `fallback`. */
static long query_number(M0Str query, const char *key, long fallback) {
    size_t klen = strlen(key);
    const char *q = (const char *)query.ptr;
    for (size_t i = 0; i + klen < query.len; i++) {
        if ((i == 0 || q[i - 1] == '&') && memcmp(q + i, key, klen) == 0 && q[i + klen] == '=') {
            long v = 0;
            for (size_t j = i + klen + 1; j < query.len && q[j] >= '0' && q[j] <= '9'; j++) {
                v = v * 10 + (q[j] - '0');
            }
            return v;
        }
    }
    return fallback;
}

static int32_t echo(const M0Request *req, M0Response *resp) {
    /* Stream the body through in pieces: no buffer sized by the client. */
    int32_t rc = host->response_start(resp, 200, NULL, 0, (int64_t)req->content_length);
    uint8_t buf[16384];
    for (;;) {
        ptrdiff_t n = host->body_read(req, buf, sizeof buf);
        if (n <= 0 || rc != M0_OK) {
            break;
        }
        rc = host->response_write(resp, buf, (size_t)n);
    }
    return rc == M0_OK ? host->response_finish(resp) : rc;
}

static int32_t headers(const M0Request *req, M0Response *resp) {
    size_t total = 0;
    for (size_t i = 0; i < req->header_count; i++) {
        total += req->headers[i].name.len + req->headers[i].value.len + 3;
    }
    char *out = (char *)malloc(total + 1);
    if (out == NULL) {
        return M0_ERR_INTERNAL;
    }
    size_t at = 0;
    for (size_t i = 0; i < req->header_count; i++) {
        const M0Header *h = &req->headers[i];
        memcpy(out + at, h->name.ptr, h->name.len);
        at += h->name.len;
        memcpy(out + at, ": ", 2);
        at += 2;
        memcpy(out + at, h->value.ptr, h->value.len);
        at += h->value.len;
        out[at++] = '\n';
    }
    int32_t rc = text(resp, 200, out, at);
    free(out);
    return rc;
}

static int32_t stream(M0Response *resp) {
    int32_t rc = host->response_start(resp, 200, NULL, 0, M0_LENGTH_UNKNOWN);
    char line[32];
    for (int i = 0; i < 5 && rc == M0_OK; i++) {
        int n = snprintf(line, sizeof line, "chunk %d\n", i);
        rc = host->response_write(resp, (const uint8_t *)line, (size_t)n);
    }
    return rc == M0_OK ? host->response_finish(resp) : rc;
}

static int32_t handle(void *state, const M0Request *req, M0Response *resp) {
    (void)state;
    M0Str path = req->path;
    if (str_eq(path, "/")) {
        return text(resp, 200, "hello, world\n", 13);
    }
    if (str_eq(path, "/echo")) {
        return echo(req, resp);
    }
    if (str_eq(path, "/headers")) {
        return headers(req, resp);
    }
    if (starts_with(path, "/status/") && path.len == 11) {
        int status = 0;
        for (size_t i = 8; i < 11; i++) {
            if (path.ptr[i] < '0' || path.ptr[i] > '9') {
                return M0_ERR_NOT_FOUND;
            }
            status = status * 10 + (path.ptr[i] - '0');
        }
        return host->response_send(resp, (uint16_t)status, NULL, 0, NULL, 0);
    }
    if (str_eq(path, "/stream")) {
        return stream(resp);
    }
    if (str_eq(path, "/sleep")) {
        if (req->flags & M0_REQ_ON_LOOP) {
            /* Never block the event loop: ask for a handler thread. */
            return M0_DEFER;
        }
        long ms = query_number(req->query, "ms", 100);
        struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
        /* The server's stop signals may land on any of its threads; a
         * sleep they interrupt goes on for what is left. */
        while (nanosleep(&ts, &ts) == -1 && errno == EINTR) {
        }
        return text(resp, 200, "slept\n", 6);
    }
    if (str_eq(path, "/pid")) {
        char buf[32];
        int n = snprintf(buf, sizeof buf, "%ld\n", (long)getpid());
        return text(resp, 200, buf, (size_t)n);
    }
    if (str_eq(path, "/crash")) {
        /* Not a clean exit: the supervisor must see a worker die. */
        raise(SIGKILL);
    }
    return M0_ERR_NOT_FOUND;
}

/* Only handle is required; the hooks are for plugins with per-thread state. */
static const M0PluginCalls calls = {
    .size = sizeof(M0PluginCalls),
    .handle = handle,
    .thread_start = NULL,
    .thread_stop = NULL,
    .handle_batch = NULL,
    .shutdown = NULL,
    .admit = NULL,
};

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *h, const M0InitArgs *args, const M0PluginCalls **out_calls,
                                 void **out_state, M0Error *error) {
    (void)args;
    /* Every 1.x host has the functions up to counter_add; one added later
     * is used only where the host's size reaches it (fact, below). */
    if (h == NULL || h->size < offsetof(M0Host, counter_add) + sizeof h->counter_add) {
        if (error != NULL) {
            const char *msg = "hello_c needs a newer m0serve host table; upgrade m0serve";
            error->message_len = (uint32_t)strlen(msg);
            memcpy(error->message, msg, error->message_len);
        }
        return M0_INIT_REFUSED;
    }
    host = h;
    /* ABI 1.2: tell --doctor which route may block (and so is deferred
     * when called on the event loop). */
    if (h->size >= offsetof(M0Host, fact) + sizeof h->fact) {
        static const char key[] = "hello_c.blocking_routes", value[] = "/sleep";
        h->fact((const uint8_t *)key, sizeof key - 1, (const uint8_t *)value, sizeof value - 1);
    }
    *out_calls = &calls;
    *out_state = NULL;
    return M0_OK;
}
