/* slow_init_plugin: the fixture of tests/health.rs for a plugin whose init
 * takes as long as the test wants (a model loading). Written against
 * include/m0serve.h alone.
 *
 * Its argument is a path. Init logs the port it serves and then waits while
 * that path exists; if PATH.fail exists once it stops waiting, init fails.
 * Every request is answered "loaded <worker index>". The server's check
 * before it binds runs init too, with port 0: that one does not wait.
 *
 * Build: cc -std=c11 -Wall -Wextra -Werror -fPIC -shared -fvisibility=hidden
 *        -Iinclude tests/c/slow_init_plugin.c -o libslow_init_plugin.so
 */
#define _POSIX_C_SOURCE 200809L
#include "m0serve.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const M0Host *host_table;
static char body[64];

static const M0PluginInfo info = {
    .size = sizeof(M0PluginInfo),
    .abi_major = M0_ABI_MAJOR,
    .abi_minor = 0,
    .call_model = M0_CALL_REENTRANT,
    .name = "slow_init",
    .version = "1.0.0",
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
};

static int32_t handle(void *state, const M0Request *r, M0Response *resp) {
    (void)state;
    (void)r;
    M0Header h = {{(const uint8_t *)"Content-Type", 12}, {(const uint8_t *)"text/plain", 10}};
    return host_table->response_send(resp, 200, &h, 1, (const uint8_t *)body, strlen(body));
}

static const M0PluginCalls calls = {.size = sizeof(M0PluginCalls), .handle = handle};

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

M0_EXPORT int32_t m0_plugin_init(const M0Host *host, const M0InitArgs *args, const M0PluginCalls **out,
                                 void **state, M0Error *error) {
    char hold[512], fail[520], line[600];
    if (args->arg.len == 0 || args->arg.len >= sizeof hold) {
        const char *msg = "slow_init_plugin needs a path as its argument";
        error->message_len = (uint32_t)strlen(msg);
        memcpy(error->message, msg, error->message_len);
        return M0_INIT_REFUSED;
    }
    memcpy(hold, args->arg.ptr, args->arg.len);
    hold[args->arg.len] = 0;
    snprintf(fail, sizeof fail, "%s.fail", hold);
    int n = snprintf(line, sizeof line, "slow_init: worker %u loading on port %u while %s exists",
                     args->worker_index, (unsigned)args->server.port, hold);
    host->log(M0_LOG_INFO, (const uint8_t *)line, (size_t)n);
    struct timespec tick = {0, 10 * 1000 * 1000};
    while (args->server.port != 0 && access(hold, F_OK) == 0) nanosleep(&tick, NULL);
    if (access(fail, F_OK) == 0) {
        const char *msg = "slow_init_plugin: told to fail";
        error->message_len = (uint32_t)strlen(msg);
        memcpy(error->message, msg, error->message_len);
        return M0_INIT_FAILED;
    }
    snprintf(body, sizeof body, "loaded %u\n", args->worker_index);
    host_table = host;
    *out = &calls;
    *state = NULL;
    return M0_OK;
}
