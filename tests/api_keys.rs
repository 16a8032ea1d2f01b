//! API keys in the core (`--api-key-file`, `M0_API_KEY`, `--api-key`):
//! without `Authorization: Bearer <key>` a request is answered 401 before
//! any plugin sees it; the health path, the metrics listener and the open
//! paths stay open; keys never show in a log, an error, the doctor or the
//! workers' environment.

use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;
use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Client, Server, command, plugin};

const KEY: &str = "sk-m0-test-1f2e3d4c5b6a";
const OTHER: &str = "sk-m0-second-9a8b7c";

fn key_file(name: &str, mode: u32) -> PathBuf {
    let path = support::scratch_dir("api_keys").join(name);
    std::fs::write(&path, format!("# keys\n{KEY}\n\n  {OTHER}  \n")).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
    path
}

fn get_with(addr: std::net::SocketAddr, path: &str, auth: Option<&str>) -> support::Response {
    let mut c = Client::connect(addr);
    match auth {
        Some(value) => c.request("GET", path, &[("Authorization", value)], b""),
        None => c.get(path),
    }
}

#[test]
fn without_a_key_the_core_answers_401_and_the_plugin_never_sees_it() {
    let file = key_file("keys-ok", 0o600);
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let hello = plugin("hello_c");
        let mut args = vec![
            "--plugin",
            hello.to_str().unwrap(),
            "--workers",
            "2",
            "--api-key-file",
            file.to_str().unwrap(),
            "--health-path",
            "/healthz",
            "--api-key-open-path",
            "/pid",
            "--metrics",
            "127.0.0.1:0",
            "--access-log",
            "-",
        ];
        args.extend_from_slice(mode);
        let s = Server::start(&args);
        for auth in [
            None,
            Some("Bearer wrong"),
            Some(&format!("Basic {KEY}")[..]),
            Some("Bearer"),
        ] {
            let r = get_with(s.addr, "/", auth);
            assert_eq!(r.status, 401, "{mode:?} {auth:?}");
            assert_eq!(r.header("www-authenticate"), Some("Bearer"));
            assert_eq!(r.header("content-type"), Some("application/json"));
            let v: serde_json::Value = serde_json::from_slice(&r.body).unwrap();
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
        }
        // Either key, any case of the scheme; a 401 keeps the connection.
        let mut c = Client::connect(s.addr);
        assert_eq!(c.get("/").status, 401);
        let r = c.request(
            "GET",
            "/",
            &[("Authorization", &format!("Bearer {KEY}"))],
            b"",
        );
        assert_eq!(r.text(), "hello, world\n", "{mode:?}");
        let r = c.request(
            "GET",
            "/",
            &[("Authorization", &format!("bearer {OTHER}"))],
            b"",
        );
        assert_eq!(r.status, 200);
        // A POST's body is read past, and the next request on the
        // connection is served.
        let r = c.request("POST", "/echo", &[], b"hello");
        assert_eq!(r.status, 401);
        let r = c.request(
            "POST",
            "/echo",
            &[("Authorization", &format!("Bearer {KEY}"))],
            b"hi",
        );
        assert_eq!(r.text(), "hi");
        // Open without a key: the health path, an open path, the metrics.
        assert_eq!(get_with(s.addr, "/healthz", None).status, 200);
        assert_eq!(get_with(s.addr, "/pid", None).status, 200);
        let metrics = s.metrics_addr();
        assert_eq!(get_with(metrics, "/metrics", None).status, 200);
        // Refusals are in the access log; no key anywhere in the log.
        assert!(
            s.wait_for_log("\" 401 ", Duration::from_secs(5)),
            "{}",
            s.log()
        );
        let log = s.log();
        assert!(
            log.contains("API keys: 2 key(s) from --api-key-file"),
            "{log}"
        );
        assert!(!log.contains(KEY) && !log.contains(OTHER), "{log}");
    }
}

#[test]
fn a_key_from_the_environment_is_not_left_in_the_workers_environment() {
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let hello = plugin("hello_c");
        let mut args = vec!["--plugin", hello.to_str().unwrap(), "--workers", "1"];
        args.extend_from_slice(mode);
        let mut cmd = command(&args);
        cmd.env("M0_API_KEY", KEY);
        let s = Server::start_cmd(cmd);
        assert_eq!(get_with(s.addr, "/", None).status, 401, "{mode:?}");
        assert_eq!(
            get_with(s.addr, "/", Some(&format!("Bearer {KEY}"))).status,
            200
        );
        for pid in s.worker_pids() {
            let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
            let text = String::from_utf8_lossy(&environ);
            assert!(
                !text.contains(KEY),
                "{mode:?}: worker {pid} still holds the key"
            );
        }
    }
}

#[test]
fn a_key_file_others_may_read_is_refused_with_78_and_the_fix() {
    let file = key_file("keys-open", 0o644);
    let hello = plugin("hello_c");
    let out = command(&[
        "--plugin",
        hello.to_str().unwrap(),
        "--api-key-file",
        file.to_str().unwrap(),
    ])
    .output_bounded()
    .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("chmod 600 {}", file.display())),
        "{err}"
    );
    assert!(!err.contains(KEY), "{err}");
    // An open path without a key is a mistake too.
    let out = command(&[
        "--plugin",
        hello.to_str().unwrap(),
        "--api-key-open-path",
        "/x",
    ])
    .output_bounded()
    .unwrap();
    assert_eq!(out.status.code(), Some(78));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no API key"));
}

#[test]
fn the_doctor_says_how_many_keys_and_from_where_but_never_which() {
    let file = key_file("keys-doctor", 0o600);
    let hello = plugin("hello_c");
    let mut cmd = command(&[
        "--plugin",
        hello.to_str().unwrap(),
        "--api-key-file",
        file.to_str().unwrap(),
        "--api-key",
        "sk-on-the-command-line",
        "--doctor",
    ]);
    cmd.env("M0_API_KEY", "sk-from-the-environment");
    let out = cmd.output_bounded().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{text}");
    let v: serde_json::Value = serde_json::from_str(&text).unwrap();
    let keys = &v["server"]["api_keys"];
    assert_eq!(keys["count"], 4, "{keys}");
    let from: Vec<&str> = keys["from"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    assert_eq!(from[0], "--api-key (1)");
    assert_eq!(from[1], "M0_API_KEY");
    assert!(
        from[2].starts_with("--api-key-file ") && from[2].ends_with(" (2)"),
        "{from:?}"
    );
    // The command line is seen by `ps`: a warning with the fix.
    assert!(
        v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["warning"] == true && c["detail"].as_str().unwrap().contains("ps")),
        "{text}"
    );
    let all = format!("{text}{}", String::from_utf8_lossy(&out.stderr));
    for secret in [
        KEY,
        OTHER,
        "sk-from-the-environment",
        "sk-on-the-command-line",
    ] {
        assert!(!all.contains(secret), "{secret} in:\n{all}");
    }
}
