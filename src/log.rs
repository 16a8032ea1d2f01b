//! Server log lines on stderr, one `write` per line so lines from threads
//! and processes never interleave. Prefixed with the role and pid.

use std::fmt::Arguments;
use std::io::Write;
use std::sync::Mutex;

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
    line("", args);
}

pub fn warn(args: Arguments<'_>) {
    line("warning", args);
}

pub fn error(args: Arguments<'_>) {
    line("error", args);
}

/// A line from a plugin, through the host table.
pub fn plugin(level: u32, message: &str) {
    let tag = match level {
        m0serve_abi::M0_LOG_ERROR => "plugin error",
        m0serve_abi::M0_LOG_WARN => "plugin warning",
        m0serve_abi::M0_LOG_DEBUG => "plugin debug",
        _ => "plugin",
    };
    line(tag, format_args!("{}", message.trim_end_matches('\n')));
}
