//! m0serve plugin: serve a Python WSGI (PEP 3333) application.
//!
//! ARG is `MODULE[:ATTR]` (ATTR defaults to `application`); `--app-dir` goes
//! first on `sys.path`; `--venv` (or `$VIRTUAL_ENV`) picks a virtual
//! environment. CPython is embedded: started in each worker at init through
//! `PyConfig`, never finalised. Calls are reentrant but serialised by the GIL
//! (`M0_LOCK_HELD`), and the time spent waiting for it is reported.
//!
//! Layout: m0-pyhost starts Python and keeps one Python thread state per
//! handler thread; `app` loads the application, `environ` builds the environ,
//! `input`/`errors`/`filewrapper` are the `wsgi.*` objects and `respond` is
//! `start_response` plus sending the body.

#![deny(clippy::undocumented_unsafe_blocks)]

mod app;
mod environ;
mod errors;
mod filewrapper;
mod host;
mod input;
mod respond;

use std::cell::RefCell;
use std::ffi::CStr;

use m0_pyhost::ThreadState;
use m0_pyhost::interp::format_exception;
use m0serve_plugin::{
    Description, Error, InitArgs, InitError, ProcessLock, Request, Response, Sent,
};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};

use crate::app::AppSpec;
use crate::environ::{EnvironCache, Keys, ServerInfo};
use crate::errors::WsgiErrors;
use crate::host::Host;
use crate::respond::{BodyError, HeaderBuffers, StartResponse};

const VERSION: &CStr =
    match CStr::from_bytes_with_nul(concat!(env!("CARGO_PKG_VERSION"), "\0").as_bytes()) {
        Ok(v) => v,
        Err(_) => panic!("the crate version has no NUL"),
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

impl m0serve_plugin::Plugin for AppState {
    // Reentrant, but the GIL is held for the whole call; it forks safely
    // (the doctor warns about modules that do not); the time spent waiting
    // for the GIL is reported to the adaptive pool.
    const DESCRIPTION: Description = Description::new(c"wsgi", VERSION)
        .process_lock(ProcessLock::Held)
        .compute_threads(0)
        .reports_lock_wait();

    fn init(host: &'static Host, args: &InitArgs) -> Result<AppState, InitError> {
        init(host, args)
    }

    fn thread_start(&self, thread_index: u32) -> Result<(), Error> {
        CTX.with_borrow_mut(|slot| {
            if slot.is_some() {
                return Ok(());
            }
            match start_thread(self) {
                Ok(ctx) => {
                    *slot = Some(ctx);
                    Ok(())
                }
                Err(e) => {
                    host::get().error(&format!("{e} (thread {thread_index})"));
                    Err(Error::INTERNAL)
                }
            }
        })
    }

    fn thread_stop(&self, _thread_index: u32) {
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
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let host = host::get();
        CTX.with_borrow_mut(|slot| {
            if slot.is_none() {
                // The host did not call thread_start on this thread: make the
                // thread state now and keep it.
                match start_thread(self) {
                    Ok(ctx) => *slot = Some(ctx),
                    Err(e) => {
                        host.error(&e);
                        return Err(Error::INTERNAL);
                    }
                }
            }
            let Some(ctx) = slot.as_mut() else {
                return Err(Error::INTERNAL);
            };
            let _gil = ctx.ts.acquire(host);
            Python::attach(|py| serve(py, self, ctx, req, resp))
        })
    }
}

m0serve_plugin::export!(AppState);

fn init(host: &'static Host, args: &InitArgs) -> Result<AppState, InitError> {
    let spec = AppSpec::parse(&args.arg).map_err(|e| InitError::refused(format!("wsgi: {e}")))?;
    let server_port = args.server_port;
    let server_ip = args.server_ip.clone();
    let multithread = args.max_handler_threads.max(args.handler_threads) > 1;
    let multiprocess = args.workers > 1;

    type Facts = Vec<(&'static str, String)>;
    let (app, about, facts) = m0_pyhost::start(
        host,
        args,
        "wsgi",
        |py, python| -> Result<(AppState, String, Facts), InitError> {
            let app = app::load_app(py, &spec, &python.app_dir)
                .map_err(|e| e.map_message(|m| format!("wsgi: {m}")))?;
            let about = format!(
                "wsgi: {}; app {} from {}; wsgi.multithread={} wsgi.multiprocess={}",
                python.summary(py),
                spec.display(),
                python.app_dir.display(),
                if multithread { "True" } else { "False" },
                if multiprocess { "True" } else { "False" },
            );
            let facts = python.facts(py, spec.display(), &app);
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
        },
    )?;
    host.info(&about);
    m0_pyhost::state_facts(host, &facts);
    Ok(app)
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

/// "GET /path" for log lines.
fn request_line(req: &Request<'_>) -> String {
    format!(
        "{} {}",
        String::from_utf8_lossy(req.method()),
        String::from_utf8_lossy(req.target())
    )
}

fn serve(
    py: Python<'_>,
    app: &AppState,
    ctx: &mut ThreadCtx,
    req: &Request<'_>,
    response: Response<'_>,
) -> Result<Sent, Error> {
    let host = host::get();
    let template = ctx.template.bind(py);
    let server_from_request = app.server.name_port.is_none();
    // SAFETY: the Python objects that hold these handles (`wsgi.input`,
    // `start_response`) are invalidated below, before this call returns,
    // whatever the application kept of them.
    let (body, response) = unsafe { (req.detach_body(), response.detach()) };
    let built = environ::build(
        py,
        &app.keys,
        template,
        &mut ctx.cache,
        server_from_request,
        req,
        body,
    );
    let (env, input) = match built {
        Ok(x) => x,
        Err(e) => {
            host.error(&format!(
                "wsgi: {}: cannot build the environ: {}",
                request_line(req),
                format_exception(py, &e)
            ));
            return Err(Error::INTERNAL);
        }
    };
    let buffers = std::mem::take(&mut ctx.header_buffers);
    let head_request = req.method() == b"HEAD";
    let sr = match Bound::new(py, StartResponse::new(response, buffers, head_request)) {
        Ok(sr) => sr,
        Err(e) => {
            host.error(&format!("wsgi: {}: {e}", request_line(req)));
            return Err(Error::INTERNAL);
        }
    };

    let (rc, failure) = match app.app.bind(py).call1((env, &sr)) {
        Ok(body) => respond::send_body(py, &sr, &body),
        Err(e) => (m0serve_abi::M0_ERR_INTERNAL, Some(BodyError::App(e))),
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
                format_exception(py, &e)
            ));
        }
    }
    if let Ok(mut i) = input.try_borrow_mut() {
        i.invalidate();
    }
    let mut sent = None;
    if let Ok(mut s) = sr.try_borrow_mut() {
        sent = s.sent();
        ctx.header_buffers = s.invalidate();
    }
    if let Ok(mut e) = ctx.errors.bind(py).try_borrow_mut() {
        e.flush_pending();
    }
    if client_gone && rc >= 0 {
        return Err(Error::DISCONNECTED);
    }
    match (Error::from_code(rc), sent) {
        (Some(e), _) => Err(e),
        (None, Some(sent)) => Ok(sent),
        (None, None) => {
            host.warn(&format!(
                "wsgi: {}: the application returned without a complete response; answering 500",
                request_line(req)
            ));
            Err(Error::INTERNAL)
        }
    }
}

#[cfg(test)]
mod tests {
    use m0serve_abi::{M0_CALL_REENTRANT, M0_CAP_REPORTS_LOCK_WAIT, M0_LOCK_HELD};
    use m0serve_plugin::Plugin;

    use super::*;

    #[test]
    fn descriptor_is_consistent() {
        let info = AppState::DESCRIPTION.to_info();
        assert_eq!(info.call_model, M0_CALL_REENTRANT);
        assert_eq!(info.process_lock, M0_LOCK_HELD);
        assert_eq!(
            info.caps & M0_CAP_REPORTS_LOCK_WAIT,
            M0_CAP_REPORTS_LOCK_WAIT
        );
    }
}
