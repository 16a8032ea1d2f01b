/*
 * Backends for the embed plugin's tests (tests/embed_native_backend.rs) and
 * the call-overhead bench, against include/m0embed_backend.h; defines pick
 * which:
 *
 *   (none)            identity: row r is [its token count, its ids..., 0...]
 *                     (dim floats), from packed inputs
 *   -DPADDED          the same from padded inputs (the mask gives the count)
 *   -DLOAD_FAILS      load fails with FIXTURE-LOAD-MARKER
 *   -DFORWARD_FAILS_AT=N   forward fails (FIXTURE-FORWARD-MARKER) for a batch
 *                     holding an input of N tokens or more
 *   -DABI_MAJOR=N     the table claims ABI major N; load and forward append
 *                     "called" to the file $M0_TEST_BACKEND_MARKER
 *   -DTABLE_SIZE=N    the table claims to be N bytes
 *   -DNO_FORWARD      the table's forward is NULL
 *   -DMARK_OPEN       opening the library appends the process's pid to the
 *                     file $M0_TEST_BACKEND_OPENED (which process opened it)
 *
 * The identity backend's dim is its model folder's: -DDIM=N (default 64,
 * the static fixture's; 384 for all-MiniLM-L6-v2).
 */
#define _POSIX_C_SOURCE 200809L
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "m0embed_backend.h"

#ifndef DIM
#define DIM 64
#endif
#ifndef ABI_MAJOR
#define ABI_MAJOR M0_EMBED_ABI_MAJOR
#endif
#ifndef TABLE_SIZE
#define TABLE_SIZE sizeof(M0EmbedBackend)
#endif
#ifdef PADDED
#define INPUTS M0_EMBED_INPUT_PADDED
#else
#define INPUTS M0_EMBED_INPUT_PACKED
#endif

static const M0EmbedInfo INFO = {
    .size = sizeof(M0EmbedInfo), .dim = DIM, .inputs = INPUTS, .holds_lock = 0,
    .threads = 1, .name = "fixture " __FILE__,
};

__attribute__((unused)) static int32_t fail(M0EmbedError *e, const char *message) {
    size_t n = strlen(message);
    if (n > M0_EMBED_ERROR_MESSAGE_LEN) n = M0_EMBED_ERROR_MESSAGE_LEN;
    memcpy(e->message, message, n);
    e->message_len = (uint32_t)n;
    return M0_EMBED_ERR_FAILED;
}

/* A call the plugin should never have made: leaves a mark the test reads. */
static void mark(void) {
    const char *path = getenv("M0_TEST_BACKEND_MARKER");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fputs("called\n", f);
        fclose(f);
    }
}

static int32_t load(const char *dir, const M0EmbedLimits *limits, void **state, M0EmbedError *e) {
    (void)dir;
    (void)limits;
    if (ABI_MAJOR != M0_EMBED_ABI_MAJOR) mark();
    *state = (void *)&INFO;
#ifdef LOAD_FAILS
    return fail(e, "FIXTURE-LOAD-MARKER: this backend refuses every model");
#else
    (void)e;
    return M0_EMBED_OK;
#endif
}

static const M0EmbedInfo *describe(void *state) { return state; }

__attribute__((unused)) static int32_t forward(void *state, const M0EmbedBatch *b, float *out, M0EmbedError *e) {
    (void)state;
    if (ABI_MAJOR != M0_EMBED_ABI_MAJOR) mark();
    for (uint32_t r = 0; r < b->rows; r++) {
        const int32_t *ids;
        uint32_t n;
#ifdef PADDED
        ids = b->ids + (size_t)r * b->width;
        n = 0;
        for (uint32_t c = 0; c < b->width; c++) n += (uint32_t)b->mask[(size_t)r * b->width + c];
#else
        ids = b->ids + b->offsets[r];
        n = b->offsets[r + 1] - b->offsets[r];
#endif
#ifdef FORWARD_FAILS_AT
        if (n >= FORWARD_FAILS_AT) return fail(e, "FIXTURE-FORWARD-MARKER: an input too long for me");
#else
        (void)e;
#endif
        float *row = out + (size_t)r * DIM;
        memset(row, 0, DIM * sizeof *row);
        row[0] = (float)n;
        for (uint32_t t = 0; t < n && t + 1 < DIM; t++) row[t + 1] = (float)ids[t];
    }
    return M0_EMBED_OK;
}

static void unload(void *state) { (void)state; }

#ifdef MARK_OPEN
__attribute__((constructor)) static void opened(void) {
    const char *path = getenv("M0_TEST_BACKEND_OPENED");
    FILE *f = path ? fopen(path, "a") : NULL;
    if (f) {
        fprintf(f, "%ld\n", (long)getpid());
        fclose(f);
    }
}
#endif

static const M0EmbedBackend TABLE = {
    .size = TABLE_SIZE, .abi_major = ABI_MAJOR, .abi_minor = M0_EMBED_ABI_MINOR,
    .load = load, .describe = describe,
#ifdef NO_FORWARD
    .forward = NULL,
#else
    .forward = forward,
#endif
    .unload = unload,
};

M0_EMBED_EXPORT const M0EmbedBackend *m0_embed_backend(void) { return &TABLE; }
