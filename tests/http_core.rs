//! The HTTP/1.1 core over real sockets, with the hello_c plugin.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::{Client, hello_c, raw_exchange, status_of};

#[test]
fn get_answers_with_date_and_server_headers() {
    let s = hello_c(&[]);
    let r = support::get(s.addr, "/");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"hello, world\n");
    assert_eq!(r.header("server"), Some("m0serve"));
    assert!(
        r.header("date")
            .is_some_and(|d| d.ends_with(" GMT") && d.len() == 29),
        "{:?}",
        r.header("date")
    );
    assert_eq!(r.header("content-length"), Some("13"));
}

#[test]
fn keep_alive_serves_many_requests_on_one_connection() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    for _ in 0..50 {
        let r = c.get("/");
        assert_eq!(r.status, 200);
        assert_eq!(r.header("connection"), None);
    }
}

#[test]
fn pipelined_requests_are_answered_in_order() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    // A slow request first: the fast ones behind it must not overtake it.
    c.send(
        b"GET /sleep?ms=200 HTTP/1.1\r\nHost: t\r\n\r\nGET /status/201 HTTP/1.1\r\nHost: t\r\n\r\n\
          POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\n\r\nabcGET /status/202 HTTP/1.1\r\nHost: t\r\n\r\n",
    );
    let statuses: Vec<u16> = (0..4)
        .map(|_| c.read_response(false).unwrap().status)
        .collect();
    assert_eq!(statuses, [200, 201, 200, 202]);
}

#[test]
fn content_length_and_chunked_bodies_are_echoed() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    let body: Vec<u8> = (0..1_000_000u32).map(|i| (i * 7 % 251) as u8).collect();
    let r = c.request("POST", "/echo", &[], &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.body, body);

    // Chunked, split across writes at awkward places, with an extension and
    // a trailer.
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n5;x=y\r\nhel");
    std::thread::sleep(Duration::from_millis(50));
    c.send(b"lo\r\n6\r\n wor");
    std::thread::sleep(Duration::from_millis(50));
    c.send(b"ld\r\n0\r\nTrailer-A: 1\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.text(), "hello world");
    // The connection is still usable and the next request inherits nothing.
    let r = c.get("/headers");
    assert_eq!(r.text(), "Host: t\n");
}

#[test]
fn chunked_response_when_the_plugin_gives_no_length() {
    let s = hello_c(&[]);
    let r = support::get(s.addr, "/stream");
    assert!(r.chunked);
    assert_eq!(r.text(), "chunk 0\nchunk 1\nchunk 2\nchunk 3\nchunk 4\n");
}

#[test]
fn head_has_the_length_but_no_body() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    let r = c.request("HEAD", "/", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length"), Some("13"));
    // The next response on the connection parses cleanly: no stray body bytes.
    assert_eq!(c.get("/").body, b"hello, world\n");
}

#[test]
fn expect_100_continue() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 4\r\nExpect: 100-continue\r\n\r\n");
    let interim = c.read_response(false).unwrap();
    assert_eq!(interim.status, 100);
    c.send(b"ping");
    let r = c.read_response(false).unwrap();
    assert_eq!((r.status, r.text().as_str()), (200, "ping"));
}

#[test]
fn oversized_body_is_refused_before_it_is_sent() {
    let s = hello_c(&["--max-body", "1k"]);
    let mut c = Client::connect(s.addr);
    c.send(b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 1048576\r\nExpect: 100-continue\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 413);
    assert_eq!(r.header("connection"), Some("close"));
    // The body names the limit and what raises it.
    let text = r.text();
    assert!(
        text.contains("at most 1024 bytes") && text.contains("--max-body / M0_MAX_BODY"),
        "{text}"
    );
    assert!(c.is_closed(Duration::from_secs(5)));
    // Chunked bodies count decoded bytes.
    let out = raw_exchange(
        s.addr,
        b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\n800\r\n",
    );
    assert_eq!(status_of(&out), 413);
    // Said once in the log, however many are refused.
    assert!(s.wait_for_log("was refused with 413", Duration::from_secs(5)));
    assert_eq!(s.log_count("was refused with 413"), 1, "{}", s.log());
}

#[test]
fn the_default_body_limit_passes_an_ordinary_upload() {
    // 20 MiB: more than the 4 MiB the limit once was (a photo, a PDF).
    let s = hello_c(&[]);
    let body: Vec<u8> = (0..20 * 1024 * 1024u32).map(|i| (i % 251) as u8).collect();
    let mut c = Client::connect(s.addr);
    let r = c.request("POST", "/echo", &[], &body);
    assert_eq!(r.status, 200);
    assert_eq!(r.body.len(), body.len());
}

#[test]
fn http10_closes_unless_keep_alive_is_asked() {
    let s = hello_c(&[]);
    let out = raw_exchange(s.addr, b"GET / HTTP/1.0\r\n\r\n");
    assert!(
        out.starts_with(b"HTTP/1.0 200 OK\r\n"),
        "{}",
        String::from_utf8_lossy(&out)
    );
    assert!(out.ends_with(b"hello, world\n"));

    let mut c = Client::connect(s.addr);
    c.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("connection"), Some("keep-alive"));
    c.send(b"GET / HTTP/1.0\r\nConnection: keep-alive\r\n\r\n");
    assert_eq!(c.read_response(false).unwrap().status, 200);

    // A streamed body on 1.0 is delimited by close.
    let out = raw_exchange(
        s.addr,
        b"GET /stream HTTP/1.0\r\nConnection: keep-alive\r\n\r\n",
    );
    let text = String::from_utf8_lossy(&out);
    assert!(
        !text.contains("Transfer-Encoding") && text.ends_with("chunk 4\n"),
        "{text}"
    );
}

#[test]
fn connection_close_is_honoured() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    c.send(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.header("connection"), Some("close"));
    assert!(c.is_closed(Duration::from_secs(5)));
}

#[test]
fn bad_requests_get_a_precise_status_and_the_connection_closes() {
    let s = hello_c(&[]);
    let cases: &[(&[u8], u16)] = &[
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3\r\nContent-Length: 3\r\n\r\nabc", 400),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: 3x\r\n\r\nabc", 400),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked, gzip\r\n\r\n", 400),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip, chunked\r\n\r\n", 501),
        (b"POST /echo HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: chunked\r\n\r\nfffffffffffffffffff\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\rX: y\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-A : y\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t\r\nX-A: y\r\n folded\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n", 400),
        (b"GET / HTTP/2.0\r\nHost: t\r\n\r\n", 505),
        (b"GET / HTTP/1.1\r\nHost: t\r\nExpect: coffee\r\n\r\n", 417),
        (b"BAD\x01 / HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        // RFC 9112 sections 3 and 3.2: single spaces, an ASCII target, a
        // Host that is uri-host[:port].
        (b"GET  / HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"GET /  HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"GET / HTTP/1.1 \r\nHost: t\r\n\r\n", 400),
        (b"GET /caf\xc3\xa9 HTTP/1.1\r\nHost: t\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: a b\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: t:80:80\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: user@t\r\n\r\n", 400),
    ];
    for (bytes, want) in cases {
        let out = raw_exchange(s.addr, bytes);
        assert_eq!(
            status_of(&out),
            *want,
            "for {:?}: {}",
            String::from_utf8_lossy(bytes),
            String::from_utf8_lossy(&out)
        );
        if *want != 200 {
            assert!(String::from_utf8_lossy(&out).contains("Connection: close"));
        }
    }
    // The worker is still serving.
    assert_eq!(support::get(s.addr, "/").status, 200);
}

#[test]
fn limits_have_flags_and_statuses() {
    let s = hello_c(&[
        "--max-uri",
        "100",
        "--max-header-bytes",
        "1k",
        "--max-headers",
        "5",
    ]);
    let long_uri = format!("GET /{} HTTP/1.1\r\nHost: t\r\n\r\n", "a".repeat(200));
    assert_eq!(status_of(&raw_exchange(s.addr, long_uri.as_bytes())), 414);
    let big_header = format!(
        "GET / HTTP/1.1\r\nHost: t\r\nX: {}\r\n\r\n",
        "v".repeat(2000)
    );
    assert_eq!(status_of(&raw_exchange(s.addr, big_header.as_bytes())), 431);
    let many = "GET / HTTP/1.1\r\nHost: t\r\nA: 1\r\nB: 1\r\nC: 1\r\nD: 1\r\nE: 1\r\nF: 1\r\n\r\n";
    assert_eq!(status_of(&raw_exchange(s.addr, many.as_bytes())), 431);
}

#[test]
fn slow_head_gets_408_and_idle_connections_close() {
    let s = hello_c(&["--header-timeout", "0.5", "--idle-timeout", "0.7"]);
    // Slowloris: part of a head, then nothing.
    let mut slow = TcpStream::connect(s.addr).unwrap();
    slow.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    slow.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n").unwrap();
    let mut out = Vec::new();
    let _ = slow.read_to_end(&mut out);
    assert_eq!(status_of(&out), 408, "{}", String::from_utf8_lossy(&out));

    // Idle keep-alive: closed silently after the idle timeout.
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").status, 200);
    let started = Instant::now();
    assert!(c.is_closed(Duration::from_secs(10)));
    // Closed by the idle timer, not by the header timer of a fresh request.
    assert!(started.elapsed() >= Duration::from_millis(500));
}

#[test]
fn keep_alive_request_cap_closes_the_connection() {
    let s = hello_c(&["--max-keepalive-requests", "3"]);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").header("connection"), None);
    assert_eq!(c.get("/").header("connection"), None);
    assert_eq!(c.get("/").header("connection"), Some("close"));
    assert!(c.is_closed(Duration::from_secs(5)));
}

#[test]
fn plugin_error_codes_map_to_statuses_and_status_routes_pass_through() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/missing").status, 404);
    assert_eq!(c.get("/status/418").status, 418);
    let r = c.get("/status/204");
    assert_eq!((r.status, r.header("content-length")), (204, None));
    assert_eq!(c.get("/").status, 200);
}

#[test]
fn a_slow_handler_does_not_stall_other_connections() {
    let s = hello_c(&[]);
    let addr = s.addr;
    let slow: Vec<_> = (0..2)
        .map(|_| {
            std::thread::spawn(move || {
                let r = support::get(addr, "/sleep?ms=1500");
                (r.status, Instant::now())
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let fast = support::get(addr, "/");
    let fast_done = Instant::now();
    assert_eq!(fast.status, 200);
    for handle in slow {
        let (status, done) = handle.join().unwrap();
        assert_eq!(status, 200);
        assert!(
            fast_done < done,
            "the fast request waited behind a slow one"
        );
    }
}

#[test]
fn request_headers_are_handed_over_as_sent() {
    let s = hello_c(&[]);
    let mut c = Client::connect(s.addr);
    c.send(
        b"GET /headers HTTP/1.1\r\nHost: t\r\nX-Mixed-Case: Va lue\r\nx-dup: 1\r\nx-dup: 2\r\n\r\n",
    );
    let r = c.read_response(false).unwrap();
    assert_eq!(
        r.text(),
        "Host: t\nX-Mixed-Case: Va lue\nx-dup: 1\nx-dup: 2\n"
    );
}

#[test]
fn a_full_queue_answers_503_with_retry_after() {
    let s = hello_c(&["--blocking-threads", "1", "--queue-depth", "1"]);
    let addr = s.addr;
    // One request occupies the only thread, one waits in the queue. (Only
    // /sleep reaches the pool: hello_c answers the rest on the loop.)
    let busy = std::thread::spawn(move || support::get(addr, "/sleep?ms=800").status);
    std::thread::sleep(Duration::from_millis(150));
    let queued = std::thread::spawn(move || support::get(addr, "/sleep?ms=1").status);
    std::thread::sleep(Duration::from_millis(150));
    let mut c = Client::connect(addr);
    c.send(b"GET /sleep?ms=1 HTTP/1.1\r\nHost: t\r\n\r\n");
    let r = c.read_response(false).unwrap();
    assert_eq!(r.status, 503);
    assert_eq!(r.header("retry-after"), Some("1"));
    assert_eq!(busy.join().unwrap(), 200);
    assert_eq!(queued.join().unwrap(), 200);
    // Once the queue has room the server answers normally.
    assert_eq!(support::get(addr, "/").status, 200);
}
