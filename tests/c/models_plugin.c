/* models_plugin: the fixture of tests/models.rs, a plugin that serves
 * several models behind one port (ABI 1.6), written against
 * include/m0serve.h alone.
 *
 * Its ARGs (M0InitArgs.args, in order): each NAME registers a model with
 * M0Host.model_register; `gate=PATH` makes a call holding a /gate request
 * wait until PATH exists (polled every 1 ms, 30 s at most), logging
 * "models_plugin: call SEQ waits for the gate", and a request with
 * `hold=NAME` in its query makes its call wait the same way for
 * PATH.NAME; `budget=N` refuses a
 * request whose model already has N admitted (M0Host.model_in_flight).
 * Init checks what 1.6 promises and refuses (78) when it does not hold:
 * a name registered twice gets the same id, a malformed one
 * M0_ERR_INVALID, and every ARG arrives in `args` with `arg` the first.
 *
 * It admits (M0_CAP_ADMIT) and batches (M0_CAP_BATCH, up to 4 requests):
 *   admit: GET /stats is answered at once, 200 "admitted=N ended=E
 *          in_flight=A,B,..." (requests admitted so far; calls that have
 *          returned; model_in_flight of each model, by id). Any other request names its model in the query
 *          (`model=NAME`): an unknown one is 404; over the budget, 429
 *          "over budget model=NAME in_flight=N"; else request_model(id)
 *          and cost 1 (a request with no `model=` has no model).
 *   handle_batch: every call takes the next number of a sequence (1 for
 *          the first), and answers each request 200
 *          "id=ID model=NAME seq=SEQ size=N models=M1,M2,... late=RC
 *          beside=R1,R2,... thread=T" where `models` lists the model of
 *          each request of the call, as the plugin saw them, `late` is
 *          what request_model answered when called outside admit
 *          (M0_ERR_STATE, -101), `beside` the calls of each model (in the
 *          order of the ARGs) that were running when this call started,
 *          and `thread` the call's M0Request.thread_index.
 * Its own metrics: the counter models_plugin_requests_total{model} per
 * request answered, and the histogram models_plugin_batch_size{model}
 * (bounds 1, 2, 4) per call.
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden
 *        -Iinclude tests/c/models_plugin.c -o libmodels_plugin.so
 */
#define _POSIX_C_SOURCE 200809L
#include "m0serve.h"

#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MODELS 8

static const M0Host *host;
static char gate[1024];
static unsigned long budget;
static char names[MODELS][64];
static int32_t ids[MODELS];
static size_t model_count;
static atomic_ulong calls;
static atomic_ulong admitted;
static atomic_ulong ended;
/* Calls running per model (by index in `names`), the last for none. */
static atomic_ulong running[MODELS + 1];
static int32_t requests_metric = -1;
static int32_t batch_metric = -1;

static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = M0_ABI_MINOR,
    .call_model = M0_CALL_REENTRANT,
    .name = "models_plugin",
    .version = "1.0.0",
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
    .compute_threads = 1,
    .caps = M0_CAP_BATCH | M0_CAP_ADMIT,
    .max_batch = 4,
};

static int path_is(const M0Request *req, const char *lit) {
    size_t n = strlen(lit);
    return req->path.len == n && memcmp(req->path.ptr, lit, n) == 0;
}

/* The value of `key=` in the query, or an empty view. */
static M0Str query_param(M0Str query, const char *key) {
    const char *q = (const char *)query.ptr;
    size_t k = strlen(key);
    for (size_t i = 0; i + k + 1 <= query.len; i++) {
        if ((i == 0 || q[i - 1] == '&') && memcmp(q + i, key, k) == 0 && q[i + k] == '=') {
            size_t end = i + k + 1;
            while (end < query.len && q[end] != '&') {
                end++;
            }
            M0Str v = {query.ptr + i + k + 1, end - i - k - 1};
            return v;
        }
    }
    M0Str none = {NULL, 0};
    return none;
}

/* The index of the model the request names, -1 for none, -2 unknown. */
static int model_of(const M0Request *req) {
    M0Str m = query_param(req->query, "model");
    if (m.len == 0) {
        return -1;
    }
    for (size_t i = 0; i < model_count; i++) {
        if (strlen(names[i]) == m.len && memcmp(names[i], m.ptr, m.len) == 0) {
            return (int)i;
        }
    }
    return -2;
}

static int32_t text(M0Response *resp, uint16_t status, const char *body, int len) {
    M0Header type = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    if (len < 0) {
        return M0_ERR_INTERNAL;
    }
    return host->response_send(resp, status, &type, 1, (const uint8_t *)body, (size_t)len);
}

static int32_t admit(void *state, const M0Request *req, M0Response *resp, uint64_t in_flight, uint64_t *cost) {
    (void)state;
    (void)in_flight;
    char body[256];
    if (path_is(req, "/stats")) {
        int n = snprintf(body, sizeof body, "admitted=%lu ended=%lu in_flight=", atomic_load(&admitted),
                         atomic_load(&ended));
        for (size_t i = 0; i < model_count && n > 0 && (size_t)n < sizeof body; i++) {
            n += snprintf(body + n, sizeof body - (size_t)n, "%s%llu", i ? "," : "",
                          (unsigned long long)host->model_in_flight((uint32_t)ids[i]));
        }
        return text(resp, 200, body, n);
    }
    int m = model_of(req);
    if (m == -2) {
        return text(resp, 404, body, snprintf(body, sizeof body, "no such model"));
    }
    if (m >= 0) {
        uint64_t held = host->model_in_flight((uint32_t)ids[m]);
        if (budget > 0 && held + 1 > budget) {
            return text(resp, 429, body,
                        snprintf(body, sizeof body, "over budget model=%s in_flight=%llu", names[m],
                                 (unsigned long long)held));
        }
        if (host->request_model(req, (uint32_t)ids[m]) != M0_OK) {
            return M0_ERR_INTERNAL;
        }
    }
    atomic_fetch_add(&admitted, 1);
    *cost = 1;
    return M0_OK;
}

/* Waits until `path` exists (30 s at most). */
static void wait_for_gate(unsigned long seq, const char *path) {
    char line[96];
    int n = snprintf(line, sizeof line, "models_plugin: call %lu waits for the gate", seq);
    host->log(M0_LOG_INFO, (const uint8_t *)line, (size_t)n);
    const struct timespec ms = {0, 1000000};
    for (int i = 0; i < 30000 && path[0] != '\0' && access(path, F_OK) != 0; i++) {
        nanosleep(&ms, NULL);
    }
}

static const char *name_of(int m) { return m >= 0 ? names[m] : "-"; }

static int32_t handle_batch(void *state, const M0Request *const *requests, M0Response *const *responses, size_t count) {
    (void)state;
    unsigned long seq = atomic_fetch_add(&calls, 1) + 1;
    int first = count > 0 ? model_of(requests[0]) : -1;
    size_t slot = first >= 0 ? (size_t)first : MODELS;
    char beside[128];
    int blen = 0;
    for (size_t i = 0; i < model_count && blen >= 0 && (size_t)blen < sizeof beside; i++) {
        blen += snprintf(beside + blen, sizeof beside - (size_t)blen, "%s%lu", i ? "," : "",
                         atomic_load(&running[i]));
    }
    atomic_fetch_add(&running[slot], 1);
    char models[512];
    int len = 0;
    for (size_t i = 0; i < count; i++) {
        int m = model_of(requests[i]);
        len += snprintf(models + len, sizeof models - (size_t)len, "%s%s", i ? "," : "", name_of(m));
        if ((size_t)len >= sizeof models) {
            len = (int)sizeof models - 1;
        }
    }
    for (size_t i = 0; i < count; i++) {
        M0Str hold = query_param(requests[i]->query, "hold");
        char held[1100];
        if (path_is(requests[i], "/gate")) {
            wait_for_gate(seq, gate);
        } else if (hold.len > 0 && gate[0] != '\0' && hold.len < 64) {
            snprintf(held, sizeof held, "%s.%.*s", gate, (int)hold.len, (const char *)hold.ptr);
            wait_for_gate(seq, held);
        }
    }
    M0Header label = {{(const uint8_t *)"model", 5}, {(const uint8_t *)name_of(first), strlen(name_of(first))}};
    host->metric_record((uint32_t)batch_metric, &label, 1, (double)count);
    for (size_t i = 0; i < count; i++) {
        int m = model_of(requests[i]);
        int32_t late = host->request_model(requests[i], m >= 0 ? (uint32_t)ids[m] : 0);
        M0Str id = query_param(requests[i]->query, "id");
        char body[700];
        int n = snprintf(body, sizeof body, "id=%.*s model=%s seq=%lu size=%zu models=%.*s late=%d beside=%s thread=%u",
                         (int)id.len, id.len ? (const char *)id.ptr : "", name_of(m), seq, count, len, models, late,
                         model_count ? beside : "-", requests[i]->thread_index);
        M0Header l = {{(const uint8_t *)"model", 5}, {(const uint8_t *)name_of(m), strlen(name_of(m))}};
        host->metric_record((uint32_t)requests_metric, &l, 1, 1.0);
        text(responses[i], 200, body, n);
    }
    atomic_fetch_sub(&running[slot], 1);
    atomic_fetch_add(&ended, 1);
    return M0_OK;
}

static int32_t handle(void *state, const M0Request *request, M0Response *response) {
    return handle_batch(state, &request, &response, 1);
}

static const M0PluginCalls table = {
    .size = sizeof(M0PluginCalls),
    .handle = handle,
    .handle_batch = handle_batch,
    .admit = admit,
};

static int32_t refuse(M0Error *error, const char *why) {
    size_t n = strlen(why);
    memcpy(error->message, why, n);
    error->message_len = (uint32_t)n;
    return M0_INIT_REFUSED;
}

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *h, const M0InitArgs *args, const M0PluginCalls **out, void **state,
                                 M0Error *error) {
    host = h;
    if (h->size < offsetof(M0Host, metric_record) + sizeof h->metric_record ||
        args->size < offsetof(M0InitArgs, arg_count) + sizeof args->arg_count) {
        return refuse(error, "models_plugin needs a host of ABI 1.6");
    }
    if (args->arg_count > 0 &&
        (args->arg.len != args->args[0].len || memcmp(args->arg.ptr, args->args[0].ptr, args->arg.len) != 0)) {
        return refuse(error, "models_plugin: arg is not the first of args");
    }
    for (size_t i = 0; i < args->arg_count; i++) {
        M0Str a = args->args[i];
        char value[1024];
        size_t n = a.len < sizeof value - 1 ? a.len : sizeof value - 1;
        memcpy(value, a.ptr, n);
        value[n] = '\0';
        if (strncmp(value, "gate=", 5) == 0) {
            strcpy(gate, value + 5);
        } else if (strncmp(value, "budget=", 7) == 0) {
            budget = strtoul(value + 7, NULL, 10);
        } else if (model_count < MODELS && n < sizeof names[0]) {
            strcpy(names[model_count], value);
            ids[model_count] = h->model_register(a.ptr, a.len);
            if (ids[model_count] < 0 || h->model_register(a.ptr, a.len) != ids[model_count]) {
                return refuse(error, "models_plugin: a model name did not keep its id");
            }
            model_count++;
        }
    }
    if (h->model_register((const uint8_t *)"bad name", 8) != M0_ERR_INVALID) {
        return refuse(error, "models_plugin: a name with a space was registered");
    }
    static const double bounds[] = {1, 2, 4};
    static const char help_r[] = "Requests the fixture answered.";
    static const char help_b[] = "Requests per call, by model.";
    requests_metric = h->metric_define(M0_METRIC_COUNTER, (const uint8_t *)"models_plugin_requests_total", 28,
                                       (const uint8_t *)help_r, sizeof help_r - 1, NULL, 0);
    batch_metric = h->metric_define(M0_METRIC_HISTOGRAM, (const uint8_t *)"models_plugin_batch_size", 24,
                                    (const uint8_t *)help_b, sizeof help_b - 1, bounds, 3);
    if (requests_metric < 0 || batch_metric < 0) {
        return refuse(error, "models_plugin: its metrics were refused");
    }
    *out = &table;
    *state = NULL;
    return M0_OK;
}
