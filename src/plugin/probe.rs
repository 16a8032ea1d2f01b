//! Reading a plugin's descriptor without loading it into this process.
//!
//! The supervisor must never load application code, and the doctor must
//! survive a plugin that crashes or hangs when opened. Both run this binary
//! again as a throwaway child (`M0_PROBE_PLUGIN=path`), which opens the
//! plugin, prints its descriptor as `key=value` lines and exits.

use std::io::Read;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use super::descriptor::Descriptor;
use super::loader::{EXIT_STARTUP, Plugin, PluginError};

pub const PROBE_ENV: &str = "M0_PROBE_PLUGIN";

/// In the probe child: report and exit.
pub fn run_child(path: &Path) -> ! {
    let code = match Plugin::open(path) {
        Ok(plugin) => {
            print!("{}", plugin.descriptor.to_lines());
            0
        }
        Err(e) => {
            println!("error={}", e.message.replace('\n', " "));
            e.exit_code
        }
    };
    crate::worker::exit_now(code)
}

/// Probe `path` in a child, waiting at most `timeout`.
pub fn probe(path: &Path, timeout: Duration) -> Result<Descriptor, PluginError> {
    let exe = std::env::current_exe().map_err(|e| PluginError {
        exit_code: EXIT_STARTUP,
        message: format!("cannot find this binary: {e}"),
    })?;
    let mut child = Command::new(exe)
        .env(PROBE_ENV, path)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .map_err(|e| PluginError {
            exit_code: EXIT_STARTUP,
            message: format!("cannot start the plugin probe: {e}"),
        })?;
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(2)),
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(PluginError {
                    exit_code: EXIT_STARTUP,
                    message: format!(
                        "plugin {} did not finish loading within {} s (probed in a child process)",
                        path.display(),
                        timeout.as_secs()
                    ),
                });
            }
        }
    };
    let mut text = String::new();
    if let Some(mut out) = child.stdout.take() {
        let _ = out.read_to_string(&mut text);
    }
    if let Some(message) = text.lines().find_map(|l| l.strip_prefix("error=")) {
        return Err(PluginError {
            exit_code: status.code().unwrap_or(EXIT_STARTUP),
            message: message.to_string(),
        });
    }
    if let Some(d) = status
        .success()
        .then(|| Descriptor::from_lines(&text))
        .flatten()
    {
        return Ok(d);
    }
    let how = match (
        status.code(),
        std::os::unix::process::ExitStatusExt::signal(&status),
    ) {
        (_, Some(sig)) => format!("was killed by signal {sig}"),
        (Some(code), _) => format!("exited with status {code}"),
        _ => "ended abnormally".to_string(),
    };
    Err(PluginError {
        exit_code: EXIT_STARTUP,
        message: format!(
            "plugin {} crashed while loading: the probe process {how}",
            path.display()
        ),
    })
}
