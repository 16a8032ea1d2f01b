//! The C entry points that `export!` installs for a [`Plugin`]: each turns
//! the host's pointers into the safe views, calls the trait, and catches
//! any panic at the boundary, turning it into an ABI error code.

use std::any::Any;
use std::ffi::c_void;
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::OnceLock;

use m0serve_abi::{
    self as abi, M0_ERROR_MESSAGE_LEN, M0Error, M0Host, M0InitArgs, M0PluginCalls, M0PluginInfo,
    M0Request, M0Response,
};

use crate::{Admit, Batch, Host, InitArgs, InitError, Plugin, Request, Response};

/// The descriptor, made once from [`Plugin::describe`] on the first call
/// of `m0_plugin_describe`, and static after.
pub struct Info(OnceLock<M0PluginInfo>);

// SAFETY: the descriptor's pointers are to static, immutable strings, so it
// may be sent to and shared by any thread.
unsafe impl Send for Info {}
// SAFETY: as for Send; OnceLock makes the one write safe.
unsafe impl Sync for Info {}

impl Info {
    pub const fn new() -> Info {
        Info(OnceLock::new())
    }

    pub fn get<P: Plugin>(&self) -> *const M0PluginInfo {
        // A panic in describe must not unwind into the host: a descriptor
        // of size 0, which the host refuses, stands for it.
        self.0.get_or_init(|| match catch_unwind(P::describe) {
            Ok(d) => d.to_info(),
            Err(_) => M0PluginInfo {
                size: 0,
                ..P::DESCRIPTION.to_info()
            },
        })
    }
}

impl Default for Info {
    fn default() -> Info {
        Info::new()
    }
}

/// The calls table for `P`; the hooks a plugin does not override cost one
/// empty call each.
pub const fn calls<P: Plugin>() -> M0PluginCalls {
    M0PluginCalls {
        size: size_of::<M0PluginCalls>() as u32,
        handle: Some(handle::<P>),
        thread_start: Some(thread_start::<P>),
        thread_stop: Some(thread_stop::<P>),
        // Called only when the descriptor declares M0_CAP_BATCH.
        handle_batch: Some(handle_batch::<P>),
        shutdown: Some(shutdown::<P>),
        // Called only when the descriptor declares M0_CAP_ADMIT.
        admit: Some(admit::<P>),
    }
}

/// The text of a panic's payload.
fn panic_text(payload: &(dyn Any + Send)) -> &str {
    if let Some(s) = payload.downcast_ref::<&str>() {
        s
    } else if let Some(s) = payload.downcast_ref::<String>() {
        s
    } else {
        "a panic without a message"
    }
}

fn log_panic<P: Plugin>(hook: &str, payload: &(dyn Any + Send), then: &str) {
    if let Some(host) = crate::host() {
        host.error(&format!(
            "{}: panicked in {hook}: {}; {then}",
            P::DESCRIPTION.name(),
            panic_text(payload)
        ));
    }
}

/// `m0_plugin_init` for `P`.
///
/// # Safety
/// The host's arguments, as `M0InitFn` documents them.
pub unsafe fn init<P: Plugin>(
    host: *const M0Host,
    args: *const M0InitArgs,
    calls: &'static M0PluginCalls,
    calls_out: *mut *const M0PluginCalls,
    state_out: *mut *mut c_void,
    error: *mut M0Error,
) -> i32 {
    let name = P::DESCRIPTION.name();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's table and arguments, valid for the call.
        let host = unsafe { Host::install(host) }
            .map_err(|e| InitError::refused(format!("{name}: {e}")))?;
        // SAFETY: as above.
        let args = unsafe { InitArgs::read(args) }
            .map_err(|e| InitError::refused(format!("{name}: {e}")))?;
        P::init(host, &args)
    }))
    .unwrap_or_else(|payload| {
        Err(InitError::failed(format!(
            "{name}: panicked during init: {}",
            panic_text(&*payload)
        )))
    });
    match outcome {
        Ok(plugin) if !calls_out.is_null() && !state_out.is_null() => {
            // SAFETY: out-pointers are valid for writes (ABI contract); the
            // state lives for the rest of the process (never freed: the
            // host never unloads a plugin).
            unsafe {
                *calls_out = calls;
                *state_out = Box::into_raw(Box::new(plugin)).cast();
            }
            abi::M0_OK
        }
        Ok(_) => abi::M0_INIT_FAILED,
        Err(e) => {
            // SAFETY: NULL or the host's buffer (ABI contract).
            unsafe { write_error(error, &e.message) };
            e.code
        }
    }
}

/// The plugin behind the host's state pointer.
///
/// # Safety
/// `state` is NULL or the pointer `init` wrote, alive for the process.
unsafe fn plugin<'a, P: Plugin>(state: *mut c_void) -> Option<&'a P> {
    // SAFETY: the caller's contract; `init` boxed a `P` there.
    unsafe { (state as *const P).as_ref() }
}

unsafe extern "C" fn handle<P: Plugin>(
    state: *mut c_void,
    request: *const M0Request,
    response: *mut M0Response,
) -> i32 {
    // SAFETY: the state pointer from init (ABI contract).
    let (Some(plugin), Some(host)) = (unsafe { plugin::<P>(state) }, crate::host()) else {
        return abi::M0_ERR_INTERNAL;
    };
    if request.is_null() || response.is_null() {
        return abi::M0_ERR_INTERNAL;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's request and response for this call.
        let (req, resp) = unsafe { (Request::new(&*request, host), Response::new(response, host)) };
        plugin.handle(&req, resp)
    }));
    match outcome {
        Ok(Ok(_sent)) => abi::M0_OK,
        Ok(Err(e)) => e.code(),
        Err(payload) => {
            log_panic::<P>(
                &request_line("handle", request),
                &*payload,
                "the host answers 500, or cuts the response off if it had begun",
            );
            abi::M0_ERR_INTERNAL
        }
    }
}

/// "handle for GET /path", for a panic's log line.
fn request_line(hook: &str, request: *const M0Request) -> String {
    // SAFETY: the host's request for the call in progress (non-null, checked
    // by the caller).
    let (method, target) = unsafe { ((*request).method.as_bytes(), (*request).target.as_bytes()) };
    format!(
        "{hook} for {} {}",
        String::from_utf8_lossy(method),
        String::from_utf8_lossy(target)
    )
}

unsafe extern "C" fn handle_batch<P: Plugin>(
    state: *mut c_void,
    requests: *const *const M0Request,
    responses: *const *mut M0Response,
    count: usize,
) -> i32 {
    // SAFETY: the state pointer from init (ABI contract).
    let (Some(plugin), Some(host)) = (unsafe { plugin::<P>(state) }, crate::host()) else {
        return abi::M0_ERR_INTERNAL;
    };
    if count == 0 {
        return abi::M0_OK;
    }
    if requests.is_null() || responses.is_null() {
        return abi::M0_ERR_INTERNAL;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `count` requests and responses at these pointers, valid
        // for the call (ABI contract).
        let batch = unsafe {
            Batch::new(
                std::slice::from_raw_parts(requests, count),
                std::slice::from_raw_parts(responses, count),
                host,
            )
        };
        plugin.handle_batch(batch)
    }));
    match outcome {
        Ok(Ok(())) => abi::M0_OK,
        Ok(Err(e)) => e.code(),
        Err(payload) => {
            log_panic::<P>(
                "handle_batch",
                &*payload,
                "the host answers what the batch left unanswered",
            );
            abi::M0_ERR_INTERNAL
        }
    }
}

unsafe extern "C" fn admit<P: Plugin>(
    state: *mut c_void,
    request: *const M0Request,
    response: *mut M0Response,
    in_flight: u64,
    cost: *mut u64,
) -> i32 {
    // SAFETY: the state pointer from init (ABI contract).
    let (Some(plugin), Some(host)) = (unsafe { plugin::<P>(state) }, crate::host()) else {
        return abi::M0_ERR_INTERNAL;
    };
    if request.is_null() || response.is_null() || cost.is_null() {
        return abi::M0_ERR_INTERNAL;
    }
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: the host's request and response for this call.
        let (req, resp) = unsafe { (Request::new(&*request, host), Response::new(response, host)) };
        plugin.admit(&req, resp, in_flight)
    }));
    match outcome {
        Ok(Admit::Cost(n)) => {
            // SAFETY: non-null, and the host's to write for this call.
            unsafe { *cost = n };
            abi::M0_OK
        }
        Ok(Admit::Answered(Ok(_sent))) => abi::M0_OK,
        Ok(Admit::Answered(Err(e))) => e.code(),
        Err(payload) => {
            log_panic::<P>(
                &request_line("admit", request),
                &*payload,
                "the host answers 500, or cuts the response off if it had begun",
            );
            abi::M0_ERR_INTERNAL
        }
    }
}

unsafe extern "C" fn thread_start<P: Plugin>(state: *mut c_void, index: u32) -> i32 {
    // SAFETY: the state pointer from init (ABI contract).
    let Some(plugin) = (unsafe { plugin::<P>(state) }) else {
        return abi::M0_ERR_INTERNAL;
    };
    match catch_unwind(AssertUnwindSafe(|| plugin.thread_start(index))) {
        Ok(Ok(())) => abi::M0_OK,
        Ok(Err(e)) => e.code(),
        Err(payload) => {
            log_panic::<P>(
                &format!("thread_start on thread {index}"),
                &*payload,
                "the worker stops",
            );
            abi::M0_ERR_INTERNAL
        }
    }
}

unsafe extern "C" fn thread_stop<P: Plugin>(state: *mut c_void, index: u32) {
    // SAFETY: the state pointer from init (ABI contract).
    let Some(plugin) = (unsafe { plugin::<P>(state) }) else {
        return;
    };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| plugin.thread_stop(index))) {
        log_panic::<P>(
            &format!("thread_stop on thread {index}"),
            &*payload,
            "the thread exits anyway",
        );
    }
}

unsafe extern "C" fn shutdown<P: Plugin>(state: *mut c_void) {
    // SAFETY: the state pointer from init (ABI contract).
    let Some(plugin) = (unsafe { plugin::<P>(state) }) else {
        return;
    };
    if let Err(payload) = catch_unwind(AssertUnwindSafe(|| plugin.shutdown())) {
        log_panic::<P>("shutdown", &*payload, "the worker exits anyway");
    }
}

/// Copies `message` into the host's error buffer. One too long for it
/// keeps its first line and its tail (where a traceback ends in the
/// error), and goes to the log whole.
///
/// # Safety
/// `error` is NULL or points to a writable `M0Error` whose `size` is right.
unsafe fn write_error(error: *mut M0Error, message: &str) {
    if message.len() > M0_ERROR_MESSAGE_LEN
        && let Some(host) = crate::host()
    {
        host.error(message);
    }
    // SAFETY: NULL or writable (the caller's contract).
    let Some(e) = (unsafe { error.as_mut() }) else {
        return;
    };
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

/// `message` cut to `max` bytes: its first line (at most half), a gap
/// marker, and as much of its end as fits.
pub(crate) fn fit_message(message: &str, max: usize) -> String {
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
}
