//! Embedded CPython for m0serve plugins (the WSGI plugin, the Python
//! embedding backends).
//!
//! [`start`] brings the interpreter up in a worker at init: the virtual
//! environment (`--venv`, else `$VIRTUAL_ENV`, else the Python the plugin
//! was built against), libpython made global, `PyConfig` with an explicit
//! `program_name`, no Python signal handlers, `--app-dir` first on
//! `sys.path`. [`Embedded`] states what came up as `python.*` facts, which
//! `m0serve --doctor` reports. `gil` keeps one Python thread state per
//! handler thread and serves GIL acquisitions in arrival order, reporting
//! the wait to the host. `interp` holds the steps, and imports.
//!
//! A plugin that uses this crate must link libpython with a RUNPATH in its
//! own build.rs (`pyo3_build_config::add_libpython_rpath_link_args()`): a
//! link argument from a library crate's build script does not reach the
//! cdylib.

#![deny(clippy::undocumented_unsafe_blocks)]

pub mod gil;
pub mod interp;

use std::path::{Path, PathBuf};

use m0serve_plugin::{Host, InitArgs, InitError};
use pyo3::ffi;
use pyo3::prelude::*;

pub use crate::gil::{Held, ThreadState, without_gil};

/// The host table. Only called from init and the calls after it, by which
/// time the SDK has installed it.
pub fn host() -> &'static Host {
    m0serve_plugin::host().expect("the SDK installs the host table before init runs")
}

/// The interpreter as it came up in this worker.
#[derive(Debug)]
pub struct Embedded {
    /// The program and virtual environment chosen.
    pub setup: interp::PythonSetup,
    /// The libpython this plugin is linked with, if dladdr found it.
    pub libpython: Option<PathBuf>,
    /// `--app-dir`, canonical: first on `sys.path`.
    pub app_dir: PathBuf,
}

/// Starts Python in this worker (or joins the one already running) and runs
/// `load` with the GIL once `--app-dir` is on `sys.path`; the GIL is released
/// before returning, for the handler threads. `plugin` prefixes the messages.
///
/// A refused `--app-dir` or virtual environment is [`InitError::refused`]; a
/// Python that does not start is [`InitError::failed`], as is what `load`
/// returns.
pub fn start<T>(
    host: &'static Host,
    args: &InitArgs,
    plugin: &str,
    load: impl FnOnce(Python<'_>, &Embedded) -> Result<T, InitError>,
) -> Result<T, InitError> {
    let app_dir: PathBuf = std::fs::canonicalize(&args.app_dir)
        .ok()
        .filter(|p| p.is_dir())
        .ok_or_else(|| {
            InitError::refused(format!(
                "{plugin}: --app-dir {} is not a directory",
                args.app_dir.display()
            ))
        })?;
    let venv_arg = args
        .venv
        .as_deref()
        .map(|v| v.to_string_lossy().into_owned())
        .unwrap_or_default();

    let libpython = interp::libpython_path();
    match &libpython {
        Some(p) => {
            if let Err(e) = interp::promote_libpython(p) {
                host.warn(&format!(
                    "{plugin}: could not make {} global ({e}); extension modules may fail to import",
                    p.display()
                ));
            }
        }
        None => host.warn(&format!("{plugin}: could not locate libpython with dladdr")),
    }
    let setup = interp::choose_python(&venv_arg, libpython.as_deref())?;
    let started_here = interp::start_python(&setup.program)?;
    let embedded = Embedded {
        setup,
        libpython,
        app_dir,
    };

    let loaded = Python::attach(|py| -> Result<T, InitError> {
        if started_here {
            interp::keep_signals_default(py).map_err(|e| {
                InitError::failed(format!(
                    "{plugin}: cannot reset Python's SIGINT handler: {e}"
                ))
            })?;
        }
        interp::prepend_sys_path(py, &embedded.app_dir).map_err(|e| {
            InitError::failed(format!(
                "{plugin}: cannot put {} on sys.path: {e}",
                embedded.app_dir.display()
            ))
        })?;
        load(py, &embedded)
    });
    if started_here {
        // Init took the GIL on this thread; handler threads need it.
        // SAFETY: this thread holds the GIL since Py_InitializeFromConfig; the
        // main thread state is kept (never finalised).
        unsafe { ffi::PyEval_SaveThread() };
    }
    loaded
}

/// Runtimes that do not survive `fork()` without `exec` (threads or driver
/// state made at import): the doctor warns about them unless workers are
/// spawned.
const FORK_UNSAFE: [&str; 9] = [
    "torch",
    "tensorflow",
    "jax",
    "max",
    "coremltools",
    "objc",
    "grpc",
    "cupy",
    "mlx",
];

impl Embedded {
    /// `sys.NAME` as text; empty when it cannot be read.
    fn sys_attr(py: Python<'_>, name: &str) -> String {
        py.import("sys")
            .and_then(|sys| sys.getattr(name))
            .and_then(|v| v.str().map(|s| s.to_string()))
            .unwrap_or_default()
    }

    fn libpython_text(&self) -> String {
        self.libpython
            .as_deref()
            .map(|p| p.display().to_string())
            .unwrap_or_default()
    }

    fn venv(&self) -> Option<&Path> {
        self.setup.venv.as_deref()
    }

    /// `Python 3.11.7 (...) (libpython ...), sys.executable ..., sys.prefix
    /// ... (venv ...)`, for the plugin's startup line.
    pub fn summary(&self, py: Python<'_>) -> String {
        format!(
            "Python {} (libpython {}), sys.executable {}, sys.prefix {}{}",
            Self::sys_attr(py, "version").replace('\n', " "),
            self.libpython
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "?".into()),
            Self::sys_attr(py, "executable"),
            Self::sys_attr(py, "prefix"),
            self.venv()
                .map(|v| format!(" (venv {})", v.display()))
                .unwrap_or_default(),
        )
    }

    /// The `python.*` facts for the host's `--doctor` and checks: the
    /// interpreter, `app` (what the plugin was asked to import),
    /// `resolved` (the repr of what it got) and the fork-unsafe runtimes
    /// imported so far. An empty libpython or venv: not found, none;
    /// `venv_source` says which setting named the venv.
    pub fn facts(
        &self,
        py: Python<'_>,
        app: String,
        resolved: &Bound<'_, PyAny>,
    ) -> Vec<(&'static str, String)> {
        vec![
            (
                "python.version",
                Self::sys_attr(py, "version").replace('\n', " "),
            ),
            ("python.libpython", self.libpython_text()),
            ("python.executable", Self::sys_attr(py, "executable")),
            ("python.prefix", Self::sys_attr(py, "prefix")),
            ("python.base_prefix", Self::sys_attr(py, "base_prefix")),
            (
                "python.venv",
                self.venv()
                    .map(|v| v.display().to_string())
                    .unwrap_or_default(),
            ),
            ("python.venv_source", self.setup.venv_source.to_string()),
            ("python.app", app),
            (
                "python.resolved",
                resolved.repr().map(|r| r.to_string()).unwrap_or_default(),
            ),
            (
                "python.fork_unsafe_modules",
                fork_unsafe_modules(py).join(","),
            ),
        ]
    }
}

/// The runtimes of [`FORK_UNSAFE`] in `sys.modules`.
fn fork_unsafe_modules(py: Python<'_>) -> Vec<&'static str> {
    let Ok(modules) = py.import("sys").and_then(|sys| sys.getattr("modules")) else {
        return Vec::new();
    };
    FORK_UNSAFE
        .iter()
        .copied()
        .filter(|m| modules.contains(*m).unwrap_or(false))
        .collect()
}

/// States each fact with the host.
pub fn state_facts(host: &Host, facts: &[(&str, String)]) {
    for (key, value) in facts {
        // The keys are well-formed constants: a refusal cannot happen.
        let _ = host.fact(key, value);
    }
}
