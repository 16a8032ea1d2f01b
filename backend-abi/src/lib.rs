//! The m0-embed backend ABI, version 1: a forward pass behind a C header.
//!
//! The embed plugin does everything around a forward pass (the model
//! folder's tokenizer, the TEI, OpenAI and Cohere APIs, batching,
//! admission, errors, normalisation); a backend turns a batch of token ids
//! into one pooled vector per input. This crate is the single source of the
//! C ABI between the two: `include/m0embed_backend.h` is generated from it
//! by cbindgen and checked in, and `backend-abi/tests/header.rs` fails when
//! they disagree. It has no dependencies.
//!
//! # Conventions
//! - A backend exports one function, `m0_embed_backend`
//!   ([`M0_EMBED_BACKEND_SYMBOL`]), which returns its [`M0EmbedBackend`]
//!   table, valid for the life of the process. The plugin opens the library
//!   `RTLD_NOW | RTLD_LOCAL` in each worker (after `fork()` or `exec`,
//!   never in the supervisor), calls the entry point once, checks the
//!   table, then calls `load`, `describe`, `forward` (from several handler
//!   threads at once) and `unload`.
//! - Every struct begins with `size`, its own `sizeof` as its writer knows
//!   it. Structs only grow at the end; a reader uses a field only when
//!   `size` covers it ([`covers`]). The 1.0 sizes are frozen minimums.
//! - Functions return `int32_t`: [`M0_EMBED_OK`] (0) or a negative
//!   `M0_EMBED_ERR_*` code, and on failure write a one-line message into
//!   the caller's [`M0EmbedError`] (at most its `size` allows).
//! - A backend never unwinds or longjmps out of a call: a C++ or Swift
//!   backend catches its own exceptions and returns an error.
//! - Memory handed to a call (the model folder's path, the batch, the
//!   output buffer) is the caller's and valid for that call only.
//!
//! # Versioning
//! [`M0_EMBED_ABI_MAJOR`] must match exactly: a library of another major
//! is refused before any call into it but the entry point. The minor only
//! grows; the plugin accepts any minor of its major, since a backend reads
//! a newer field of what it is handed only when `size` covers it.
//!
//! # Changelog
//! - 1.0: the first version.
#![no_std]

use core::ffi::{c_char, c_void};

/// Major ABI version: a backend built for another major is refused.
pub const M0_EMBED_ABI_MAJOR: u32 = 1;
/// Minor ABI version: grows with additive changes.
pub const M0_EMBED_ABI_MINOR: u32 = 0;

/// The exported entry point's name, without the NUL (the header has it as
/// a macro).
pub const M0_EMBED_BACKEND_SYMBOL: &str = "m0_embed_backend";

/// Success.
pub const M0_EMBED_OK: i32 = 0;
/// The call failed; the message says why (a load: the plugin refuses to
/// start, exit 78; a forward pass: that batch is answered 500/424).
pub const M0_EMBED_ERR_FAILED: i32 = -1;
/// The model folder is not one this backend serves.
pub const M0_EMBED_ERR_UNSUPPORTED: i32 = -2;
/// An argument broke this header's rules (a batch over the limits).
pub const M0_EMBED_ERR_INVALID: i32 = -3;

/// `M0EmbedInfo.inputs`: the batch as packed sequences, `ids` one input
/// after another and `offsets` where each starts (no padding).
pub const M0_EMBED_INPUT_PACKED: u32 = 1;
/// `M0EmbedInfo.inputs`: the batch right-padded with id 0 to its longest
/// input, `rows * width` ids and a mask of 1 (token) and 0 (padding).
pub const M0_EMBED_INPUT_PADDED: u32 = 2;

/// Size of the message buffer in `M0EmbedError`.
pub const M0_EMBED_ERROR_MESSAGE_LEN: usize = 512;

/// Why a call failed, written by the backend into the caller's buffer.
#[repr(C)]
pub struct M0EmbedError {
    /// `sizeof(M0EmbedError)` as the caller was compiled.
    pub size: u32,
    /// The length of the message written into `message` (no NUL needed).
    pub message_len: u32,
    pub message: [u8; M0_EMBED_ERROR_MESSAGE_LEN],
}

/// The most the plugin will hand one `forward` call, given to `load` so a
/// backend can size its buffers (or compile a model for those shapes).
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0EmbedLimits {
    /// `sizeof(M0EmbedLimits)` as the plugin was compiled.
    pub size: u32,
    /// Most inputs (rows) in one call.
    pub max_rows: u32,
    /// Most tokens in one call, summed over its inputs (packed), or
    /// `rows * width` (padded).
    pub max_tokens: u32,
    /// Most tokens of one input: the model's max_seq_length.
    pub max_seq_len: u32,
}

/// What a backend says of itself after `load`: owned by the backend,
/// valid until `unload`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0EmbedInfo {
    /// `sizeof(M0EmbedInfo)` as the backend was compiled.
    pub size: u32,
    /// Floats per output row; must equal the model folder's dimension.
    pub dim: u32,
    /// `M0_EMBED_INPUT_PACKED` or `M0_EMBED_INPUT_PADDED`.
    pub inputs: u32,
    /// 1 when a call holds a process-wide lock (the plugin then makes one
    /// call at a time in the worker), 0 when calls may overlap.
    pub holds_lock: u32,
    /// Compute threads one call uses (at least 1).
    pub threads: u32,
    /// The backend's name and version for logs and `--doctor`, a
    /// NUL-terminated UTF-8 string.
    pub name: *const c_char,
}

/// One `forward` call's inputs: token ids of the model's tokenizer, as the
/// backend's `inputs` asked. Never empty, never over the limits given to
/// `load`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0EmbedBatch {
    /// `sizeof(M0EmbedBatch)` as the plugin was compiled.
    pub size: u32,
    /// Inputs in the batch; the output has this many rows.
    pub rows: u32,
    /// Ids at `ids`: the sum of the inputs' lengths (packed) or `rows *
    /// width` (padded).
    pub tokens: u32,
    /// Padded: the length of every row (the longest input). Packed: 0.
    pub width: u32,
    /// The token ids.
    pub ids: *const i32,
    /// Packed: `rows + 1` entries, input r being `ids[offsets[r] ..
    /// offsets[r + 1]]` (an input may be empty: its row is zeros). Padded:
    /// NULL.
    pub offsets: *const u32,
    /// Padded: `rows * width` entries, 1 for a token and 0 for padding.
    /// Packed: NULL.
    pub mask: *const i32,
}

/// `load`: reads the model in `model_dir` (a NUL-terminated path) for
/// calls within `limits`; on success writes its state to `*state`.
pub type M0EmbedLoadFn = unsafe extern "C" fn(
    model_dir: *const c_char,
    limits: *const M0EmbedLimits,
    state: *mut *mut c_void,
    error: *mut M0EmbedError,
) -> i32;
/// `describe`: what the loaded backend is; never NULL after a load.
pub type M0EmbedDescribeFn = unsafe extern "C" fn(state: *mut c_void) -> *const M0EmbedInfo;
/// `forward`: the pooled, not normalized, vectors of `batch` into `out`,
/// `batch.rows * dim` floats row after row (the caller's buffer). Called
/// from several threads at once unless `holds_lock`.
pub type M0EmbedForwardFn = unsafe extern "C" fn(
    state: *mut c_void,
    batch: *const M0EmbedBatch,
    out: *mut f32,
    error: *mut M0EmbedError,
) -> i32;
/// `unload`: frees the state; nothing is called after it.
pub type M0EmbedUnloadFn = unsafe extern "C" fn(state: *mut c_void);
/// The exported entry point's type.
pub type M0EmbedEntryFn = unsafe extern "C" fn() -> *const M0EmbedBackend;

/// A backend's table, returned by its `m0_embed_backend`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct M0EmbedBackend {
    /// `sizeof(M0EmbedBackend)` as the backend was compiled.
    pub size: u32,
    /// `M0_EMBED_ABI_MAJOR` as the backend was compiled.
    pub abi_major: u32,
    /// `M0_EMBED_ABI_MINOR` as the backend was compiled.
    pub abi_minor: u32,
    /// Required: see `M0EmbedLoadFn`.
    pub load: Option<
        unsafe extern "C" fn(
            model_dir: *const c_char,
            limits: *const M0EmbedLimits,
            state: *mut *mut c_void,
            error: *mut M0EmbedError,
        ) -> i32,
    >,
    /// Required: see `M0EmbedDescribeFn`.
    pub describe: Option<unsafe extern "C" fn(state: *mut c_void) -> *const M0EmbedInfo>,
    /// Required: see `M0EmbedForwardFn`.
    pub forward: Option<
        unsafe extern "C" fn(
            state: *mut c_void,
            batch: *const M0EmbedBatch,
            out: *mut f32,
            error: *mut M0EmbedError,
        ) -> i32,
    >,
    /// Required: see `M0EmbedUnloadFn`.
    pub unload: Option<unsafe extern "C" fn(state: *mut c_void)>,
}

/// Whether a struct whose writer declared `size` bytes holds a field that
/// ends at byte `end` (its `offset_of!` plus its `size_of`).
pub const fn covers(size: u32, end: usize) -> bool {
    size as usize >= end
}

// Sizes: the 1.0 end of each struct is the least a reader may be handed,
// and is frozen, whatever is added after it.

/// The smallest table accepted: the end of `unload` (48 bytes on 64-bit
/// targets).
pub const MIN_BACKEND_SIZE: u32 =
    (core::mem::offset_of!(M0EmbedBackend, unload) + size_of::<Option<M0EmbedUnloadFn>>()) as u32;
/// The smallest `M0EmbedInfo` accepted: the end of `name` (32 bytes on
/// 64-bit targets).
pub const MIN_INFO_SIZE: u32 =
    (core::mem::offset_of!(M0EmbedInfo, name) + size_of::<*const c_char>()) as u32;
/// The smallest `M0EmbedBatch` a backend may be handed: the end of `mask`
/// (40 bytes on 64-bit targets).
pub const MIN_BATCH_SIZE: u32 =
    (core::mem::offset_of!(M0EmbedBatch, mask) + size_of::<*const i32>()) as u32;
/// The smallest `M0EmbedLimits` a backend may be handed (16 bytes).
pub const MIN_LIMITS_SIZE: u32 =
    (core::mem::offset_of!(M0EmbedLimits, max_seq_len) + size_of::<u32>()) as u32;
/// The smallest `M0EmbedError` a backend may be handed.
pub const MIN_ERROR_SIZE: u32 = size_of::<M0EmbedError>() as u32;

#[cfg(target_pointer_width = "64")]
const _: () = assert!(
    MIN_BACKEND_SIZE == 48 && MIN_INFO_SIZE == 32 && MIN_BATCH_SIZE == 40 && MIN_LIMITS_SIZE == 16
);
const _: () = assert!(MIN_ERROR_SIZE == 520);
// The field types the sizes above are computed with: a field whose type
// changes fails to compile here instead of moving a minimum silently.
const _: fn(&M0EmbedBackend) -> &Option<unsafe extern "C" fn(*mut c_void)> = |t| &t.unload;
const _: fn(&M0EmbedInfo) -> &*const c_char = |i| &i.name;
const _: fn(&M0EmbedBatch) -> &*const i32 = |b| &b.mask;
const _: fn(&M0EmbedLimits) -> &u32 = |l| &l.max_seq_len;
