//! m0serve plugin: serve a Python WSGI (PEP 3333) application.
//!
//! ARG is `MODULE[:ATTR]` (ATTR defaults to `application`); `--app-dir` goes
//! first on `sys.path`; `--venv` (or `$VIRTUAL_ENV`) picks a virtual
//! environment. CPython is embedded: started in each worker at init through
//! `PyConfig`, never finalised. Calls are reentrant but serialised by the GIL
//! (`M0_LOCK_HELD`), and the time spent waiting for it is reported.
//!
//! Layout: `interp` starts Python and loads the app, `gil` keeps one Python
//! thread state per handler thread, `environ` builds the environ,
//! `input`/`errors`/`filewrapper` are the `wsgi.*` objects and `respond` is
//! `start_response` plus sending the body.

#![deny(clippy::undocumented_unsafe_blocks)]

mod environ;
mod errors;
mod filewrapper;
mod gil;
mod host;
mod input;
mod interp;
mod respond;

use std::cell::RefCell;
use std::ffi::{CStr, c_void};
use std::os::unix::ffi::OsStrExt;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::path::{Path, PathBuf};

use m0serve_abi::{
    M0_ABI_MAJOR, M0_ABI_MINOR, M0_CALL_REENTRANT, M0_CAP_REPORTS_LOCK_WAIT, M0_ERR_INTERNAL,
    M0_ERROR_MESSAGE_LEN, M0_LOCK_HELD, M0_OK, M0_START_FORK_SAFE, M0Error, M0Host, M0InitArgs,
    M0PluginCalls, M0PluginInfo, M0Request, M0Response, M0Str,
};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::environ::{EnvironCache, Keys, ServerInfo};
use crate::errors::WsgiErrors;
use crate::gil::ThreadState;
use crate::host::Host;
use crate::interp::{AppSpec, InitError};
use crate::respond::{BodyError, HeaderBuffers, StartResponse};

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version has no NUL"),
    };

static INFO: M0PluginInfo = M0PluginInfo {
    size: size_of::<M0PluginInfo>() as u32,
    abi_major: M0_ABI_MAJOR,
    abi_minor: M0_ABI_MINOR,
    call_model: M0_CALL_REENTRANT,
    name: c"wsgi".as_ptr(),
    version: VERSION.as_ptr(),
    max_concurrency: 0,
    process_lock: M0_LOCK_HELD,
    start: M0_START_FORK_SAFE,
    compute_threads: 0,
    caps: M0_CAP_REPORTS_LOCK_WAIT,
    max_batch: 0,
};

static CALLS: M0PluginCalls = M0PluginCalls {
    size: size_of::<M0PluginCalls>() as u32,
    handle: Some(handle),
    thread_start: Some(thread_start),
    thread_stop: Some(thread_stop),
    handle_batch: None,
    shutdown: None,
};

/// Everything a request needs that is the same for the whole worker.
struct AppState {
    app: Py<PyAny>,
    keys: Keys,
    server: ServerInfo,
    spec: String,
}

/// One handler thread's Python state and scratch space.
struct ThreadCtx {
    ts: ThreadState,
    template: Py<PyDict>,
    errors: Py<WsgiErrors>,
    cache: EnvironCache,
    header_buffers: HeaderBuffers,
}

thread_local! {
    static CTX: RefCell<Option<ThreadCtx>> = const { RefCell::new(None) };
}

/// The static descriptor; no side effects.
#[unsafe(no_mangle)]
pub extern "C" fn m0_plugin_describe() -> *const M0PluginInfo {
    &INFO
}

/// Starts Python in this worker and loads the application.
///
/// # Safety
/// Called by the host as `M0InitFn` documents: valid pointers, once, on the
/// main thread, before any handler thread starts.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn m0_plugin_init(
    host: *const M0Host,
    args: *const M0InitArgs,
    calls: *mut *const M0PluginCalls,
    state: *mut *mut c_void,
    error: *mut M0Error,
) -> i32 {
    let result = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host passes a valid table (ABI contract).
        let host = unsafe { Host::install(host) }.map_err(InitError::failed)?;
        // SAFETY: `args` is valid for the call (ABI contract).
        let app = unsafe { init(host, args) }?;
        Ok::<_, InitError>(Box::into_raw(Box::new(app)))
    }));
    let outcome = match result {
        Ok(r) => r,
        Err(_) => Err(InitError::failed("wsgi: internal panic during init")),
    };
    match outcome {
        Ok(app) => {
            // SAFETY: out-pointers are valid for writes (ABI contract); the
            // state lives for the rest of the process (never freed).
            unsafe {
                *calls = &CALLS;
                *state = app.cast();
            }
            M0_OK
        }
        Err(e) => {
            // SAFETY: `error` is NULL or a host buffer (ABI contract).
            unsafe { write_error(error, &e.message) };
            e.code
        }
    }
}

/// Copies `message` into the host's error buffer; a message too long keeps
/// its first line and its tail (the exception is at the end of a traceback).
///
/// # Safety
/// `error` is NULL or points to a writable `M0Error` whose `size` is right.
unsafe fn write_error(error: *mut M0Error, message: &str) {
    if message.len() > M0_ERROR_MESSAGE_LEN
        && let Some(host) = Host::try_get()
    {
        // The buffer cannot hold it all: the whole text goes to the log.
        host.error(message);
    }
    if error.is_null() {
        return;
    }
    // SAFETY: non-null and writable (caller); `size` is read first.
    let e = unsafe { &mut *error };
    if (e.size as usize) < size_of::<M0Error>() {
        return;
    }
    let fitted = fit_message(message, M0_ERROR_MESSAGE_LEN);
    e.message[..fitted.len()].copy_from_slice(fitted.as_bytes());
    e.message_len = fitted.len() as u32;
}

fn floor_char(s: &str, mut i: usize) -> usize {
    while i > 0 && !s.is_char_boundary(i) {
        i -= 1;
    }
    i
}

fn fit_message(message: &str, max: usize) -> String {
    if message.len() <= max {
        return message.to_owned();
    }
    const GAP: &str = "\n[...]\n";
    let first_end = message.find('\n').unwrap_or(message.len()).min(max / 2);
    let head = &message[..floor_char(message, first_end)];
    let budget = max - head.len() - GAP.len();
    let mut start = message.len() - budget;
    while !message.is_char_boundary(start) {
        start += 1;
    }
    format!("{head}{GAP}{}", &message[start..])
}

fn str_arg(s: &M0Str) -> &[u8] {
    // SAFETY: the host's views are valid during `m0_plugin_init`.
    unsafe { s.as_bytes() }
}

/// # Safety
/// `args` must be NULL or a valid `M0InitArgs`.
unsafe fn init(host: &'static Host, args: *const M0InitArgs) -> Result<AppState, InitError> {
    if args.is_null() {
        return Err(InitError::failed("wsgi: the host passed no init arguments"));
    }
    // SAFETY: non-null, valid for the call (ABI contract).
    let args = unsafe { &*args };
    if (args.size as usize) < size_of::<M0InitArgs>() {
        return Err(InitError::refused(format!(
            "wsgi: the host's init arguments are {} bytes, this plugin needs {}",
            args.size,
            size_of::<M0InitArgs>()
        )));
    }
    let arg = String::from_utf8_lossy(str_arg(&args.arg)).into_owned();
    let spec = AppSpec::parse(&arg).map_err(|e| InitError::refused(format!("wsgi: {e}")))?;
    let app_dir_raw = str_arg(&args.app_dir);
    let app_dir = Path::new(std::ffi::OsStr::from_bytes(if app_dir_raw.is_empty() {
        b"."
    } else {
        app_dir_raw
    }));
    let app_dir: PathBuf = std::fs::canonicalize(app_dir)
        .ok()
        .filter(|p| p.is_dir())
        .ok_or_else(|| {
            InitError::refused(format!(
                "wsgi: --app-dir {} is not a directory",
                app_dir.display()
            ))
        })?;
    let venv_arg = String::from_utf8_lossy(str_arg(&args.venv)).into_owned();

    let libpython = interp::libpython_path();
    match &libpython {
        Some(p) => {
            if let Err(e) = interp::promote_libpython(p) {
                host.warn(&format!(
                    "wsgi: could not make {} global ({e}); extension modules may fail to import",
                    p.display()
                ));
            }
        }
        None => host.warn("wsgi: could not locate libpython with dladdr"),
    }
    let setup = interp::choose_python(&venv_arg, libpython.as_deref())?;
    let started_here = interp::start_python(&setup.program)?;

    let server_port = args.server.port;
    let server_ip = String::from_utf8_lossy(str_arg(&args.server.ip)).into_owned();
    let multithread = args.max_handler_threads.max(args.handler_threads) > 1;
    let multiprocess = args.workers > 1;

    type Facts = Vec<(&'static str, String)>;
    let loaded = Python::attach(|py| -> Result<(AppState, String, Facts), InitError> {
        if started_here {
            interp::keep_signals_default(py).map_err(|e| {
                InitError::failed(format!("wsgi: cannot reset Python's SIGINT handler: {e}"))
            })?;
        }
        interp::prepend_sys_path(py, &app_dir).map_err(|e| {
            InitError::failed(format!(
                "wsgi: cannot put {} on sys.path: {e}",
                app_dir.display()
            ))
        })?;
        let app = interp::load_app(py, &spec, &app_dir).map_err(|mut e| {
            e.message = format!("wsgi: {}", e.message);
            e
        })?;
        let sys = py
            .import("sys")
            .map_err(|e| InitError::failed(e.to_string()))?;
        let attr = |name: &str| -> String {
            sys.getattr(name)
                .and_then(|v| v.str().map(|s| s.to_string()))
                .unwrap_or_default()
        };
        let about = format!(
            "wsgi: Python {} (libpython {}), sys.executable {}, sys.prefix {}{}; app {} from {}; \
             wsgi.multithread={} wsgi.multiprocess={}",
            attr("version").replace('\n', " "),
            libpython
                .as_deref()
                .map(|p| p.display().to_string())
                .unwrap_or_else(|| "?".into()),
            attr("executable"),
            attr("prefix"),
            setup
                .venv
                .as_deref()
                .map(|v| format!(" (venv {})", v.display()))
                .unwrap_or_default(),
            spec.display(),
            app_dir.display(),
            if multithread { "True" } else { "False" },
            if multiprocess { "True" } else { "False" },
        );
        // The same, as facts for the host's --doctor and checks (an empty
        // libpython or venv: not found, none).
        let facts = vec![
            ("python.version", attr("version").replace('\n', " ")),
            (
                "python.libpython",
                libpython
                    .as_deref()
                    .map(|p| p.display().to_string())
                    .unwrap_or_default(),
            ),
            ("python.executable", attr("executable")),
            ("python.prefix", attr("prefix")),
            ("python.base_prefix", attr("base_prefix")),
            (
                "python.venv",
                setup
                    .venv
                    .as_deref()
                    .map(|v| v.display().to_string())
                    .unwrap_or_default(),
            ),
            ("python.app", spec.display()),
            (
                "python.resolved",
                app.repr().map(|r| r.to_string()).unwrap_or_default(),
            ),
            (
                "python.fork_unsafe_modules",
                fork_unsafe_modules(&sys).join(","),
            ),
        ];
        let name_port = (server_port != 0).then(|| {
            (
                PyString::new(py, &server_ip).unbind(),
                PyString::new(py, &server_port.to_string()).unbind(),
            )
        });
        Ok((
            AppState {
                app: app.unbind(),
                keys: Keys::new(py),
                server: ServerInfo {
                    name_port,
                    multithread,
                    multiprocess,
                },
                spec: spec.display(),
            },
            about,
            facts,
        ))
    });
    if started_here {
        // Init took the GIL on this thread; handler threads need it.
        // SAFETY: this thread holds the GIL since Py_InitializeFromConfig; the
        // main thread state is kept (never finalised).
        unsafe { ffi::PyEval_SaveThread() };
    }
    let (app, about, facts) = loaded?;
    host.info(&about);
    for (key, value) in &facts {
        host.fact(key, value);
    }
    Ok(app)
}

/// Runtimes the app imported that do not survive `fork()` without `exec`
/// (threads or driver state made at import): the doctor warns about them
/// unless workers are spawned.
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

fn fork_unsafe_modules(sys: &Bound<'_, PyModule>) -> Vec<&'static str> {
    let Ok(modules) = sys.getattr("modules") else {
        return Vec::new();
    };
    FORK_UNSAFE
        .iter()
        .copied()
        .filter(|m| modules.contains(*m).unwrap_or(false))
        .collect()
}

/// Builds a handler thread's context: thread state, environ template.
fn start_thread(app: &AppState) -> Result<ThreadCtx, String> {
    // SAFETY: Python was initialised by init; a handler thread does not hold
    // the GIL between calls.
    let (ts, made) = unsafe {
        ThreadState::create(|py| -> PyResult<(Py<PyDict>, Py<WsgiErrors>)> {
            let errors = Bound::new(py, WsgiErrors::new())?;
            let template = environ::make_template(py, &app.keys, &app.server, &errors)?;
            Ok((template.unbind(), errors.unbind()))
        })
    };
    match made {
        Ok((template, errors)) => Ok(ThreadCtx {
            ts,
            template,
            errors,
            cache: EnvironCache::new(),
            header_buffers: HeaderBuffers::default(),
        }),
        Err(e) => {
            // SAFETY: same thread, GIL released by `create`.
            unsafe { ts.destroy(|_| {}) };
            Err(format!("wsgi: cannot prepare a handler thread: {e}"))
        }
    }
}

unsafe extern "C" fn thread_start(state: *mut c_void, thread_index: u32) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `state` is the AppState returned by init, alive forever.
        let app = unsafe { &*(state as *const AppState) };
        CTX.with_borrow_mut(|slot| {
            if slot.is_some() {
                return M0_OK;
            }
            match start_thread(app) {
                Ok(ctx) => {
                    *slot = Some(ctx);
                    M0_OK
                }
                Err(e) => {
                    Host::get().error(&format!("{e} (thread {thread_index})"));
                    M0_ERR_INTERNAL
                }
            }
        })
    }));
    r.unwrap_or(M0_ERR_INTERNAL)
}

unsafe extern "C" fn thread_stop(_state: *mut c_void, _thread_index: u32) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if let Some(ctx) = CTX.with_borrow_mut(Option::take) {
            let ThreadCtx {
                ts,
                template,
                errors,
                cache,
                header_buffers: _,
            } = ctx;
            // SAFETY: created on this thread by thread_start; GIL released.
            unsafe {
                ts.destroy(|py| {
                    if let Ok(mut e) = errors.bind(py).try_borrow_mut() {
                        e.flush_pending();
                    }
                    drop((template, errors, cache));
                })
            };
        }
    }));
}

unsafe extern "C" fn handle(
    state: *mut c_void,
    request: *const M0Request,
    response: *mut M0Response,
) -> i32 {
    let r = catch_unwind(AssertUnwindSafe(|| {
        if state.is_null() || request.is_null() || response.is_null() {
            return M0_ERR_INTERNAL;
        }
        // SAFETY: `state` is the AppState from init (alive forever);
        // `request` is valid for this call (ABI contract).
        let (app, req) = unsafe { (&*(state as *const AppState), &*request) };
        let host = Host::get();
        CTX.with_borrow_mut(|slot| {
            if slot.is_none() {
                // The host did not call thread_start on this thread: make the
                // thread state now and keep it.
                match start_thread(app) {
                    Ok(ctx) => *slot = Some(ctx),
                    Err(e) => {
                        host.error(&e);
                        return M0_ERR_INTERNAL;
                    }
                }
            }
            let Some(ctx) = slot.as_mut() else {
                return M0_ERR_INTERNAL;
            };
            let _gil = ctx.ts.acquire(host);
            Python::attach(|py| serve(py, app, ctx, req, response))
        })
    }));
    r.unwrap_or(M0_ERR_INTERNAL)
}

/// "GET /path" for log lines.
fn request_line(req: &M0Request) -> String {
    // SAFETY: views valid for the `handle` call.
    let (m, t) = unsafe { (req.method.as_bytes(), req.target.as_bytes()) };
    format!(
        "{} {}",
        String::from_utf8_lossy(m),
        String::from_utf8_lossy(t)
    )
}

fn serve(
    py: Python<'_>,
    app: &AppState,
    ctx: &mut ThreadCtx,
    req: &M0Request,
    response: *mut M0Response,
) -> i32 {
    let host = Host::get();
    let template = ctx.template.bind(py);
    let server_from_request = app.server.name_port.is_none();
    // SAFETY: `req` is the request of this `handle` call.
    let built = unsafe {
        environ::build(
            py,
            &app.keys,
            template,
            &mut ctx.cache,
            server_from_request,
            req,
        )
    };
    let (env, input) = match built {
        Ok(x) => x,
        Err(e) => {
            host.error(&format!(
                "wsgi: {}: cannot build the environ: {}",
                request_line(req),
                interp::format_exception(py, &e)
            ));
            return M0_ERR_INTERNAL;
        }
    };
    let buffers = std::mem::take(&mut ctx.header_buffers);
    // SAFETY: the method view is valid for the `handle` call.
    let head_request = unsafe { req.method.as_bytes() } == b"HEAD";
    let sr = match Bound::new(py, StartResponse::new(response, buffers, head_request)) {
        Ok(sr) => sr,
        Err(e) => {
            host.error(&format!("wsgi: {}: {e}", request_line(req)));
            return M0_ERR_INTERNAL;
        }
    };

    let (rc, failure) = match app.app.bind(py).call1((env, &sr)) {
        Ok(body) => respond::send_body(py, &sr, &body),
        Err(e) => (M0_ERR_INTERNAL, Some(BodyError::App(e))),
    };
    let client_gone = sr.try_borrow().map(|s| s.client_gone()).unwrap_or(false);
    match failure {
        None => {}
        Some(BodyError::Host(code)) => host.debug(&format!(
            "wsgi: {}: response not completed (m0serve error {code})",
            request_line(req)
        )),
        Some(BodyError::App(_)) if client_gone => host.debug(&format!(
            "wsgi: {}: the client disconnected",
            request_line(req)
        )),
        Some(BodyError::App(e)) => {
            let head_sent = sr.try_borrow().map(|s| s.head_sent()).unwrap_or(true);
            host.error(&format!(
                "wsgi: {}: application error ({}) in {}:\n{}",
                request_line(req),
                if head_sent {
                    "response cut off"
                } else {
                    "500 sent"
                },
                app.spec,
                interp::format_exception(py, &e)
            ));
        }
    }
    if let Ok(mut i) = input.try_borrow_mut() {
        i.invalidate();
    }
    if let Ok(mut s) = sr.try_borrow_mut() {
        ctx.header_buffers = s.invalidate();
    }
    if let Ok(mut e) = ctx.errors.bind(py).try_borrow_mut() {
        e.flush_pending();
    }
    if client_gone && rc >= 0 {
        return m0serve_abi::M0_ERR_DISCONNECTED;
    }
    rc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_messages_keep_head_and_tail() {
        let msg = format!("first line\n{}\nValueError: the end", "x".repeat(2000));
        let fitted = fit_message(&msg, 512);
        assert!(fitted.len() <= 512);
        assert!(fitted.starts_with("first line\n[...]"));
        assert!(fitted.ends_with("ValueError: the end"));
        assert_eq!(fit_message("short", 512), "short");
        let wide = "é".repeat(600);
        assert!(fit_message(&wide, 512).len() <= 512);
    }

    #[test]
    fn descriptor_is_consistent() {
        let info = m0_plugin_describe();
        // SAFETY: points to the static INFO.
        let info = unsafe { &*info };
        assert_eq!(info.abi_major, M0_ABI_MAJOR);
        assert_eq!(info.call_model, M0_CALL_REENTRANT);
        assert_eq!(info.process_lock, M0_LOCK_HELD);
        assert_eq!(
            info.caps & M0_CAP_REPORTS_LOCK_WAIT,
            M0_CAP_REPORTS_LOCK_WAIT
        );
    }
}
