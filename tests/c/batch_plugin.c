/* batch_plugin: the fixture of tests/batching.rs, a plugin that takes its
 * requests in batches (M0_CAP_BATCH, up to 8 requests and 1000 body bytes
 * per call) and says in every answer which call served it. Written against
 * include/m0serve.h alone.
 *
 * Every call, handle_batch or handle (served as a batch of one by the same
 * code), takes the next number of an atomic sequence, 1 for the first. An
 * answered request gets 200 with
 *
 *   id=<query param id> size=<requests in the call> seq=<the call's number> bytes=<its body length>
 *
 * (the body read to its end with body_read), except on these paths:
 *
 *   /gate   the whole call first waits until the file named by ARG exists
 *           (polled every 1 ms, 30 s at most), logging "batch_plugin: call
 *           SEQ of N request(s) waits for the gate"; then answers as usual
 *   /bad    answered 400 "bad id=<id>"; the rest of the call is unaffected
 *   /skip   left unanswered (the host answers it 500)
 *   /fail   the call returns M0_ERR_INTERNAL when it reaches this request:
 *           the requests before it are answered, it and those after are
 *           not (the host answers them 500)
 *   /stats  "calls=<calls so far, this one included> largest=<largest call>"
 *   /slow   the whole call first sleeps 100 ms, once however many requests
 *           it holds (as a model's forward pass costs about the same for
 *           one sentence or eight); then answers as usual
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden
 *        -Iinclude tests/c/batch_plugin.c -o libbatch_plugin.so
 */
#define _POSIX_C_SOURCE 200809L
#include "m0serve.h"

#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const M0Host *host;
/* ARG, NUL-terminated; empty: /gate does not wait. */
static char gate[4096];
static atomic_ulong calls;
static atomic_ulong largest;

static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = M0_ABI_MINOR,
    .call_model = M0_CALL_REENTRANT,
    .name = "batch_plugin",
    .version = "1.0.0",
    .max_concurrency = 0,
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
    .compute_threads = 1,
    .caps = M0_CAP_BATCH,
    .max_batch = 8,
    .max_batch_bytes = 1000,
};

static int path_is(const M0Request *req, const char *lit) {
    size_t n = strlen(lit);
    return req->path.len == n && memcmp(req->path.ptr, lit, n) == 0;
}

/* The value of `id` in the query, or an empty string. */
static M0Str query_id(M0Str query) {
    const char *q = (const char *)query.ptr;
    for (size_t i = 0; i + 3 <= query.len; i++) {
        if ((i == 0 || q[i - 1] == '&') && memcmp(q + i, "id=", 3) == 0) {
            size_t end = i + 3;
            while (end < query.len && q[end] != '&') {
                end++;
            }
            M0Str id = {query.ptr + i + 3, end - i - 3};
            return id;
        }
    }
    M0Str none = {NULL, 0};
    return none;
}

static int32_t text(M0Response *resp, uint16_t status, const char *body, int len) {
    M0Header type = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    if (len < 0) {
        return M0_ERR_INTERNAL;
    }
    return host->response_send(resp, status, &type, 1, (const uint8_t *)body, (size_t)len);
}

/* Reads the body to its end; its length, or a negative M0_ERR_*. */
static long long body_length(const M0Request *req) {
    uint8_t buf[4096];
    long long total = 0;
    for (;;) {
        ptrdiff_t n = host->body_read(req, buf, sizeof buf);
        if (n <= 0) {
            return n < 0 ? (long long)n : total;
        }
        total += n;
    }
}

static void wait_for_gate(unsigned long seq, size_t count) {
    char line[96];
    int n = snprintf(line, sizeof line, "batch_plugin: call %lu of %zu request(s) waits for the gate", seq, count);
    host->log(M0_LOG_INFO, (const uint8_t *)line, (size_t)n);
    const struct timespec ms = {0, 1000000};
    for (int i = 0; i < 30000 && gate[0] != '\0' && access(gate, F_OK) != 0; i++) {
        nanosleep(&ms, NULL);
    }
}

static int32_t answer(const M0Request *req, M0Response *resp, size_t count, unsigned long seq) {
    char body[160];
    M0Str id = query_id(req->query);
    int id_len = id.len > 32 ? 32 : (int)id.len;
    const char *id_text = id.len ? (const char *)id.ptr : "";
    if (path_is(req, "/bad")) {
        return text(resp, 400, body, snprintf(body, sizeof body, "bad id=%.*s", id_len, id_text));
    }
    if (path_is(req, "/stats")) {
        return text(resp, 200, body,
                    snprintf(body, sizeof body, "calls=%lu largest=%lu", atomic_load(&calls), atomic_load(&largest)));
    }
    long long bytes = body_length(req);
    if (bytes < 0) {
        return (int32_t)bytes;
    }
    return text(resp, 200, body,
                snprintf(body, sizeof body, "id=%.*s size=%zu seq=%lu bytes=%lld", id_len, id_text, count, seq, bytes));
}

static int32_t handle_batch(void *state, const M0Request *const *requests, M0Response *const *responses, size_t count) {
    (void)state;
    unsigned long seq = atomic_fetch_add(&calls, 1) + 1;
    unsigned long seen = atomic_load(&largest);
    while (seen < count && !atomic_compare_exchange_weak(&largest, &seen, count)) {
    }
    for (size_t i = 0; i < count; i++) {
        if (path_is(requests[i], "/gate")) {
            wait_for_gate(seq, count);
            break;
        }
    }
    for (size_t i = 0; i < count; i++) {
        if (path_is(requests[i], "/slow")) {
            const struct timespec slow = {0, 100000000};
            nanosleep(&slow, NULL);
            break;
        }
    }
    int32_t rc = M0_OK;
    for (size_t i = 0; i < count; i++) {
        if (path_is(requests[i], "/fail")) {
            return M0_ERR_INTERNAL;
        }
        if (path_is(requests[i], "/skip")) {
            continue;
        }
        int32_t one = answer(requests[i], responses[i], count, seq);
        if (one != M0_OK && rc == M0_OK) {
            rc = one;
        }
    }
    return rc;
}

/* One request: a batch of one, by the same code. */
static int32_t handle(void *state, const M0Request *request, M0Response *response) {
    return handle_batch(state, &request, &response, 1);
}

static const M0PluginCalls table = {
    .size = sizeof(M0PluginCalls),
    .handle = handle,
    .handle_batch = handle_batch,
};

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *h, const M0InitArgs *args, const M0PluginCalls **out, void **state,
                                 M0Error *error) {
    (void)error;
    host = h;
    size_t n = args->arg.len < sizeof gate - 1 ? args->arg.len : sizeof gate - 1;
    if (n > 0) {
        memcpy(gate, args->arg.ptr, n);
    }
    gate[n] = '\0';
    *out = &table;
    *state = NULL;
    return M0_OK;
}
