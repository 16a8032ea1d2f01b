//! Clients that hold connections without finishing: a head sent a byte at
//! a time (slowloris) and a client that never reads its responses. Each is
//! cut at its timeout while ordinary clients are served beside them.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use support::{Client, hello_c, status_of};

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
    for _ in 0..200_000 {
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
