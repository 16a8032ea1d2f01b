//! The host's functions: the log, the clock, the counters and facts, and
//! (for the response and body types) the raw calls.

use std::sync::OnceLock;

use m0serve_abi::{
    self as abi, HOST_FACT_END, HOST_METRIC_DEFINE_END, HOST_METRIC_RECORD_END,
    HOST_MODEL_IN_FLIGHT_END, HOST_MODEL_REGISTER_END, HOST_READY_END, HOST_REASON_END,
    HOST_REQUEST_MODEL_END, M0Header, M0Host, M0Request, M0Response, MIN_HOST_SIZE, covers,
};

use crate::Error;

/// The host's function table, copied at init so that no call depends on
/// the host's struct layout afterwards. One per process; every method may
/// be called from any thread.
pub struct Host {
    log: unsafe extern "C" fn(u32, *const u8, usize),
    pub(crate) response_start:
        unsafe extern "C" fn(*mut M0Response, u16, *const M0Header, usize, i64) -> i32,
    pub(crate) response_write: unsafe extern "C" fn(*mut M0Response, *const u8, usize) -> i32,
    pub(crate) response_finish: unsafe extern "C" fn(*mut M0Response) -> i32,
    pub(crate) response_send:
        unsafe extern "C" fn(*mut M0Response, u16, *const M0Header, usize, *const u8, usize) -> i32,
    pub(crate) body_read: unsafe extern "C" fn(*const M0Request, *mut u8, usize) -> isize,
    now_ns: unsafe extern "C" fn() -> u64,
    counter_add: unsafe extern "C" fn(u32, u64),
    /// 1.2; `None` from an older host, whose table ends before it.
    fact: Option<unsafe extern "C" fn(*const u8, usize, *const u8, usize) -> i32>,
    /// 1.4; `None` from an older host.
    pub(crate) response_reason:
        Option<unsafe extern "C" fn(*mut M0Response, *const u8, usize) -> i32>,
    /// 1.4; `None` from an older host.
    set_ready: Option<unsafe extern "C" fn(u32) -> i32>,
    /// 1.6 (models and metrics, `models.rs`); `None` from an older host.
    pub(crate) model_register: Option<unsafe extern "C" fn(*const u8, usize) -> i32>,
    pub(crate) request_model: Option<unsafe extern "C" fn(*const M0Request, u32) -> i32>,
    pub(crate) model_in_flight: Option<unsafe extern "C" fn(u32) -> u64>,
    pub(crate) metric_define: Option<
        unsafe extern "C" fn(u32, *const u8, usize, *const u8, usize, *const f64, usize) -> i32,
    >,
    pub(crate) metric_record: Option<unsafe extern "C" fn(u32, *const M0Header, usize, f64) -> i32>,
    abi_minor: u32,
}

static HOST: OnceLock<Host> = OnceLock::new();

/// The host, once init has begun; `None` before (in a unit test, say).
pub fn host() -> Option<&'static Host> {
    HOST.get()
}

/// Log levels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Level {
    Error,
    Warn,
    Info,
    Debug,
}

impl Host {
    /// Copies the table at `host` (the first call wins; later calls return
    /// the installed table).
    ///
    /// # Safety
    /// `host` is NULL or points to an `M0Host` of at least `size` readable
    /// bytes, whose functions live as long as the process.
    pub(crate) unsafe fn install(host: *const M0Host) -> Result<&'static Host, String> {
        if let Some(installed) = HOST.get() {
            return Ok(installed);
        }
        // SAFETY: the caller's contract is `read`'s.
        let table = unsafe { Host::read(host) }?;
        Ok(HOST.get_or_init(|| table))
    }

    /// # Safety
    /// As for `install`.
    pub(crate) unsafe fn read(host: *const M0Host) -> Result<Host, String> {
        if host.is_null() {
            return Err("the host passed no function table".into());
        }
        // SAFETY: non-null, and `size` is the first field of every version.
        let size = unsafe { (*host).size };
        if size < MIN_HOST_SIZE {
            return Err(format!(
                "the host's function table is {size} bytes; this plugin needs at least \
                 {MIN_HOST_SIZE} (m0serve ABI 1.0): upgrade m0serve"
            ));
        }
        // The table is read field by field through the pointer, never as a
        // whole `&M0Host`: an older host's table is shorter than ours.
        // SAFETY: the size check covers every 1.0 field.
        let (major, minor) = unsafe { ((*host).abi_major, (*host).abi_minor) };
        if major != abi::M0_ABI_MAJOR {
            return Err(format!(
                "the host speaks m0serve ABI {major}.{minor}, this plugin {}.{}: \
                 rebuild the plugin against the host's m0serve.h",
                abi::M0_ABI_MAJOR,
                abi::M0_ABI_MINOR
            ));
        }
        // SAFETY: as above, each field read is a 1.0 function, and each
        // later one is read only when `size` says the table has it.
        Ok(unsafe {
            Host {
                log: (*host).log,
                response_start: (*host).response_start,
                response_write: (*host).response_write,
                response_finish: (*host).response_finish,
                response_send: (*host).response_send,
                body_read: (*host).body_read,
                now_ns: (*host).now_ns,
                counter_add: (*host).counter_add,
                fact: covers(size, HOST_FACT_END).then(|| (*host).fact),
                response_reason: covers(size, HOST_REASON_END).then(|| (*host).response_reason),
                set_ready: covers(size, HOST_READY_END).then(|| (*host).set_ready),
                model_register: covers(size, HOST_MODEL_REGISTER_END)
                    .then(|| (*host).model_register),
                request_model: covers(size, HOST_REQUEST_MODEL_END).then(|| (*host).request_model),
                model_in_flight: covers(size, HOST_MODEL_IN_FLIGHT_END)
                    .then(|| (*host).model_in_flight),
                metric_define: covers(size, HOST_METRIC_DEFINE_END).then(|| (*host).metric_define),
                metric_record: covers(size, HOST_METRIC_RECORD_END).then(|| (*host).metric_record),
                abi_minor: minor,
            }
        })
    }

    /// The minor ABI version the host speaks.
    pub fn abi_minor(&self) -> u32 {
        self.abi_minor
    }

    /// Writes a line to the server log.
    pub fn log(&self, level: Level, message: &str) {
        let level = match level {
            Level::Error => abi::M0_LOG_ERROR,
            Level::Warn => abi::M0_LOG_WARN,
            Level::Info => abi::M0_LOG_INFO,
            Level::Debug => abi::M0_LOG_DEBUG,
        };
        // SAFETY: a host function valid for the life of the process; the
        // pointer and length describe `message`, alive for the call.
        unsafe { (self.log)(level, message.as_ptr(), message.len()) }
    }

    pub fn error(&self, message: &str) {
        self.log(Level::Error, message)
    }

    pub fn warn(&self, message: &str) {
        self.log(Level::Warn, message)
    }

    pub fn info(&self, message: &str) {
        self.log(Level::Info, message)
    }

    pub fn debug(&self, message: &str) {
        self.log(Level::Debug, message)
    }

    /// The host's monotonic clock, in nanoseconds.
    pub fn now_ns(&self) -> u64 {
        // SAFETY: a host function without arguments, callable from any thread.
        unsafe { (self.now_ns)() }
    }

    /// Reports one wait of `ns` nanoseconds for the plugin's process-wide
    /// lock; the adaptive pool sizes itself by these (declare
    /// [`Description::reports_lock_wait`](crate::Description::reports_lock_wait)).
    pub fn lock_waited(&self, ns: u64) {
        // SAFETY: a host function, callable from any thread.
        unsafe {
            (self.counter_add)(abi::M0_COUNTER_LOCK_WAIT_NS, ns);
            (self.counter_add)(abi::M0_COUNTER_LOCK_WAITS, 1);
        }
    }

    /// States a fact about how the plugin runs, for `m0serve --doctor` and
    /// the startup checks: `key` is a dotted lowercase name
    /// (`python.version`). A host older than ABI 1.2 has no facts: then
    /// this does nothing and returns `Ok`.
    pub fn fact(&self, key: &str, value: &str) -> Result<(), Error> {
        let Some(fact) = self.fact else {
            return Ok(());
        };
        // SAFETY: a host function valid for the life of the process; both
        // pointers describe strings alive for the call.
        Error::check(unsafe { fact(key.as_ptr(), key.len(), value.as_ptr(), value.len()) })
    }

    /// Says whether this worker is ready for traffic (a model still
    /// warming up after init: `false`, then `true`): the server's health
    /// path answers 503 meanwhile. `false` from a host older than ABI 1.4,
    /// which has no health path to tell.
    pub fn set_ready(&self, ready: bool) -> bool {
        let Some(set) = self.set_ready else {
            return false;
        };
        // SAFETY: a host function valid for the life of the process.
        unsafe { set(u32::from(ready)) == abi::M0_OK }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    unsafe extern "C" fn log(_: u32, _: *const u8, _: usize) {}
    unsafe extern "C" fn start(
        _: *mut M0Response,
        _: u16,
        _: *const M0Header,
        _: usize,
        _: i64,
    ) -> i32 {
        0
    }
    unsafe extern "C" fn write(_: *mut M0Response, _: *const u8, _: usize) -> i32 {
        0
    }
    unsafe extern "C" fn finish(_: *mut M0Response) -> i32 {
        0
    }
    unsafe extern "C" fn send(
        _: *mut M0Response,
        _: u16,
        _: *const M0Header,
        _: usize,
        _: *const u8,
        _: usize,
    ) -> i32 {
        0
    }
    unsafe extern "C" fn read_body(_: *const M0Request, _: *mut u8, _: usize) -> isize {
        0
    }
    unsafe extern "C" fn now() -> u64 {
        0
    }
    unsafe extern "C" fn count(_: u32, _: u64) {}
    unsafe extern "C" fn fact(_: *const u8, _: usize, _: *const u8, _: usize) -> i32 {
        abi::M0_ERR_INVALID
    }
    unsafe extern "C" fn reason(_: *mut M0Response, _: *const u8, _: usize) -> i32 {
        abi::M0_ERR_INVALID
    }
    unsafe extern "C" fn ready(_: u32) -> i32 {
        abi::M0_OK
    }
    unsafe extern "C" fn register(_: *const u8, len: usize) -> i32 {
        len as i32
    }
    unsafe extern "C" fn request_model(_: *const M0Request, _: u32) -> i32 {
        abi::M0_OK
    }
    unsafe extern "C" fn in_flight(model: u32) -> u64 {
        u64::from(model) + 100
    }
    unsafe extern "C" fn define(
        kind: u32,
        _: *const u8,
        _: usize,
        _: *const u8,
        _: usize,
        _: *const f64,
        count: usize,
    ) -> i32 {
        (kind * 10) as i32 + count as i32
    }
    unsafe extern "C" fn record(_: u32, _: *const M0Header, _: usize, _: f64) -> i32 {
        abi::M0_OK
    }

    fn table(size: u32, major: u32) -> M0Host {
        M0Host {
            size,
            abi_major: major,
            abi_minor: abi::M0_ABI_MINOR,
            log,
            response_start: start,
            response_write: write,
            response_finish: finish,
            response_send: send,
            body_read: read_body,
            now_ns: now,
            counter_add: count,
            fact,
            response_reason: reason,
            set_ready: ready,
            model_register: register,
            request_model,
            model_in_flight: in_flight,
            metric_define: define,
            metric_record: record,
        }
    }

    #[test]
    fn models_and_metrics_are_used_only_when_the_hosts_size_covers_them() {
        let full = table(size_of::<M0Host>() as u32, abi::M0_ABI_MAJOR);
        // SAFETY: a whole, valid table.
        let host = unsafe { Host::read(&full) }.unwrap();
        assert_eq!(host.register_model("abc"), Ok(crate::ModelId(3)));
        assert_eq!(host.model_in_flight(crate::ModelId(2)), 102);
        assert!(host.define_counter("c", "").is_ok());
        assert!(host.define_histogram("h", "", &[1.0, 2.0]).is_ok());
        host.record(host.define_counter("c", "").unwrap(), &[("a", "b")], 1.0);
        // A 1.5 host's table ends at set_ready: nothing past it is called.
        let older = table(HOST_READY_END as u32, abi::M0_ABI_MAJOR);
        // SAFETY: valid, and longer than it says.
        let host = unsafe { Host::read(&older) }.unwrap();
        assert!(host.model_register.is_none() && host.metric_record.is_none());
        assert!(host.register_model("abc").is_err());
        assert_eq!(host.model_in_flight(crate::ModelId(2)), 0);
        assert!(host.define_counter("c", "").is_err());
        assert!(host.define_histogram("h", "", &[1.0]).is_err());
    }

    #[test]
    fn fact_is_used_only_when_the_hosts_size_covers_it() {
        let full = table(size_of::<M0Host>() as u32, abi::M0_ABI_MAJOR);
        // SAFETY: a whole, valid table.
        let host = unsafe { Host::read(&full) }.unwrap();
        assert_eq!(host.fact("a.b", "c"), Err(Error::INVALID));
        // A host before 1.2 says its table ends at counter_add: no call.
        let older = table(MIN_HOST_SIZE, abi::M0_ABI_MAJOR);
        // SAFETY: valid, and longer than it says.
        let host = unsafe { Host::read(&older) }.unwrap();
        assert!(host.fact.is_none());
        assert_eq!(host.fact("a.b", "c"), Ok(()));
    }

    #[test]
    fn a_short_table_or_another_major_is_refused_with_the_fix() {
        let short = table(MIN_HOST_SIZE - 8, abi::M0_ABI_MAJOR);
        // SAFETY: valid, and longer than it says.
        let refused = unsafe { Host::read(&short) }.err().unwrap();
        assert!(
            refused.contains(&format!("needs at least {MIN_HOST_SIZE}"))
                && refused.contains("upgrade m0serve"),
            "{refused}"
        );
        let other = table(size_of::<M0Host>() as u32, abi::M0_ABI_MAJOR + 1);
        // SAFETY: a whole, valid table.
        let refused = unsafe { Host::read(&other) }.err().unwrap();
        assert!(refused.contains("rebuild the plugin"), "{refused}");
        // SAFETY: NULL is handled.
        assert!(unsafe { Host::read(std::ptr::null()) }.is_err());
    }
}
