//! `--doctor` for a person and for a program: indented on a terminal, one
//! line on a pipe, the same JSON either way; and a usage error's check
//! names the arguments that are missing.

use std::fs::File;
use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use crate::support::OutputBounded;
use crate::support::{binary, plugin};

fn doctor_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args)
        .arg("--doctor")
        .args(["--port", "0"])
        .env_remove("M0_PLUGIN")
        .env_remove("M0_WORKERS")
        .env_remove("M0_BLOCKING_THREADS");
    cmd
}

/// A new pseudo-terminal: (the master, the terminal a program writes to).
fn pty() -> (File, File) {
    // SAFETY: plain libc calls on a descriptor this function owns; the
    // name is copied out of ptsname_r's buffer before it is dropped.
    unsafe {
        let master = libc::posix_openpt(libc::O_RDWR | libc::O_NOCTTY);
        assert!(
            master >= 0,
            "posix_openpt: {}",
            std::io::Error::last_os_error()
        );
        let master = OwnedFd::from_raw_fd(master);
        use std::os::fd::AsRawFd;
        assert_eq!(libc::grantpt(master.as_raw_fd()), 0);
        assert_eq!(libc::unlockpt(master.as_raw_fd()), 0);
        let mut name = [0 as libc::c_char; 128];
        assert_eq!(
            libc::ptsname_r(master.as_raw_fd(), name.as_mut_ptr(), name.len()),
            0
        );
        let path = std::ffi::CStr::from_ptr(name.as_ptr())
            .to_string_lossy()
            .into_owned();
        let terminal = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .unwrap_or_else(|e| panic!("open {path}: {e}"));
        (File::from(master), terminal)
    }
}

/// What the doctor prints with its standard output on a terminal, and its
/// exit code.
fn on_a_terminal(args: &[&str]) -> (String, Option<i32>) {
    let (mut master, terminal) = pty();
    let mut cmd = doctor_cmd(args);
    cmd.stdout(Stdio::from(terminal)).stderr(Stdio::null());
    let mut child = cmd.spawn().unwrap();
    // The terminal's last copy goes with the command, so the master reads
    // to the end (EIO) once the doctor exits.
    drop(cmd);
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match master.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
    }
    let code = child.wait().unwrap().code();
    // The terminal turns each newline into CR LF.
    (String::from_utf8(out).unwrap().replace("\r\n", "\n"), code)
}

#[test]
fn indented_on_a_terminal_and_one_line_on_a_pipe() {
    let hello = plugin("hello_c");
    let args = ["--plugin", hello.to_str().unwrap()];
    let (shown, code) = on_a_terminal(&args);
    assert_eq!(code, Some(0), "{shown}");
    let piped = doctor_cmd(&args).output_bounded().unwrap();
    assert_eq!(piped.status.code(), Some(0));
    let piped = String::from_utf8(piped.stdout).unwrap();

    assert_eq!(piped.lines().count(), 1, "{piped}");
    assert!(shown.lines().count() > 50, "{shown}");
    assert!(shown.starts_with("{\n  \"m0serve\": "), "{shown}");
    assert!(shown.contains("\n    \"version\": "), "{shown}");
    let shown: serde_json::Value = serde_json::from_str(&shown).unwrap();
    let piped: serde_json::Value = serde_json::from_str(&piped).unwrap();
    // The same report (each run binds its own free port for the check).
    assert_eq!(shown["plugin"], piped["plugin"]);
    assert_eq!(shown["server"], piped["server"]);
    let names = |j: &serde_json::Value| -> Vec<serde_json::Value> {
        j["checks"]
            .as_array()
            .unwrap()
            .iter()
            .map(|c| c["name"].clone())
            .collect()
    };
    assert_eq!(names(&shown), names(&piped));
}

#[test]
fn a_missing_plugin_is_named_in_the_usage_check() {
    for terminal in [false, true] {
        let (text, code) = if terminal {
            on_a_terminal(&[])
        } else {
            let out = doctor_cmd(&[]).output_bounded().unwrap();
            (String::from_utf8(out.stdout).unwrap(), out.status.code())
        };
        assert_eq!(code, Some(2), "{text}");
        let j: serde_json::Value = serde_json::from_str(&text).unwrap();
        let check = &j["checks"][0];
        assert_eq!(check["name"], "usage", "{j:#}");
        let detail = check["detail"].as_str().unwrap();
        assert!(
            detail.contains("were not provided") && detail.contains("--plugin <PLUGIN>"),
            "{detail}"
        );
        let fix = check["fix"].as_str().unwrap();
        assert!(
            fix.contains("--plugin") && fix.contains("M0_PLUGIN") && fix.contains("hello_c"),
            "{fix}"
        );
    }
}
