//! The README's commands, run as a new user would run them: every `sh`
//! block in the order written, on the checkout this test builds from.

use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support;
use crate::support::{Server, repo_root};

/// A command that builds before it serves may take this long to be ready.
const BUILD_AND_START: Duration = Duration::from_secs(30 * 60);

/// Every line of every `sh` block, with `\` continuations joined.
fn sh_commands(readme: &str) -> Vec<String> {
    let mut commands = Vec::new();
    let mut in_sh = false;
    let mut pending = String::new();
    for line in readme.lines() {
        let fence = line.trim_start().strip_prefix("```");
        match fence {
            Some(lang) if !in_sh => in_sh = lang.trim() == "sh",
            Some(_) => in_sh = false,
            None if in_sh => {
                let line = line.trim();
                if let Some(head) = line.strip_suffix('\\') {
                    pending.push_str(head);
                    pending.push(' ');
                } else if !line.is_empty() || !pending.is_empty() {
                    pending.push_str(line);
                    commands.push(std::mem::take(&mut pending));
                }
            }
            None => {}
        }
    }
    commands
}

/// What a README line is, for this test.
#[derive(Debug, PartialEq)]
enum Kind {
    /// Runs until stopped: a user runs it in a terminal of its own.
    Server,
    /// Asks the server that is running.
    Client,
    /// The test suite itself: not run from inside it.
    ThisSuite,
    /// Runs to completion.
    Command,
}

/// The README's command that runs every test; `.ci/run` runs it too.
const TEST_COMMAND: &str = "tests/run";

fn kind(line: &str) -> Kind {
    if line == TEST_COMMAND || line.starts_with("cargo test") {
        Kind::ThisSuite
    } else if line.starts_with("curl ") {
        Kind::Client
    } else if line.starts_with("cargo run")
        || line.starts_with("plugins/embed/run")
        || (line.contains("m0serve ") && !line.contains("--doctor"))
    {
        Kind::Server
    } else {
        Kind::Command
    }
}

/// `sh -c LINE` from the checkout's root, on an ephemeral port (the README
/// says 8000; `M0_PORT` moves every server and the doctor off it, so the
/// test never meets a server of the user's).
fn sh(line: &str) -> Command {
    let mut cmd = Command::new("sh");
    cmd.arg("-c").arg(line).current_dir(repo_root());
    for var in [
        "M0_WORKERS",
        "M0_LOG_LEVEL",
        "M0_BLOCKING_THREADS",
        "M0_PLUGIN",
    ] {
        cmd.env_remove(var);
    }
    cmd.env("M0_PORT", "0");
    cmd
}

/// Ctrl-C: SIGINT to the server's whole process group, as a terminal sends
/// it; the server must drain and exit 0.
fn ctrl_c(mut server: Server, line: &str) {
    // SAFETY: the server leads a process group of its own, which we started.
    unsafe { libc::kill(-server.pid(), libc::SIGINT) };
    let status = server.wait_exit(Duration::from_secs(60));
    assert!(
        status.is_some_and(|s| s.success()),
        "`{line}` did not stop cleanly on Ctrl-C ({status:?}):\n{}",
        server.log()
    );
}

#[test]
fn the_readmes_commands_are_found_and_classified() {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let commands = sh_commands(&readme);
    let kinds: Vec<Kind> = commands.iter().map(|c| kind(c)).collect();
    // The quickstart: the demo first, the test command among the commands.
    assert_eq!(kinds.first(), Some(&Kind::Server), "{commands:#?}");
    assert_eq!(
        commands.first().map(String::as_str),
        Some("cargo run --release -- --plugin hello_c")
    );
    let suite = commands.iter().position(|c| c == TEST_COMMAND);
    assert!(suite.is_some(), "no `{TEST_COMMAND}` in {commands:#?}");
    // What people run first comes before the test suite: the demo, the
    // embedding server and the WSGI (Flask) example.
    for first in ["plugins/embed/run", "--plugin wsgi"] {
        let at = commands.iter().position(|c| c.contains(first));
        assert!(
            at.is_some_and(|i| Some(i) < suite),
            "`{first}` must come before `{TEST_COMMAND}`: {commands:#?}"
        );
    }
    // Every client line comes after a server line.
    let first_client = kinds.iter().position(|k| *k == Kind::Client);
    assert!(first_client.is_some_and(|i| i > 0), "{commands:#?}");
    // CI runs exactly the README's test command.
    let ci = std::fs::read_to_string(repo_root().join(".ci/run")).unwrap();
    assert!(
        ci.lines()
            .any(|l| l.split("||").next().unwrap_or("").trim() == TEST_COMMAND),
        ".ci/run does not run `{TEST_COMMAND}`, the README's test command:\n{ci}"
    );
}

#[test]
fn the_readmes_commands_work_in_the_order_written() {
    let _serial = support::one_at_a_time();
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut running: Option<(Server, String)> = None;
    for line in sh_commands(&readme) {
        let kind = kind(&line);
        eprintln!("readme: {kind:?}: {line}");
        if !matches!(kind, Kind::Client)
            && kind != Kind::ThisSuite
            && let Some((server, started)) = running.take()
        {
            ctrl_c(server, &started);
        }
        match kind {
            Kind::ThisSuite => {}
            Kind::Server => {
                // `exec`: the shell becomes the command, so the Ctrl-C and
                // the exit status are the server's own (a shell that waits
                // for it may itself die of the SIGINT).
                let server = Server::try_start_within(sh(&format!("exec {line}")), BUILD_AND_START)
                    .unwrap_or_else(|(log, status)| {
                        panic!("`{line}` did not start ({status:?}):\n{log}")
                    });
                running = Some((server, line));
            }
            Kind::Client => {
                let (server, started) = running
                    .as_ref()
                    .unwrap_or_else(|| panic!("`{line}` comes before any server is started"));
                // The server is on an ephemeral port; --fail makes an HTTP
                // error fail the line.
                let asked = line
                    .replace("localhost:8000", &server.addr.to_string())
                    .replacen("curl ", "curl --fail ", 1);
                let out = sh(&asked).stderr(Stdio::inherit()).output().unwrap();
                let stdout = String::from_utf8_lossy(&out.stdout);
                assert!(
                    out.status.success() && !stdout.is_empty(),
                    "`{line}` against `{started}` failed ({}): {stdout}\n{}",
                    out.status,
                    server.log()
                );
                // What the README says the answer holds, after the `#`.
                if let Some((_, expected)) = line.rsplit_once(" # ") {
                    assert!(
                        stdout.contains(expected.trim()),
                        "`{line}` answered {stdout:?}, not the {expected:?} the README shows"
                    );
                }
            }
            Kind::Command => {
                let out = sh(&line).stderr(Stdio::inherit()).output().unwrap();
                assert!(
                    out.status.success(),
                    "`{line}` failed ({}):\n{}",
                    out.status,
                    String::from_utf8_lossy(&out.stdout)
                );
            }
        }
    }
    if let Some((server, started)) = running.take() {
        ctrl_c(server, &started);
    }
}
