//! Leak guard: a worker serving 20k requests of the conformance app grows
//! less than 4 MiB after the first 1k (which warm caches and the allocator).

use crate::support::wsgi::{Conn, WsgiServer, get, rss_kib};

/// One round of requests touching the hot paths: sized and streamed bodies,
/// input reading, header parsing, and an error (500 with a traceback).
fn round(conn: &mut Conn, i: usize) {
    let body = vec![b'x'; 1 + i % 2000];
    let r = match i % 8 {
        0 => conn.request("GET", "/", &[], b""),
        1 => conn.request(
            "GET",
            "/environ?x=1",
            &[("X-Test", "a"), ("X-Test", "b")],
            b"",
        ),
        2 => conn.request("POST", "/input/echo", &[], &body),
        3 => conn.request("POST", "/input/readline", &[], b"a\nb\nc"),
        4 => conn.request("GET", "/body/list", &[], b""),
        5 => conn.request("GET", "/write", &[], b""),
        6 => conn.request("GET", "/body/content-length", &[], b""),
        _ => conn.request("GET", "/file-wrapper", &[], b""),
    };
    assert_eq!(r.status, 200, "request {i}");
    if i % 100 == 99 {
        let r = conn.request("GET", "/raise", &[], b"");
        assert_eq!(r.status, 500);
    }
}

#[test]
fn worker_rss_is_flat_over_20k_requests() {
    // A fixed pool: thread stacks and per-thread arenas are not leaks, and
    // this test must not depend on what the adaptive controller decides.
    let srv = WsgiServer::start(
        "conformance:application",
        &["--workers", "1", "--blocking-threads", "2"],
    );
    let worker: u32 = get(srv.port, "/pid").text().trim().parse().unwrap();
    // Keep-alive connections, a fresh one every 500 requests.
    let mut conn = Conn::open(srv.port);
    let mut i = 0;
    let mut serve = |n: usize, conn: &mut Conn| {
        for _ in 0..n {
            if i % 500 == 499 {
                *conn = Conn::open(srv.port);
            }
            round(conn, i);
            i += 1;
        }
    };
    serve(1_000, &mut conn);
    let after_1k = rss_kib(worker).expect("worker RSS");
    serve(19_000, &mut conn);
    let after_20k = rss_kib(worker).expect("worker RSS");
    let grown = after_20k.saturating_sub(after_1k);
    eprintln!("worker RSS: {after_1k} KiB after 1k, {after_20k} KiB after 20k (+{grown} KiB)");
    assert!(
        grown < 4 * 1024,
        "worker RSS grew {grown} KiB from 1k to 20k requests"
    );
    assert_eq!(
        get(srv.port, "/pid").text().trim().parse::<u32>().unwrap(),
        worker
    );
}
