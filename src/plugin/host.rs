//! The host function table handed to every plugin at init.
//!
//! Each function is an `extern "C"` boundary: it checks its pointers, and a
//! panic inside it is caught and turned into an error code, never unwound
//! into the plugin.

use std::panic::{AssertUnwindSafe, catch_unwind};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use m0serve_abi as abi;

use crate::plugin::exchange::Exchange;
use crate::plugin::{models, plugin_metrics};

/// The table. Static: valid for the life of the process.
pub static HOST: abi::M0Host = abi::M0Host {
    size: std::mem::size_of::<abi::M0Host>() as u32,
    abi_major: abi::M0_ABI_MAJOR,
    abi_minor: abi::M0_ABI_MINOR,
    log: host_log,
    response_start: host_response_start,
    response_write: host_response_write,
    response_finish: host_response_finish,
    response_send: host_response_send,
    body_read: host_body_read,
    now_ns: host_now_ns,
    counter_add: host_counter_add,
    fact: host_fact,
    response_reason: host_response_reason,
    set_ready: host_set_ready,
    model_register: host_model_register,
    request_model: host_request_model,
    model_in_flight: host_model_in_flight,
    metric_define: host_metric_define,
    metric_record: host_metric_record,
};

/// Whether the plugin says this worker is ready for traffic
/// (`M0Host::set_ready`); the health path reads it.
pub static READY: AtomicBool = AtomicBool::new(true);

/// Counters plugins report into (this worker's).
pub static LOCK_WAIT_NS: AtomicU64 = AtomicU64::new(0);
pub static LOCK_WAITS: AtomicU64 = AtomicU64::new(0);

/// Run `f` inside the panic boundary; a panic becomes `on_panic`.
fn boundary<T>(on_panic: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(on_panic)
}

/// The exchange behind a response handle.
///
/// # Safety
/// `response` must be a handle the host passed to the plugin's current
/// `handle` call (it points at that call's `Exchange`).
unsafe fn exchange<'a>(response: *mut abi::M0Response) -> Option<&'a mut Exchange<'a>> {
    // SAFETY: per the function's contract the handle is an Exchange owned by
    // the handler thread's stack frame that is inside the call.
    unsafe { response.cast::<Exchange<'a>>().as_mut() }
}

/// The headers array as name/value byte pairs.
///
/// # Safety
/// `headers` points to `count` valid `M0Header`s whose views are readable.
unsafe fn header_pairs<'h>(
    headers: *const abi::M0Header,
    count: usize,
) -> Option<impl Iterator<Item = (&'h [u8], &'h [u8])> + Clone> {
    if count > 0 && headers.is_null() {
        return None;
    }
    let slice: &[abi::M0Header] = if count == 0 {
        &[]
    } else {
        // SAFETY: non-null with `count` elements, per the caller.
        unsafe { std::slice::from_raw_parts(headers, count) }
    };
    // SAFETY: each view is readable per the caller's contract.
    Some(
        slice
            .iter()
            .map(|h| unsafe { (h.name.as_bytes(), h.value.as_bytes()) }),
    )
}

/// # Safety
/// `data` points to `len` readable bytes (or is NULL with `len` 0).
unsafe fn bytes<'d>(data: *const u8, len: usize) -> Option<&'d [u8]> {
    if len == 0 {
        Some(&[])
    } else if data.is_null() {
        None
    } else {
        // SAFETY: non-null with `len` bytes, per the caller.
        Some(unsafe { std::slice::from_raw_parts(data, len) })
    }
}

unsafe extern "C" fn host_log(level: u32, message: *const u8, len: usize) {
    boundary((), || {
        // SAFETY: the plugin passes `len` readable bytes.
        if let Some(text) = unsafe { bytes(message, len) } {
            crate::log::plugin(level, &String::from_utf8_lossy(text));
        }
    })
}

unsafe extern "C" fn host_response_start(
    response: *mut abi::M0Response,
    status: u16,
    headers: *const abi::M0Header,
    header_count: usize,
    content_length: i64,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes the handle of its current call.
        let Some(ex) = (unsafe { exchange(response) }) else {
            return abi::M0_ERR_INVALID;
        };
        // SAFETY: the plugin passes `header_count` valid headers.
        let Some(pairs) = (unsafe { header_pairs(headers, header_count) }) else {
            return abi::M0_ERR_INVALID;
        };
        ex.start(status, pairs, content_length)
    })
}

unsafe extern "C" fn host_response_reason(
    response: *mut abi::M0Response,
    reason: *const u8,
    len: usize,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes the handle of its current call.
        let Some(ex) = (unsafe { exchange(response) }) else {
            return abi::M0_ERR_INVALID;
        };
        // SAFETY: the plugin passes `len` readable bytes.
        let Some(reason) = (unsafe { bytes(reason, len) }) else {
            return abi::M0_ERR_INVALID;
        };
        ex.set_reason(reason)
    })
}

unsafe extern "C" fn host_set_ready(ready: u32) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        READY.store(ready != 0, Ordering::Relaxed);
        abi::M0_OK
    })
}

unsafe extern "C" fn host_response_write(
    response: *mut abi::M0Response,
    data: *const u8,
    len: usize,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes the handle of its current call.
        let Some(ex) = (unsafe { exchange(response) }) else {
            return abi::M0_ERR_INVALID;
        };
        // SAFETY: the plugin passes `len` readable bytes.
        let Some(data) = (unsafe { bytes(data, len) }) else {
            return abi::M0_ERR_INVALID;
        };
        ex.write(data)
    })
}

unsafe extern "C" fn host_response_finish(response: *mut abi::M0Response) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes the handle of its current call.
        match unsafe { exchange(response) } {
            Some(ex) => ex.finish(),
            None => abi::M0_ERR_INVALID,
        }
    })
}

unsafe extern "C" fn host_response_send(
    response: *mut abi::M0Response,
    status: u16,
    headers: *const abi::M0Header,
    header_count: usize,
    body: *const u8,
    body_len: usize,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes the handle of its current call.
        let Some(ex) = (unsafe { exchange(response) }) else {
            return abi::M0_ERR_INVALID;
        };
        // SAFETY: the plugin passes valid headers and `body_len` bytes.
        let (Some(pairs), Some(body)) = (unsafe { header_pairs(headers, header_count) }, unsafe {
            bytes(body, body_len)
        }) else {
            return abi::M0_ERR_INVALID;
        };
        let code = ex.start(status, pairs, body.len() as i64);
        if code != abi::M0_OK {
            return code;
        }
        let code = ex.write(body);
        if code != abi::M0_OK {
            return code;
        }
        ex.finish()
    })
}

unsafe extern "C" fn host_body_read(
    request: *const abi::M0Request,
    buf: *mut u8,
    len: usize,
) -> isize {
    boundary(abi::M0_ERR_INTERNAL as isize, || {
        if request.is_null() || (buf.is_null() && len > 0) {
            return abi::M0_ERR_INVALID as isize;
        }
        // SAFETY: the request is the one handed to the current call; its
        // host_data is that call's Exchange.
        let Some(ex) = (unsafe { exchange((*request).host_data.cast()) }) else {
            return abi::M0_ERR_INVALID as isize;
        };
        if len == 0 {
            return 0;
        }
        // SAFETY: the plugin passes `len` writable bytes at `buf`.
        let out = unsafe { std::slice::from_raw_parts_mut(buf, len) };
        ex.read_body(out) as isize
    })
}

unsafe extern "C" fn host_now_ns() -> u64 {
    boundary(0, monotonic_ns)
}

unsafe extern "C" fn host_counter_add(counter: u32, value: u64) {
    match counter {
        abi::M0_COUNTER_LOCK_WAIT_NS => LOCK_WAIT_NS.fetch_add(value, Ordering::Relaxed),
        abi::M0_COUNTER_LOCK_WAITS => LOCK_WAITS.fetch_add(value, Ordering::Relaxed),
        _ => 0,
    };
}

/// The facts this process's plugin stated (`M0Host::fact`), in the order
/// first stated. The doctor's probe prints them after init.
static FACTS: std::sync::Mutex<Vec<(String, String)>> = std::sync::Mutex::new(Vec::new());

/// The facts stated so far.
pub fn facts() -> Vec<(String, String)> {
    FACTS.lock().unwrap_or_else(|e| e.into_inner()).clone()
}

/// A dotted lowercase name, as `M0Host::fact` documents: parts of `a-z`,
/// `0-9` and `_` joined by single dots, beginning with a letter, at most 64
/// bytes. It then needs no escaping in the probe's `key=value` lines.
fn is_fact_key(key: &[u8]) -> bool {
    key.len() <= 64
        && key.first().is_some_and(u8::is_ascii_lowercase)
        && key.split(|&b| b == b'.').all(|part| {
            !part.is_empty()
                && part
                    .iter()
                    .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_')
        })
}

unsafe extern "C" fn host_fact(
    key: *const u8,
    key_len: usize,
    value: *const u8,
    value_len: usize,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes `key_len` and `value_len` readable bytes.
        let (Some(key), Some(value)) = (unsafe { bytes(key, key_len) }, unsafe {
            bytes(value, value_len)
        }) else {
            return abi::M0_ERR_INVALID;
        };
        if !is_fact_key(key) {
            return abi::M0_ERR_INVALID;
        }
        let key = String::from_utf8_lossy(key).into_owned();
        let value = String::from_utf8_lossy(value).into_owned();
        let mut facts = FACTS.lock().unwrap_or_else(|e| e.into_inner());
        match facts.iter_mut().find(|(k, _)| *k == key) {
            Some(fact) => fact.1 = value,
            None => facts.push((key, value)),
        }
        abi::M0_OK
    })
}

unsafe extern "C" fn host_model_register(name: *const u8, len: usize) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes `len` readable bytes.
        let Some(name) = (unsafe { bytes(name, len) }) else {
            return abi::M0_ERR_INVALID;
        };
        match models::register(name) {
            Some(id) => id as i32,
            None => {
                crate::log::warn(format_args!(
                    "the plugin's model name {:?} is refused (M0_ERR_INVALID): a name is 1 to {} \
                     bytes of visible ASCII without '\"' or '\\', and a process serves at most {} \
                     models",
                    String::from_utf8_lossy(name),
                    abi::M0_MODEL_NAME_MAX,
                    abi::M0_MODELS_MAX
                ));
                abi::M0_ERR_INVALID
            }
        }
    })
}

unsafe extern "C" fn host_request_model(request: *const abi::M0Request, model: u32) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        if request.is_null() {
            return abi::M0_ERR_INVALID;
        }
        // SAFETY: the request is the one handed to the current call; its
        // host_data is that call's Exchange.
        let Some(ex) = (unsafe { exchange((*request).host_data.cast()) }) else {
            return abi::M0_ERR_INVALID;
        };
        if !ex.admitting {
            return abi::M0_ERR_STATE;
        }
        if !models::is_registered(model) {
            return abi::M0_ERR_INVALID;
        }
        ex.model = model;
        abi::M0_OK
    })
}

unsafe extern "C" fn host_model_in_flight(model: u32) -> u64 {
    boundary(0, || models::in_flight(model))
}

unsafe extern "C" fn host_metric_define(
    kind: u32,
    name: *const u8,
    name_len: usize,
    help: *const u8,
    help_len: usize,
    bounds: *const f64,
    bound_count: usize,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        // SAFETY: the plugin passes `name_len` and `help_len` readable bytes.
        let (Some(name), Some(help)) = (unsafe { bytes(name, name_len) }, unsafe {
            bytes(help, help_len)
        }) else {
            return abi::M0_ERR_INVALID;
        };
        let bounds: &[f64] = if kind != abi::M0_METRIC_HISTOGRAM || bound_count == 0 {
            &[]
        } else if bounds.is_null() || bound_count > abi::M0_METRIC_BOUNDS_MAX {
            return abi::M0_ERR_INVALID;
        } else {
            // SAFETY: non-null with `bound_count` (at most 16) f64s, per the
            // plugin's side of the contract.
            unsafe { std::slice::from_raw_parts(bounds, bound_count) }
        };
        match plugin_metrics::check(kind, name, help, bounds).and_then(plugin_metrics::define) {
            Ok(id) => id as i32,
            Err(why) => {
                crate::log::warn(format_args!(
                    "the plugin's metric {:?} is refused (M0_ERR_INVALID): {why}",
                    String::from_utf8_lossy(name)
                ));
                abi::M0_ERR_INVALID
            }
        }
    })
}

unsafe extern "C" fn host_metric_record(
    metric: u32,
    labels: *const abi::M0Header,
    label_count: usize,
    value: f64,
) -> i32 {
    boundary(abi::M0_ERR_INTERNAL, || {
        if label_count > abi::M0_METRIC_LABELS_MAX {
            return abi::M0_ERR_INVALID;
        }
        // SAFETY: the plugin passes `label_count` valid pairs.
        let Some(labels) = (unsafe { header_pairs(labels, label_count) }) else {
            return abi::M0_ERR_INVALID;
        };
        plugin_metrics::record(metric, labels, value)
    })
}

/// CLOCK_MONOTONIC in nanoseconds.
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec we own.
    if unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) } != 0 {
        return 0;
    }
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}
