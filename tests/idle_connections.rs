//! Ten thousand idle keep-alive connections on one worker: all held, what
//! each costs in memory reported, and requests on other connections served
//! meanwhile.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use crate::support::{Client, hello_c};

/// The resident memory of `pid`, in KiB.
fn rss_kib(pid: i32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap()
}

/// Raise this process's descriptor limit to its hard limit; the new limit.
fn raise_nofile() -> u64 {
    // SAFETY: plain getrlimit/setrlimit on a local struct.
    unsafe {
        let mut l = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut l);
        l.rlim_cur = l.rlim_max;
        libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        l.rlim_cur
    }
}

const IDLE: usize = 10_000;

#[test]
fn ten_thousand_idle_keep_alive_connections_are_held_and_others_are_served() {
    // The server inherits the raised limit; each side holds one end.
    let limit = raise_nofile();
    if limit < IDLE as u64 + 200 {
        eprintln!(
            "skipped: RLIMIT_NOFILE hard limit {limit} is below {} (raise it to run this)",
            IDLE + 200
        );
        return;
    }
    let s = hello_c(&["--idle-timeout", "300", "--backlog", "4096"]);
    let worker = s.worker_pids()[0];
    let before = rss_kib(worker);
    let mut idle = Vec::with_capacity(IDLE);
    let mut buf = [0u8; 512];
    for i in 0..IDLE {
        let mut c = TcpStream::connect(s.addr)
            .unwrap_or_else(|e| panic!("connection {i}: {e}\n{}", s.log()));
        c.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        // One request each, so every connection is accepted, served and
        // then idle in keep-alive.
        c.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n").unwrap();
        let mut got = 0;
        while !buf[..got].ends_with(b"hello, world\n") {
            let n = c.read(&mut buf[got..]).unwrap();
            assert!(n > 0, "connection {i} closed");
            got += n;
        }
        idle.push(c);
    }
    let after = rss_kib(worker);
    eprintln!(
        "{IDLE} idle keep-alive connections: worker RSS {before} KiB -> {after} KiB, {:.2} KiB each",
        (after.saturating_sub(before)) as f64 / IDLE as f64
    );
    // Served beside them, on a fresh connection and on the oldest idle one.
    let mut c = Client::connect(s.addr);
    for _ in 0..100 {
        assert_eq!(c.get("/").status, 200);
    }
    let oldest = &mut idle[0];
    oldest
        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
        .unwrap();
    let mut got = 0;
    while !buf[..got].ends_with(b"hello, world\n") {
        let n = oldest.read(&mut buf[got..]).unwrap();
        assert!(n > 0, "the oldest idle connection was closed");
        got += n;
    }
    // Every one still open: none was dropped to make room (a read finds
    // nothing to read, not the end).
    for (i, c) in idle.iter_mut().enumerate() {
        c.set_nonblocking(true).unwrap();
        match c.read(&mut buf) {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("idle connection {i}: {other:?}"),
        }
    }
    assert_eq!(s.log_count("accept failed"), 0, "{}", s.log());
}
