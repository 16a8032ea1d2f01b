/* A plugin that breaks the ABI in one way chosen at compile time, for the
 * loader's refusal tests. Each -D picks the defect. */
#include "m0serve.h"
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#ifndef ABI_MAJOR
#define ABI_MAJOR M0_ABI_MAJOR
#endif
#ifndef ABI_MINOR
#define ABI_MINOR M0_ABI_MINOR
#endif
#ifndef COMPUTE_THREADS
#define COMPUTE_THREADS 1
#endif
#ifndef CAPS
#define CAPS 0
#endif
#ifndef MAX_BATCH
#define MAX_BATCH 0
#endif
#ifndef INFO_SIZE
#define INFO_SIZE sizeof(M0PluginInfo)
#endif
#ifndef CALLS_SIZE
#define CALLS_SIZE sizeof(M0PluginCalls)
#endif

static const M0PluginInfo info = {
    .size = INFO_SIZE,
    .abi_major = ABI_MAJOR,
    .abi_minor = ABI_MINOR,
    .call_model = M0_CALL_REENTRANT,
    .name = "bad",
    .version = "0",
    .process_lock = M0_LOCK_NONE,
    .start = M0_START_FORK_SAFE,
    .compute_threads = COMPUTE_THREADS,
    .caps = CAPS,
    .max_batch = MAX_BATCH,
};

#ifndef NO_INIT
static int32_t handle(void *s, const M0Request *r, M0Response *resp) {
    (void)s;
    (void)r;
    (void)resp;
    return M0_ERR_INTERNAL;
}

static const M0PluginCalls calls = {.size = CALLS_SIZE, .handle = handle};
#endif

#ifdef CRASH_AT_LOAD
__attribute__((constructor)) static void crash(void) { abort(); }
#endif

M0_EXPORT const M0PluginInfo *m0_plugin_describe(void) { return &info; }

#ifndef NO_INIT
M0_EXPORT int32_t m0_plugin_init(const M0Host *host, const M0InitArgs *args, const M0PluginCalls **out,
                                 void **state, M0Error *error) {
    (void)host;
    (void)args;
#ifdef CRASH_IN_INIT
    abort();
#endif
#ifdef CRASH_IN_WORKER_INIT
    /* Starts in the server's check before it binds (the probe child is
     * marked by M0_PROBE_INIT) and crashes in every worker: a plugin whose
     * failure depends on where it runs, for the rapid-crash rule. */
    if (getenv("M0_PROBE_INIT") == NULL) {
        abort();
    }
#endif
#if defined(INIT_REFUSES) || defined(INIT_FAILS)
    const char *msg = "this plugin says no: set FOO to fix it";
    error->message_len = (uint32_t)strlen(msg);
    memcpy(error->message, msg, error->message_len);
#ifdef INIT_REFUSES
    return M0_INIT_REFUSED;
#else
    return M0_INIT_FAILED;
#endif
#endif
#ifdef STATES_FACTS
    /* Facts for the doctor (ABI 1.2): a value with the characters the
     * probe escapes, a key the host must refuse, and a key stated twice. */
    if (host->size < offsetof(M0Host, fact) + sizeof host->fact) {
        return M0_INIT_FAILED;
    }
#define FACT(k, v) host->fact((const uint8_t *)(k), strlen(k), (const uint8_t *)(v), strlen(v))
    FACT("bad.replaced", "first");
    FACT("bad.escaped", "one\ntwo\rthree\\four");
    int32_t refused = FACT("Bad.Key", "x") == M0_ERR_INVALID && FACT("bad..key", "x") == M0_ERR_INVALID &&
                      FACT("", "x") == M0_ERR_INVALID && FACT("bad.key=", "x") == M0_ERR_INVALID;
    FACT("bad.malformed_keys_refused", refused ? "yes" : "no");
    FACT("bad.replaced", "second");
#undef FACT
#endif
    (void)error;
    *out = &calls;
    *state = NULL;
    return M0_OK;
}
#endif
