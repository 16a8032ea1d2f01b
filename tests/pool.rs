//! The handler pool with the WSGI plugin: GIL parallelism judged by ratios
//! measured in one run, and fairness judged by order.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

// These tests measure time: `serial` keeps them from running beside each
// other.
use crate::support::{self, Server, serial};

fn pool_server(threads: &str) -> Server {
    let fixed = ["--blocking-threads", threads];
    let extra: &[&str] = if threads == "adaptive" { &[] } else { &fixed };
    Server::start_cmd(crate::support::wsgi::pool_app_command(extra))
}

fn timed_get(addr: SocketAddr, path: &str) -> Duration {
    let started = Instant::now();
    let r = support::get(addr, path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    started.elapsed()
}

/// One call of a hashing view as the app saw it.
#[derive(Debug, Clone, Copy)]
struct Call {
    start_ns: u64,
    end_ns: u64,
    /// Time its thread was on a CPU or waiting for one, over the call.
    runnable_ns: u64,
}

impl Call {
    /// Share of the call's wall time its thread could run: near 1 whatever
    /// other processes do (waiting for a CPU counts), well under 1 when it
    /// slept waiting for the GIL.
    fn runnable(&self) -> f64 {
        self.runnable_ns as f64 / (self.end_ns - self.start_ns).max(1) as f64
    }
}

fn call(addr: SocketAddr, path: &str) -> Call {
    let r = support::get(addr, path);
    assert_eq!(r.status, 200, "{path}: {}", r.text());
    let fields: Vec<u64> = r
        .text()
        .split_whitespace()
        .map(|f| f.parse().expect("a number"))
        .collect();
    let [_, start_ns, end_ns, runnable_ns] = fields[..] else {
        panic!("{path}: {}", r.text());
    };
    Call {
        start_ns,
        end_ns,
        runnable_ns,
    }
}

/// Two calls sent at once: whether they were inside the app at the same
/// time, and the lower of their runnable shares. Each the median of 3.
fn two_at_once(addr: SocketAddr, path: &str) -> (bool, f64) {
    call(addr, path); // calibrates the view's fixed work
    let mut overlapped = 0;
    let mut shares: Vec<f64> = (0..3)
        .map(|_| {
            let a = std::thread::spawn({
                let path = path.to_string();
                move || call(addr, &path)
            });
            let b = call(addr, path);
            let a = a.join().unwrap();
            if a.start_ns.max(b.start_ns) < a.end_ns.min(b.end_ns) {
                overlapped += 1;
            }
            a.runnable().min(b.runnable())
        })
        .collect();
    shares.sort_by(f64::total_cmp);
    (overlapped >= 2, shares[1])
}

#[test]
fn a_view_that_releases_the_gil_runs_in_parallel_and_one_that_holds_it_does_not() {
    let _serial = serial();
    // Judged from inside the app, by the kernel's accounting of each
    // thread: with the GIL released, both threads stay runnable the whole
    // call (on a CPU or waiting for one, which other processes decide);
    // with it held, each sleeps while the other has it. Wall time would
    // mix in how many CPUs other processes leave idle.
    let two = pool_server("2");
    let (release_overlap, release) = two_at_once(two.addr, "/release");
    let (hold_overlap, hold) = two_at_once(two.addr, "/hold");
    drop(two);
    let one = pool_server("1");
    let (release_1_overlap, _) = two_at_once(one.addr, "/release");
    let (hold_1_overlap, _) = two_at_once(one.addr, "/hold");
    eprintln!(
        "two at once, share of the call each thread could run: 2 threads release {release:.2} \
         (overlapped {release_overlap}), hold {hold:.2} (overlapped {hold_overlap}); \
         1 thread overlapped: release {release_1_overlap}, hold {hold_1_overlap}"
    );
    assert!(
        release_overlap && hold_overlap,
        "two threads took both calls at once"
    );
    assert!(
        release > 0.85,
        "the GIL-releasing view did not run in parallel: runnable {release:.2} of its call"
    );
    assert!(
        hold < 0.75,
        "the GIL-holding view ran in parallel: runnable {hold:.2} of its call"
    );
    assert!(
        !release_1_overlap && !hold_1_overlap,
        "one thread serialises both"
    );
}

/// Wall time of two requests at once over one alone, the median of 3.
fn two_over_one(addr: SocketAddr, path: &str) -> f64 {
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
            timed_get(addr, path);
            a.join().unwrap();
            started.elapsed().as_secs_f64()
        })
        .collect();
    ones.sort_by(f64::total_cmp);
    twos.sort_by(f64::total_cmp);
    twos[1] / ones[1]
}

/// The same judgement with views that block instead of compute: a 200 ms
/// sleep needs no CPU, so the wall-time ratio depends on the GIL alone,
/// not on how many CPUs other processes leave idle.
#[test]
fn a_call_that_blocks_without_the_gil_overlaps_and_one_that_blocks_holding_it_does_not() {
    let _serial = serial();
    let server = pool_server("2");
    let release = two_over_one(server.addr, "/block-release");
    let hold = two_over_one(server.addr, "/block-hold");
    eprintln!("two at once / one alone, blocking 200 ms: release {release:.2} hold {hold:.2}");
    assert!(
        release < 1.3,
        "the GIL-free block did not overlap: {release:.2}"
    );
    assert!(hold > 1.7, "the GIL-holding block overlapped: {hold:.2}");
}

#[test]
fn no_request_is_overtaken_by_many_later_ones() {
    let _serial = serial();
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
    eprintln!("served order (worst overtaking {worst}): {served:?}");
    assert!(
        worst <= 8,
        "a request was overtaken by {worst} later ones: {served:?}"
    );
}
