//! Clients that hold connections without finishing: a head sent a byte at
//! a time (slowloris) and a client that never reads its responses. Each is
//! cut at its timeout while ordinary clients are served beside them.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::test_dir::TestDir;
use crate::support::{Client, hello_c, status_of};

/// 300 connections trickle a head a byte every 100 ms; the header timeout
/// (1 s, from the first byte) ends every one with 408 or a close, and 200
/// ordinary requests on another connection meanwhile are all answered.
#[test]
fn trickled_heads_are_cut_at_the_header_timeout_while_others_are_served() {
    let s = hello_c(&["--header-timeout", "1"]);
    let head = b"GET / HTTP/1.1\r\nHost: t\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n\r\n";
    let mut slow: Vec<Option<TcpStream>> = (0..300)
        .map(|_| {
            let c = TcpStream::connect(s.addr).unwrap();
            c.set_nonblocking(true).unwrap();
            Some(c)
        })
        .collect();
    let addr = s.addr;
    let normal = std::thread::spawn(move || {
        let mut c = Client::connect(addr);
        (0..200).filter(|_| c.get("/").status == 200).count()
    });
    // A byte a round to every slow connection still open, for as long as
    // the head lasts (longer than the timeout).
    let mut cut = 0;
    for &byte in head.iter() {
        for conn in slow.iter_mut() {
            let Some(c) = conn else { continue };
            if c.write_all(&[byte]).is_err() {
                *conn = None;
                cut += 1;
            }
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(normal.join().unwrap(), 200, "{}", s.log());
    // What each slow connection got: 408 or nothing, never an answer.
    let mut refused = 0;
    for c in slow.into_iter().flatten() {
        c.set_nonblocking(false).unwrap();
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let mut c = c;
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        let status = status_of(&out);
        assert!(
            status == 408 || out.is_empty(),
            "a slow head was answered {status}: {}",
            String::from_utf8_lossy(&out)
        );
        refused += 1;
    }
    assert_eq!(refused + cut, 300);
}

/// Each connection is cut at its own deadline, not with every other one
/// that falls due in the same quarter second. Twelve connections open in
/// one order and start their heads in the reverse one, 100 ms apart: their
/// 408s come in the order the heads began (latest-opened first). Sweeps
/// every 250 ms cut two or three at once, in the order they were opened,
/// and about six of the eleven neighbours came out reversed; one reversal
/// is allowed for a stall of the box.
#[test]
fn connections_are_cut_in_the_order_their_deadlines_fall() {
    // Two seconds: longer than the 1.2 s the heads take to begin, so every
    // one is cut by the timeout its first byte started, none by the one its
    // connection started with when accepted.
    let s = hello_c(&["--header-timeout", "2"]);
    let conns: Vec<TcpStream> = (0..12)
        .map(|_| TcpStream::connect(s.addr).unwrap())
        .collect();
    let arrived = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let mut readers = Vec::new();
    for (i, mut c) in conns.into_iter().enumerate().rev() {
        c.write_all(b"G").unwrap();
        let arrived = arrived.clone();
        readers.push(std::thread::spawn(move || {
            c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
            let mut out = Vec::new();
            let _ = c.read_to_end(&mut out);
            arrived.lock().unwrap().push(i);
            status_of(&out)
        }));
        std::thread::sleep(Duration::from_millis(100));
    }
    for r in readers {
        assert_eq!(r.join().unwrap(), 408, "{}", s.log());
    }
    // The heads began from 11 down to 0, and so should the cuts come.
    let order = arrived.lock().unwrap().clone();
    let reversed = order.windows(2).filter(|w| w[0] < w[1]).count();
    assert!(
        reversed <= 1,
        "cut in the order {order:?} ({reversed} neighbours reversed), not 11 down to 0"
    );
}

/// A client that pipelines requests and never reads gets only what the
/// kernel holds for it answered: its own receive buffer and at most
/// `TCP_NOTSENT_LOWAT` (16 KiB) unsent on the server's side. Without that
/// limit the server's send buffer grew to megabytes, and the worker
/// answered about 24,000 of these requests (3.6 MB) before the socket
/// refused more: work done for nobody while the clients that read waited.
#[test]
fn a_client_that_never_reads_gets_a_bounded_number_of_answers() {
    let mut s = hello_c(&["--idle-timeout", "60", "--max-keepalive-requests", "0"]);
    let mut hog = TcpStream::connect(s.addr).unwrap();
    // Blocked for this long: the server reads no more of our requests.
    hog.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
    let request = b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n".repeat(64);
    let mut sent = 0usize;
    while sent < 20_000_000 && hog.write_all(&request).is_ok() {
        sent += 64;
    }
    // Closed unread: what the kernel held is dropped, and the worker
    // learns it on its next write.
    drop(hog);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").status, 200);
    let log = s.stop_and_log();
    let served: usize = log
        .lines()
        .find_map(|l| {
            let (_, rest) = l.split_once("connection(s) accepted, ")?;
            rest.split_once(" request(s) served")?.0.parse().ok()
        })
        .unwrap_or_else(|| panic!("no closing line\n{log}"));
    eprintln!("never-reading client: {served} requests answered of {sent} sent");
    // About 1,000 here (150-byte answers); 24,000 without the limit.
    assert!(
        served > 10 && served < 5_000,
        "{served} answered of {sent}\n{log}"
    );
}

/// A client that sends many requests and never reads: once the socket
/// will take no more, the idle timeout (which also bounds a response the
/// client stops reading) closes it; another client is served meanwhile.
#[test]
fn a_client_that_never_reads_is_closed_at_the_idle_timeout() {
    let s = hello_c(&["--idle-timeout", "1", "--max-keepalive-requests", "0"]);
    let mut hog = TcpStream::connect(s.addr).unwrap();
    hog.set_write_timeout(Some(Duration::from_secs(5))).unwrap();
    let request = b"GET /stream HTTP/1.1\r\nHost: t\r\n\r\n";
    // Until our side's buffers are full too (or the server closes).
    let mut sent = 0usize;
    // Bounded far above what the socket buffers hold (about 10 MB here),
    // so the writes block and the idle timeout ends them.
    for _ in 0..2_000_000 {
        if hog.write_all(request).is_err() {
            break;
        }
        sent += 1;
    }
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").status, 200);
    // Now read: what was sent, then the end (a close, or a reset).
    hog.set_read_timeout(Some(Duration::from_secs(60))).unwrap();
    let mut buf = vec![0u8; 1 << 16];
    let mut got = 0usize;
    let mut answered = 0usize;
    let mut tail: Vec<u8> = Vec::new();
    let ended = loop {
        match hog.read(&mut buf) {
            Ok(0) => break true,
            Ok(n) => {
                got += n;
                // Count status lines, across read boundaries.
                tail.extend_from_slice(&buf[..n]);
                answered += tail.windows(9).filter(|w| w == b"HTTP/1.1 ").count();
                let keep = tail.len().saturating_sub(8);
                tail.drain(..keep);
            }
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break true,
            Err(_) => break false,
        }
    };
    assert!(
        ended,
        "the connection was never closed ({got} bytes read)\n{}",
        s.log()
    );
    // Closed for not reading: long before every request was answered.
    eprintln!("never-reading client: {answered} of {sent} requests answered before the close");
    assert!(
        answered > 0 && answered < sent,
        "{answered} of {sent} answered"
    );
    assert_eq!(c.get("/").status, 200, "{}", s.log());
}

/// Sends `body` (after its head) to `/echo` in pieces of `piece` bytes
/// every `every`, until the server answers or closes; returns the answer
/// and how many body bytes had been written when it came.
fn trickle_body(
    addr: std::net::SocketAddr,
    body: &[u8],
    piece: usize,
    every: Duration,
) -> (Vec<u8>, usize) {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    let mut c = TcpStream::connect(addr).unwrap();
    let head = format!(
        "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    );
    c.write_all(head.as_bytes()).unwrap();
    let sent = Arc::new(AtomicUsize::new(0));
    let mut writer = c.try_clone().unwrap();
    let (body_owned, sent_w) = (body.to_vec(), sent.clone());
    let w = std::thread::spawn(move || {
        for part in body_owned.chunks(piece) {
            if writer.write_all(part).is_err() {
                return;
            }
            sent_w.fetch_add(part.len(), Ordering::SeqCst);
            std::thread::sleep(every);
        }
    });
    c.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    let mut out = Vec::new();
    let mut buf = [0u8; 4096];
    // Until the whole answer is in (the echo's length is known) or the close.
    loop {
        match c.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.extend_from_slice(&buf[..n]),
        }
        if status_of(&out) == 200 && out.ends_with(body) {
            break;
        }
    }
    let at_answer = sent.load(Ordering::SeqCst);
    drop(c);
    let _ = w.join();
    (out, at_answer)
}

/// A body that never stalls as long as `--body-timeout` but trickles in
/// below `--body-min-rate` is cut with 408 long before its end, while a
/// body above the rate on the same server is served whole; with the rate
/// rule off (0) the same trickle is served, as before the rule existed.
#[test]
fn a_body_below_the_minimum_rate_is_cut_and_one_above_it_is_served() {
    let s = hello_c(&["--body-timeout", "1", "--body-min-rate", "100"]);
    let body: Vec<u8> = (0..400).map(|i| b'a' + (i % 26) as u8).collect();
    let addr = s.addr;
    // 10 bytes every 20 ms: about 500 bytes/s, above the rate.
    let fast_body = body.clone();
    let fast =
        std::thread::spawn(move || trickle_body(addr, &fast_body, 10, Duration::from_millis(20)));
    // A byte every 100 ms: 10 bytes/s, each gap well inside the 1 s timeout.
    let (slow_out, slow_sent) = trickle_body(s.addr, &body, 1, Duration::from_millis(100));
    assert_eq!(
        status_of(&slow_out),
        408,
        "{}\n{}",
        String::from_utf8_lossy(&slow_out),
        s.log()
    );
    assert!(
        slow_sent < body.len() / 2,
        "cut only after {slow_sent} of {} bytes",
        body.len()
    );
    let (fast_out, fast_sent) = fast.join().unwrap();
    assert_eq!(status_of(&fast_out), 200, "{}", s.log());
    assert!(fast_out.ends_with(&body));
    // The writer counts a piece after it went: the last may not be counted yet.
    assert!(fast_sent + 10 >= body.len(), "{fast_sent}");

    let off = hello_c(&["--body-timeout", "1", "--body-min-rate", "0"]);
    let short = &body[..30];
    let (out, sent) = trickle_body(off.addr, short, 1, Duration::from_millis(100));
    assert_eq!(status_of(&out), 200, "{}", off.log());
    assert!(out.ends_with(short));
    assert!(sent + 1 >= short.len(), "{sent}");
}

/// Two clients, each with a pipe full of pipelined requests (megabytes in
/// the socket buffers) and each reading every answer as fast as it comes:
/// the loop answers at most 16 of one connection's requests before it
/// turns to the other, so in the access log (a line per answer, in the
/// order written) the two alternate in runs of at most 16. Without the
/// bound one connection is answered until its socket runs dry or its
/// answers spill, thousands in a row.
#[test]
fn pipelining_clients_take_turns_of_at_most_16_answers() {
    // 200,000 lines (16 MB), removed when the test passes.
    let dir = TestDir::new("slow_clients");
    let log = dir.join("turns.log");
    let mut s = hello_c(&[
        "--max-keepalive-requests",
        "0",
        "--access-log",
        log.to_str().unwrap(),
        "--access-log-format",
        "combined",
    ]);
    const N: usize = 100_000;
    let hogs: Vec<_> = ["/a", "/b"]
        .into_iter()
        .map(|path| {
            let addr = s.addr;
            std::thread::spawn(move || {
                let request = format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n");
                let mut c = TcpStream::connect(addr).unwrap();
                let mut reader = c.try_clone().unwrap();
                // Read answers as they come, counting them, until all N are in.
                let read = std::thread::spawn(move || {
                    let mut buf = vec![0u8; 1 << 20];
                    let (mut seen, mut tail) = (0usize, Vec::new());
                    while seen < N {
                        let n = match reader.read(&mut buf) {
                            Ok(0) | Err(_) => break,
                            Ok(n) => n,
                        };
                        tail.extend_from_slice(&buf[..n]);
                        seen += tail.windows(4).filter(|w| w == b"\r\n\r\n").count();
                        let keep = tail.len().saturating_sub(3);
                        tail.drain(..keep);
                    }
                    seen
                });
                c.write_all(request.repeat(N).as_bytes()).unwrap();
                read.join().unwrap()
            })
        })
        .collect();
    for hog in hogs {
        assert_eq!(hog.join().unwrap(), N, "{}", s.log());
    }
    s.signal(libc::SIGTERM);
    s.wait_exit(Duration::from_secs(30));
    let text = std::fs::read_to_string(&log).unwrap();
    // Runs of consecutive answers to the same connection, while both had
    // requests left (the last run of each is only what the other left).
    let order: Vec<bool> = text
        .lines()
        .filter(|l| l.contains("GET /a ") || l.contains("GET /b "))
        .map(|l| l.contains("GET /a "))
        .collect();
    assert_eq!(order.len(), 2 * N);
    let mut runs = Vec::new();
    let mut len = 1;
    for w in order.windows(2) {
        if w[0] == w[1] {
            len += 1;
        } else {
            runs.push(len);
            len = 1;
        }
    }
    runs.sort_unstable();
    let median = runs.get(runs.len() / 2).copied().unwrap_or(2 * N);
    eprintln!(
        "pipelining: {} alternations, median run {median}, longest {:?}",
        runs.len(),
        runs.last()
    );
    // Twice the bound: a turn in which the other had nothing ready (its
    // reader behind on a busy machine) joins two runs; without the bound
    // the median is in the thousands.
    assert!(
        median <= 32,
        "median run of one connection's answers {median} (of {} runs)",
        runs.len()
    );
}
