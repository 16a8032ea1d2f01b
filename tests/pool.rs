//! The handler pool with the WSGI plugin: GIL parallelism judged by ratios
//! measured in one run, and fairness judged by order.

#[path = "wsgi_http.rs"]
mod wsgi_http;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use wsgi_http::support::{self, Server};

/// These tests measure time: keep them from running beside each other.
static SERIAL: Mutex<()> = Mutex::new(());

fn pool_server(threads: &str) -> Server {
    let fixed = ["--blocking-threads", threads];
    let extra: &[&str] = if threads == "adaptive" { &[] } else { &fixed };
    Server::start_cmd(wsgi_http::pool_app_command(extra))
}

fn timed_get(addr: SocketAddr, path: &str) -> Duration {
    let started = Instant::now();
    let r = support::get(addr, path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    started.elapsed()
}

/// Wall time of one request, and of two at once, each the median of 3.
fn one_and_two(addr: SocketAddr, path: &str) -> f64 {
    timed_get(addr, path); // calibrates the view's fixed work
    let mut ones: Vec<f64> = (0..3)
        .map(|_| timed_get(addr, path).as_secs_f64())
        .collect();
    let mut twos: Vec<f64> = (0..3)
        .map(|_| {
            let started = Instant::now();
            let a = std::thread::spawn({
                let path = path.to_string();
                move || timed_get(addr, &path)
            });
            let b = timed_get(addr, path);
            let _ = (a.join().unwrap(), b);
            started.elapsed().as_secs_f64()
        })
        .collect();
    ones.sort_by(f64::total_cmp);
    twos.sort_by(f64::total_cmp);
    twos[1] / ones[1]
}

/// The two-at-once / one-alone ratios of a GIL-releasing and a GIL-holding
/// view, on one server with `threads` handler threads.
fn release_and_hold(threads: &str, release: &str, hold: &str) -> (f64, f64) {
    let server = pool_server(threads);
    (
        one_and_two(server.addr, release),
        one_and_two(server.addr, hold),
    )
}

#[test]
fn a_view_that_releases_the_gil_runs_in_parallel_and_one_that_holds_it_does_not() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (release, hold) = release_and_hold("2", "/release", "/hold");
    let (release_1, hold_1) = release_and_hold("1", "/release", "/hold");
    eprintln!(
        "two at once / one alone: 2 threads release {release:.2} hold {hold:.2}; 1 thread release {release_1:.2} hold {hold_1:.2}"
    );
    assert!(
        release < 1.45,
        "the GIL-releasing view did not run in parallel: {release:.2}"
    );
    assert!(hold > 1.6, "the GIL-holding view overlapped: {hold:.2}");
    assert!(
        hold - release > 0.35,
        "no clear gap: release {release:.2}, hold {hold:.2}"
    );
    assert!(
        release_1 > 1.6 && hold_1 > 1.6,
        "one thread serialises both: {release_1:.2}, {hold_1:.2}"
    );
}

/// The same judgement with views that block instead of compute: the ratio
/// then depends on the GIL alone, not also on how many CPUs are idle.
#[test]
fn a_call_that_blocks_without_the_gil_overlaps_and_one_that_blocks_holding_it_does_not() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let (release, hold) = release_and_hold("2", "/block-release", "/block-hold");
    eprintln!("two at once / one alone, blocking 200 ms: release {release:.2} hold {hold:.2}");
    assert!(
        release < 1.3,
        "the GIL-free block did not overlap: {release:.2}"
    );
    assert!(hold > 1.7, "the GIL-holding block overlapped: {hold:.2}");
}

#[test]
fn no_request_is_overtaken_by_many_later_ones() {
    let _serial = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let s = pool_server("adaptive");
    let n = 64;
    let mut conns: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    support::get(s.addr, "/seq"); // warm: the first call imports nothing new
    // Sent in order i = 0..n, as fast as the client can.
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        c.write_all(b"GET /seq HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    let mut served: Vec<u64> = Vec::with_capacity(n);
    for c in &mut conns {
        let mut buf = Vec::new();
        let mut chunk = [0u8; 512];
        while !(buf.windows(4).any(|w| w == b"\r\n\r\n") && buf.ends_with(b"\n") && buf.len() > 4) {
            let k = c.read(&mut chunk).unwrap();
            assert!(k > 0);
            buf.extend_from_slice(&chunk[..k]);
        }
        let text = String::from_utf8_lossy(&buf).into_owned();
        served.push(
            text.rsplit("\r\n\r\n")
                .next()
                .unwrap()
                .trim()
                .parse()
                .unwrap(),
        );
    }
    // For each request, how many requests sent after it were served first.
    let worst = (0..n)
        .map(|i| (i + 1..n).filter(|&j| served[j] < served[i]).count())
        .max()
        .unwrap();
    assert!(
        worst <= 8,
        "a request was overtaken by {worst} later ones: {served:?}"
    );
}
