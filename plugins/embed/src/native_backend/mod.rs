//! A forward pass in a native library written against
//! `include/m0embed_backend.h` (C, C++, Swift, Rust...), as an m0-embed
//! [`Backend`]: `M0_EMBED_BACKEND=/path/libbackend.so m0serve --plugin
//! embed MODEL_DIR`.
//!
//! The library is opened in [`Backend::load`], in the worker after
//! `fork()` or `exec` (never in the supervisor), and its table checked
//! before any other call (`library`); the model folder is read by the
//! plugin (its tokenizer, its dimension: an encoder's folder, or a static
//! embedding model's, `model::static_module`), then the backend's `load`
//! is given the folder and the limits of the calls it will get. Each
//! [`Backend::embed`] is cut into calls within those limits (`batch`), each
//! into a float buffer of this side's. A call that fails answers its batch
//! 500 (OpenAI) / 424 (TEI) with the backend's message; the worker goes on.
//!
//! `choice` is what `libm0_embed.so` exports: the native encoder, or this
//! when [`ENV_BACKEND`] is set.

mod batch;
mod choice;
mod library;

pub use choice::EmbedBackend;

use std::ffi::{CStr, CString, c_void};
use std::path::Path;
use std::sync::Mutex;

use m0embed_backend_abi::{
    M0_EMBED_ERROR_MESSAGE_LEN, M0_EMBED_INPUT_PACKED, M0_EMBED_INPUT_PADDED, M0_EMBED_OK,
    M0EmbedError, M0EmbedLimits, MIN_INFO_SIZE,
};
use m0serve_plugin::{Description, Host, InitArgs, InitError};

use crate::backend::{Backend, BackendError, ModelSource};
use crate::model::{self, Encoded, ModelInfo, Task, Tokenizer};
use crate::settings::{self, Settings};
use batch::{Call, Inputs};
use library::Library;

pub use settings::ENV_BACKEND;

/// [`ENV_BACKEND`]'s value, when set and not empty.
pub fn configured() -> Option<std::path::PathBuf> {
    std::env::var_os(ENV_BACKEND)
        .filter(|v| !v.is_empty())
        .map(Into::into)
}

/// A loaded native backend over a model folder.
pub struct NativeBackend {
    info: ModelInfo,
    tokenizer: Tokenizer,
    library: Library,
    /// What the backend's `load` returned; freed by `unload` on drop.
    state: *mut c_void,
    inputs: Inputs,
    limits: M0EmbedLimits,
    /// The backend's name, for messages.
    name: String,
    /// One call at a time, when the backend holds a process-wide lock.
    serial: Option<Mutex<()>>,
}

// SAFETY: the header makes `forward` callable from several threads at once
// unless the backend says it holds a process-wide lock, and then `serial`
// makes one call at a time; `state` is only handed back to the backend.
unsafe impl Send for NativeBackend {}
// SAFETY: as for Send: every use of `state` goes through the backend's
// functions, which the header makes thread-safe (or `serial` serialises).
unsafe impl Sync for NativeBackend {}

fn new_error() -> Box<M0EmbedError> {
    Box::new(M0EmbedError {
        size: size_of::<M0EmbedError>() as u32,
        message_len: 0,
        message: [0; M0_EMBED_ERROR_MESSAGE_LEN],
    })
}

/// What the backend wrote into `e`, or a stand-in when it wrote nothing.
fn message_of(e: &M0EmbedError, code: i32) -> String {
    let len = (e.message_len as usize).min(M0_EMBED_ERROR_MESSAGE_LEN);
    let text = String::from_utf8_lossy(&e.message[..len])
        .trim()
        .to_string();
    if text.is_empty() {
        format!("error {code}, with no message")
    } else {
        text
    }
}

impl Backend for NativeBackend {
    // The native encoder's description: the plugin is `embed` whatever
    // runs its forward pass, and a backend's lock is kept by `serial`.
    const DESCRIPTION: Description = <model::Model as Backend>::DESCRIPTION;

    const MODEL_DIR_HINT: &'static str = <model::Model as Backend>::MODEL_DIR_HINT;

    fn load(
        host: &'static Host,
        _args: &InitArgs,
        model: ModelSource<'_>,
    ) -> Result<NativeBackend, InitError> {
        let path = configured().ok_or_else(|| {
            InitError::refused(format!(
                "embed: {ENV_BACKEND} is not set; set it to a backend library's path"
            ))
        })?;
        model
            .settings
            .refuse_bfloat16_for(
                "embed",
                &format!("the backend {ENV_BACKEND}={}", path.display()),
            )
            .map_err(InitError::refused)?;
        let library = Library::open(&path)?;
        let (info, tokenizer) = model::describe_folder(model.dir, model.name)
            .map_err(|e| InitError::refused(format!("embed: cannot read the model: {e}")))?;
        if info.task != Task::Embed {
            return Err(InitError::refused(format!(
                "embed: the model in {} is a {} model, and a backend ({ENV_BACKEND}) serves \
                 embedding models only; unset {ENV_BACKEND} to serve it with the native encoder",
                model.dir.display(),
                info.task.kind()
            )));
        }
        let limits = limits_for(model.settings, info.max_len);
        let (state, described) = load_backend(&library, model.dir, &limits)?;
        // From here on, `backend` owns `state`: a refusal unloads it.
        let mut backend = NativeBackend {
            name: described.name.clone(),
            inputs: described.inputs,
            info,
            tokenizer,
            library,
            state,
            limits,
            serial: described.holds_lock.then(|| Mutex::new(())),
        };
        if described.dim != backend.info.dim {
            return Err(InitError::refused(format!(
                "embed: backend {} ({}) says dim {}, but the model in {} is {} wide; point \
                 {ENV_BACKEND} at the backend for this model",
                path.display(),
                described.name,
                described.dim,
                model.dir.display(),
                backend.info.dim
            )));
        }
        backend.info.threads = described.threads;
        let declared = Settings::threads_for_descriptor() as usize;
        if described.threads != declared {
            host.warn(&format!(
                "embed: backend {} computes with {} thread(s) a call, but {} declares {declared} \
                 (the core sizes the handler pool by it); set {}={}",
                described.name,
                described.threads,
                settings::ENV_THREADS,
                settings::ENV_THREADS,
                described.threads
            ));
        }
        let abi = format!("{}.{}", backend.library.abi.0, backend.library.abi.1);
        host.info(&format!(
            "embed: backend {} ({}, ABI {abi}, dim {}, {} inputs, {} process-wide lock, {} \
             thread(s)), calls of up to {} inputs and {} tokens",
            path.display(),
            described.name,
            described.dim,
            described.inputs.name(),
            if described.holds_lock {
                "holds a"
            } else {
                "no"
            },
            described.threads,
            limits.max_rows,
            limits.max_tokens,
        ));
        for (key, value) in [
            ("embed.backend", path.display().to_string()),
            ("embed.backend_name", described.name.clone()),
            ("embed.backend_abi", abi.clone()),
            ("embed.backend_dim", described.dim.to_string()),
            ("embed.backend_inputs", described.inputs.name().to_string()),
            (
                "embed.backend_lock",
                if described.holds_lock { "held" } else { "none" }.to_string(),
            ),
            ("embed.backend_threads", described.threads.to_string()),
        ] {
            // Well-formed constant keys: the host refuses none of them.
            let _ = host.fact(key, &value);
        }
        Ok(backend)
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn embed(&self, batch: &[Encoded]) -> Result<Vec<f32>, BackendError> {
        let _one = self
            .serial
            .as_ref()
            .map(|m| m.lock().unwrap_or_else(|e| e.into_inner()));
        let dim = self.info.dim;
        let mut out = vec![0f32; batch.len() * dim];
        let mut done = 0;
        for chunk in batch::chunks(batch, self.inputs, &self.limits) {
            let call = Call::new(self.inputs, chunk);
            let rows = &mut out[done * dim..(done + chunk.len()) * dim];
            self.forward(&call, rows, chunk.len())?;
            done += chunk.len();
        }
        Ok(out)
    }
}

impl NativeBackend {
    /// One `forward` call into `out` (`rows * dim` floats).
    fn forward(&self, call: &Call, out: &mut [f32], rows: usize) -> Result<(), BackendError> {
        let forward = self.library.forward;
        let mut error = new_error();
        let batch = call.batch();
        // SAFETY: `state` is what load returned and not yet unloaded;
        // `batch` points into `call`, alive for the call; `out` holds
        // `rows * dim` floats, as the header promises the backend.
        let code = unsafe { forward(self.state, &batch, out.as_mut_ptr(), &mut *error) };
        if code != M0_EMBED_OK {
            return Err(BackendError::new(
                format!(
                    "backend {} failed a forward pass of {rows} input(s): {}",
                    self.name,
                    message_of(&error, code)
                ),
                format!(
                    "{ENV_BACKEND}={} returned {code}",
                    self.library.path.display()
                ),
            ));
        }
        Ok(())
    }
}

impl Drop for NativeBackend {
    fn drop(&mut self) {
        // SAFETY: `state` is what load returned; nothing calls the backend
        // after this.
        unsafe { (self.library.unload)(self.state) };
    }
}

/// The limits of the calls the plugin will make: `M0_EMBED_MAX_BATCH_REQUESTS`
/// inputs, and the tokens the plugin gives one forward pass (a quarter of
/// `M0_EMBED_MAX_BATCH_BYTES`, at least one whole input).
fn limits_for(settings: &Settings, max_len: usize) -> M0EmbedLimits {
    let tokens = (settings.max_batch_bytes as usize / 4).max(max_len);
    M0EmbedLimits {
        size: size_of::<M0EmbedLimits>() as u32,
        max_rows: settings.max_batch_requests.max(1),
        max_tokens: tokens.min(u32::MAX as usize) as u32,
        max_seq_len: max_len.min(u32::MAX as usize) as u32,
    }
}

/// What the backend says of itself, read and checked.
struct Described {
    name: String,
    dim: usize,
    inputs: Inputs,
    holds_lock: bool,
    threads: usize,
}

/// The backend's `load` and `describe`: its state and what it is. A
/// failed load is refused (78) with the backend's message; a bad
/// description unloads it and is refused too.
fn load_backend(
    library: &Library,
    dir: &Path,
    limits: &M0EmbedLimits,
) -> Result<(*mut c_void, Described), InitError> {
    let path = library.path.display();
    let (load, describe, unload) = (library.load, library.describe, library.unload);
    let dir_c = CString::new(dir.as_os_str().as_encoded_bytes()).map_err(|_| {
        InitError::refused(format!(
            "embed: the model folder {} holds a NUL byte",
            dir.display()
        ))
    })?;
    let mut error = new_error();
    let mut state: *mut c_void = std::ptr::null_mut();
    // SAFETY: the arguments are valid for the call, as the header says:
    // a NUL-terminated path, the limits, a state slot and an error buffer.
    let code = unsafe { load(dir_c.as_ptr(), limits, &mut state, &mut *error) };
    if code != M0_EMBED_OK {
        return Err(InitError::refused(format!(
            "embed: backend {path} ({ENV_BACKEND}) cannot load the model in {}: {}",
            dir.display(),
            message_of(&error, code)
        )));
    }
    let refuse = |state: *mut c_void, what: String| {
        // SAFETY: `state` is what load returned; nothing calls the backend
        // after this.
        unsafe { unload(state) };
        InitError::refused(format!(
            "embed: backend {path} ({ENV_BACKEND}) {what}; fix the backend"
        ))
    };
    // SAFETY: `state` is what load returned.
    let info = unsafe { describe(state) };
    if info.is_null() {
        return Err(refuse(state, "described itself as NULL".into()));
    }
    // SAFETY: non-null, and the header makes it valid until unload; its
    // `size` is read before anything past it.
    let size = unsafe { info.cast::<u32>().read() };
    if size < MIN_INFO_SIZE {
        return Err(refuse(
            state,
            format!("described itself in {size} bytes, less than {MIN_INFO_SIZE}"),
        ));
    }
    // SAFETY: it holds at least the 1.0 fields, all this plugin reads.
    let info = unsafe { info.read() };
    let name = if info.name.is_null() {
        "unnamed".to_string()
    } else {
        // SAFETY: a NUL-terminated string valid until unload, by the header.
        unsafe { CStr::from_ptr(info.name) }
            .to_string_lossy()
            .into_owned()
    };
    let inputs = match info.inputs {
        M0_EMBED_INPUT_PACKED => Inputs::Packed,
        M0_EMBED_INPUT_PADDED => Inputs::Padded,
        other => {
            return Err(refuse(
                state,
                format!(
                    "asks for inputs {other}, neither M0_EMBED_INPUT_PACKED ({M0_EMBED_INPUT_PACKED}) \
                     nor M0_EMBED_INPUT_PADDED ({M0_EMBED_INPUT_PADDED})"
                ),
            ));
        }
    };
    if info.dim == 0 {
        return Err(refuse(state, "says dim 0".into()));
    }
    Ok((
        state,
        Described {
            name,
            dim: info.dim as usize,
            inputs,
            holds_lock: info.holds_lock != 0,
            threads: info.threads.max(1) as usize,
        },
    ))
}
