//! The server's own log on stderr, one `write` per line so lines from
//! threads and processes never interleave.
//!
//! Text lines are laid out as gunicorn lays its out, so whoever reads (or
//! greps, or ships) a gunicorn log reads this one:
//! `[2026-12-05 11:30:00 +0000] [1234] [INFO] supervisor: message`, the
//! time in UTC (no time-zone lookup, which takes a lock in libc), then the
//! pid, the level, and the process's role. `--log-format json` writes one
//! object a line instead, in the access log's style (`line::rfc3339`,
//! `line::json_str`).
//!
//! Lines are written at startup, at exit and on rare events, never per
//! request, and never between a fork and an exec (the supervisor's spawn
//! path calls only async-signal-safe functions there): formatting into a
//! fresh buffer here costs nothing a request would see.

pub mod line;

use std::fmt::Arguments;
use std::io::Write;
use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};

use m0serve_abi::{M0_LOG_DEBUG, M0_LOG_ERROR, M0_LOG_INFO, M0_LOG_WARN};

/// The most verbose level written (`--log-level`), an `M0_LOG_*` value;
/// set once at start, before any worker is forked.
static LEVEL: AtomicU32 = AtomicU32::new(M0_LOG_INFO);

/// `--log-format json`; set once at start, before any worker is forked.
static JSON: AtomicBool = AtomicBool::new(false);

/// Write lines up to `level` (`M0_LOG_ERROR` .. `M0_LOG_DEBUG`).
pub fn set_level(level: u32) {
    LEVEL.store(level, Ordering::Relaxed);
}

/// Write JSON lines (`--log-format json`) instead of text.
pub fn set_json(json: bool) {
    JSON.store(json, Ordering::Relaxed);
}

fn enabled(level: u32) -> bool {
    level <= LEVEL.load(Ordering::Relaxed)
}

/// Replaced in a forked worker, hence a lock and not a OnceLock. The
/// supervisor that forks has no other thread, so the lock is never held
/// across a fork.
static ROLE: Mutex<String> = Mutex::new(String::new());

/// Name this process in its log lines ("supervisor", "worker 1").
pub fn set_role(role: String) {
    *ROLE.lock().unwrap_or_else(|e| e.into_inner()) = role;
}

/// A line's level, as each format names it.
#[derive(Clone, Copy)]
enum Level {
    Debug,
    Info,
    Warning,
    Error,
}

impl Level {
    fn from_abi(level: u32) -> Level {
        match level {
            M0_LOG_ERROR => Level::Error,
            M0_LOG_WARN => Level::Warning,
            M0_LOG_DEBUG => Level::Debug,
            _ => Level::Info,
        }
    }
    /// gunicorn's names.
    fn text(self) -> &'static str {
        match self {
            Level::Debug => "DEBUG",
            Level::Info => "INFO",
            Level::Warning => "WARNING",
            Level::Error => "ERROR",
        }
    }
    fn json(self) -> &'static str {
        match self {
            Level::Debug => "debug",
            Level::Info => "info",
            Level::Warning => "warning",
            Level::Error => "error",
        }
    }
}

/// Where a line comes from: the server itself, or a plugin through the
/// host table.
#[derive(Clone, Copy, PartialEq)]
enum Source {
    Server,
    Plugin,
}

fn write_line(level: Level, source: Source, args: Arguments<'_>) {
    let role = ROLE.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut message = String::with_capacity(96);
    let _ = std::fmt::Write::write_fmt(&mut message, args);
    let message = message.trim_end_matches('\n');
    let (secs, micros) = line::wall_clock();
    let mut out = Vec::with_capacity(message.len() + 80);
    if JSON.load(Ordering::Relaxed) {
        line::json_line(
            &mut out,
            &line::JsonLine {
                secs,
                micros,
                pid: std::process::id(),
                level: level.json(),
                role: &role,
                plugin: source == Source::Plugin,
                message,
            },
        );
    } else {
        out.push(b'[');
        line::text_time(&mut out, secs);
        let _ = write!(out, "] [{}] [{}] ", std::process::id(), level.text());
        if !role.is_empty() {
            out.extend_from_slice(role.as_bytes());
            out.extend_from_slice(b": ");
        }
        if source == Source::Plugin {
            out.extend_from_slice(b"plugin: ");
        }
        out.extend_from_slice(message.as_bytes());
        out.push(b'\n');
    }
    let _ = std::io::stderr().lock().write_all(&out);
}

pub fn info(args: Arguments<'_>) {
    if enabled(M0_LOG_INFO) {
        write_line(Level::Info, Source::Server, args);
    }
}

/// The server's tuning detail (pool sizes, hand-offs, per-worker
/// statistics): for whoever tunes it, not for every run.
pub fn debug(args: Arguments<'_>) {
    if enabled(M0_LOG_DEBUG) {
        write_line(Level::Debug, Source::Server, args);
    }
}

pub fn warn(args: Arguments<'_>) {
    if enabled(M0_LOG_WARN) {
        write_line(Level::Warning, Source::Server, args);
    }
}

pub fn error(args: Arguments<'_>) {
    write_line(Level::Error, Source::Server, args);
}

/// A line from a plugin, through the host table.
pub fn plugin(level: u32, message: &str) {
    if level != M0_LOG_ERROR && !enabled(level.clamp(M0_LOG_ERROR, M0_LOG_DEBUG)) {
        return;
    }
    write_line(
        Level::from_abi(level),
        Source::Plugin,
        format_args!("{message}"),
    );
}
