/* readiness_plugin: the fixture of tests/health.rs, a plugin that says when
 * its worker is ready for traffic (M0Host.set_ready, ABI 1.4). Written
 * against include/m0serve.h alone.
 *
 * It starts not ready (as a plugin that loads a model in the background
 * after init would); then
 *
 *   /ready     set_ready(1), answers "ready"
 *   /unready   set_ready(0), answers "unready"
 *   anything   "hello"
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden
 *        -Iinclude tests/c/readiness_plugin.c -o libreadiness_plugin.so
 */
#include "m0serve.h"

#include <stddef.h>
#include <string.h>

static const M0Host *host_table;

static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = 4,
    .call_model = M0_CALL_REENTRANT,
    .name = "readiness",
    .version = "1.0.0",
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
};

static int path_is(const M0Request *r, const char *p) {
    size_t n = strlen(p);
    return r->path.len == n && memcmp(r->path.ptr, p, n) == 0;
}

static int32_t text(M0Response *resp, const char *body) {
    M0Header h = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    return host_table->response_send(resp, 200, &h, 1, (const uint8_t *)body, strlen(body));
}

static int32_t handle(void *state, const M0Request *r, M0Response *resp) {
    (void)state;
    if (path_is(r, "/ready")) {
        host_table->set_ready(1);
        return text(resp, "ready\n");
    }
    if (path_is(r, "/unready")) {
        host_table->set_ready(0);
        return text(resp, "unready\n");
    }
    return text(resp, "hello\n");
}

static const M0PluginCalls calls = {.size = sizeof(M0PluginCalls), .handle = handle};

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *host, const M0InitArgs *args, const M0PluginCalls **out,
                                 void **state, M0Error *error) {
    (void)args;
    if (host->size < offsetof(M0Host, set_ready) + sizeof host->set_ready) {
        const char *msg = "readiness_plugin needs a host of ABI 1.4 (M0Host.set_ready)";
        error->message_len = (uint32_t)strlen(msg);
        memcpy(error->message, msg, error->message_len);
        return M0_INIT_REFUSED;
    }
    host_table = host;
    host->set_ready(0);
    *out = &calls;
    *state = NULL;
    return M0_OK;
}
