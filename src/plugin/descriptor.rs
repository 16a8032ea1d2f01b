//! A plugin's declaration, copied out of its static `M0PluginInfo` and read
//! with "undeclared means the safest choice".

use m0serve_abi as abi;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallModel {
    Pinned,
    Serialized,
    Reentrant,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProcessLock {
    /// Held for the whole call (a GIL): calls never overlap.
    Held,
    /// Exists but released while waiting or computing natively.
    Released,
    None,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Descriptor {
    pub name: String,
    pub version: String,
    pub abi_major: u32,
    pub abi_minor: u32,
    pub call_model: CallModel,
    /// 0: no limit.
    pub max_concurrency: u32,
    pub process_lock: ProcessLock,
    pub needs_exec: bool,
    pub compute_threads: u32,
    pub batch: bool,
    /// 0: no limit.
    pub max_batch: u32,
    /// 0: no limit (and what a plugin before 1.3 declares).
    pub max_batch_bytes: u32,
    pub reports_lock_wait: bool,
    /// Declares `M0_CAP_INLINE`: its handler never blocks.
    pub inline: bool,
    /// Declares `M0_CAP_ADMIT` (1.5): each request is admitted or refused
    /// by the plugin on the event loop before it is queued.
    pub admit: bool,
}

impl Descriptor {
    /// Read a descriptor the caller has checked for size and version.
    pub fn from_info(info: &abi::M0PluginInfo) -> Descriptor {
        Descriptor {
            name: c_text(info.name, "(unnamed)"),
            version: c_text(info.version, "(no version)"),
            abi_major: info.abi_major,
            abi_minor: info.abi_minor,
            call_model: match info.call_model {
                abi::M0_CALL_REENTRANT => CallModel::Reentrant,
                abi::M0_CALL_SERIALIZED => CallModel::Serialized,
                _ => CallModel::Pinned,
            },
            max_concurrency: info.max_concurrency,
            process_lock: match info.process_lock {
                abi::M0_LOCK_NONE => ProcessLock::None,
                abi::M0_LOCK_RELEASED => ProcessLock::Released,
                _ => ProcessLock::Held,
            },
            needs_exec: info.start != abi::M0_START_FORK_SAFE,
            compute_threads: info.compute_threads.max(1),
            batch: info.caps & abi::M0_CAP_BATCH != 0,
            max_batch: info.max_batch,
            // Zero when the plugin's struct ends before it (see
            // `loader::copy_declared`).
            max_batch_bytes: info.max_batch_bytes,
            reports_lock_wait: info.caps & abi::M0_CAP_REPORTS_LOCK_WAIT != 0,
            inline: info.caps & abi::M0_CAP_INLINE != 0,
            // 1.4 and older defined no such bit: a plugin built for them
            // that sets it means nothing by it.
            admit: info.caps & abi::M0_CAP_ADMIT != 0 && info.abi_minor >= 5,
        }
    }

    /// Most calls that may be in flight at once in one worker.
    pub fn concurrency_cap(&self) -> u32 {
        match self.call_model {
            CallModel::Pinned | CallModel::Serialized => 1,
            CallModel::Reentrant if self.max_concurrency > 0 => self.max_concurrency,
            CallModel::Reentrant => u32::MAX,
        }
    }

    /// Whether the event loop calls the plugin itself, and why (or why not).
    /// Only a reentrant plugin with no cap may: an inline call is one more
    /// caller beside the handler threads, and the pool is sized to the cap.
    pub fn inline_calls(&self) -> (bool, &'static str) {
        match (self.inline, self.call_model, self.max_concurrency) {
            (false, _, _) => (false, "the plugin does not declare M0_CAP_INLINE"),
            // 1.0 defined no such bit, so a 1.0 plugin that sets it means
            // nothing by it, and cannot see M0_REQ_ON_LOOP or answer with
            // M0_DEFER when a call would block.
            (true, _, _) if self.abi_minor < 1 => (
                false,
                "M0_CAP_INLINE ignored: the plugin is built for ABI 1.0, before it",
            ),
            (true, CallModel::Reentrant, 0) => (true, "the plugin declares it never blocks"),
            (true, CallModel::Reentrant, _) => (
                false,
                "M0_CAP_INLINE ignored: the plugin caps its concurrency",
            ),
            (true, _, _) => (false, "M0_CAP_INLINE ignored: the plugin is not reentrant"),
        }
    }

    pub fn call_model_name(&self) -> &'static str {
        match self.call_model {
            CallModel::Pinned => "pinned",
            CallModel::Serialized => "serialized",
            CallModel::Reentrant => "reentrant",
        }
    }

    pub fn process_lock_name(&self) -> &'static str {
        match self.process_lock {
            ProcessLock::Held => "held",
            ProcessLock::Released => "released",
            ProcessLock::None => "none",
        }
    }
}

fn c_text(p: *const core::ffi::c_char, fallback: &str) -> String {
    if p.is_null() {
        return fallback.to_string();
    }
    // SAFETY: the ABI says name and version are static NUL-terminated strings.
    unsafe { std::ffi::CStr::from_ptr(p) }
        .to_string_lossy()
        .into_owned()
}

impl Descriptor {
    /// `key=value` lines, the probe child's report (see `probe.rs`).
    pub fn to_lines(&self) -> String {
        format!(
            "name={}\nversion={}\nabi_major={}\nabi_minor={}\ncall_model={}\nmax_concurrency={}\nprocess_lock={}\n\
             needs_exec={}\ncompute_threads={}\nbatch={}\nmax_batch={}\nmax_batch_bytes={}\nreports_lock_wait={}\ninline={}\nadmit={}\n",
            self.name.replace('\n', " "),
            self.version.replace('\n', " "),
            self.abi_major,
            self.abi_minor,
            self.call_model_name(),
            self.max_concurrency,
            self.process_lock_name(),
            u8::from(self.needs_exec),
            self.compute_threads,
            u8::from(self.batch),
            self.max_batch,
            self.max_batch_bytes,
            u8::from(self.reports_lock_wait),
            u8::from(self.inline),
            u8::from(self.admit),
        )
    }

    pub fn from_lines(text: &str) -> Option<Descriptor> {
        let get = |key: &str| {
            text.lines().find_map(|l| {
                l.strip_prefix(key)
                    .and_then(|r| r.strip_prefix('='))
                    .map(str::to_string)
            })
        };
        let num = |key: &str| get(key).and_then(|v| v.parse::<u32>().ok());
        Some(Descriptor {
            name: get("name")?,
            version: get("version")?,
            abi_major: num("abi_major")?,
            abi_minor: num("abi_minor")?,
            call_model: match get("call_model")?.as_str() {
                "reentrant" => CallModel::Reentrant,
                "serialized" => CallModel::Serialized,
                _ => CallModel::Pinned,
            },
            max_concurrency: num("max_concurrency")?,
            process_lock: match get("process_lock")?.as_str() {
                "none" => ProcessLock::None,
                "released" => ProcessLock::Released,
                _ => ProcessLock::Held,
            },
            needs_exec: num("needs_exec")? != 0,
            compute_threads: num("compute_threads")?,
            batch: num("batch")? != 0,
            max_batch: num("max_batch")?,
            max_batch_bytes: num("max_batch_bytes")?,
            reports_lock_wait: num("reports_lock_wait")? != 0,
            inline: num("inline")? != 0,
            // A probe of an older m0serve wrote no such line.
            admit: num("admit").is_some_and(|n| n != 0),
        })
    }
}
