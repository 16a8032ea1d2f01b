/*
 * m0-embed backend ABI: a forward pass the embed plugin calls
 * (M0_EMBED_BACKEND=/path/libbackend.so m0serve --plugin embed MODEL_DIR).
 * GENERATED from backend-abi/src/lib.rs by cbindgen: do not edit.
 * Refresh: M0_UPDATE_HEADER=1 cargo test -p m0embed-backend-abi --test header
 *
 * A backend includes this header only and exports one function,
 * m0_embed_backend, returning its M0EmbedBackend table (mark it
 * M0_EMBED_EXPORT and build with -fvisibility=hidden). It links nothing of
 * the server. Read the conventions in the comments of M0EmbedBackend.
 */

#ifndef M0EMBED_BACKEND_H
#define M0EMBED_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#if defined(_WIN32)
#define M0_EMBED_EXPORT __declspec(dllexport)
#else
#define M0_EMBED_EXPORT __attribute__((visibility("default")))
#endif

#define M0_EMBED_BACKEND_SYMBOL "m0_embed_backend"

typedef struct M0EmbedBackend M0EmbedBackend;

#ifdef __cplusplus
extern "C" {
#endif
/* The one entry point a backend exports: its table, valid for the life of
 * the process. Called once per worker, before anything else. */
M0_EMBED_EXPORT const M0EmbedBackend *m0_embed_backend(void);
#ifdef __cplusplus
}  /* extern "C" */
#endif


// Major ABI version: a backend built for another major is refused.
#define M0_EMBED_ABI_MAJOR 1

// Minor ABI version: grows with additive changes.
#define M0_EMBED_ABI_MINOR 0

// Success.
#define M0_EMBED_OK 0

// The call failed; the message says why (a load: the plugin refuses to
// start, exit 78; a forward pass: that batch is answered 500/424).
#define M0_EMBED_ERR_FAILED -1

// The model folder is not one this backend serves.
#define M0_EMBED_ERR_UNSUPPORTED -2

// An argument broke this header's rules (a batch over the limits).
#define M0_EMBED_ERR_INVALID -3

// `M0EmbedInfo.inputs`: the batch as packed sequences, `ids` one input
// after another and `offsets` where each starts (no padding).
#define M0_EMBED_INPUT_PACKED 1

// `M0EmbedInfo.inputs`: the batch right-padded with id 0 to its longest
// input, `rows * width` ids and a mask of 1 (token) and 0 (padding).
#define M0_EMBED_INPUT_PADDED 2

// Size of the message buffer in `M0EmbedError`.
#define M0_EMBED_ERROR_MESSAGE_LEN 512

// Why a call failed, written by the backend into the caller's buffer.
typedef struct M0EmbedError {
  // `sizeof(M0EmbedError)` as the caller was compiled.
  uint32_t size;
  // The length of the message written into `message` (no NUL needed).
  uint32_t message_len;
  uint8_t message[M0_EMBED_ERROR_MESSAGE_LEN];
} M0EmbedError;

// The most the plugin will hand one `forward` call, given to `load` so a
// backend can size its buffers (or compile a model for those shapes).
typedef struct M0EmbedLimits {
  // `sizeof(M0EmbedLimits)` as the plugin was compiled.
  uint32_t size;
  // Most inputs (rows) in one call.
  uint32_t max_rows;
  // Most tokens in one call, summed over its inputs (packed), or
  // `rows * width` (padded).
  uint32_t max_tokens;
  // Most tokens of one input: the model's max_seq_length.
  uint32_t max_seq_len;
} M0EmbedLimits;

// What a backend says of itself after `load`: owned by the backend,
// valid until `unload`.
typedef struct M0EmbedInfo {
  // `sizeof(M0EmbedInfo)` as the backend was compiled.
  uint32_t size;
  // Floats per output row; must equal the model folder's dimension.
  uint32_t dim;
  // `M0_EMBED_INPUT_PACKED` or `M0_EMBED_INPUT_PADDED`.
  uint32_t inputs;
  // 1 when a call holds a process-wide lock (the plugin then makes one
  // call at a time in the worker), 0 when calls may overlap.
  uint32_t holds_lock;
  // Compute threads one call uses (at least 1).
  uint32_t threads;
  // The backend's name and version for logs and `--doctor`, a
  // NUL-terminated UTF-8 string.
  const char *name;
} M0EmbedInfo;

// One `forward` call's inputs: token ids of the model's tokenizer, as the
// backend's `inputs` asked. Never empty, never over the limits given to
// `load`.
typedef struct M0EmbedBatch {
  // `sizeof(M0EmbedBatch)` as the plugin was compiled.
  uint32_t size;
  // Inputs in the batch; the output has this many rows.
  uint32_t rows;
  // Ids at `ids`: the sum of the inputs' lengths (packed) or `rows *
  // width` (padded).
  uint32_t tokens;
  // Padded: the length of every row (the longest input). Packed: 0.
  uint32_t width;
  // The token ids.
  const int32_t *ids;
  // Packed: `rows + 1` entries, input r being `ids[offsets[r] ..
  // offsets[r + 1]]` (an input may be empty: its row is zeros). Padded:
  // NULL.
  const uint32_t *offsets;
  // Padded: `rows * width` entries, 1 for a token and 0 for padding.
  // Packed: NULL.
  const int32_t *mask;
} M0EmbedBatch;

// A backend's table, returned by its `m0_embed_backend`.
typedef struct M0EmbedBackend {
  // `sizeof(M0EmbedBackend)` as the backend was compiled.
  uint32_t size;
  // `M0_EMBED_ABI_MAJOR` as the backend was compiled.
  uint32_t abi_major;
  // `M0_EMBED_ABI_MINOR` as the backend was compiled.
  uint32_t abi_minor;
  // Required: see `M0EmbedLoadFn`.
  int32_t (*load)(const char *model_dir, const struct M0EmbedLimits *limits, void **state, struct M0EmbedError *error);
  // Required: see `M0EmbedDescribeFn`.
  const struct M0EmbedInfo *(*describe)(void *state);
  // Required: see `M0EmbedForwardFn`.
  int32_t (*forward)(void *state, const struct M0EmbedBatch *batch, float *out, struct M0EmbedError *error);
  // Required: see `M0EmbedUnloadFn`.
  void (*unload)(void *state);
} M0EmbedBackend;

// `load`: reads the model in `model_dir` (a NUL-terminated path) for
// calls within `limits`; on success writes its state to `*state`.
typedef int32_t (*M0EmbedLoadFn)(const char *model_dir, const struct M0EmbedLimits *limits, void **state, struct M0EmbedError *error);

// `describe`: what the loaded backend is; never NULL after a load.
typedef const struct M0EmbedInfo *(*M0EmbedDescribeFn)(void *state);

// `forward`: the pooled, not normalized, vectors of `batch` into `out`,
// `batch.rows * dim` floats row after row (the caller's buffer). Called
// from several threads at once unless `holds_lock`.
typedef int32_t (*M0EmbedForwardFn)(void *state, const struct M0EmbedBatch *batch, float *out, struct M0EmbedError *error);

// `unload`: frees the state; nothing is called after it.
typedef void (*M0EmbedUnloadFn)(void *state);

// The exported entry point's type.
typedef const struct M0EmbedBackend *(*M0EmbedEntryFn)(void);



#endif  /* M0EMBED_BACKEND_H */
