//! Reading a plugin's descriptor without loading it into this process.
//!
//! The supervisor must never load application code, and the doctor must
//! survive a plugin that crashes or hangs when opened. Both run this binary
//! again as a throwaway child (`M0_PROBE_PLUGIN=path`), which opens the
//! plugin, prints its descriptor as `key=value` lines and exits (a refusal
//! as `error=`, and its fix as `error_fix=`). For the
//! doctor the child also runs the plugin's init with the real arguments
//! (`M0_PROBE_INIT=1`), so an application that fails to import is found
//! without serving anything (a failure as `init_error=CODE<tab>MESSAGE`, and
//! its fix as `init_fix=`; a success as `init=ok` and whether the calls
//! table has `handle_batch` as `handle_batch=0|1`), and prints the facts the plugin stated
//! (`M0Host::fact`) as `fact.KEY=VALUE` lines, which no other key begins
//! with.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::descriptor::Descriptor;
use super::loader::{Calls, Plugin, PluginError};
use crate::process::{EXIT_OK, EXIT_STARTUP};

pub const PROBE_ENV: &str = "M0_PROBE_PLUGIN";
pub const PROBE_INIT_ENV: &str = "M0_PROBE_INIT";

/// What a probe found.
pub struct Report {
    pub descriptor: Result<Descriptor, PluginError>,
    /// With init: its outcome.
    pub init: Option<Result<(), PluginError>>,
    /// With init: the facts the plugin stated, in the order first stated.
    pub facts: Vec<(String, String)>,
    /// After a successful init: whether the calls table has `handle_batch`.
    pub handle_batch: Option<bool>,
}

/// A fact's value on one line: backslash, newline and carriage return
/// escaped as `\\`, `\n` and `\r`.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            c => out.push(c),
        }
    }
    out
}

fn unescape(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('r') => out.push('\r'),
            Some(other) => out.push(other),
            None => out.push('\\'),
        }
    }
    out
}

/// In the probe child: report and exit. With `M0_PROBE_INIT` set, `init`
/// runs the plugin's init; the caller builds its arguments, since they need
/// the command line and the worker's pool plan, which the plugin layer does
/// not know.
pub fn run_child(path: &Path, init: impl FnOnce(&Plugin) -> Result<Calls, PluginError>) -> ! {
    let plugin = match Plugin::open(path) {
        Ok(plugin) => plugin,
        Err(e) => {
            println!("error={}", e.message.replace('\n', " "));
            if let Some(fix) = &e.fix {
                println!("error_fix={}", fix.replace('\n', " "));
            }
            crate::process::exit_now(e.exit_code)
        }
    };
    print!("{}", plugin.descriptor.to_lines());
    if std::env::var_os(PROBE_INIT_ENV).is_some() {
        match init(&plugin) {
            Ok(calls) => println!(
                "init=ok\nhandle_batch={}",
                u8::from(calls.handle_batch.is_some())
            ),
            Err(e) => {
                // Escaped, not flattened: a traceback keeps its lines.
                println!("init_error={}\t{}", e.exit_code, escape(&e.message));
                if let Some(fix) = &e.fix {
                    println!("init_fix={}", escape(fix));
                }
            }
        }
        for (key, value) in super::host::facts() {
            println!("fact.{key}={}", escape(&value));
        }
    }
    crate::process::exit_now(EXIT_OK)
}

/// Probe `path` in a child, waiting at most `timeout`.
pub fn probe(path: &Path, timeout: Duration) -> Result<Descriptor, PluginError> {
    run_probe(path, timeout, false).descriptor
}

/// Probe and run init with this process's arguments (for the doctor).
pub fn probe_with_init(path: &Path, timeout: Duration) -> Report {
    run_probe(path, timeout, true)
}

fn run_probe(path: &Path, timeout: Duration, with_init: bool) -> Report {
    let fail = |message: String| Report {
        descriptor: Err(PluginError {
            exit_code: EXIT_STARTUP,
            message,
            fix: None,
        }),
        init: None,
        facts: Vec::new(),
        handle_batch: None,
    };
    let exe = match std::env::current_exe() {
        Ok(exe) => exe,
        Err(e) => return fail(format!("cannot find this binary: {e}")),
    };
    let mut cmd = Command::new(exe);
    cmd.env(PROBE_ENV, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    if with_init {
        cmd.env(PROBE_INIT_ENV, "1")
            .args(std::env::args_os().skip(1))
            // What the plugin and the app log during init is not the
            // doctor's report, which is the stdout lines and the facts.
            .stderr(Stdio::null());
    } else {
        cmd.stderr(Stdio::inherit());
    }
    let mut child = match cmd.spawn() {
        Ok(c) => c,
        Err(e) => return fail(format!("cannot start the plugin probe: {e}")),
    };
    let mut stdout = child.stdout.take();
    let stdout_reader = std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(out) = stdout.as_mut() {
            let _ = out.read_to_string(&mut text);
        }
        text
    });
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return fail(format!(
                    "plugin {} did not finish loading within {} s (probed in a child process)",
                    path.display(),
                    timeout.as_secs()
                ));
            }
        }
    };
    let text = stdout_reader.join().unwrap_or_default();
    let line = |key: &str| text.lines().find_map(|l| l.strip_prefix(key));
    if let Some(message) = line("error=") {
        let exit_code = status.code().unwrap_or(EXIT_STARTUP);
        return Report {
            descriptor: Err(PluginError {
                exit_code,
                message: message.to_string(),
                fix: line("error_fix=").map(str::to_string),
            }),
            init: None,
            facts: Vec::new(),
            handle_batch: None,
        };
    }
    let descriptor = Descriptor::from_lines(&text);
    let facts = text
        .lines()
        .filter_map(|l| l.strip_prefix("fact.")?.split_once('='))
        .map(|(key, value)| (key.to_string(), unescape(value)))
        .collect();
    let handle_batch = line("handle_batch=").map(|v| v == "1");
    let init = text.lines().find_map(|l| {
        if l == "init=ok" {
            return Some(Ok(()));
        }
        let (code, message) = l.strip_prefix("init_error=")?.split_once('\t')?;
        Some(Err(PluginError {
            exit_code: code.parse().unwrap_or(EXIT_STARTUP),
            message: unescape(message),
            fix: line("init_fix=").map(unescape),
        }))
    });
    match descriptor {
        Some(d) if status.success() || init.is_some() => Report {
            descriptor: Ok(d),
            init,
            facts,
            handle_batch,
        },
        _ => {
            let how = match (
                status.code(),
                std::os::unix::process::ExitStatusExt::signal(&status),
            ) {
                (_, Some(sig)) => format!("was killed by signal {sig}"),
                (Some(code), _) => format!("exited with status {code}"),
                _ => "ended abnormally".to_string(),
            };
            let stage = if descriptor.is_some() {
                "starting"
            } else {
                "loading"
            };
            let message = format!(
                "plugin {} crashed while {stage}: the probe process {how}",
                path.display()
            );
            match descriptor {
                Some(d) => Report {
                    descriptor: Ok(d),
                    init: Some(Err(PluginError {
                        exit_code: EXIT_STARTUP,
                        message,
                        fix: None,
                    })),
                    facts,
                    handle_batch: None,
                },
                None => Report {
                    descriptor: Err(PluginError {
                        exit_code: EXIT_STARTUP,
                        message,
                        fix: None,
                    }),
                    init: None,
                    facts,
                    handle_batch: None,
                },
            }
        }
    }
}
