//! `--health-path`: the core answers the probe itself, before any plugin;
//! 200 while the worker serves, 503 once it drains.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Client, Server, command, plugin};

fn hello(extra: &[&str]) -> Server {
    let hello = plugin("hello_c");
    let mut args = vec!["--plugin", hello.to_str().unwrap(), "--workers", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

#[test]
fn the_health_path_is_answered_by_the_core_and_the_rest_by_the_plugin() {
    // Without the flag the plugin answers the path (hello_c: 404).
    let plain = hello(&[]);
    assert_eq!(Client::connect(plain.addr).get("/healthz").status, 404);
    drop(plain);

    let s = hello(&["--health-path", "/healthz"]);
    let mut c = Client::connect(s.addr);
    // Twice on one keep-alive connection, a query ignored.
    for path in ["/healthz", "/healthz?probe=1"] {
        let r = c.get(path);
        assert_eq!(r.status, 200);
        assert_eq!(r.text(), "ok\n");
        assert_eq!(r.header("cache-control"), Some("no-store"));
        assert_eq!(r.header("connection"), None, "kept alive");
    }
    // HEAD: the length of the GET, no body.
    c.send(b"HEAD /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response(true).expect("an answer to HEAD");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("3"));
    assert!(r.body.is_empty());
    // The plugin still answers everything else, on the same connection.
    assert_eq!(c.get("/").text(), "hello, world\n");
    assert_eq!(c.get("/healthz/deeper").status, 404);
    // Pipelined: a probe between two plugin requests, answered in order.
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\n\r\nGET /healthz HTTP/1.1\r\nHost: t\r\n\r\nGET / HTTP/1.1\r\nHost: t\r\n\r\n");
    let texts: Vec<String> = (0..3)
        .map(|_| c.read_response(false).expect("pipelined answer").text())
        .collect();
    assert_eq!(texts, ["hello, world\n", "ok\n", "hello, world\n"]);
}

#[test]
fn the_health_path_answers_503_once_the_worker_drains() {
    let mut s = hello(&["--health-path", "/healthz"]);
    // A connection made before the stop and not yet heard from: its first
    // request is answered during the drain (with Connection: close).
    let mut early = TcpStream::connect(s.addr).unwrap();
    early
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    // A request in flight keeps the worker draining for a while.
    let addr = s.addr;
    let slow = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        c.get("/sleep?ms=1500").status
    });
    std::thread::sleep(Duration::from_millis(300));
    s.signal(libc::SIGTERM);
    assert!(
        s.wait_for_log("draining: ", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    early
        .write_all(b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut out = Vec::new();
    let _ = early.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}\n{}", s.log());
    assert!(text.contains("Connection: close\r\n"), "{text}");
    assert!(text.ends_with("draining\n"), "{text}");
    assert_eq!(slow.join().unwrap(), 200);
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|st| st.code()), Some(0), "{}", s.log());
}

#[test]
fn a_health_path_that_is_not_a_path_is_a_usage_error() {
    let hello = plugin("hello_c");
    for bad in ["healthz", "/health?x", "/a b"] {
        let out = command(&["--plugin", hello.to_str().unwrap(), "--health-path", bad])
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("--health-path"), "{bad}: {err}");
    }
}

/// A plugin that says it is not ready (ABI 1.4 `set_ready`) makes the
/// health path 503 until it says it is; its requests are served meanwhile.
#[test]
fn the_health_path_follows_what_the_plugin_says_of_its_readiness() {
    let out = support::scratch_dir("readiness_plugin").join("libreadiness_plugin.so");
    let src = support::repo_root().join("tests/c/readiness_plugin.c");
    support::cc(&["-shared", src.to_str().unwrap()], &out);
    let s = Server::start(&[
        "--plugin",
        out.to_str().unwrap(),
        "--workers",
        "1",
        "--health-path",
        "/healthz",
    ]);
    let mut c = Client::connect(s.addr);
    let probe = |c: &mut Client| {
        let r = c.get("/healthz");
        (r.status, r.text())
    };
    assert_eq!(probe(&mut c), (503, "not ready\n".to_string()));
    assert_eq!(c.get("/").text(), "hello\n", "served while not ready");
    assert_eq!(c.get("/ready").text(), "ready\n");
    assert_eq!(probe(&mut c), (200, "ok\n".to_string()));
    assert_eq!(c.get("/unready").text(), "unready\n");
    assert_eq!(probe(&mut c), (503, "not ready\n".to_string()));
}
