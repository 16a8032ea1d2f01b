//! The adaptive pool when workers share the CPUs: two workers pinned to two
//! CPUs, judged by the pool sizes in their closing lines. A view that
//! computes without the GIL gets about one thread per CPU across both
//! workers; a view that sleeps still gets the threads its clients need, and
//! a fast request is answered beside the sleeping ones.

use std::io::Write;
use std::time::Duration;

// The pools measure the CPUs they share: tests beside them would move
// what they measure.
use crate::support::{self, Client, Server, serial};

/// Two workers on exactly two CPUs, or `None` (said on stderr) where this
/// process may use fewer.
fn two_workers_on_two_cpus(extra: &[&str]) -> Option<Server> {
    let mut args = vec!["--workers", "2", "--max-keepalive-requests", "0"];
    args.extend_from_slice(extra);
    let mut cmd = crate::support::wsgi::pool_app_command(&args);
    if let Err(cpus) = support::pin_to_cpus(&mut cmd, 2) {
        // Straight to the terminal: the harness shows what a passing test
        // prints only with --nocapture.
        let _ = writeln!(
            std::io::stderr(),
            "pool_shared: skipped, this process may use {cpus} CPU and the test needs 2 \
             (two workers sharing two CPUs)"
        );
        return None;
    }
    let s = Server::start_cmd(cmd);
    assert!(
        s.wait_for_log_count(" serving wsgi ", 2, Duration::from_secs(30)) == 2,
        "{}",
        s.log()
    );
    assert!(
        s.log().contains("2 workers share 2 usable CPU(s)"),
        "the workers did not see two shared CPUs:\n{}",
        s.log()
    );
    Some(s)
}

/// `clients` keep-alive clients send `path` `each` times; every answer
/// is 200.
fn load(
    s: &Server,
    clients: usize,
    each: usize,
    path: &'static str,
) -> Vec<std::thread::JoinHandle<()>> {
    (0..clients)
        .map(|_| {
            let addr = s.addr;
            std::thread::spawn(move || {
                let mut c = Client::connect(addr);
                for _ in 0..each {
                    let r = c.get(path);
                    assert_eq!(r.status, 200, "{}", r.text());
                }
            })
        })
        .collect()
}

/// SIGTERM, a clean drain, and each worker's pool size from its closing
/// line ("handler pool: N thread(s) at the end; ...").
fn pool_sizes_at_the_end(mut s: Server) -> (Vec<usize>, String) {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(30));
    let log = s.log();
    assert!(status.is_some_and(|st| st.success()), "{status:?}\n{log}");
    let lines: Vec<&str> = log
        .lines()
        .filter(|l| l.contains(" thread(s) at the end;"))
        .collect();
    assert_eq!(lines.len(), 2, "a closing line per worker:\n{log}");
    let sizes = lines
        .iter()
        .map(|l| {
            let head = l.split(" thread(s) at the end;").next().unwrap();
            head.rsplit(' ').next().unwrap().parse().unwrap()
        })
        .collect();
    (sizes, lines.join("\n"))
}

#[test]
fn two_workers_on_two_cpus_keep_about_a_thread_per_cpu_for_a_view_computing_without_the_gil() {
    let _serial = serial();
    // With the default call path (one CPU per worker: loop calls, the pool
    // for what is handed over) and with every call in the pool.
    for extra in [&[][..], &["--no-inline"][..]] {
        let Some(s) = two_workers_on_two_cpus(extra) else {
            return;
        };
        // 16 clients of about a millisecond of hashing each: 8 per
        // worker, far more than two CPUs run at once.
        for client in load(&s, 16, 400, "/hash") {
            client.join().expect("a client");
        }
        let (sizes, lines) = pool_sizes_at_the_end(s);
        eprintln!("{extra:?}: {sizes:?}\n{lines}");
        assert!(
            sizes.iter().all(|&n| n <= 2),
            "{extra:?}: a worker ended with more than two threads: {sizes:?}\n{lines}"
        );
        assert!(
            sizes.iter().sum::<usize>() <= 3,
            "{extra:?}: more than three threads for two CPUs: {sizes:?}\n{lines}"
        );
    }
}

#[test]
fn two_workers_on_two_cpus_grow_for_a_view_that_sleeps_and_answer_a_fast_request_beside_it() {
    let _serial = serial();
    let Some(s) = two_workers_on_two_cpus(&[]) else {
        return;
    };
    // 32 clients of 50 ms sleeps; half-way, a fast request on a
    // connection of its own, which reports how many sleeps its worker had
    // in progress when it was answered.
    let clients = load(&s, 32, 60, "/sleep50");
    while s.log_count("handler pool: ") < 4 {
        // Until the pools have grown a little: each change is a log line.
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !clients.iter().all(|c| c.is_finished()),
            "the load ended before the pools changed:\n{}",
            s.log()
        );
    }
    let fast = support::get(s.addr, "/asleep");
    assert_eq!(fast.status, 200, "{}", fast.text());
    let asleep: usize = fast.text().trim().parse().unwrap();
    for client in clients {
        client.join().expect("a client");
    }
    let (sizes, lines) = pool_sizes_at_the_end(s);
    eprintln!("sleeping: {sizes:?}, {asleep} asleep beside the fast request\n{lines}");
    assert!(
        asleep > 0,
        "the fast request waited for the sleeping ones: {asleep} asleep when it was answered"
    );
    // Past the three threads the computing view gets: 16 clients per
    // worker sleep at once.
    let total: usize = sizes.iter().sum();
    assert!(
        total >= 8 && sizes.iter().all(|&n| n >= 3),
        "the pools did not grow for sleeping calls: {sizes:?}\n{lines}"
    );
}
