//! What a plugin declares about itself: the static descriptor the host
//! reads before it starts the plugin (and `m0serve --doctor` reports).

use core::ffi::CStr;

use m0serve_abi as abi;

/// How the host may call the plugin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CallModel {
    /// Every call on one and the same host thread.
    Pinned,
    /// One call at a time, from any handler thread.
    Serialized,
    /// Any number of concurrent calls from any handler threads.
    Reentrant,
}

/// Whether a process-wide lock (an interpreter's GIL) limits the calls.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProcessLock {
    /// Held for the whole call.
    Held,
    /// Exists, but calls release it while they wait or compute natively.
    Released,
    /// No process-wide lock.
    None,
}

/// Where the plugin may be started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// In a forked copy of the supervisor.
    ForkSafe,
    /// Only in a freshly exec'd process (a runtime that does not survive
    /// `fork()`).
    NeedsExec,
}

/// The descriptor: name and version, and how the plugin may be called.
/// Built with `const` methods, so it is the plugin's
/// [`Plugin::DESCRIPTION`](crate::Plugin::DESCRIPTION) constant:
///
/// ```
/// use m0serve_plugin::{CallModel, Description};
/// const D: Description = Description::new(c"demo", c"1.0.0")
///     .call_model(CallModel::Reentrant)
///     .inline();
/// ```
#[derive(Clone, Copy, Debug)]
pub struct Description {
    pub(crate) name: &'static CStr,
    pub(crate) version: &'static CStr,
    pub(crate) call_model: CallModel,
    pub(crate) lock: ProcessLock,
    pub(crate) start: Start,
    pub(crate) max_concurrency: u32,
    pub(crate) compute_threads: u32,
    pub(crate) caps: u32,
    pub(crate) max_batch: u32,
    pub(crate) max_batch_bytes: u32,
    pub(crate) several_args: bool,
}

impl Description {
    /// A plugin that the host may call from any handler thread at once,
    /// holds no process-wide lock, may start after `fork()`, computes on
    /// the calling thread and declares no capabilities.
    pub const fn new(name: &'static CStr, version: &'static CStr) -> Description {
        Description {
            name,
            version,
            call_model: CallModel::Reentrant,
            lock: ProcessLock::None,
            start: Start::ForkSafe,
            max_concurrency: 0,
            compute_threads: 1,
            caps: 0,
            max_batch: 0,
            max_batch_bytes: 0,
            several_args: false,
        }
    }

    pub const fn call_model(mut self, model: CallModel) -> Description {
        self.call_model = model;
        self
    }

    pub const fn process_lock(mut self, lock: ProcessLock) -> Description {
        self.lock = lock;
        self
    }

    pub const fn start(mut self, start: Start) -> Description {
        self.start = start;
        self
    }

    /// The most calls in flight at once in one worker (0: no limit).
    pub const fn max_concurrency(mut self, n: u32) -> Description {
        self.max_concurrency = n;
        self
    }

    /// Threads one call computes with itself (a BLAS pool); the host sizes
    /// its pool by usable CPUs divided by this.
    pub const fn compute_threads(mut self, n: u32) -> Description {
        self.compute_threads = n;
        self
    }

    /// `handle` never blocks, so the host may call it on its event loop
    /// (`M0_CAP_INLINE`); a request that would block returns
    /// [`Error::DEFER`](crate::Error::DEFER) when
    /// [`Request::on_loop`](crate::Request::on_loop) says so.
    pub const fn inline(mut self) -> Description {
        self.caps |= abi::M0_CAP_INLINE;
        self
    }

    /// The plugin reports its lock waits with
    /// [`Host::lock_waited`](crate::Host::lock_waited)
    /// (`M0_CAP_REPORTS_LOCK_WAIT`).
    pub const fn reports_lock_wait(mut self) -> Description {
        self.caps |= abi::M0_CAP_REPORTS_LOCK_WAIT;
        self
    }

    /// The host may hand [`Plugin::handle_batch`](crate::Plugin::handle_batch)
    /// up to `max` requests at once (`M0_CAP_BATCH`).
    pub const fn batch(mut self, max: u32) -> Description {
        self.caps |= abi::M0_CAP_BATCH;
        self.max_batch = max;
        self
    }

    /// With [`batch`](Self::batch): the most body bytes one batch holds,
    /// summed over its requests (they stand for the work a request costs,
    /// such as an embedding model's tokens); a request larger on its own is
    /// still served, alone. Needs a host of ABI 1.3 or later.
    pub const fn batch_bytes(mut self, max: u32) -> Description {
        self.max_batch_bytes = max;
        self
    }

    /// The host asks [`Plugin::admit`](crate::Plugin::admit) about every
    /// request before it queues it (`M0_CAP_ADMIT`). Needs a host of ABI
    /// 1.5 or later.
    pub const fn admits(mut self) -> Description {
        self.caps |= abi::M0_CAP_ADMIT;
        self
    }

    /// The plugin takes several ARGs ([`InitArgs::args`](crate::InitArgs::args),
    /// such as several model folders). Needs a host of ABI 1.6 or later:
    /// a host refuses several ARGs for a plugin that declares an older
    /// minor, which would see only the first.
    pub const fn several_args(mut self) -> Description {
        self.several_args = true;
        self
    }

    /// The least ABI minor whose features this description uses: a host
    /// refuses a plugin that declares a newer minor than its own, so an SDK
    /// plugin declares only what it needs and loads on every host that has
    /// it. Host functions added later (`fact`, 1.2) are looked up by the
    /// table's size instead, and do nothing on an older host.
    pub const fn abi_minor(&self) -> u32 {
        if self.several_args {
            // M0InitArgs.args came in 1.6: an older host hands only the
            // first ARG.
            6
        } else if self.caps & abi::M0_CAP_ADMIT != 0 {
            // M0_CAP_ADMIT and M0PluginCalls.admit came in 1.5: an older
            // host would never ask, and queue every request.
            5
        } else if self.max_batch_bytes != 0 {
            // M0PluginInfo.max_batch_bytes came in 1.3: an older host would
            // ignore the limit.
            3
        } else if self.caps & abi::M0_CAP_INLINE != 0 {
            // M0_CAP_INLINE, M0Request.flags and M0_DEFER came in 1.1.
            1
        } else {
            0
        }
    }

    /// The ABI descriptor, for the `export!` macro's static.
    pub const fn to_info(&self) -> abi::M0PluginInfo {
        abi::M0PluginInfo {
            size: size_of::<abi::M0PluginInfo>() as u32,
            abi_major: abi::M0_ABI_MAJOR,
            abi_minor: self.abi_minor(),
            call_model: match self.call_model {
                CallModel::Pinned => abi::M0_CALL_PINNED,
                CallModel::Serialized => abi::M0_CALL_SERIALIZED,
                CallModel::Reentrant => abi::M0_CALL_REENTRANT,
            },
            name: self.name.as_ptr(),
            version: self.version.as_ptr(),
            max_concurrency: self.max_concurrency,
            process_lock: match self.lock {
                ProcessLock::Held => abi::M0_LOCK_HELD,
                ProcessLock::Released => abi::M0_LOCK_RELEASED,
                ProcessLock::None => abi::M0_LOCK_NONE,
            },
            start: match self.start {
                Start::ForkSafe => abi::M0_START_FORK_SAFE,
                Start::NeedsExec => abi::M0_START_NEEDS_EXEC,
            },
            compute_threads: self.compute_threads,
            caps: self.caps,
            max_batch: self.max_batch,
            max_batch_bytes: self.max_batch_bytes,
        }
    }

    /// The name, for log lines.
    pub fn name(&self) -> &'static str {
        self.name.to_str().unwrap_or("plugin")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_descriptor_declares_the_least_minor_it_needs() {
        let plain = Description::new(c"p", c"1").to_info();
        assert_eq!((plain.abi_major, plain.abi_minor), (abi::M0_ABI_MAJOR, 0));
        assert_eq!(plain.call_model, abi::M0_CALL_REENTRANT);
        assert_eq!(plain.process_lock, abi::M0_LOCK_NONE);
        assert_eq!(plain.start, abi::M0_START_FORK_SAFE);
        let inline = Description::new(c"p", c"1").inline().batch(8).to_info();
        assert_eq!(inline.abi_minor, 1);
        assert_eq!(inline.caps, abi::M0_CAP_INLINE | abi::M0_CAP_BATCH);
        assert_eq!(inline.max_batch, 8);
        let sized = Description::new(c"p", c"1").batch(8).batch_bytes(4096);
        assert_eq!(
            (sized.to_info().abi_minor, sized.to_info().max_batch_bytes),
            (3, 4096)
        );
        let admits = Description::new(c"p", c"1")
            .batch(8)
            .batch_bytes(4096)
            .admits();
        assert_eq!(
            (admits.to_info().abi_minor, admits.to_info().caps),
            (5, abi::M0_CAP_BATCH | abi::M0_CAP_ADMIT)
        );
        let several = admits.several_args().to_info();
        assert_eq!(several.abi_minor, 6);
        let held = Description::new(c"p", c"1")
            .call_model(CallModel::Pinned)
            .process_lock(ProcessLock::Held)
            .start(Start::NeedsExec)
            .compute_threads(4)
            .max_concurrency(2)
            .to_info();
        assert_eq!(
            (
                held.call_model,
                held.process_lock,
                held.start,
                held.compute_threads,
                held.max_concurrency
            ),
            (
                abi::M0_CALL_PINNED,
                abi::M0_LOCK_HELD,
                abi::M0_START_NEEDS_EXEC,
                4,
                2
            )
        );
    }
}
