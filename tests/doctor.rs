//! `--doctor ARGS` and `ARGS` agree on the exit code, over a matrix of
//! argument sets; the doctor's JSON has the documented keys; the doctor
//! never listens.

use std::net::TcpListener;
use std::process::Command;
use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, bad_plugin, binary, plugin, repo_root};

const TOP_KEYS: [&str; 9] = [
    "m0serve", "ok", "exit", "build", "plugin", "topology", "server", "checks", "exit",
];

fn cmd(args: &[String]) -> Command {
    let mut c = Command::new(binary());
    c.args(args)
        .env_remove("M0_WORKERS")
        .env_remove("M0_BLOCKING_THREADS");
    c
}

/// Run the doctor: (exit code, parsed JSON).
fn doctor(args: &[String]) -> (i32, serde_json::Value) {
    let out = cmd(args)
        .arg("--doctor")
        .output_bounded()
        .expect("run --doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    let json: serde_json::Value = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "--doctor {args:?} printed no JSON ({e}):\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code().unwrap_or(-1), json)
}

/// Run the server: its exit code, or 0 when it came up and served (then it
/// is stopped with SIGTERM and must exit 0).
fn server(args: &[String]) -> i32 {
    match Server::try_start(cmd(args)) {
        Ok(mut s) => {
            assert!(
                support::get(s.addr, "/").status / 100 != 5,
                "server for {args:?} answered 5xx"
            );
            s.signal(libc::SIGTERM);
            let status = s
                .wait_exit(Duration::from_secs(30))
                .expect("server stops on SIGTERM");
            status.code().unwrap_or(-1)
        }
        Err((log, status)) => status
            .and_then(|s| s.code())
            .unwrap_or_else(|| panic!("no exit for {args:?}:\n{log}")),
    }
}

fn strings(args: &[&str]) -> Vec<String> {
    args.iter().map(|s| s.to_string()).collect()
}

#[test]
fn doctor_and_server_exit_with_the_same_code_over_a_matrix() {
    let hello = plugin("hello_c").display().to_string();
    let wsgi = crate::support::wsgi::plugin().display().to_string();
    let apps = repo_root().join("tests/apps").display().to_string();
    let major2 = bad_plugin("doctor_major2", &["-DABI_MAJOR=2"])
        .display()
        .to_string();
    let crashes = bad_plugin("doctor_crashes", &["-DCRASH_AT_LOAD"])
        .display()
        .to_string();
    let refuses = bad_plugin("doctor_refuses", &["-DINIT_REFUSES"])
        .display()
        .to_string();
    let fails = bad_plugin("doctor_fails", &["-DINIT_FAILS"])
        .display()
        .to_string();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let taken_port = taken.local_addr().unwrap().port().to_string();
    let local = ["--host", "127.0.0.1", "--port", "0"];
    let with = |extra: &[&str]| -> Vec<String> {
        local.iter().chain(extra).map(|s| s.to_string()).collect()
    };

    let matrix: Vec<(&str, Vec<String>, i32)> = vec![
        ("hello", with(&["--plugin", &hello]), 0),
        (
            "two workers",
            with(&["--plugin", &hello, "--workers", "2"]),
            0,
        ),
        (
            "spawn",
            with(&["--plugin", &hello, "--workers", "2", "--spawn-workers"]),
            0,
        ),
        (
            "fixed pool",
            with(&["--plugin", &hello, "--blocking-threads", "4"]),
            0,
        ),
        (
            "wsgi app",
            with(&[
                "--plugin",
                &wsgi,
                "--app-dir",
                &apps,
                "conformance:application",
            ]),
            0,
        ),
        ("no plugin", with(&[]), 2),
        (
            "bad port",
            strings(&["--plugin", &hello, "--port", "80eighty"]),
            2,
        ),
        (
            "zero workers",
            with(&["--plugin", &hello, "--workers", "0"]),
            2,
        ),
        (
            "bad size",
            with(&["--plugin", &hello, "--max-body", "4x"]),
            2,
        ),
        (
            "bad host",
            strings(&["--plugin", &hello, "--host", "not-an-ip", "--port", "0"]),
            2,
        ),
        ("missing plugin", with(&["--plugin", "no_such_plugin"]), 1),
        (
            "missing venv",
            with(&[
                "--plugin",
                &wsgi,
                "--venv",
                "/nonexistent/venv",
                "conformance",
            ]),
            78,
        ),
        (
            "not a venv",
            with(&["--plugin", &wsgi, "--venv", &apps, "conformance"]),
            78,
        ),
        (
            "missing app dir",
            with(&["--plugin", &hello, "--app-dir", "/nonexistent/dir"]),
            1,
        ),
        ("another ABI major", with(&["--plugin", &major2]), 78),
        ("crashes at load", with(&["--plugin", &crashes]), 1),
        ("init refuses", with(&["--plugin", &refuses]), 78),
        ("init fails", with(&["--plugin", &fails]), 1),
        (
            "app fails to import",
            with(&[
                "--plugin",
                &wsgi,
                "--app-dir",
                &apps,
                "broken_import:application",
            ]),
            1,
        ),
        (
            "port in use",
            strings(&[
                "--plugin",
                &hello,
                "--host",
                "127.0.0.1",
                "--port",
                &taken_port,
            ]),
            1,
        ),
    ];
    assert!(matrix.len() >= 15);
    for (name, args, want) in &matrix {
        let (d, json) = doctor(args);
        assert_eq!(d, *want, "{name}: doctor exit\n{json:#}");
        assert_eq!(json["exit"], *want, "{name}: the JSON's exit");
        assert_eq!(json["ok"], *want == 0, "{name}");
        for key in TOP_KEYS {
            assert!(json.get(key).is_some(), "{name}: no {key}:\n{json:#}");
        }
        let checks = json["checks"].as_array().expect("checks is a list");
        let first_failed = checks.iter().find(|c| c["ok"] == false);
        match first_failed {
            Some(c) => {
                assert_eq!(
                    c["exit"], *want,
                    "{name}: the first failed check decides:\n{json:#}"
                );
                assert!(c["fix"].is_string(), "{name}: a failed check names a fix");
            }
            None => assert_eq!(*want, 0),
        }
        let s = server(args);
        assert_eq!(s, d, "{name}: the server exited {s}, the doctor said {d}");
    }
    drop(taken);
}

#[test]
fn doctor_reports_the_plugin_topology_and_limits() {
    let hello = plugin("hello_c").display().to_string();
    let args = strings(&[
        "--plugin",
        &hello,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
        "--workers",
        "2",
        "--max-body",
        "1m",
    ]);
    let (code, j) = doctor(&args);
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(j["build"]["abi_major"], 1);
    assert_eq!(
        j["build"]["header_fingerprint"].as_str().map(str::len),
        Some(16)
    );
    assert_eq!(j["plugin"]["name"], "hello_c");
    assert_eq!(j["plugin"]["call_model"], "reentrant");
    assert_eq!(j["plugin"]["process_lock"], "none");
    assert_eq!(j["plugin"]["needs_exec"], false);
    assert_eq!(j["topology"]["workers"], 2);
    assert_eq!(j["topology"]["worker_mode"], "fork");
    assert_eq!(j["topology"]["accept_sharing"], true);
    assert_eq!(j["topology"]["handler_threads"]["source"], "adaptive");
    // Both workers run on the supervisor's CPUs: their pools size together.
    assert_eq!(j["topology"]["handler_threads"]["workers_sharing_cpus"], 2);
    assert!(
        j["topology"]["handler_threads"]["reason"]
            .as_str()
            .unwrap()
            .contains("the pools size together from the shared page"),
        "{j:#}"
    );
    assert!(j["topology"]["usable_cpus"].as_u64().unwrap() >= 1);
    assert_eq!(j["server"]["max_body"], 1 << 20);
    assert_eq!(j["plugin"]["declares_inline"], true);
    // Stated by hello_c's init through M0Host.fact.
    assert_eq!(
        j["plugin"]["facts"]["hello_c.blocking_routes"], "/sleep",
        "{j:#}"
    );
    assert_eq!(j["plugin"]["declares_batch"], false);
    assert_eq!(j["batching"]["on"], false);
    assert_eq!(
        j["batching"]["reason"],
        "the plugin does not declare M0_CAP_BATCH"
    );
    assert_eq!(j["topology"]["inline_calls"], true, "{j:#}");
    let mut off = args.clone();
    off.push("--no-inline".into());
    let (_, j_off) = doctor(&off);
    assert_eq!(j_off["topology"]["inline_calls"], false);
    assert_eq!(
        j_off["topology"]["inline_reason"],
        "turned off with --no-inline"
    );
    // Inline calls exclude loop calls.
    assert_eq!(j["topology"]["loop_calls"], false);
    assert_eq!(j["topology"]["loop_calls_reason"], "its calls are inline");
    let names: Vec<&str> = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    assert_eq!(&names[..4], ["host", "app-dir", "plugin", "plugin-abi"]);
    assert_eq!(names.last(), Some(&"port"));
}

#[test]
fn a_declared_batch_without_handle_batch_is_reported_and_not_used() {
    // The fixture declares M0_CAP_BATCH but its calls table has no
    // handle_batch: the doctor learns that from the probe's init and says
    // what the worker will do, one request at a time.
    let batching = bad_plugin("doctor_batch8", &["-DCAPS=M0_CAP_BATCH", "-DMAX_BATCH=8"])
        .display()
        .to_string();
    let (code, j) = doctor(&strings(&[
        "--plugin",
        &batching,
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]));
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(j["plugin"]["declares_batch"], true, "{j:#}");
    assert_eq!(j["plugin"]["max_batch"], 8, "{j:#}");
    assert_eq!(j["batching"]["on"], false, "{j:#}");
    assert_eq!(
        j["batching"]["reason"],
        "the plugin declares M0_CAP_BATCH but its calls table has no handle_batch"
    );
    assert!(j["batching"]["max_requests"].is_null(), "{j:#}");
}

#[test]
fn doctor_reports_python_for_the_wsgi_plugin() {
    let wsgi = crate::support::wsgi::plugin().display().to_string();
    let apps = repo_root().join("tests/apps").display().to_string();
    let args = strings(&[
        "--plugin",
        &wsgi,
        "--app-dir",
        &apps,
        "--port",
        "0",
        "conformance:application",
    ]);
    let (code, j) = doctor(&args);
    assert_eq!(code, 0, "{j:#}");
    let py = &j["python"];
    assert!(
        py["version"].as_str().unwrap().starts_with("3.11"),
        "{py:#}"
    );
    assert!(
        py["libpython"].as_str().unwrap().contains("libpython3.11"),
        "{py:#}"
    );
    assert_eq!(py["app_imports"], true);
    assert!(
        py["resolved"].as_str().unwrap().contains("function"),
        "{py:#}"
    );
    // The object is built from the python.* facts the plugin states at
    // init through M0Host.fact (ABI 1.2), with the members it always had.
    let mut members: Vec<&str> = py.as_object().unwrap().keys().map(|k| k.as_str()).collect();
    members.sort_unstable();
    assert_eq!(
        members,
        [
            "app",
            "app_imports",
            "base_prefix",
            "executable",
            "fork_unsafe",
            "libpython",
            "prefix",
            "resolved",
            "venv",
            "venv_from",
            "version"
        ],
        "{py:#}"
    );
    let facts = &j["plugin"]["facts"];
    assert_eq!(facts["python.version"], py["version"], "{j:#}");
    assert_eq!(facts["python.app"], "conformance:application", "{j:#}");
    assert_eq!(facts["python.fork_unsafe_modules"], "", "{j:#}");
    assert_eq!(j["plugin"]["process_lock"], "held");
    // Loop calls on every topology; measured against the pool where a
    // worker has CPUs to spare.
    let usable = j["topology"]["usable_cpus"].as_u64().unwrap();
    let workers = j["topology"]["workers"].as_u64().unwrap();
    assert_eq!(j["topology"]["loop_calls"], true, "{j:#}");
    assert_eq!(
        j["topology"]["loop_calls_measured"],
        usable > workers,
        "{j:#}"
    );
    assert_eq!(j["topology"]["workers_wanted"], usable, "{j:#}");
    if usable > workers {
        // A pool fixed by hand has no controller to measure them with.
        let mut fixed = args.clone();
        fixed.extend(strings(&["--blocking-threads", "2"]));
        let (_, j) = doctor(&fixed);
        assert_eq!(j["topology"]["loop_calls"], false, "{j:#}");
    }
    let mut one_each = args.clone();
    one_each.extend(strings(&["--workers", &usable.to_string()]));
    let (code, j) = doctor(&one_each);
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(j["topology"]["loop_calls"], true, "{j:#}");
    assert_eq!(j["topology"]["loop_calls_measured"], false, "{j:#}");
    let mut auto = args.clone();
    auto.extend(strings(&["--workers", "auto"]));
    let (code, j) = doctor(&auto);
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(j["topology"]["workers"], usable, "{j:#}");
    one_each.push("--no-inline".into());
    let (_, j) = doctor(&one_each);
    assert_eq!(j["topology"]["loop_calls"], false);
    assert_eq!(
        j["topology"]["loop_calls_reason"],
        "turned off with --no-inline"
    );
}

/// The interpreter a user's activated venv selects (no `--venv`), as the
/// doctor reports it: the venv, which setting named it, the prefix and the
/// libpython in use.
#[test]
fn doctor_reports_the_venv_taken_from_virtual_env() {
    let venv = support::scratch_dir("doctor_virtual_env").join("venv");
    let made = Command::new(crate::support::wsgi::python())
        .args(["-m", "venv", "--without-pip", "--clear"])
        .arg(&venv)
        .status()
        .expect("run python -m venv");
    assert!(made.success());
    let wsgi = crate::support::wsgi::plugin().display().to_string();
    let apps = repo_root().join("tests/apps").display().to_string();
    let args = strings(&[
        "--plugin",
        &wsgi,
        "--app-dir",
        &apps,
        "--port",
        "0",
        "conformance:application",
    ]);
    let out = cmd(&args)
        .arg("--doctor")
        .env_remove("M0_VENV")
        .env("VIRTUAL_ENV", &venv)
        .output_bounded()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(out.status.code(), Some(0), "{j:#}");
    let py = &j["python"];
    let venv = std::path::absolute(&venv).unwrap().display().to_string();
    assert_eq!(py["venv"], venv.as_str(), "{py:#}");
    assert_eq!(py["venv_from"], "VIRTUAL_ENV", "{py:#}");
    assert_eq!(py["prefix"], venv.as_str(), "{py:#}");
    assert!(
        py["executable"].as_str().unwrap().starts_with(&venv),
        "{py:#}"
    );
    assert!(
        py["libpython"].as_str().unwrap().contains("libpython3.11"),
        "{py:#}"
    );
    assert_eq!(py["app_imports"], true);
}

#[test]
fn doctor_reports_the_facts_a_plugin_states_at_init() {
    let p = bad_plugin("doctor_facts", &["-DSTATES_FACTS"])
        .display()
        .to_string();
    let out = cmd(&strings(&["--plugin", &p, "--port", "0", "--doctor"]))
        .output_bounded()
        .expect("run --doctor");
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let j: serde_json::Value = serde_json::from_str(text.trim()).expect("JSON");
    let facts = j["plugin"]["facts"].as_object().expect("plugin.facts");
    // Newlines and backslashes cross the probe's line protocol intact; the
    // malformed keys were refused with M0_ERR_INVALID and never recorded;
    // a key stated twice keeps its place and its last value.
    assert_eq!(facts["bad.escaped"], "one\ntwo\rthree\\four", "{j:#}");
    assert_eq!(facts["bad.malformed_keys_refused"], "yes", "{j:#}");
    assert_eq!(facts["bad.replaced"], "second", "{j:#}");
    assert_eq!(facts.len(), 3, "{j:#}");
    let at = |key: &str| text.find(&format!("\"{key}\"")).unwrap();
    assert!(
        at("bad.replaced") < at("bad.escaped")
            && at("bad.escaped") < at("bad.malformed_keys_refused"),
        "facts keep the order first stated: {text}"
    );
    // No python.* fact, so no python object.
    assert!(j.get("python").is_none(), "{j:#}");
}

#[test]
fn doctor_reports_the_loaders_fix_apart_from_the_problem() {
    // (plugin defect, failed check, what the detail says, the fix)
    let cases = [
        (
            "major2",
            "-DABI_MAJOR=2",
            "plugin-abi",
            "built for m0serve ABI 2.",
            "rebuild the plugin",
        ),
        (
            "minor9",
            "-DABI_MINOR=9",
            "plugin-abi",
            "needs m0serve ABI 1.9",
            "upgrade m0serve",
        ),
        // Found by init, which the doctor runs in its probe: the fix
        // crosses the probe's stdout as its own line.
        (
            "calls8",
            "-DCALLS_SIZE=8",
            "plugin-init",
            "M0PluginCalls is 8 bytes",
            "rebuild the plugin",
        ),
    ];
    for (name, define, check, detail, fix) in cases {
        let p = bad_plugin(&format!("doctor_fix_{name}"), &[define])
            .display()
            .to_string();
        let (code, j) = doctor(&strings(&["--plugin", &p, "--port", "0"]));
        assert_eq!(code, 78, "{name}: {j:#}");
        let failed = j["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["ok"] == false)
            .unwrap_or_else(|| panic!("{name}: no failed check: {j:#}"));
        assert_eq!(failed["name"], check, "{name}: {j:#}");
        let (d, f) = (
            failed["detail"].as_str().unwrap(),
            failed["fix"].as_str().unwrap(),
        );
        assert!(d.contains(detail) && !d.contains(fix), "{name}: {failed}");
        assert!(f.starts_with(fix), "{name}: {failed}");
    }
}

#[test]
fn doctor_never_listens_and_names_a_taken_port() {
    let hello = plugin("hello_c").display().to_string();
    let taken = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let args = strings(&[
        "--plugin",
        &hello,
        "--host",
        "127.0.0.1",
        "--port",
        &port.to_string(),
    ]);
    let (code, j) = doctor(&args);
    assert_eq!(code, 1);
    let port_check = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "port")
        .expect("a port check");
    assert_eq!(port_check["ok"], false);
    assert!(
        port_check["detail"]
            .as_str()
            .unwrap()
            .contains(&format!("port {port}")),
        "{port_check}"
    );
    let fix = port_check["fix"].as_str().unwrap();
    assert!(fix.contains("--port"), "{port_check}");
    assert!(
        !port_check["detail"].as_str().unwrap().contains("--port"),
        "the fix is said once: {port_check}"
    );
    // The full report is still there.
    assert_eq!(j["plugin"]["name"], "hello_c");
    // And with the port free, the doctor leaves nothing listening.
    drop(taken);
    let (code, _) = doctor(&args);
    assert_eq!(code, 0);
    assert!(
        TcpListener::bind(("127.0.0.1", port)).is_ok(),
        "the doctor left the port bound"
    );
}

#[test]
fn usage_errors_exit_2_naming_the_flag() {
    let out = cmd(&strings(&["--plugin", "x", "--port", "80eighty"]))
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--port"));
    let out = cmd(&strings(&["--no-such-flag"])).output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = cmd(&strings(&["--version"])).output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stdout).starts_with("m0serve "));
    // Environment variables are read, and a flag beats them.
    let hello = plugin("hello_c").display().to_string();
    let mut c = cmd(&strings(&["--plugin", &hello, "--doctor", "--port", "0"]));
    c.env("M0_WORKERS", "3").env("M0_MAX_BODY", "2k");
    let j: serde_json::Value = serde_json::from_slice(&c.output_bounded().unwrap().stdout).unwrap();
    assert_eq!(j["topology"]["workers"], 3);
    assert_eq!(j["server"]["max_body"], 2048);
    let mut c = cmd(&strings(&[
        "--plugin",
        &hello,
        "--doctor",
        "--port",
        "0",
        "--workers",
        "2",
    ]));
    c.env("M0_WORKERS", "3");
    let j: serde_json::Value = serde_json::from_slice(&c.output_bounded().unwrap().stdout).unwrap();
    assert_eq!(j["topology"]["workers"], 2);
    // A bad value from a variable names the variable, in the server's
    // message and the doctor's check alike; from the flag, the flag.
    let mut c = cmd(&strings(&["--plugin", &hello, "--port", "0"]));
    c.env("M0_WORKERS", "abc");
    let out = c.output_bounded().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2));
    assert!(
        err.contains("in M0_WORKERS (the variable for --workers)"),
        "{err}"
    );
    let mut c = cmd(&strings(&["--plugin", &hello, "--doctor"]));
    c.env("M0_MAX_BODY", "4x");
    let j: serde_json::Value = serde_json::from_slice(&c.output_bounded().unwrap().stdout).unwrap();
    assert!(
        j["checks"][0]["detail"]
            .as_str()
            .unwrap()
            .contains("in M0_MAX_BODY"),
        "{j:#}"
    );
    let mut c = cmd(&strings(&["--plugin", &hello, "--workers", "abc"]));
    c.env("M0_WORKERS", "abc");
    let err = String::from_utf8_lossy(&c.output_bounded().unwrap().stderr).into_owned();
    assert!(err.contains("for '--workers"), "{err}");
}

#[test]
fn advice_for_costly_setups_warns_without_failing() {
    let wsgi = crate::support::wsgi::plugin().display().to_string();
    let apps = repo_root().join("tests/apps").display().to_string();
    let local = ["--host", "127.0.0.1", "--port", "0"];
    let with = |extra: &[&str]| -> Vec<String> {
        local.iter().chain(extra).map(|s| s.to_string()).collect()
    };
    // A GIL-holding plugin with a fixed pool larger than 2.
    let (code, j) = doctor(&with(&[
        "--plugin",
        &wsgi,
        "--app-dir",
        &apps,
        "--blocking-threads",
        "8",
        "conformance:application",
    ]));
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(support::doctor_warnings(&j), ["lock-held-pool"], "{j:#}");
    let (_, j) = doctor(&with(&[
        "--plugin",
        &wsgi,
        "--app-dir",
        &apps,
        "--blocking-threads",
        "2",
        "conformance:application",
    ]));
    assert!(support::doctor_warnings(&j).is_empty(), "{j:#}");

    // A fork-unsafe runtime needs no spawn mode: the worker imports it
    // after its fork, and the doctor says so without a warning.
    let (code, j) = doctor(&with(&[
        "--plugin",
        &wsgi,
        "--app-dir",
        &apps,
        "forkunsafe_app:application",
    ]));
    assert_eq!(code, 0, "{j:#}");
    assert!(support::doctor_warnings(&j).is_empty(), "{j:#}");
    let said = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "fork-unsafe-runtime")
        .unwrap_or_else(|| panic!("no fork-unsafe-runtime check:\n{j:#}"));
    assert_eq!(said["ok"], true, "{j:#}");
    assert!(
        said["detail"]
            .as_str()
            .unwrap()
            .contains("after its own fork"),
        "{j:#}"
    );
    assert!(j["python"]["fork_unsafe"].as_str().unwrap() != "", "{j:#}");

    // More workers than usable CPUs for a plugin that computes with threads.
    let busy = bad_plugin("doctor_compute4", &["-DCOMPUTE_THREADS=4"])
        .display()
        .to_string();
    let cpus = j["topology"]["usable_cpus"].as_u64().unwrap();
    let workers = (cpus + 1).to_string();
    let (code, j) = doctor(&with(&["--plugin", &busy, "--workers", &workers]));
    assert_eq!(code, 0, "{j:#}");
    assert_eq!(support::doctor_warnings(&j), ["workers-vs-cpus"], "{j:#}");
}

/// `--help` shows `--plugin` as required and says what ARG is for each
/// plugin that ships, not for one of them only.
#[test]
fn help_shows_the_plugin_as_required_and_arg_for_every_plugin() {
    let out = cmd(&[]).arg("--help").output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("Usage: m0serve [OPTIONS] --plugin <PLUGIN> [ARG]..."),
        "{help}"
    );
    let arg = help
        .split("Arguments:")
        .nth(1)
        .and_then(|rest| rest.split("Options:").next())
        .unwrap_or_else(|| panic!("no Arguments section:\n{help}"));
    for plugin in ["wsgi", "embed", "pyembed", "hello_c"] {
        assert!(arg.contains(plugin), "ARG's help names no {plugin}:\n{arg}");
    }
    // Without it: a usage error (2) that names it, not a failed startup.
    let out = cmd(&[]).env_remove("M0_PLUGIN").output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--plugin <PLUGIN>"));
}
