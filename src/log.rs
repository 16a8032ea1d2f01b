//! Server log lines on stderr, one `write` per line so lines from threads
//! and processes never interleave. Prefixed with the role and pid.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU32, Ordering};

use m0serve_abi::{M0_LOG_DEBUG, M0_LOG_ERROR, M0_LOG_INFO, M0_LOG_WARN};

/// The most verbose level written (`--log-level`), an `M0_LOG_*` value;
/// set once at start, before any worker is forked.
static LEVEL: AtomicU32 = AtomicU32::new(M0_LOG_INFO);

/// Write lines up to `level` (`M0_LOG_ERROR` .. `M0_LOG_DEBUG`).
pub fn set_level(level: u32) {
    LEVEL.store(level, Ordering::Relaxed);
}

fn enabled(level: u32) -> bool {
    level <= LEVEL.load(Ordering::Relaxed)
}

/// Replaced in a forked worker, hence a lock and not a OnceLock.
static ROLE: Mutex<String> = Mutex::new(String::new());

/// Name this process in its log lines ("supervisor", "worker 1").
pub fn set_role(role: String) {
    *ROLE.lock().unwrap_or_else(|e| e.into_inner()) = role;
}

fn line(level: &str, args: Arguments<'_>) {
    let mut text = String::with_capacity(96);
    use std::fmt::Write as _;
    {
        let role = ROLE.lock().unwrap_or_else(|e| e.into_inner());
        let role = if role.is_empty() {
            "m0serve"
        } else {
            role.as_str()
        };
        let _ = write!(text, "m0serve[{}] {role}: ", std::process::id());
    }
    if !level.is_empty() {
        text.push_str(level);
        text.push_str(": ");
    }
    let _ = text.write_fmt(args);
    text.push('\n');
    let _ = std::io::stderr().lock().write_all(text.as_bytes());
}

pub fn info(args: Arguments<'_>) {
    if enabled(M0_LOG_INFO) {
        line("", args);
    }
}

/// The server's tuning detail (pool sizes, hand-offs, per-worker
/// statistics): for whoever tunes it, not for every run.
pub fn debug(args: Arguments<'_>) {
    if enabled(M0_LOG_DEBUG) {
        line("debug", args);
    }
}

pub fn warn(args: Arguments<'_>) {
    if enabled(M0_LOG_WARN) {
        line("warning", args);
    }
}

pub fn error(args: Arguments<'_>) {
    line("error", args);
}

/// A line from a plugin, through the host table.
pub fn plugin(level: u32, message: &str) {
    if level != M0_LOG_ERROR && !enabled(level.clamp(M0_LOG_ERROR, M0_LOG_DEBUG)) {
        return;
    }
    let tag = match level {
        M0_LOG_ERROR => "plugin error",
        M0_LOG_WARN => "plugin warning",
        M0_LOG_DEBUG => "plugin debug",
        _ => "plugin",
    };
    line(tag, format_args!("{}", message.trim_end_matches('\n')));
}
