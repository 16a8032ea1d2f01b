//! The host function table, copied once at init.

use std::sync::OnceLock;

use m0serve_abi::{
    HOST_FACT_END, M0_COUNTER_LOCK_WAIT_NS, M0_COUNTER_LOCK_WAITS, M0_LOG_DEBUG, M0_LOG_ERROR,
    M0_LOG_INFO, M0_LOG_WARN, M0Header, M0Host, M0Request, M0Response, MIN_HOST_SIZE, covers,
};

/// The host functions this plugin uses. Copied out of the `M0Host` table so
/// that no call depends on the host's struct layout after init.
pub struct Host {
    log: unsafe extern "C" fn(u32, *const u8, usize),
    response_start: unsafe extern "C" fn(*mut M0Response, u16, *const M0Header, usize, i64) -> i32,
    response_write: unsafe extern "C" fn(*mut M0Response, *const u8, usize) -> i32,
    response_finish: unsafe extern "C" fn(*mut M0Response) -> i32,
    response_send:
        unsafe extern "C" fn(*mut M0Response, u16, *const M0Header, usize, *const u8, usize) -> i32,
    body_read: unsafe extern "C" fn(*const M0Request, *mut u8, usize) -> isize,
    now_ns: unsafe extern "C" fn() -> u64,
    counter_add: unsafe extern "C" fn(u32, u64),
    /// 1.2; `None` from an older host, whose table ends before it.
    fact: Option<unsafe extern "C" fn(*const u8, usize, *const u8, usize) -> i32>,
}

static HOST: OnceLock<Host> = OnceLock::new();

impl Host {
    /// Copies the table. Fails when the host's table is too short.
    ///
    /// # Safety
    /// `host` must point to a valid `M0Host` whose `size` tells the truth.
    pub unsafe fn install(host: *const M0Host) -> Result<&'static Host, String> {
        // SAFETY: the caller's contract is `read`'s.
        let table = unsafe { Host::read(host) }?;
        Ok(HOST.get_or_init(|| table))
    }

    /// The functions of the table at `host`, as many as its `size` says
    /// it has.
    ///
    /// # Safety
    /// As for `install`.
    unsafe fn read(host: *const M0Host) -> Result<Host, String> {
        if host.is_null() {
            return Err("wsgi: the host passed no function table".into());
        }
        // SAFETY: non-null, and the caller guarantees that `size` bytes of
        // M0Host are readable there; `size` is the first field of every
        // version.
        let size = unsafe { (*host).size };
        if size < MIN_HOST_SIZE {
            return Err(format!(
                "wsgi: the host's function table is {size} bytes, this plugin needs {MIN_HOST_SIZE}"
            ));
        }
        // The table is read field by field through the pointer, never as a
        // whole `&M0Host`: an older host's table is shorter than ours.
        // SAFETY: the size check covers every 1.0 field.
        let major = unsafe { (*host).abi_major };
        if major != m0serve_abi::M0_ABI_MAJOR {
            return Err(format!(
                "wsgi: host ABI major {major} differs from the plugin's {}",
                m0serve_abi::M0_ABI_MAJOR
            ));
        }
        // SAFETY: as above, every field read here is a 1.0 function.
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
                // SAFETY: read only when `size` says the host's table has it.
                fact: covers(size, HOST_FACT_END).then(|| (*host).fact),
            }
        })
    }

    /// The installed table. Only called after a successful init.
    pub fn get() -> &'static Host {
        HOST.get()
            .expect("m0_plugin_init installs the host table first")
    }

    /// The installed table, if init got that far.
    pub fn try_get() -> Option<&'static Host> {
        HOST.get()
    }

    pub fn log(&self, level: u32, message: &str) {
        // SAFETY: `log` is a host function valid for the life of the process;
        // the pointer and length describe `message`, alive for the call.
        unsafe { (self.log)(level, message.as_ptr(), message.len()) }
    }

    pub fn error(&self, message: &str) {
        self.log(M0_LOG_ERROR, message)
    }

    pub fn warn(&self, message: &str) {
        self.log(M0_LOG_WARN, message)
    }

    pub fn info(&self, message: &str) {
        self.log(M0_LOG_INFO, message)
    }

    pub fn debug(&self, message: &str) {
        self.log(M0_LOG_DEBUG, message)
    }

    /// States a fact for the host's `--doctor` and startup checks (see
    /// `M0Host::fact`); an older host without `fact` hears nothing. The
    /// caller passes a well-formed key, so the status is not looked at.
    pub fn fact(&self, key: &str, value: &str) {
        if let Some(fact) = self.fact {
            // SAFETY: a host function valid for the life of the process;
            // both pointers describe strings alive for the call.
            unsafe { fact(key.as_ptr(), key.len(), value.as_ptr(), value.len()) };
        }
    }

    pub fn now_ns(&self) -> u64 {
        // SAFETY: host function without arguments, callable from any thread.
        unsafe { (self.now_ns)() }
    }

    /// Reports one wait for the GIL.
    pub fn lock_waited(&self, ns: u64) {
        // SAFETY: host function, callable from any handler thread.
        unsafe {
            (self.counter_add)(M0_COUNTER_LOCK_WAIT_NS, ns);
            (self.counter_add)(M0_COUNTER_LOCK_WAITS, 1);
        }
    }

    /// # Safety
    /// `req` must be the request of the `handle` call in progress.
    pub unsafe fn body_read(&self, req: *const M0Request, buf: &mut [u8]) -> isize {
        // SAFETY: the caller vouches for `req`; `buf` is writable for its length.
        unsafe { (self.body_read)(req, buf.as_mut_ptr(), buf.len()) }
    }

    /// # Safety
    /// `resp` must be the response of the `handle` call in progress.
    pub unsafe fn start(
        &self,
        resp: *mut M0Response,
        status: u16,
        headers: &[M0Header],
        content_length: i64,
    ) -> i32 {
        // SAFETY: the caller vouches for `resp`; `headers` and the bytes they
        // view are alive for the call.
        unsafe {
            (self.response_start)(
                resp,
                status,
                headers.as_ptr(),
                headers.len(),
                content_length,
            )
        }
    }

    /// # Safety
    /// `resp` must be the response of the `handle` call in progress.
    pub unsafe fn write(&self, resp: *mut M0Response, data: &[u8]) -> i32 {
        // SAFETY: the caller vouches for `resp`; `data` is alive for the call.
        unsafe { (self.response_write)(resp, data.as_ptr(), data.len()) }
    }

    /// # Safety
    /// `resp` must be the response of the `handle` call in progress.
    pub unsafe fn finish(&self, resp: *mut M0Response) -> i32 {
        // SAFETY: the caller vouches for `resp`.
        unsafe { (self.response_finish)(resp) }
    }

    /// # Safety
    /// `resp` must be the response of the `handle` call in progress.
    pub unsafe fn send(
        &self,
        resp: *mut M0Response,
        status: u16,
        headers: &[M0Header],
        body: &[u8],
    ) -> i32 {
        // SAFETY: the caller vouches for `resp`; headers and body are alive
        // for the call.
        unsafe {
            (self.response_send)(
                resp,
                status,
                headers.as_ptr(),
                headers.len(),
                body.as_ptr(),
                body.len(),
            )
        }
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
        0
    }

    fn table(size: u32) -> M0Host {
        M0Host {
            size,
            abi_major: m0serve_abi::M0_ABI_MAJOR,
            abi_minor: m0serve_abi::M0_ABI_MINOR,
            log,
            response_start: start,
            response_write: write,
            response_finish: finish,
            response_send: send,
            body_read: read_body,
            now_ns: now,
            counter_add: count,
            fact,
        }
    }

    #[test]
    fn fact_is_used_only_when_the_hosts_size_covers_it() {
        let full = table(size_of::<M0Host>() as u32);
        // SAFETY: a whole, valid table.
        assert!(unsafe { Host::read(&full) }.unwrap().fact.is_some());
        // A host before 1.2 says its table ends at counter_add.
        let older = table(MIN_HOST_SIZE);
        // SAFETY: valid, and longer than it says.
        assert!(unsafe { Host::read(&older) }.unwrap().fact.is_none());
        let short = table(MIN_HOST_SIZE - 8);
        // SAFETY: as above.
        let refused = unsafe { Host::read(&short) }.err().unwrap();
        assert!(
            refused.contains(&format!("this plugin needs {MIN_HOST_SIZE}")),
            "{refused}"
        );
    }
}
