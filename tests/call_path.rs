//! The call path on a worker with CPUs to spare: loop calls start on, and
//! the adaptive controller measures them against the pool alone under
//! concurrent load. A GIL-holding hello keeps its loop calls (a second
//! thread only adds a hop per request); a view that computes without the
//! GIL gets the pool, whose threads run at once.

use std::io::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::Duration;

// The controller compares throughput window against window: tests beside
// it would move what it measures.
use crate::support::{self, Client, Server, serial};

const CLIENTS: usize = 8;
/// How long a server may take to reach a verdict under load. A failure
/// timeout, not a measure: each losing probe doubles the wait for the next
/// (600 ms, 1.2 s, ... 19.2 s), so this leaves room for several.
const SETTLE: Duration = Duration::from_secs(90);

/// Clients on keep-alive connections sending `path` until stopped; each
/// keeps the bodies it got while `keep` is set.
struct Load {
    stop: Arc<AtomicBool>,
    keep: Arc<AtomicBool>,
    sent: Arc<AtomicU64>,
    clients: Vec<JoinHandle<Vec<String>>>,
}

impl Load {
    fn start(s: &Server, path: &'static str) -> Load {
        let stop = Arc::new(AtomicBool::new(false));
        let keep = Arc::new(AtomicBool::new(false));
        let sent = Arc::new(AtomicU64::new(0));
        let clients = (0..CLIENTS)
            .map(|_| {
                let (stop, keep, sent) = (stop.clone(), keep.clone(), sent.clone());
                let addr = s.addr;
                std::thread::spawn(move || {
                    let mut c = Client::connect(addr);
                    let mut bodies = Vec::new();
                    while !stop.load(Ordering::Relaxed) {
                        let keeping = keep.load(Ordering::Relaxed);
                        let r = c.get(path);
                        assert_eq!(r.status, 200, "{}", r.text());
                        sent.fetch_add(1, Ordering::Relaxed);
                        if keeping {
                            bodies.push(r.text());
                        }
                    }
                    bodies
                })
            })
            .collect();
        Load {
            stop,
            keep,
            sent,
            clients,
        }
    }

    fn sent(&self) -> u64 {
        self.sent.load(Ordering::Relaxed)
    }

    /// Send `n` more requests in all (keeping their bodies), then stop.
    fn finish_after(self, n: u64) -> (u64, Vec<String>) {
        let until = self.sent() + n;
        self.keep.store(true, Ordering::Relaxed);
        while self.sent() < until {
            std::thread::sleep(Duration::from_millis(5));
        }
        self.stop.store(true, Ordering::Relaxed);
        let bodies = self
            .clients
            .into_iter()
            .flat_map(|c| c.join().expect("a client"))
            .collect();
        (self.sent.load(Ordering::Relaxed), bodies)
    }
}

/// SIGTERM, a clean drain, and the closing line of the worker.
fn closing_line(mut s: Server) -> String {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(20));
    let log = s.log();
    assert!(status.is_some_and(|st| st.success()), "{status:?}\n{log}");
    log.lines()
        .find(|l| l.contains(" loop call(s), "))
        .unwrap_or_else(|| panic!("no closing counts:\n{log}"))
        .to_string()
}

/// The number just before `what` in `line`.
fn count_before(line: &str, what: &str) -> u64 {
    let head = line.split(what).next().unwrap();
    head.rsplit(' ')
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count before {what:?}: {line}"))
}

fn unpinned_server() -> Server {
    // The clients keep their connections (1000 requests each by default).
    let s = Server::start_cmd(crate::support::wsgi::pool_app_command(&[
        "--workers",
        "1",
        "--max-keepalive-requests",
        "0",
    ]));
    assert!(
        s.wait_for_log("loop calls on", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    assert!(
        s.log()
            .contains("the controller measures them against the pool"),
        "{}",
        s.log()
    );
    s
}

#[test]
fn with_cpus_to_spare_a_gil_holding_hello_makes_loop_calls_and_a_gil_releasing_view_runs_on_threads_at_once()
 {
    let _serial = serial();
    let cpus = support::usable_cpus();
    if cpus < 2 {
        // Straight to the terminal: the harness shows what a passing test
        // prints only with --nocapture.
        let _ = writeln!(
            std::io::stderr(),
            "call_path: skipped, this process may use {cpus} CPU and the test needs 2 \
             (with one CPU per worker loop calls are always on, see tests/loop_calls.rs)"
        );
        return;
    }

    // A GIL-holding hello: the controller tries the pool alone and goes
    // back to loop calls.
    let s = unpinned_server();
    let load = Load::start(&s, "/hello");
    assert!(
        s.wait_for_log("call path: back to loop calls", SETTLE),
        "the pool was never tried and dropped:\n{}",
        s.log()
    );
    // Long after, beside the time it took to settle: later probes of the
    // pool (backing off) and a false hand-off (another process kept the
    // leader off its CPU) each send a window of calls to the pool.
    let settled_at = load.sent();
    let (sent, _) = load.finish_after((4 * settled_at).max(20_000));
    let hello = closing_line(s);
    let loop_calls = count_before(&hello, " loop call(s)");
    // Of the requests after it settled, a good share were loop calls even
    // if every request before was a call in the pool: not all, as a later
    // probe of the pool takes a window, and a false hand-off (other
    // processes kept the leader off its CPU while another thread held the
    // GIL) a back-off of 250 ms or more; on a box busy with builds those
    // took up to half.
    let after = sent - settled_at;
    assert!(
        loop_calls >= settled_at + after / 3,
        "{loop_calls} loop calls of {sent} requests, {settled_at} before it settled: {hello}"
    );
    assert!(
        hello.contains("call path: loop calls on"),
        "ended without loop calls: {hello}"
    );

    // A view that hashes without the GIL: the pool alone serves more, and
    // its calls run on two threads at once.
    let s = unpinned_server();
    let load = Load::start(&s, "/hash-at");
    assert!(
        s.wait_for_log("call path: loop calls suspended", SETTLE),
        "loop calls were never suspended:\n{}",
        s.log()
    );
    let (_, bodies) = load.finish_after(400);
    let calls: Vec<(u64, u64, u64)> = bodies
        .iter()
        .map(|b| {
            let f: Vec<u64> = b.split_whitespace().map(|x| x.parse().unwrap()).collect();
            (f[0], f[1], f[2])
        })
        .collect();
    // A call overlaps when another, on another thread, was inside the app
    // at the same time: never with loop calls, whose one thread calls the
    // app for one request after another.
    let overlapping = calls
        .iter()
        .filter(|a| {
            calls
                .iter()
                .any(|b| a.2 != b.2 && a.0.max(b.0) < a.1.min(b.1))
        })
        .count();
    let share = overlapping as f64 / calls.len() as f64;
    let threads: std::collections::BTreeSet<u64> = calls.iter().map(|c| c.2).collect();
    let release = closing_line(s);
    eprintln!(
        "hello: {hello}\nhash: {release}\nhash: {overlapping} of {} calls overlapped one on another thread, {} threads",
        calls.len(),
        threads.len()
    );
    // Loop calls overlap only around a hand-off, a call or two; how many
    // overlap in the pool depends on the CPUs other processes leave.
    assert!(
        share > 0.05 && threads.len() >= 2,
        "{overlapping} of {} calls ran beside another, on {} thread(s): {release}",
        calls.len(),
        threads.len()
    );
    assert!(
        release.contains("call path: loop calls suspended"),
        "ended on loop calls: {release}"
    );
}
