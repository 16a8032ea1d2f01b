//! The test suite's own scripts, run as `tests/run` runs them:
//! `tests/install-tools` without root names every missing tool and the one
//! command that installs them in one line, and installs nothing;
//! `tests/outlived.py` fails a command that leaves a process running, names
//! it and stops it, and passes the command's own status on otherwise. And
//! the line a test whose tool is missing fails with.

use std::path::Path;
use std::process::{Command, Output};

use crate::support;
use crate::support::OutputBounded;
use crate::support::repo_root;
use crate::support::test_dir::TestDir;
use crate::support::tools::missing_tools_line;

/// A copy of the repository's `tests/install-tools` in `dir/tests`, beside
/// a `tests/system-tools.txt` of `list` (the script reads the list beside
/// itself).
fn install_tools_with(dir: &Path, list: &str) -> std::path::PathBuf {
    let tests = dir.join("tests");
    std::fs::create_dir_all(&tests).unwrap();
    let script = tests.join("install-tools");
    std::fs::copy(repo_root().join("tests/install-tools"), &script).unwrap();
    std::fs::write(tests.join("system-tools.txt"), list).unwrap();
    script
}

/// `script` as a user who is not root: as `nobody` where this test runs as
/// root (as CI does), else as this user.
fn as_user(script: &Path) -> Output {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let mut cmd = if root {
        let mut c = Command::new("setpriv");
        c.args(["--reuid=65534", "--regid=65534", "--clear-groups"])
            .arg(script);
        c
    } else {
        Command::new(script)
    };
    cmd.output_bounded().unwrap()
}

/// A folder under the system's temp dir (which any user may reach, unlike
/// a checkout under /root), removed when the test passes.
struct TempDir(std::path::PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

#[test]
fn install_tools_without_root_names_what_is_missing_in_one_line_and_installs_nothing() {
    use std::os::unix::fs::PermissionsExt;
    let temp = std::env::temp_dir().join(format!("m0-install-tools-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&temp);
    let guard = TempDir(temp);
    let dir = guard.0.as_path();
    std::fs::create_dir_all(dir.join("tests")).unwrap();
    for d in [dir.to_path_buf(), dir.join("tests")] {
        std::fs::set_permissions(d, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let script = install_tools_with(
        dir,
        "# tool package test why\n\
         sh dash tests/a.rs present everywhere\n\
         m0-no-such-tool m0-no-such-package tests/b.rs a reason\n\
         m0-nor-this-one m0-no-such-package tests/c.rs another\n",
    );
    let out = as_user(&script);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(err.lines().count(), 1, "not one line: {err}");
    for want in [
        "m0-no-such-tool (m0-no-such-package)",
        "m0-nor-this-one (m0-no-such-package)",
        "tests/b.rs tests/c.rs",
        "sudo tests/install-tools",
    ] {
        assert!(err.contains(want), "{want:?} not in {err}");
    }
    assert!(!err.contains("sh (dash)"), "a tool that is there: {err}");
    assert!(
        !dir.join("target/install-tools.log").exists(),
        "it ran apt-get"
    );
}

#[test]
fn install_tools_with_every_tool_there_says_so_and_installs_nothing() {
    let dir = TestDir::new("install_tools_present");
    let script = install_tools_with(&dir, "sh dash tests/a.rs present everywhere\n");
    let out = Command::new(&script).output_bounded().unwrap();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{said}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(said.contains("all present"), "{said}");
    assert!(!dir.join("target/install-tools.log").exists());
}

#[test]
fn a_missing_tool_fails_its_test_in_one_line_naming_the_install_command() {
    let listed = |pairs: &[(&str, &str)]| -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(t, p)| (t.to_string(), p.to_string()))
            .collect()
    };
    assert_eq!(missing_tools_line(&listed(&[("sh", "dash")])), None);
    let line = missing_tools_line(&listed(&[
        ("sh", "dash"),
        ("m0-no-such-tool", "m0-no-such-package"),
    ]))
    .expect("a missing tool");
    assert!(!line.contains('\n'), "{line}");
    assert!(
        line.contains("m0-no-such-tool (m0-no-such-package)"),
        "{line}"
    );
    assert!(line.contains("tests/install-tools"), "{line}");
    assert!(!line.contains("sh (dash)"), "{line}");
    // Every tool the tests run is in the list.
    let every = support::tools::listed_tools();
    for tool in [
        "nginx",
        "chromium",
        "promtool",
        "prometheus",
        "systemd-socket-activate",
        "curl",
    ] {
        assert!(
            every.iter().any(|(t, _)| t == tool),
            "{tool} not in tests/system-tools.txt"
        );
    }
}

fn outlived(args: &[&str]) -> Output {
    // The interpreter tests/run gives it.
    let python = std::env::var("PYTHON").unwrap_or_else(|_| "python3.11".into());
    Command::new(python)
        .arg(repo_root().join("tests/outlived.py"))
        .args(args)
        .output_bounded()
        .unwrap()
}

#[test]
fn outlived_fails_a_command_that_leaves_a_process_running_and_stops_it() {
    // A marker no other process has: the leftover is found by it after.
    let marker = format!("m0-outlived-{}", std::process::id());
    let script = format!("exec -a {marker} sleep 600 & exit 0");
    let out = outlived(&["bash", "-c", &script]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("outlived") && err.contains(&marker), "{err}");
    let still: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(&marker))
        .collect();
    assert!(still.is_empty(), "left running: {still:?}");
}

#[test]
fn outlived_passes_the_commands_status_on_when_nothing_is_left() {
    let out = outlived(&["sh", "-c", "sleep 0.1 & exit 3"]);
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = outlived(&["true"]);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
