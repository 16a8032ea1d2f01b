//! Starting the embedded interpreter and importing from it.
//!
//! What was measured to matter when embedding CPython in a plugin:
//! libpython is re-opened `RTLD_GLOBAL` so extension modules resolve its
//! symbols, Python is initialised through `PyConfig` with an explicit
//! `program_name` (the venv's `bin/python` or the build interpreter), no
//! Python signal handlers, no argv parsing, and it is never finalised.

use std::ffi::{CStr, CString, c_void};
use std::mem::MaybeUninit;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyList, PyString};

pub use m0serve_plugin::InitError;

/// A dotted name (`pkg.mod`, `app.wsgi`): identifiers joined by dots.
pub fn is_dotted_name(s: &str) -> bool {
    !s.is_empty() && s.split('.').all(is_identifier)
}

/// A Python identifier, close enough: letters (any non-ASCII counts as one),
/// digits not first, underscores.
fn is_identifier(s: &str) -> bool {
    let mut chars = s.chars();
    match chars.next() {
        Some(c) if c == '_' || c.is_alphabetic() => {}
        _ => return false,
    }
    chars.all(|c| c == '_' || c.is_alphanumeric())
}

/// Where the interpreter comes from, decided before it starts.
#[derive(Debug)]
pub struct PythonSetup {
    /// `program_name` for `PyConfig`: drives `sys.executable` and `sys.prefix`.
    pub program: PathBuf,
    /// The virtual environment in use, if any.
    pub venv: Option<PathBuf>,
    /// What named it: `--venv` (the flag or `M0_VENV`), `VIRTUAL_ENV`, or
    /// empty for none.
    pub venv_source: &'static str,
}

/// Picks the interpreter: `--venv`, else `$VIRTUAL_ENV`, else the Python this
/// plugin was built against.
pub fn choose_python(venv_arg: &str, libpython: Option<&Path>) -> Result<PythonSetup, InitError> {
    let env_venv = std::env::var_os("VIRTUAL_ENV").filter(|v| !v.is_empty());
    let (venv, source) = if !venv_arg.is_empty() {
        (Some(PathBuf::from(venv_arg)), "--venv")
    } else if let Some(v) = env_venv {
        (Some(PathBuf::from(v)), "VIRTUAL_ENV")
    } else {
        (None, "")
    };
    if let Some(venv) = venv {
        let venv = std::path::absolute(&venv).unwrap_or(venv);
        let cfg = venv.join("pyvenv.cfg");
        let cfg_text = std::fs::read_to_string(&cfg).map_err(|e| {
            InitError::refused(format!(
                "{source} {}: not a Python virtual environment ({}: {e})",
                venv.display(),
                cfg.display()
            ))
        })?;
        check_venv_version(&venv, source, &cfg_text)?;
        let program = ["python", "python3"]
            .iter()
            .map(|name| venv.join("bin").join(name))
            .find(|p| p.exists())
            .ok_or_else(|| {
                InitError::refused(format!("{source} {}: it has no bin/python", venv.display()))
            })?;
        return Ok(PythonSetup {
            program,
            venv: Some(venv),
            venv_source: source,
        });
    }
    Ok(PythonSetup {
        program: base_python(libpython),
        venv: None,
        venv_source: source,
    })
}

/// The base interpreter: the one pyo3 was configured with at build time, or
/// the `bin/python3.X` beside the libpython actually loaded.
fn base_python(libpython: Option<&Path>) -> PathBuf {
    let built = env!("M0_PYHOST_BUILD_PYTHON");
    if !built.is_empty() && Path::new(built).exists() {
        return PathBuf::from(built);
    }
    if let Some(lib) = libpython
        && let Some(prefix) = lib.parent().and_then(Path::parent)
    {
        let (major, minor) = linked_version();
        let candidate = prefix.join("bin").join(format!("python{major}.{minor}"));
        if candidate.exists() {
            return candidate;
        }
    }
    PathBuf::from("python3")
}

/// Major and minor of the libpython we are linked with (`Py_GetVersion` is
/// usable before initialisation).
pub fn linked_version() -> (u32, u32) {
    // SAFETY: Py_GetVersion returns a static NUL-terminated string and needs
    // no initialised interpreter.
    let v = unsafe { CStr::from_ptr(ffi::Py_GetVersion()) };
    parse_major_minor(&v.to_string_lossy()).unwrap_or((0, 0))
}

fn parse_major_minor(v: &str) -> Option<(u32, u32)> {
    let mut it = v.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// A venv made by another Python (3.12 when we embed 3.11) has packages
/// built for that ABI: refuse it rather than fail obscurely on import.
fn check_venv_version(venv: &Path, source: &str, cfg: &str) -> Result<(), InitError> {
    let declared = cfg.lines().find_map(|line| {
        let (k, v) = line.split_once('=')?;
        let k = k.trim();
        (k == "version" || k == "version_info").then(|| v.trim().to_owned())
    });
    let Some(declared) = declared else {
        return Ok(());
    };
    let linked = linked_version();
    match parse_major_minor(&declared) {
        Some(v) if v != linked => Err(InitError::refused(format!(
            "{source} {} was made by Python {declared}, but this plugin embeds Python {}.{}; \
             recreate it with python{}.{} -m venv",
            venv.display(),
            linked.0,
            linked.1,
            linked.0,
            linked.1
        ))),
        _ => Ok(()),
    }
}

/// The path of the libpython this library is linked with, found from the
/// address of one of its functions.
pub fn libpython_path() -> Option<PathBuf> {
    let mut info = MaybeUninit::<libc::Dl_info>::zeroed();
    let addr = ffi::Py_InitializeFromConfig as *const c_void;
    // SAFETY: dladdr only reads the address and fills `info`.
    let found = unsafe { libc::dladdr(addr, info.as_mut_ptr()) };
    if found == 0 {
        return None;
    }
    // SAFETY: dladdr succeeded, so `info` is initialised.
    let info = unsafe { info.assume_init() };
    if info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dli_fname is a NUL-terminated path owned by the loader.
    let name = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(PathBuf::from(std::ffi::OsStr::from_bytes(name.to_bytes())))
}

/// Makes libpython's symbols global so extension modules (`_ssl`, `_ctypes`)
/// resolve `PyExc_ValueError` and friends: the host opens us `RTLD_LOCAL`.
pub fn promote_libpython(path: &Path) -> Result<(), String> {
    let c = CString::new(path.as_os_str().as_bytes()).map_err(|e| e.to_string())?;
    // SAFETY: RTLD_NOLOAD only re-opens an already loaded object to change
    // its flags; the handle is intentionally leaked (never unloaded).
    let handle = unsafe {
        libc::dlopen(
            c.as_ptr(),
            libc::RTLD_NOW | libc::RTLD_NOLOAD | libc::RTLD_GLOBAL,
        )
    };
    if handle.is_null() {
        // SAFETY: dlerror returns NULL or a NUL-terminated message.
        let err = unsafe { libc::dlerror() };
        let msg = if err.is_null() {
            "unknown error".to_owned()
        } else {
            // SAFETY: non-null dlerror result is a C string.
            unsafe { CStr::from_ptr(err) }
                .to_string_lossy()
                .into_owned()
        };
        return Err(msg);
    }
    Ok(())
}

/// Starts the interpreter through `PyConfig`. On return this thread holds
/// the GIL. Returns false when Python was already running in this process.
pub fn start_python(program: &Path) -> Result<bool, InitError> {
    // SAFETY: Py_IsInitialized may be called at any time.
    if unsafe { ffi::Py_IsInitialized() } != 0 {
        return Ok(false);
    }
    let program_c = CString::new(program.as_os_str().as_bytes())
        .map_err(|_| InitError::refused("the Python program path contains a NUL byte"))?;
    let mut config = MaybeUninit::<ffi::PyConfig>::uninit();
    // SAFETY: PyConfig_InitPythonConfig fully initialises the struct; the
    // fields set afterwards are plain ints and a wide string owned by the
    // config (set through PyConfig_SetBytesString); PyConfig_Clear frees it
    // on every path.
    unsafe {
        ffi::PyConfig_InitPythonConfig(config.as_mut_ptr());
        let cfg = config.as_mut_ptr();
        (*cfg).install_signal_handlers = 0;
        (*cfg).parse_argv = 0;
        // print() from the app reaches the server log at once, not when a
        // block buffer fills (stdout is a pipe or a file under a server).
        (*cfg).buffered_stdio = 0;
        let status =
            ffi::PyConfig_SetBytesString(cfg, &raw mut (*cfg).program_name, program_c.as_ptr());
        if ffi::PyStatus_Exception(status) != 0 {
            ffi::PyConfig_Clear(cfg);
            return Err(InitError::failed(format!(
                "cannot set Python's program name to {}: {}",
                program.display(),
                status_message(&status)
            )));
        }
        let status = ffi::Py_InitializeFromConfig(cfg);
        ffi::PyConfig_Clear(cfg);
        if ffi::PyStatus_Exception(status) != 0 {
            return Err(InitError::failed(format!(
                "Python failed to start (program {}): {}",
                program.display(),
                status_message(&status)
            )));
        }
    }
    Ok(true)
}

fn status_message(status: &ffi::PyStatus) -> String {
    let text = |p: *const std::ffi::c_char| {
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: PyStatus messages are static C strings.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let func = text(status.func);
    let msg = text(status.err_msg);
    match (func.is_empty(), msg.is_empty()) {
        (_, true) => format!("exit code {}", status.exitcode),
        (true, false) => msg,
        (false, false) => format!("{func}: {msg}"),
    }
}

/// Formats a Python exception with its traceback, as Python prints it.
pub fn format_exception(py: Python<'_>, err: &PyErr) -> String {
    let formatted = (|| -> PyResult<String> {
        let tb = py.import("traceback")?;
        let lines = tb.call_method1(
            "format_exception",
            (err.get_type(py), err.value(py), err.traceback(py)),
        )?;
        let joined = PyString::new(py, "").call_method1("join", (lines,))?;
        joined.extract()
    })();
    match formatted {
        Ok(s) => s.trim_end().to_owned(),
        Err(_) => err.to_string(),
    }
}

/// Keeps SIGINT away from Python. `install_signal_handlers = 0` stops
/// Python from installing handlers at start, but the first `import signal`
/// still installs its KeyboardInterrupt handler when SIGINT is at its
/// default (CPython's signal_module_exec). Import it now, on the main
/// thread, and put the default back: the core owns signals.
pub fn keep_signals_default(py: Python<'_>) -> PyResult<()> {
    let signal = py.import("signal")?;
    let sigint = signal.getattr("SIGINT")?;
    let current = signal.call_method1("getsignal", (&sigint,))?;
    if current.is(&signal.getattr("default_int_handler")?) {
        signal.call_method1("signal", (&sigint, signal.getattr("SIG_DFL")?))?;
    }
    Ok(())
}

/// Puts `dir` first on `sys.path`.
pub fn prepend_sys_path(py: Python<'_>, dir: &Path) -> PyResult<()> {
    let sys = py.import("sys")?;
    let path = sys.getattr("path")?.cast_into::<PyList>()?;
    path.insert(0, dir.to_string_lossy().as_ref())?;
    Ok(())
}

/// Imports `module` and resolves the dotted `attr` in it (the module itself
/// when `attr` is empty). `context` says where the names came from (the
/// WSGI plugin's spec, say), for the messages; an import failure carries
/// Python's traceback.
pub fn import_attr<'py>(
    py: Python<'py>,
    module: &str,
    attr: &str,
    context: &str,
    app_dir: &Path,
) -> Result<Bound<'py, PyAny>, InitError> {
    let imported = py.import(module).map_err(|e| {
        let tb = format_exception(py, &e);
        InitError::failed(format!(
            "cannot import module `{module}` ({context}, --app-dir {}):\n{tb}",
            app_dir.display()
        ))
    })?;
    let mut obj = imported.into_any();
    let mut walked = module.to_owned();
    for part in attr.split('.').filter(|p| !p.is_empty()) {
        obj = obj.getattr(part).map_err(|e| {
            InitError::failed(format!(
                "`{walked}` has no attribute `{part}` ({context}, --app-dir {}): {e}",
                app_dir.display()
            ))
        })?;
        walked.push('.');
        walked.push_str(part);
    }
    Ok(obj)
}

/// The name of `obj`'s type, for messages.
pub fn type_name(obj: &Bound<'_, PyAny>) -> String {
    obj.get_type()
        .name()
        .map(|n| n.to_string())
        .unwrap_or_else(|_| "?".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dotted_names() {
        for good in ["m", "pkg.mod", "_x.y1", "café"] {
            assert!(is_dotted_name(good), "{good:?}");
        }
        for bad in ["", "a.", ".b", "1x", "a b", "a..b", "f()", "a:b"] {
            assert!(!is_dotted_name(bad), "{bad:?} should be refused");
        }
    }

    #[test]
    fn major_minor() {
        assert_eq!(parse_major_minor("3.11.7 (main)"), Some((3, 11)));
        assert_eq!(parse_major_minor("3.12"), Some((3, 12)));
        assert_eq!(parse_major_minor("x"), None);
    }
}
