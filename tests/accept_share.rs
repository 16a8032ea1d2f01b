//! Accept sharing: a burst of connections splits across workers, in fork
//! and spawn mode; nothing is lost when a worker dies or the server drains.
//! The tests take turns (`support::serial`): a split depends on when each
//! worker gets a CPU, and on two CPUs a neighbour's servers decide that.

use std::collections::HashMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use crate::support;
use crate::support::{Server, command, plugin};

/// Open `n` keep-alive connections together, then ask each which pid
/// serves it while all are open. Returns the connections, still open, with
/// the pid that answered on each.
fn burst(addr: SocketAddr, n: usize) -> Vec<(TcpStream, String)> {
    let mut conns: Vec<TcpStream> = (0..n).map(|_| TcpStream::connect(addr).unwrap()).collect();
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        c.write_all(b"GET /pid HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    conns
        .into_iter()
        .map(|mut c| {
            let mut buf = Vec::new();
            let mut chunk = [0u8; 512];
            while !(buf.windows(4).any(|w| w == b"\r\n\r\n")
                && buf.ends_with(b"\n")
                && buf.len() > 4)
            {
                let k = c.read(&mut chunk).unwrap();
                assert!(k > 0, "connection closed before answering");
                buf.extend_from_slice(&chunk[..k]);
            }
            let text = String::from_utf8_lossy(&buf);
            let pid = text.rsplit("\r\n\r\n").next().unwrap().trim().to_string();
            (c, pid)
        })
        .collect()
}

/// A burst of `n` connections' counts per pid, largest first.
fn burst_split(addr: SocketAddr, n: usize) -> Vec<usize> {
    let mut counts: HashMap<String, usize> = HashMap::new();
    for (_, pid) in burst(addr, n) {
        *counts.entry(pid).or_default() += 1;
    }
    let mut v: Vec<usize> = counts.into_values().collect();
    v.sort_unstable_by(|a, b| b.cmp(a));
    v
}

fn within_two_to_one(split: &[usize]) -> bool {
    split.len() == 2 && split[0] <= 2 * split[1]
}

fn start(extra: &[&str], share: bool) -> Server {
    let p = plugin("hello_c");
    let mut args = vec!["--plugin", p.to_str().unwrap(), "--workers", "2"];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    if !share {
        cmd.env("M0_ACCEPT_SHARE", "0");
    }
    Server::start_cmd(cmd)
}

#[test]
fn a_burst_of_32_splits_within_two_to_one_in_fork_and_spawn_mode() {
    let _serial = support::serial();
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let s = start(mode, true);
        for round in 0..2 {
            // Let the previous round's closes reach the workers first.
            std::thread::sleep(Duration::from_millis(300));
            let split = burst_split(s.addr, 32);
            assert!(
                within_two_to_one(&split),
                "{mode:?} round {round}: split {split:?}\n{}",
                s.log()
            );
        }
        // The same probe with sharing off, reported beside (on Linux it can
        // happen to balance, so nothing is asserted about it).
        let off = start(mode, false);
        eprintln!(
            "{mode:?}: sharing off split {:?}",
            burst_split(off.addr, 32)
        );
    }
}

/// Every round's split, over `rounds` bursts of `n` keep-alive connections
/// that each send one request, read its answer and close, the next burst
/// opened as soon as the previous one is closed (a benchmark's warm-up and
/// run, or a load balancer recycling its pool). Each split lists every
/// worker, largest first, zeros included.
fn back_to_back_splits(s: &Server, workers: usize, rounds: usize, n: usize) -> Vec<Vec<usize>> {
    (0..rounds)
        .map(|_| {
            let mut counts: HashMap<String, usize> = HashMap::new();
            for (c, pid) in burst(s.addr, n) {
                *counts.entry(pid).or_default() += 1;
                drop(c);
            }
            let mut v: Vec<usize> = counts.into_values().collect();
            v.resize(workers.max(v.len()), 0);
            v.sort_unstable_by(|a, b| b.cmp(a));
            v
        })
        .collect()
}

/// The sibling's published load once held the connections of the burst
/// that had just closed (it learns of a close only when it next runs, and
/// the acceptor ran first): every later burst split 24/8 or worse, in every
/// run. Over WSGI workers, whose leading thread calls the app between
/// passes, a worker that had answered its whole share also looked stuck in
/// its pass to the acceptor, which then kept the next burst whole (32/0).
/// Where each connection lands still depends on which worker gets a CPU
/// when, so a server whose five rounds miss is measured once more on a
/// fresh server, and both attempts are in the message; the old code misses
/// in both.
#[test]
fn back_to_back_bursts_split_evenly_in_fork_and_spawn_mode() {
    let _serial = support::serial();
    let hello = plugin("hello_c");
    let wsgi = plugin("wsgi");
    let apps = support::repo_root().join("tests/apps");
    for mode in [&[][..], &["--spawn-workers"][..]] {
        for (app, workers) in [("hello_c", 2usize), ("hello_c", 4), ("wsgi", 2)] {
            // Two workers: within 21/11. Four: none above 1.5x its share.
            let most = if workers == 2 {
                21
            } else {
                32 * 3 / (2 * workers)
            };
            let count = workers.to_string();
            let mut args = vec!["--workers", &count];
            args.extend_from_slice(mode);
            if app == "wsgi" {
                args.extend_from_slice(&["--plugin", wsgi.to_str().unwrap()]);
                args.extend_from_slice(&["--app-dir", apps.to_str().unwrap()]);
                args.push("conformance:application");
            } else {
                args.extend_from_slice(&["--plugin", hello.to_str().unwrap()]);
            }
            let mut attempts = Vec::new();
            for _ in 0..2 {
                let mut cmd = command(&args);
                cmd.env_remove("VIRTUAL_ENV").env_remove("M0_VENV");
                let s = Server::start_cmd(cmd);
                let splits = back_to_back_splits(&s, workers, 5, 32);
                eprintln!("{app} {mode:?} {workers} workers: {splits:?}");
                let met = splits.iter().all(|split| split[0] <= most);
                attempts.push(splits);
                if met {
                    break;
                }
            }
            assert!(
                attempts.len() == 1 || attempts[1].iter().all(|split| split[0] <= most),
                "{app} {mode:?} {workers} workers: a round's busiest worker took more than \
                 {most} of 32 in both attempts: {attempts:?}"
            );
        }
    }
}

/// A connection whose client hung up while its request computes stays open
/// until the answer is written, but it carries no more requests: it must not
/// count as load. When it did, a worker finishing the last requests of
/// clients that had left looked full, and every connection of the next
/// burst went to its sibling (one worker of two then served a whole
/// benchmark run).
#[test]
fn clients_that_hung_up_mid_request_do_not_count_against_their_worker() {
    let _serial = support::serial();
    let s = start(&["--blocking-threads", "32"], true);
    let mut by_pid: HashMap<String, Vec<TcpStream>> = HashMap::new();
    for (c, pid) in burst(s.addr, 40) {
        by_pid.entry(pid).or_default().push(c);
    }
    // Keep only the connections of the worker that got the most; the other
    // worker's close at once (they are idle).
    let (_, mut kept) = by_pid
        .into_iter()
        .max_by_key(|(_, conns)| conns.len())
        .unwrap();
    assert!(kept.len() >= 20, "{} of 40 on one worker", kept.len());
    std::thread::sleep(Duration::from_millis(300));
    // Each of those starts a long request, and its client leaves.
    for c in &mut kept {
        c.write_all(b"GET /sleep?ms=3000 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    drop(kept);
    std::thread::sleep(Duration::from_millis(300));
    let split = burst_split(s.addr, 16);
    assert!(within_two_to_one(&split), "split {split:?}\n{}", s.log());
}

#[test]
fn counts_are_logged_at_shutdown() {
    let _serial = support::serial();
    let mut s = start(&[], true);
    let _ = burst_split(s.addr, 16);
    s.signal(libc::SIGTERM);
    assert_eq!(
        s.wait_exit(Duration::from_secs(20))
            .and_then(|st| st.code()),
        Some(0)
    );
    let log = s.log();
    let passed: u64 = log
        .lines()
        .filter_map(|l| {
            l.split("passed ")
                .nth(1)?
                .split(" ")
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum();
    let received: u64 = log
        .lines()
        .filter_map(|l| l.split("received ").nth(1)?.trim().parse::<u64>().ok())
        .sum();
    assert_eq!(log.matches("accept sharing: accepted").count(), 2, "{log}");
    assert_eq!(
        passed, received,
        "every connection passed was received:\n{log}"
    );
}

#[test]
fn a_worker_killed_while_connections_are_passed_loses_nothing_for_the_other() {
    let _serial = support::serial();
    let s = start(&[], true);
    let pids = s.worker_pids();
    let addr = s.addr;
    // Bursts of new connections while one worker is killed.
    let load = std::thread::spawn(move || {
        let mut failures = Vec::new();
        for i in 0..40 {
            // The dying worker's connection ends without a response (0),
            // or is reset before the request is even sent.
            let mut c = TcpStream::connect(addr).expect("connect");
            c.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
            let mut out = Vec::new();
            if c.write_all(b"GET /pid HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                .is_ok()
            {
                let _ = c.read_to_end(&mut out);
            }
            let status = support::status_of(&out);
            if status != 200 {
                failures.push((i, status));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        failures
    });
    std::thread::sleep(Duration::from_millis(100));
    // SAFETY: killing a worker of the server this test started.
    unsafe { libc::kill(pids[0], libc::SIGKILL) };
    let failures = load.join().unwrap();
    // A connection handed to the dying worker in its last instant can be
    // lost with it; one accepted by the survivor never is.
    assert!(failures.len() <= 1, "{failures:?}\n{}", s.log());
    assert!(s.wait_for_log("replacing it", Duration::from_secs(10)));
    std::thread::sleep(Duration::from_millis(300));
    let new_pids = s.worker_pids();
    assert_ne!(new_pids[0], pids[0]);
    // The respawned worker receives connections again.
    let split = burst_split(s.addr, 32);
    assert!(
        within_two_to_one(&split),
        "after respawn: {split:?}\n{}",
        s.log()
    );
}

#[test]
fn sigterm_during_a_burst_loses_no_connection() {
    let _serial = support::serial();
    let mut s = start(&[], true);
    let addr = s.addr;
    let mut conns: Vec<TcpStream> = (0..32).map(|_| TcpStream::connect(addr).unwrap()).collect();
    // Every connection has a request in flight when the stop arrives.
    for c in &mut conns {
        c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        c.write_all(b"GET /sleep?ms=300 HTTP/1.1\r\nHost: t\r\n\r\n")
            .unwrap();
    }
    std::thread::sleep(Duration::from_millis(50));
    s.signal(libc::SIGTERM);
    for (i, c) in conns.iter_mut().enumerate() {
        let mut out = Vec::new();
        let _ = c.read_to_end(&mut out);
        assert!(
            out.starts_with(b"HTTP/1.1 200") && out.ends_with(b"slept\n"),
            "connection {i}: {:?}",
            String::from_utf8_lossy(&out)
        );
    }
    assert_eq!(
        s.wait_exit(Duration::from_secs(20))
            .and_then(|st| st.code()),
        Some(0),
        "{}",
        s.log()
    );
}

/// After SIGHUP replaced both workers, connections are still shared, and
/// every worker's closing line counts only its own hand-overs (the
/// replacement writes the same slot of the shared page as the worker it
/// replaced, which once marked the slot leaving for good and handed its
/// counts on).
#[test]
fn after_a_reload_a_burst_still_splits_and_counts_are_each_workers_own() {
    let _serial = support::serial();
    let mut s = start(&[], true);
    let _ = burst_split(s.addr, 16);
    // The old workers' drains end before the bursts.
    s.reload_and_wait(2);
    for round in 0..2 {
        std::thread::sleep(Duration::from_millis(300));
        let split = burst_split(s.addr, 32);
        assert!(
            within_two_to_one(&split),
            "round {round}: split {split:?}\n{}",
            s.log()
        );
    }
    s.signal(libc::SIGTERM);
    assert_eq!(
        s.wait_exit(Duration::from_secs(20))
            .and_then(|st| st.code()),
        Some(0)
    );
    let log = s.log();
    let lines: Vec<(u64, u64, u64)> = log
        .lines()
        .filter_map(|l| {
            let rest = l.split("accept sharing: accepted ").nth(1)?;
            let n: Vec<u64> = rest
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|w| w.parse().ok())
                .collect();
            Some((n[0], n[1], n[2]))
        })
        .collect();
    assert_eq!(lines.len(), 4, "{log}");
    // Every connection was accepted once by someone: 16 before, 64 after.
    let accepted: u64 = lines.iter().map(|l| l.0).sum();
    assert_eq!(accepted, 16 + 64, "{log}");
    let passed: u64 = lines.iter().map(|l| l.1).sum();
    let received: u64 = lines.iter().map(|l| l.2).sum();
    assert_eq!(passed, received, "{log}");
}
