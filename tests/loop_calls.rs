//! Loop calls: on a worker with one CPU, the thread leading the event loop
//! calls the WSGI app itself while no handler thread is busy; a call that
//! blocks has a handler thread take the loop over, and the other
//! connections are served meanwhile.

use std::io::Write;
use std::time::Duration;

// Each test's server shares one CPU: `serial` keeps them from sharing it
// with each other too.
use crate::support::{self, Client, Server, serial};

fn one_cpu_server(extra: &[&str]) -> Server {
    let mut args = vec!["--workers", "1"];
    args.extend_from_slice(extra);
    let mut cmd = crate::support::wsgi::pool_app_command(&args);
    support::pin_to_one_cpu(&mut cmd);
    Server::start_cmd(cmd)
}

/// The name of the thread that ran the app for one request.
fn app_thread(c: &mut Client) -> String {
    let r = c.get("/thread");
    assert_eq!(r.status, 200, "{}", r.text());
    r.text().trim().to_string()
}

/// SIGTERM; the worker must drain and exit 0. Gives back its
/// "(loop calls, handed over)" counts.
fn stop_and_read_counts(mut s: Server) -> (u64, u64) {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(20));
    let log = s.log();
    assert!(status.is_some_and(|st| st.success()), "{status:?}\n{log}");
    assert!(log.contains("drained:"), "{log}");
    let line = log
        .lines()
        .find(|l| l.contains(" loop call(s), "))
        .unwrap_or_else(|| panic!("no closing counts:\n{log}"));
    // "..., N loop call(s), M handed over"
    let count_before = |what: &str| -> u64 {
        let head = line.split(what).next().unwrap();
        head.rsplit(' ')
            .next()
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("no count before {what:?}: {line}"))
    };
    (count_before(" loop call(s)"), count_before(" handed over"))
}

#[test]
fn a_one_cpu_worker_calls_the_app_on_its_loop_thread() {
    let _serial = serial();
    // A hand-off here is always a false one (the view neither blocks nor
    // computes): another process kept a thread that held the GIL off the
    // shared CPU, and the leader's call waited for it. That is measured
    // again, at most twice, and said; a hand-off in every attempt fails.
    for attempt in 1..=3 {
        let s = one_cpu_server(&[]);
        assert!(
            s.wait_for_log("loop calls on", Duration::from_secs(10)),
            "{}",
            s.log()
        );
        let mut c = Client::connect(s.addr);
        let threads: Vec<String> = (0..50).map(|_| app_thread(&mut c)).collect();
        drop(c);
        let log_of_handoffs: Vec<String> = s
            .log()
            .lines()
            .filter(|l| l.contains("a handler thread leads the loop now"))
            .map(str::to_string)
            .collect();
        let (loop_calls, handed_over) = stop_and_read_counts(s);
        if handed_over > 0 && attempt < 3 {
            // Straight to the terminal: the test harness shows what a
            // passing test prints only with --nocapture.
            let _ = writeln!(
                std::io::stderr(),
                "loop_calls: attempt {attempt} was handed over under contention, measuring again: {log_of_handoffs:?}"
            );
            continue;
        }
        assert_eq!(handed_over, 0, "{log_of_handoffs:?}");
        assert!(threads.iter().all(|t| t == "m0-loop"), "{threads:?}");
        assert_eq!(loop_calls, 50);
        return;
    }
}

#[test]
fn no_inline_keeps_the_calls_on_handler_threads() {
    let _serial = serial();
    let s = one_cpu_server(&["--no-inline"]);
    assert!(
        s.wait_for_log(
            "loop calls off (turned off with --no-inline)",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    let mut c = Client::connect(s.addr);
    for _ in 0..50 {
        assert!(app_thread(&mut c).starts_with("m0-handler-"));
    }
    drop(c);
    assert_eq!(stop_and_read_counts(s), (0, 0));
}

#[test]
fn a_blocked_call_hands_the_loop_over_and_loop_calls_resume_after_the_back_off() {
    let _serial = serial();
    let s = one_cpu_server(&[]);
    // The first request is a loop call on the loop's thread, and it blocks
    // until another request opens the gate.
    let mut blocked = Client::connect(s.addr);
    blocked.send(b"GET /wait HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(
        s.wait_for_log("waiting at the gate", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    // Served while the loop's thread is still inside /wait: the loop moved.
    let mut other = Client::connect(s.addr);
    for _ in 0..20 {
        assert!(app_thread(&mut other).starts_with("m0-handler-"));
    }
    assert_eq!(other.get("/open").status, 200);
    let r = blocked
        .read_response(false)
        .expect("the blocked call answers");
    assert_eq!((r.status, r.text().as_str()), (200, "opened\n"));
    // After the back-off (250 ms), the thread that leads now calls again.
    std::thread::sleep(Duration::from_millis(600));
    for _ in 0..20 {
        app_thread(&mut other);
    }
    drop((blocked, other));
    let log = s.log();
    let (calls, handed) = stop_and_read_counts(s);
    // More hand-offs may follow where calls are slow (a debug build's first
    // call on a thread takes milliseconds); /wait had to be one.
    assert!(handed >= 1, "{log}");
    // /wait, and the first request after the back-off.
    assert!(calls >= 2, "{calls} loop calls\n{log}");
}
