//! Plugins written on the Rust SDK (`sdk/`, crate m0serve-plugin): hello_rs
//! answers every route as hello_c does, and each fault of a plugin (an
//! error, a panic in any hook, a bad header, a body longer or shorter than
//! declared) gets a precise status and log line over real sockets.

use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Client, Server, command, plugin, raw_exchange, status_of};

fn serve(name: &str, extra: &[&str]) -> Server {
    let p = plugin(name);
    let mut args = vec!["--plugin", p.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// Status, headers (without the Date, which changes) and body.
fn answer(addr: std::net::SocketAddr, raw: &[u8]) -> (u16, Vec<String>, Vec<u8>) {
    let mut c = Client::connect(addr);
    c.send(raw);
    let head_request = raw.starts_with(b"HEAD ");
    let r = c.read_response(head_request).expect("a response");
    let headers = r
        .headers
        .iter()
        .filter(|(n, _)| !n.eq_ignore_ascii_case("date"))
        .map(|(n, v)| format!("{n}: {v}"))
        .collect();
    (r.status, headers, r.body)
}

#[test]
fn hello_rs_answers_every_route_exactly_as_hello_c() {
    let c = serve("hello_c", &[]);
    let rs = serve("hello_rs", &[]);
    let requests: &[&[u8]] = &[
        b"GET / HTTP/1.1\r\nHost: t\r\n\r\n",
        b"HEAD / HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET / HTTP/1.0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 11\r\n\r\nhello there",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n",
        b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 0\r\n\r\n",
        b"GET /headers HTTP/1.1\r\nHost: t\r\nX-One: 1\r\nx-MiXeD: Case Kept\r\n\r\n",
        b"GET /status/204 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /status/418 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /status/100 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /status/2x4 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /status/2000 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /stream HTTP/1.0\r\n\r\n",
        b"GET /sleep?ms=5 HTTP/1.1\r\nHost: t\r\n\r\n",
        b"GET /nowhere HTTP/1.1\r\nHost: t\r\n\r\n",
    ];
    for raw in requests {
        let from_c = answer(c.addr, raw);
        let from_rs = answer(rs.addr, raw);
        assert_eq!(
            from_c,
            from_rs,
            "the twins differ on {:?}",
            String::from_utf8_lossy(raw)
        );
    }
    // The answers are the routes', not only equal to each other.
    assert_eq!(answer(rs.addr, requests[0]).2, b"hello, world\n");
    assert_eq!(answer(rs.addr, requests[3]).2, b"hello there");
    assert_eq!(answer(rs.addr, requests[4]).2, b"abcde");
    assert_eq!(answer(rs.addr, requests[8]).0, 418);
    assert_eq!(answer(rs.addr, requests[9]).0, 500);
    assert_eq!(answer(rs.addr, requests[15]).0, 404);
    let stream = answer(rs.addr, requests[12]);
    assert!(stream.1.iter().any(|h| h == "Transfer-Encoding: chunked"));
    assert_eq!(stream.2, b"chunk 0\nchunk 1\nchunk 2\nchunk 3\nchunk 4\n");
    // Each worker answers /pid with its own pid.
    let pid =
        String::from_utf8(answer(rs.addr, b"GET /pid HTTP/1.1\r\nHost: t\r\n\r\n").2).unwrap();
    assert_eq!(pid.trim().parse::<i32>().unwrap(), rs.worker_pids()[0]);
}

#[test]
fn hello_rs_declares_itself_as_hello_c_does() {
    let doctor = |name: &str| -> serde_json::Value {
        let p = plugin(name);
        let out = command(&["--doctor", "--plugin", p.to_str().unwrap()])
            .output_bounded()
            .expect("run --doctor");
        assert_eq!(
            out.status.code(),
            Some(0),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("doctor JSON")
    };
    let (c, rs) = (doctor("hello_c"), doctor("hello_rs"));
    for key in [
        "call_model",
        "max_concurrency",
        "process_lock",
        "needs_exec",
        "compute_threads",
        "declares_batch",
        "declares_inline",
    ] {
        assert_eq!(c["plugin"][key], rs["plugin"][key], "plugin.{key}");
    }
    assert_eq!(rs["plugin"]["name"], "hello_rs");
    // The SDK declares the least minor the plugin needs (inline calls:
    // 1.1), so it loads on every host since; hello_c declares its header's.
    assert_eq!(rs["plugin"]["abi"], "1.1");
    assert_eq!(
        c["plugin"]["abi"],
        format!("1.{}", m0serve_abi::M0_ABI_MINOR)
    );
    assert_eq!(rs["topology"]["inline_calls"], true);
    // A fact stated through the SDK reaches the doctor.
    assert_eq!(rs["plugin"]["facts"]["hello_rs.blocking_routes"], "/sleep");
}

#[test]
fn a_crashing_hello_rs_worker_is_replaced() {
    let s = serve("hello_rs", &["--workers", "2"]);
    let out = raw_exchange(s.addr, b"GET /crash HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(out.is_empty(), "{}", String::from_utf8_lossy(&out));
    assert!(
        s.wait_for_log("replacing it", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    assert_eq!(support::get(s.addr, "/").status, 200);
}

#[test]
fn errors_from_handle_become_their_statuses() {
    let s = serve("sdk_faults", &[]);
    for status in [400, 404, 413, 422, 503, 504, 500] {
        let r = support::get(s.addr, &format!("/error/{status}"));
        assert_eq!(r.status, status, "{}", s.log());
    }
    // The connection stays usable after an error answered before the head.
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/error/404").status, 404);
    assert_eq!(c.get("/").text(), "ok\n");
}

#[test]
fn a_panic_before_the_head_is_a_500_with_a_log_line_and_the_worker_lives() {
    let s = serve("sdk_faults", &[]);
    let worker = s.worker_pids();
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/panic").status, 500);
    assert!(
        s.wait_for_log(
            "sdk_faults: panicked in handle for GET /panic: boom before the head",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    // Same connection, same worker: nothing was torn down.
    assert_eq!(c.get("/").text(), "ok\n");
    assert_eq!(s.worker_pids(), worker);
    assert_eq!(s.log_count("replacing it"), 0);
}

#[test]
fn a_panic_after_the_head_cuts_the_response_off() {
    let s = serve("sdk_faults", &[]);
    let out = raw_exchange(s.addr, b"GET /panic-after-head HTTP/1.1\r\nHost: t\r\n\r\n");
    let text = String::from_utf8_lossy(&out);
    assert_eq!(status_of(&out), 200, "{text}");
    assert!(text.contains("Content-Length: 10"), "{text}");
    // The three bytes written, then the close: 7 short of the declared 10.
    assert!(text.ends_with("\r\n\r\nabc"), "{text}");
    assert!(
        s.wait_for_log(
            "panicked in handle for GET /panic-after-head: boom after the head",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    assert_eq!(support::get(s.addr, "/").status, 200);
}

#[test]
fn a_bad_header_or_status_is_refused_with_500_and_a_log_line_naming_it() {
    let s = serve("sdk_faults", &[]);
    for (path, line) in [
        ("/bad-header", "response header \"X-Bad\" is refused"),
        (
            "/host-header",
            "response header \"Content-Length\" is refused (M0_ERR_INVALID): the server writes that header itself",
        ),
        ("/bad-status", "response status 99 is refused"),
    ] {
        let r = support::get(s.addr, path);
        assert_eq!(r.status, 500, "{path}");
        assert!(
            !r.text().contains("no"),
            "{path}: the refused body went out"
        );
        assert!(
            s.wait_for_log(line, Duration::from_secs(10)),
            "{path}:\n{}",
            s.log()
        );
    }
}

#[test]
fn a_body_longer_or_shorter_than_declared_is_cut_at_the_length_and_closed() {
    let s = serve("sdk_faults", &[]);
    let mut c = Client::connect(s.addr);
    let r = c.get("/overwrite");
    assert_eq!((r.status, r.body.as_slice()), (200, &b"01234"[..]));
    assert!(
        c.is_closed(Duration::from_secs(10)),
        "kept alive after an overlong body"
    );
    assert!(
        s.wait_for_log(
            "wrote past the Content-Length it declared; 5 bytes dropped",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    let out = raw_exchange(s.addr, b"GET /short HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(
        String::from_utf8_lossy(&out).ends_with("\r\n\r\nabc"),
        "{}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn defer_from_a_handler_thread_is_a_500_with_the_hosts_warning() {
    let s = serve("sdk_faults", &[]);
    assert_eq!(support::get(s.addr, "/defer").status, 500);
    assert!(s.wait_for_log(
        "returned M0_DEFER from a handler thread",
        Duration::from_secs(10)
    ));
}

/// Runs the fault plugin with `arg` until it exits (they all stop it).
fn run_to_exit(arg: &str) -> (Option<i32>, String) {
    let p = plugin("sdk_faults");
    let out = command(&["--plugin", p.to_str().unwrap(), arg])
        .output_bounded()
        .expect("run m0serve");
    let mut log = String::from_utf8_lossy(&out.stderr).into_owned();
    log.push_str(&String::from_utf8_lossy(&out.stdout));
    (out.status.code(), log)
}

#[test]
fn init_refusal_failure_and_panic_exit_78_1_and_1_with_the_message() {
    let (code, log) = run_to_exit("refuse-init");
    assert_eq!(code, Some(78), "{log}");
    assert!(
        log.contains("ARG refuse-init refuses the configuration; pass another ARG"),
        "{log}"
    );
    let (code, log) = run_to_exit("fail-init");
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("ARG fail-init fails to start"), "{log}");
    let (code, log) = run_to_exit("panic-init");
    assert_eq!(code, Some(1), "{log}");
    assert!(
        log.contains("sdk_faults: panicked during init: boom in init"),
        "{log}"
    );
}

#[test]
fn a_panic_in_thread_start_stops_the_worker_with_a_log_line() {
    let (code, log) = run_to_exit("panic-thread-start");
    assert_ne!(code, Some(0), "{log}");
    assert!(
        log.contains("sdk_faults: panicked in thread_start on thread"),
        "{log}"
    );
    assert!(log.contains("thread_start failed"), "{log}");
}

#[test]
fn panics_in_thread_stop_and_shutdown_are_logged_and_the_drain_completes() {
    for (arg, line) in [
        (
            "panic-thread-stop",
            "sdk_faults: panicked in thread_stop on thread",
        ),
        (
            "panic-shutdown",
            "sdk_faults: panicked in shutdown: boom in shutdown",
        ),
    ] {
        let mut s = serve("sdk_faults", &[arg]);
        assert_eq!(support::get(s.addr, "/").status, 200);
        s.signal(libc::SIGTERM);
        let status = s.wait_exit(Duration::from_secs(30));
        assert_eq!(
            status.and_then(|s| s.code()),
            Some(0),
            "{arg}:\n{}",
            s.log()
        );
        assert!(s.log().contains(line), "{arg}:\n{}", s.log());
    }
}

#[test]
fn an_sdk_plugin_names_its_models_sets_them_in_admit_and_records_its_metrics() {
    let p = plugin("sdk_faults");
    let mut cmd = command(&[
        "--plugin",
        p.to_str().unwrap(),
        "--metrics",
        "127.0.0.1:0",
        "small",
        "large",
    ]);
    cmd.env("M0_FAULTS_MODELS", "1");
    let s = Server::start_cmd(cmd);
    assert!(
        s.wait_for_log("(models small, large)", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    let mut c = Client::connect(s.addr);
    for _ in 0..3 {
        let r = c.get("/model?name=large");
        // Its own cost is in flight while it is handled; set_model outside
        // admit is the host's M0_ERR_STATE.
        assert_eq!(
            (r.status, r.text()),
            (200, "model=large in_flight=1 late=-101\n".into())
        );
    }
    assert_eq!(c.get("/model?name=small").status, 200);
    let metrics = s.metrics_addr();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let wanted = [
        "sdk_faults_requests_total{model=\"large\"} 3",
        "sdk_faults_requests_total{model=\"small\"} 1",
        "m0serve_requests_total{code=\"2xx\",model=\"large\"} 3",
    ];
    loop {
        let text = Client::connect(metrics).get("/metrics").text();
        if wanted.iter().all(|w| text.lines().any(|l| l == *w)) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{wanted:?} not in:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}
