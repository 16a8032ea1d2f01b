/*
 * A static-embedding forward pass (sentence-transformers' StaticEmbedding,
 * model2vec's layout) against include/m0embed_backend.h alone: the token
 * embedding table of model.safetensors, mapped read-only and shared by
 * every worker, mean pooled over each input's packed ids.
 *
 *   cc -O2 -shared -fPIC -fvisibility=hidden -I include \
 *      backends/c/static_embedding.c -o libstatic_embedding.so
 *   M0_EMBED_BACKEND=$PWD/libstatic_embedding.so m0serve --plugin embed MODEL_DIR
 *
 * MODEL_DIR is what SentenceTransformer.save writes for a StaticEmbedding
 * (modules.json, and the module's tokenizer.json and model.safetensors in
 * MODEL_DIR or its 0_StaticEmbedding/): the plugin tokenizes, this file
 * only pools. The table is the F32 tensor `embedding.weight` (StaticEmbedding)
 * or `embeddings` (model2vec), [vocab, dim].
 */
#define _POSIX_C_SOURCE 200809L
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "m0embed_backend.h"

typedef struct {
    void *map;
    size_t map_len;
    const float *table; /* vocab x dim, in the mapping */
    uint32_t vocab, dim;
    M0EmbedInfo info;
} Static;

static int32_t fail(M0EmbedError *e, int32_t code, const char *fmt, ...) {
    char buf[M0_EMBED_ERROR_MESSAGE_LEN];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof buf) n = (int)sizeof buf - 1;
    size_t room = e->size > 8 ? e->size - 8 : 0; /* what the caller's buffer holds */
    if (room > M0_EMBED_ERROR_MESSAGE_LEN) room = M0_EMBED_ERROR_MESSAGE_LEN;
    if ((size_t)n > room) n = (int)room;
    memcpy(e->message, buf, (size_t)n);
    e->message_len = (uint32_t)n;
    return code;
}

/* The number after `key` in the JSON object text [obj, end), or -1. */
static long long number_after(const char *obj, const char *end, const char *key) {
    const char *k = strstr(obj, key);
    if (!k || k >= end) return -1;
    k += strlen(key);
    while (k < end && (*k == ' ' || *k == ':' || *k == '[' || *k == '"')) k++;
    if (k >= end || *k < '0' || *k > '9') return -1;
    return strtoll(k, NULL, 10);
}

/* Finds the tensor `name` in the safetensors header: its F32 [rows, cols]
 * shape and data offsets. 0 on success. */
static int find_tensor(const char *hdr, const char *name, long long v[4], int *f32) {
    char quoted[64];
    snprintf(quoted, sizeof quoted, "\"%s\"", name);
    const char *obj = strstr(hdr, quoted);
    if (!obj) return -1;
    const char *end = strchr(obj, '}');
    if (!end) return -1;
    const char *dtype = strstr(obj, "\"dtype\"");
    *f32 = dtype && dtype < end && strstr(dtype, "\"F32\"") && strstr(dtype, "\"F32\"") < end;
    const char *shape = strstr(obj, "\"shape\"");
    if (!shape || shape >= end) return -1;
    v[0] = number_after(shape, end, "\"shape\"");
    const char *comma = strchr(shape, ',');
    v[1] = comma && comma < end ? number_after(comma, end, ",") : -1;
    v[2] = number_after(obj, end, "\"data_offsets\"");
    const char *off = strstr(obj, "\"data_offsets\"");
    const char *c2 = off ? strchr(off, ',') : NULL;
    v[3] = c2 && c2 < end ? number_after(c2, end, ",") : -1;
    return (v[0] > 0 && v[1] > 0 && v[2] >= 0 && v[3] >= 0) ? 0 : -1;
}

static int32_t load(const char *dir, const M0EmbedLimits *limits, void **state, M0EmbedError *e) {
    (void)limits; /* any batch fits: the output is the caller's */
    char path[4096];
    int fd = -1;
    const char *where[] = {"model.safetensors", "0_StaticEmbedding/model.safetensors"};
    for (int i = 0; i < 2 && fd < 0; i++) {
        snprintf(path, sizeof path, "%s/%s", dir, where[i]);
        fd = open(path, O_RDONLY | O_CLOEXEC);
    }
    if (fd < 0)
        return fail(e, M0_EMBED_ERR_UNSUPPORTED,
                    "static_embedding: no model.safetensors in %s or its 0_StaticEmbedding/; "
                    "point MODEL_DIR at a saved StaticEmbedding model", dir);
    struct stat st;
    void *map = MAP_FAILED;
    if (fstat(fd, &st) == 0 && st.st_size > 8)
        map = mmap(NULL, (size_t)st.st_size, PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map == MAP_FAILED) return fail(e, M0_EMBED_ERR_FAILED, "static_embedding: cannot map %s", path);
    const unsigned char *b = map;
    unsigned long long n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | b[i];
    size_t len = (size_t)st.st_size;
    char *hdr = n < len - 8 ? strndup((const char *)b + 8, (size_t)n) : NULL;
    long long v[4];
    int f32 = 0, found = -1;
    if (hdr) {
        found = find_tensor(hdr, "embedding.weight", v, &f32);
        if (found != 0) found = find_tensor(hdr, "embeddings", v, &f32);
    }
    free(hdr);
    size_t data = 8 + (size_t)n;
    if (found != 0 || !f32 || v[3] - v[2] != v[0] * v[1] * 4 || data + (size_t)v[3] > len ||
        (data + (size_t)v[2]) % 4 != 0) {
        munmap(map, len);
        return fail(e, M0_EMBED_ERR_UNSUPPORTED,
                    "static_embedding: %s has no F32 [vocab, dim] tensor `embedding.weight` or "
                    "`embeddings` within the file; save the model with sentence-transformers "
                    "(StaticEmbedding) in float32", path);
    }
    Static *s = calloc(1, sizeof *s);
    if (!s) {
        munmap(map, len);
        return fail(e, M0_EMBED_ERR_FAILED, "static_embedding: out of memory");
    }
    s->map = map;
    s->map_len = len;
    s->table = (const float *)(b + data + v[2]);
    s->vocab = (uint32_t)v[0];
    s->dim = (uint32_t)v[1];
    s->info = (M0EmbedInfo){.size = sizeof(M0EmbedInfo), .dim = s->dim,
                            .inputs = M0_EMBED_INPUT_PACKED, .holds_lock = 0, .threads = 1,
                            .name = "static_embedding.c 1.0"};
    *state = s;
    return M0_EMBED_OK;
}

static const M0EmbedInfo *describe(void *state) { return &((Static *)state)->info; }

static int32_t forward(void *state, const M0EmbedBatch *batch, float *out, M0EmbedError *e) {
    const Static *s = state;
    if (!batch->offsets) return fail(e, M0_EMBED_ERR_INVALID, "static_embedding: wants packed inputs");
    for (uint32_t r = 0; r < batch->rows; r++) {
        float *row = out + (size_t)r * s->dim;
        memset(row, 0, s->dim * sizeof *row);
        uint32_t from = batch->offsets[r], to = batch->offsets[r + 1];
        for (uint32_t t = from; t < to; t++) {
            int32_t id = batch->ids[t];
            if (id < 0 || (uint32_t)id >= s->vocab)
                return fail(e, M0_EMBED_ERR_INVALID,
                            "static_embedding: token id %d outside the table's %u rows", id, s->vocab);
            const float *w = s->table + (size_t)id * s->dim;
            for (uint32_t d = 0; d < s->dim; d++) row[d] += w[d];
        }
        if (to > from) {
            float inv = 1.0f / (float)(to - from);
            for (uint32_t d = 0; d < s->dim; d++) row[d] *= inv;
        }
    }
    return M0_EMBED_OK;
}

static void unload(void *state) {
    Static *s = state;
    munmap(s->map, s->map_len);
    free(s);
}

static const M0EmbedBackend TABLE = {
    .size = sizeof(M0EmbedBackend), .abi_major = M0_EMBED_ABI_MAJOR,
    .abi_minor = M0_EMBED_ABI_MINOR, .load = load, .describe = describe,
    .forward = forward, .unload = unload,
};

M0_EMBED_EXPORT const M0EmbedBackend *m0_embed_backend(void) { return &TABLE; }
