//! The server's own log: every line dated and levelled as gunicorn's are
//! (`[time] [pid] [LEVEL] ...`), info lines short with the tuning detail at
//! debug, and `--log-format json` one object a line.

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, command, plugin};

/// A hello_c server at `level` with `extra` flags, asked once and stopped:
/// its whole log.
fn run(level: &str, extra: &[&str], env: &[(&str, &str)]) -> (i32, String) {
    let p = plugin("hello_c");
    let mut args = vec!["--plugin", p.to_str().unwrap(), "--workers", "2"];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    cmd.env("M0_LOG_LEVEL", level).env_remove("M0_LOG_FORMAT");
    for (k, v) in env {
        cmd.env(k, v);
    }
    let mut s = Server::start_cmd(cmd);
    assert_eq!(support::get(s.addr, "/").status, 200);
    let log = s.stop_and_log();
    (s.pid(), log)
}

/// `[2026-12-05 11:30:00 +0000] [1234] [INFO] rest`: (pid, level, rest).
fn parse_text_line(line: &str) -> Option<(i32, &str, &str)> {
    let rest = line.strip_prefix('[')?;
    let (time, rest) = rest.split_once("] [")?;
    let b = time.as_bytes();
    let shape = time.len() == 25
        && time.ends_with(" +0000")
        && [4, 7].iter().all(|&i| b[i] == b'-')
        && b[10] == b' '
        && [13, 16].iter().all(|&i| b[i] == b':')
        && time
            .char_indices()
            .all(|(i, c)| [4, 7, 10, 13, 16].contains(&i) || i >= 19 || c.is_ascii_digit());
    if !shape {
        return None;
    }
    let (pid, rest) = rest.split_once("] [")?;
    let (level, rest) = rest.split_once("] ")?;
    Some((pid.parse().ok()?, level, rest))
}

#[test]
fn every_line_has_the_time_the_pid_and_the_level() {
    let (pid, log) = run("debug", &[], &[]);
    let mut levels = Vec::new();
    for line in log.lines() {
        let (line_pid, level, rest) =
            parse_text_line(line).unwrap_or_else(|| panic!("not [time] [pid] [LEVEL]: {line:?}"));
        assert!(
            ["DEBUG", "INFO", "WARNING", "ERROR"].contains(&level),
            "{line}"
        );
        if rest.starts_with("supervisor: ") {
            assert_eq!(
                line_pid, pid,
                "the supervisor's lines carry its pid: {line}"
            );
        }
        levels.push(level);
    }
    assert!(
        levels.contains(&"INFO") && levels.contains(&"DEBUG"),
        "{log}"
    );
    assert!(
        log.lines()
            .any(|l| l.contains("] [INFO] supervisor: ready: serving http://")),
        "{log}"
    );
}

#[test]
fn info_lines_are_short_and_the_tuning_detail_waits_for_debug() {
    let (_, info) = run("info", &[], &[]);
    let longest = info.lines().map(str::len).max().unwrap_or(0);
    // The worker's start line said its whole plan at info (550 characters);
    // now it says what it serves.
    assert!(longest <= 160, "a {longest}-character info line:\n{info}");
    assert!(info.contains(" serving hello_c "), "{info}");
    for detail in ["inline calls", "loop calls", "plan: "] {
        assert!(!info.contains(detail), "{detail:?} at info:\n{info}");
    }
    let (_, debug) = run("debug", &[], &[]);
    assert!(
        debug
            .lines()
            .any(|l| l.contains("[DEBUG] worker 0: plan: ") && l.contains("inline calls")),
        "{debug}"
    );
}

#[test]
fn log_format_json_writes_one_object_a_line() {
    for (extra, env) in [
        (&["--log-format", "json"][..], &[][..]),
        (&[][..], &[("M0_LOG_FORMAT", "json")][..]),
    ] {
        let (pid, log) = run("debug", extra, env);
        let mut messages = Vec::new();
        for line in log.lines() {
            let j: serde_json::Value = serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("not a JSON line ({e}): {line:?}"));
            let time = j["time"].as_str().expect("time");
            assert!(time.len() == 27 && time.ends_with('Z'), "{line}");
            assert!(
                ["debug", "info", "warning", "error"].contains(&j["level"].as_str().unwrap()),
                "{line}"
            );
            assert!(j["pid"].as_i64().is_some(), "{line}");
            let process = j["process"].as_str().unwrap_or("");
            if process == "supervisor" {
                assert_eq!(j["pid"], pid, "{line}");
            }
            messages.push((
                process.to_string(),
                j["message"].as_str().expect("message").to_string(),
            ));
        }
        assert!(
            messages
                .iter()
                .any(|(p, m)| p == "supervisor" && m.starts_with("ready: serving http://")),
            "{log}"
        );
        assert!(
            messages
                .iter()
                .any(|(p, m)| p == "worker 1" && m.starts_with("drained: ")),
            "{log}"
        );
    }
}

#[test]
fn a_bad_log_format_is_a_usage_error_naming_its_variable() {
    let p = plugin("hello_c");
    let out = command(&["--plugin", p.to_str().unwrap()])
        .env("M0_LOG_FORMAT", "xml")
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("M0_LOG_FORMAT") && err.contains("json"),
        "{err}"
    );
}
