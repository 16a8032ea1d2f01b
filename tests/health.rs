//! `--health-path`: the core answers the probe itself, before any plugin;
//! 200 while the worker serves, 503 once it drains.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Client, Server, command, plugin};

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
            .output_bounded()
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

/// `tests/c/slow_init_plugin.c`, built once per test binary run (a test
/// rebuilding it while another's server opens it would fail that one).
fn slow_init_plugin() -> std::path::PathBuf {
    static BUILT: std::sync::OnceLock<std::path::PathBuf> = std::sync::OnceLock::new();
    BUILT
        .get_or_init(|| {
            let out = support::scratch_dir("slow_init_plugin").join("libslow_init_plugin.so");
            let src = support::repo_root().join("tests/c/slow_init_plugin.c");
            support::cc(&["-shared", src.to_str().unwrap()], &out);
            out
        })
        .clone()
}

/// A server of the slow-init fixture whose workers wait while `hold`
/// exists; returned once `worker` logs that it is loading (its address
/// comes from that line: the ready line comes only after init).
fn slow_server(hold: &std::path::Path, worker: u32, extra: &[&str]) -> Server {
    let lib = slow_init_plugin();
    let mut args = vec![
        "--plugin",
        lib.to_str().unwrap(),
        "--health-path",
        "/healthz",
    ];
    args.extend_from_slice(extra);
    args.push(hold.to_str().unwrap());
    let needle = format!("slow_init: worker {worker} loading on port ");
    Server::try_start_when(command(&args), Duration::from_secs(60), |log| {
        let line = log.lines().find(|l| l.contains(&needle))?;
        let port = line.split(&needle).nth(1)?.split_whitespace().next()?;
        format!("127.0.0.1:{port}").parse().ok()
    })
    .unwrap_or_else(|(log, status)| panic!("server did not start ({status:?}):\n{log}"))
}

fn hold_file(name: &str) -> std::path::PathBuf {
    let hold = support::scratch_dir("slow_init_holds").join(name);
    let _ = std::fs::remove_file(hold.with_extension("fail"));
    std::fs::write(&hold, b"").unwrap();
    hold
}

/// One request on a connection of its own; the whole answer as text.
fn exchange(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut c = TcpStream::connect(addr).unwrap();
    // A backstop against a test that hangs, not a measure of speed.
    c.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    c.write_all(request).unwrap();
    let mut out = Vec::new();
    let _ = c.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// While the plugin's init runs, the health path answers 503 `loading`;
/// a request for the plugin is held, whole or in part, and answered once
/// init returns.
#[test]
fn while_the_plugin_loads_the_health_path_is_503_and_requests_wait_for_it() {
    let hold = hold_file("one-worker");
    let s = slow_server(&hold, 0, &["--workers", "1"]);
    let probe = exchange(s.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(probe.starts_with("HTTP/1.1 503 "), "{probe}\n{}", s.log());
    assert!(probe.contains("Connection: close\r\n"), "{probe}");
    assert!(probe.contains("Cache-Control: no-store\r\n"), "{probe}");
    assert!(probe.ends_with("\r\n\r\nloading\n"), "{probe}");
    let head = exchange(s.addr, b"HEAD /healthz?x=1 HTTP/1.0\r\n\r\n");
    assert!(head.starts_with("HTTP/1.0 503 "), "{head}");
    assert!(head.ends_with("\r\n\r\n"), "no body for HEAD: {head}");
    // A whole request and half of one, sent while init runs.
    let mut whole = TcpStream::connect(s.addr).unwrap();
    whole
        .write_all(b"GET /a HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut half = TcpStream::connect(s.addr).unwrap();
    half.write_all(b"GET /b HTTP/1.1\r\nHo").unwrap();
    // Init cannot have returned: the hold file is still there.
    let again = exchange(s.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(again.ends_with("loading\n"), "{again}");
    assert!(!s.log().contains("ready: serving"), "{}", s.log());
    std::fs::remove_file(&hold).unwrap();
    assert!(
        s.wait_for_log("ready: serving", Duration::from_secs(30)),
        "{}",
        s.log()
    );
    half.write_all(b"st: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    for (name, mut conn) in [("whole", whole), ("half", half)] {
        conn.set_read_timeout(Some(Duration::from_secs(60)))
            .unwrap();
        let mut out = Vec::new();
        let _ = conn.read_to_end(&mut out);
        let text = String::from_utf8_lossy(&out);
        assert!(text.starts_with("HTTP/1.1 200 "), "{name}: {text}");
        assert!(text.ends_with("loaded 0\n"), "{name}: {text}");
    }
    assert_eq!(Client::connect(s.addr).get("/healthz").text(), "ok\n");
}

/// A request held while init runs hears 503 when init fails, and the
/// server exits 1 naming the failure.
#[test]
fn a_request_held_while_init_runs_hears_503_if_init_fails() {
    let hold = hold_file("failing");
    let mut s = slow_server(&hold, 0, &["--workers", "1"]);
    let mut held = TcpStream::connect(s.addr).unwrap();
    held.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    // Proof the worker took it: a probe after it is answered.
    let probe = exchange(s.addr, b"GET /healthz HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(probe.ends_with("loading\n"), "{probe}");
    std::fs::write(hold.with_extension("fail"), b"").unwrap();
    std::fs::remove_file(&hold).unwrap();
    held.set_read_timeout(Some(Duration::from_secs(60)))
        .unwrap();
    let mut out = Vec::new();
    let _ = held.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(text.starts_with("HTTP/1.1 503 "), "{text}\n{}", s.log());
    assert!(text.ends_with("the plugin failed to start\n"), "{text}");
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|st| st.code()), Some(1), "{}", s.log());
    assert!(s.log().contains("told to fail"), "{}", s.log());
}

/// Probes and requests on new connections while `s`'s worker `loading`
/// is in its init: every one is answered by a worker that serves (a
/// request the loading worker held would be answered only after its init,
/// so the first one it takes fails the test).
fn all_answered_by_serving_workers(s: &Server, loading: u32) {
    for i in 0..40 {
        let probe = exchange(
            s.addr,
            b"GET /healthz HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        );
        assert!(
            probe.ends_with("\r\n\r\nok\n"),
            "probe {i}: {probe:?}\n{}",
            s.log()
        );
        let get = exchange(
            s.addr,
            b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        );
        let body = get.rsplit("\r\n\r\n").next().unwrap_or("");
        assert!(
            body.starts_with("loaded ") && body != format!("loaded {loading}\n"),
            "request {i}: {get:?}\n{}",
            s.log()
        );
    }
}

/// A worker respawned after a crash loads beside a ready sibling: it
/// leaves the listener to the sibling, so no probe hears 503 and no
/// request waits for its init.
#[test]
fn a_worker_loading_beside_a_ready_sibling_leaves_the_traffic_to_it() {
    let hold = hold_file("siblings");
    std::fs::remove_file(&hold).unwrap();
    let s = slow_server(&hold, 1, &["--workers", "2"]);
    assert!(
        s.wait_for_log("ready: serving", Duration::from_secs(30)),
        "{}",
        s.log()
    );
    std::fs::write(&hold, b"").unwrap();
    let victim = s.worker_pids()[0];
    // SAFETY: killing a worker of a server this test started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    assert_eq!(
        s.wait_for_log_count("slow_init: worker 0 loading", 2, Duration::from_secs(30)),
        2,
        "{}",
        s.log()
    );
    all_answered_by_serving_workers(&s, 0);
    std::fs::remove_file(&hold).unwrap();
    assert_eq!(
        s.wait_for_log_count("serving slow_init", 3, Duration::from_secs(30)),
        3,
        "{}",
        s.log()
    );
}

/// SIGHUP with one worker: its replacement loads while it serves on, and
/// every probe and request meanwhile is the old worker's (fork and spawn).
#[test]
fn a_reload_leaves_the_traffic_to_the_worker_it_replaces() {
    for (name, extra) in [
        ("reload-fork", &[][..]),
        ("reload-spawn", &["--spawn-workers"][..]),
    ] {
        let hold = hold_file(name);
        std::fs::remove_file(&hold).unwrap();
        let mut args = vec!["--workers", "1"];
        args.extend_from_slice(extra);
        let s = slow_server(&hold, 0, &args);
        assert!(
            s.wait_for_log("ready: serving", Duration::from_secs(30)),
            "{}",
            s.log()
        );
        std::fs::write(&hold, b"").unwrap();
        s.signal(libc::SIGHUP);
        assert_eq!(
            s.wait_for_log_count("slow_init: worker 0 loading", 2, Duration::from_secs(30)),
            2,
            "{name}: {}",
            s.log()
        );
        // Both workers are index 0: the bodies cannot tell them apart, but
        // a request the new one held would not be answered before the hold
        // file goes, and a probe it took would say `loading`.
        all_answered_by_serving_workers(&s, u32::MAX);
        std::fs::remove_file(&hold).unwrap();
        assert!(
            s.wait_for_log("worker 0 replaced", Duration::from_secs(30)),
            "{name}: {}",
            s.log()
        );
    }
}
