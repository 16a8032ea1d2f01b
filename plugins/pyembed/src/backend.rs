//! The forward pass of a Python module, as an m0-embed [`Backend`].
//!
//! The module's interface:
//!
//! ```python
//! def load(model_dir: str, *, max_batch: int, max_tokens: int) -> Backend
//! class Backend:
//!     name: str; dim: int; releases_gil: bool; threads: int
//!     def forward(self, input_ids, attention_mask, token_type_ids):
//!         # int64 (B, T) numpy arrays, right-padded with 0
//!         # -> float32 (B, dim), mean-pooled over the mask, not normalized
//! ```
//!
//! `load` runs once per worker at init. A batch is padded here to its
//! longest input and cut into calls of at most `max_batch` rows.

use std::cell::RefCell;

use m0_embed::model::{self, Encoded, ModelInfo, Pooling, Tokenizer};
use m0_embed::settings::{self, Settings};
use m0_embed::{Backend, BackendError, ModelSource};
use m0_pyhost::ThreadState;
use m0_pyhost::interp::{format_exception, import_attr, is_dotted_name, type_name};
use m0serve_plugin::{Description, Error, Host, InitArgs, InitError, ProcessLock};
use pyo3::buffer::PyBuffer;
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyDict};

/// What the plugin declares of the GIL: `held` (the default: a forward pass
/// in numpy holds it between its many short calls) or `released` (one that
/// runs outside Python, such as MAX's).
pub const ENV_GIL: &str = "M0_PYEMBED_GIL";

/// The model folder when it is not the default package's.
pub const ENV_MODEL_DIR: &str = "M0_EMBED_MODEL_DIR";

fn declared_gil() -> Result<ProcessLock, String> {
    settings::variable(
        "pyembed",
        ENV_GIL,
        ProcessLock::Held,
        |v| match v {
            "held" => Some(ProcessLock::Held),
            "released" => Some(ProcessLock::Released),
            _ => None,
        },
        "held or released",
    )
}

fn lock_name(lock: ProcessLock) -> &'static str {
    match lock {
        ProcessLock::Held => "held",
        ProcessLock::Released => "released",
        ProcessLock::None => "none",
    }
}

thread_local! {
    /// This handler thread's Python thread state, kept between calls.
    static THREAD: RefCell<Option<ThreadState>> = const { RefCell::new(None) };
}

/// A Python module's forward pass over a model folder.
pub struct PyBackend {
    info: ModelInfo,
    tokenizer: Tokenizer,
    /// ARG, for messages.
    module: String,
    /// What `load` returned.
    backend: Py<PyAny>,
    /// `numpy.frombuffer` and `numpy.int64`.
    frombuffer: Py<PyAny>,
    int64: Py<PyAny>,
    /// Rows per `forward` call.
    max_batch: usize,
}

/// What `load` gave, read with the GIL.
struct Loaded {
    backend: Py<PyAny>,
    frombuffer: Py<PyAny>,
    int64: Py<PyAny>,
    name: String,
    dim: usize,
    releases_gil: bool,
    threads: usize,
    about: String,
    facts: Vec<(&'static str, String)>,
}

impl Backend for PyBackend {
    // Reentrant: each handler thread has its own Python thread state, and
    // calls take the GIL in turn (the lock wait is reported). Python starts
    // in the worker at init, never in the supervisor, so a forked worker
    // is as good as a spawned one.
    const DESCRIPTION: Description = Description::new(c"pyembed", c"0.1.0")
        .process_lock(ProcessLock::Held)
        .reports_lock_wait();

    const MODEL_DIR_HINT: &'static str =
        "set M0_EMBED_MODEL_DIR to a sentence-transformers model folder";

    fn describe(plugin: Description) -> Description {
        // Before the module is imported, so the variable, not the backend,
        // says; a bad value is refused by init.
        plugin.process_lock(declared_gil().unwrap_or(ProcessLock::Held))
    }

    fn model_arg(_args: &InitArgs) -> String {
        std::env::var(ENV_MODEL_DIR).unwrap_or_default()
    }

    fn load(
        host: &'static Host,
        args: &InitArgs,
        model: ModelSource<'_>,
    ) -> Result<PyBackend, InitError> {
        let gil = declared_gil().map_err(InitError::refused)?;
        model
            .settings
            .refuse_bfloat16_for("pyembed", "a Python backend module")
            .map_err(InitError::refused)?;
        let module = args.arg.trim().to_owned();
        if !is_dotted_name(&module) {
            return Err(InitError::refused(format!(
                "pyembed: `{module}` is not a module name; pass as ARG the backend's Python \
                 module, imported from --app-dir (for example `numpy_minilm`)"
            )));
        }
        let (mut info, tokenizer) = model::describe_folder(model.dir, model.name)
            .map_err(|e| InitError::refused(format!("pyembed: cannot read the model: {e}")))?;
        if info.pooling != Pooling::Mean {
            return Err(InitError::refused(format!(
                "pyembed: the model in {} pools with {}, but a backend's forward pass \
                 returns mean-pooled vectors; serve it with --plugin embed",
                model.dir.display(),
                info.pooling.as_str()
            )));
        }
        let max_batch = model.settings.max_batch_requests as usize;
        let loaded = m0_pyhost::start(host, args, "pyembed", |py, python| {
            load_module(py, python, &module, model.dir, max_batch, info.max_len)
        })?;
        if loaded.dim != info.dim {
            return Err(InitError::failed(format!(
                "pyembed: backend `{module}` says dim {}, but the model in {} is {} wide",
                loaded.dim,
                model.dir.display(),
                info.dim
            )));
        }
        host.info(&loaded.about);
        m0_pyhost::state_facts(host, &loaded.facts);
        for (key, value) in [
            ("pyembed.backend", module.clone()),
            ("pyembed.name", loaded.name.clone()),
            ("pyembed.gil", lock_name(gil).to_string()),
            ("pyembed.releases_gil", loaded.releases_gil.to_string()),
            ("pyembed.max_batch", max_batch.to_string()),
        ] {
            // Well-formed constant keys: the host refuses none of them.
            let _ = host.fact(key, &value);
        }
        let declared_released = gil == ProcessLock::Released;
        if loaded.releases_gil != declared_released {
            host.warn(&format!(
                "pyembed: backend `{module}` says releases_gil={}, but {ENV_GIL} declares the GIL \
                 {} (the core sizes the handler pool by it); set {ENV_GIL}={}",
                if loaded.releases_gil { "True" } else { "False" },
                lock_name(gil),
                if loaded.releases_gil {
                    "released"
                } else {
                    "held"
                },
            ));
        }
        let declared_threads = Settings::threads_for_descriptor() as usize;
        if loaded.threads != declared_threads {
            host.warn(&format!(
                "pyembed: backend `{module}` computes with {} thread(s), but {} declares {declared_threads} \
                 (the core sizes the handler pool by it); set {}={}",
                loaded.threads,
                settings::ENV_THREADS,
                settings::ENV_THREADS,
                loaded.threads
            ));
        }
        info.threads = loaded.threads;
        Ok(PyBackend {
            info,
            tokenizer,
            module,
            backend: loaded.backend,
            frombuffer: loaded.frombuffer,
            int64: loaded.int64,
            max_batch: max_batch.max(1),
        })
    }

    fn info(&self) -> &ModelInfo {
        &self.info
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn embed(&self, batch: &[Encoded]) -> Result<Vec<f32>, BackendError> {
        let host = m0_pyhost::host();
        THREAD.with_borrow_mut(|slot| {
            let ts = match slot {
                Some(ts) => ts,
                // The host did not call thread_start on this thread: make
                // the thread state now and keep it.
                // SAFETY: Python was initialised by init; a handler thread
                // does not hold the GIL between calls.
                None => slot.insert(unsafe { ThreadState::create(|_| ()) }.0),
            };
            let _gil = ts.acquire(host);
            Python::attach(|py| {
                let mut rows = Vec::with_capacity(batch.len() * self.info.dim);
                for chunk in batch.chunks(self.max_batch) {
                    rows.extend(self.forward(py, chunk)?);
                }
                Ok(rows)
            })
        })
    }

    fn thread_start(&self, _index: u32) -> Result<(), Error> {
        THREAD.with_borrow_mut(|slot| {
            if slot.is_none() {
                // SAFETY: Python was initialised by init; the host starts a
                // handler thread without the GIL.
                *slot = Some(unsafe { ThreadState::create(|_| ()) }.0);
            }
        });
        Ok(())
    }

    fn thread_stop(&self, _index: u32) {
        if let Some(ts) = THREAD.with_borrow_mut(Option::take) {
            // SAFETY: created on this thread; the GIL is released between
            // calls.
            unsafe { ts.destroy(|_| ()) };
        }
    }
}

/// Imports the module (with `--app-dir` on `sys.path`), calls its `load`
/// and reads what the backend says of itself. Every failure is
/// [`InitError::failed`] (exit 1), naming the module.
fn load_module(
    py: Python<'_>,
    python: &m0_pyhost::Embedded,
    module: &str,
    dir: &std::path::Path,
    max_batch: usize,
    max_tokens: usize,
) -> Result<Loaded, InitError> {
    let failed = |m: String| InitError::failed(format!("pyembed: {m}"));
    let context = format!("ARG `{module}`");
    let load = import_attr(py, module, "load", &context, &python.app_dir)
        .map_err(|e| e.map_message(|m| format!("pyembed: {m}")))?;
    let kwargs = PyDict::new(py);
    let py_err = |e: PyErr| failed(e.to_string());
    kwargs.set_item("max_batch", max_batch).map_err(py_err)?;
    kwargs.set_item("max_tokens", max_tokens).map_err(py_err)?;
    let call = format!(
        "{module}.load({:?}, max_batch={max_batch}, max_tokens={max_tokens})",
        dir.display().to_string()
    );
    let backend = load
        .call((dir.to_string_lossy().as_ref(),), Some(&kwargs))
        .map_err(|e| failed(format!("{call} raised:\n{}", format_exception(py, &e))))?;
    let attr = |name: &str, want: &str| {
        backend.getattr(name).map_err(|e| {
            failed(format!(
                "the backend `{call}` returned (a `{}`) has no `{name}` ({want}): {e}",
                type_name(&backend)
            ))
        })
    };
    let name: String = extract_attr(&backend, module, "name", "a str")?;
    let dim: usize = extract_attr(&backend, module, "dim", "a positive int")?;
    let releases_gil: bool = extract_attr(&backend, module, "releases_gil", "a bool")?;
    let threads: usize = extract_attr(&backend, module, "threads", "a positive int")?;
    let forward = attr("forward", "a method")?;
    if !forward.is_callable() || dim == 0 || threads == 0 {
        return Err(failed(format!(
            "backend `{module}`: forward must be callable and dim and threads positive \
             (forward is a `{}`, dim {dim}, threads {threads})",
            type_name(&forward)
        )));
    }
    // After the module: a backend may set up numpy's BLAS threads before
    // numpy is first imported.
    let numpy = py
        .import("numpy")
        .map_err(|e| failed(format!("cannot import numpy: {e}")))?;
    let frombuffer = numpy.getattr("frombuffer").map_err(py_err)?;
    let int64 = numpy.getattr("int64").map_err(py_err)?;
    let about = format!(
        "pyembed: {}; backend `{module}` ({name}, dim {dim}, {threads} thread(s), releases_gil={}) \
         from {}, up to {max_batch} rows per forward call",
        python.summary(py),
        if releases_gil { "True" } else { "False" },
        python.app_dir.display(),
    );
    let facts = python.facts(py, module.to_owned(), &backend);
    Ok(Loaded {
        backend: backend.unbind(),
        frombuffer: frombuffer.unbind(),
        int64: int64.unbind(),
        name,
        dim,
        releases_gil,
        threads,
        about,
        facts,
    })
}

/// The backend's attribute `name`, as a `T` (`want` says what it should
/// be, for the message).
fn extract_attr<'py, T>(
    backend: &Bound<'py, PyAny>,
    module: &str,
    name: &str,
    want: &str,
) -> Result<T, InitError>
where
    T: pyo3::conversion::FromPyObjectOwned<'py>,
{
    let value = backend.getattr(name).map_err(|e| {
        InitError::failed(format!(
            "pyembed: the backend `{module}.load` returned (a `{}`) has no `{name}` ({want}): {e}",
            type_name(backend)
        ))
    })?;
    value.extract().map_err(|_| {
        InitError::failed(format!(
            "pyembed: backend `{module}`: `{name}` is a `{}`, not {want}",
            type_name(&value)
        ))
    })
}

impl PyBackend {
    /// One `forward` call: the chunk padded to its longest input, its rows.
    fn forward(&self, py: Python<'_>, chunk: &[Encoded]) -> Result<Vec<f32>, BackendError> {
        let rows = chunk.len();
        let width = chunk.iter().map(Encoded::tokens).max().unwrap_or(0);
        let mut ids = vec![0i64; rows * width];
        let mut mask = vec![0i64; rows * width];
        for (r, e) in chunk.iter().enumerate() {
            for (c, &id) in e.ids().iter().enumerate() {
                ids[r * width + c] = i64::from(id);
                mask[r * width + c] = 1;
            }
        }
        let types = vec![0i64; rows * width];
        let arrays = (|| -> PyResult<_> {
            Ok((
                self.array(py, &ids, rows, width)?,
                self.array(py, &mask, rows, width)?,
                self.array(py, &types, rows, width)?,
            ))
        })()
        .map_err(|e| {
            BackendError::new(
                format!(
                    "cannot make the input arrays for backend `{}`: {e}",
                    self.module
                ),
                format_exception(py, &e),
            )
        })?;
        let out = self
            .backend
            .bind(py)
            .call_method1("forward", arrays)
            .map_err(|e| {
                BackendError::new(
                    format!("backend `{}` raised in forward: {e}", self.module),
                    format_exception(py, &e),
                )
            })?;
        self.rows_of(py, &out, rows)
    }

    /// A writable int64 (rows, width) numpy array of `data`: a copy made by
    /// `numpy.frombuffer` over a bytearray (a bytes object would give a
    /// read-only array, which a backend may not expect).
    fn array<'py>(
        &self,
        py: Python<'py>,
        data: &[i64],
        rows: usize,
        width: usize,
    ) -> PyResult<Bound<'py, PyAny>> {
        let bytes: Vec<u8> = data.iter().flat_map(|v| v.to_ne_bytes()).collect();
        let buffer = PyByteArray::new(py, &bytes);
        self.frombuffer
            .bind(py)
            .call1((buffer, self.int64.bind(py)))?
            .call_method1("reshape", (rows, width))
    }

    /// The float32 (rows, dim) array `forward` returned, as floats.
    fn rows_of(
        &self,
        py: Python<'_>,
        out: &Bound<'_, PyAny>,
        rows: usize,
    ) -> Result<Vec<f32>, BackendError> {
        let dim = self.info.dim;
        let wrong = || {
            // What it was, as numpy would say it when it is an array.
            let attr = |name: &str| {
                out.getattr(name)
                    .and_then(|v| v.str().map(|s| s.to_string()))
                    .ok()
            };
            let what = match (attr("dtype"), attr("shape")) {
                (Some(dtype), Some(shape)) => {
                    format!("a `{}` of dtype {dtype} and shape {shape}", type_name(out))
                }
                _ => format!("a `{}`", type_name(out)),
            };
            BackendError::new(
                format!(
                    "backend `{}` returned {what} from forward for {rows} input(s); it must \
                     return a float32 array of shape ({rows}, {dim})",
                    self.module
                ),
                "",
            )
        };
        let buffer = PyBuffer::<f32>::get(out).map_err(|_| wrong())?;
        if buffer.shape() != [rows, dim] {
            return Err(wrong());
        }
        buffer.to_vec(py).map_err(|e| {
            BackendError::new(
                format!("cannot read what backend `{}` returned: {e}", self.module),
                "",
            )
        })
    }
}

#[cfg(test)]
mod tests {
    use m0_embed::Embed;
    use m0serve_abi::{M0_CALL_REENTRANT, M0_CAP_BATCH, M0_CAP_REPORTS_LOCK_WAIT, M0_LOCK_HELD};
    use m0serve_plugin::Plugin;

    use super::*;

    #[test]
    fn the_descriptor_is_the_embed_plugins_with_the_gil_held() {
        let info = Embed::<PyBackend>::DESCRIPTION.to_info();
        assert_eq!(info.call_model, M0_CALL_REENTRANT);
        assert_eq!(info.process_lock, M0_LOCK_HELD);
        assert_eq!(
            info.caps & M0_CAP_REPORTS_LOCK_WAIT,
            M0_CAP_REPORTS_LOCK_WAIT
        );
        // describe() adds the batch limits (and reads M0_PYEMBED_GIL,
        // unset here).
        let described = Embed::<PyBackend>::describe().to_info();
        assert_eq!(described.caps & M0_CAP_BATCH, M0_CAP_BATCH);
        assert!(described.max_batch > 0 && described.max_batch_bytes > 0);
    }
}
