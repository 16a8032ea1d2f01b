//! A lone request computes on every CPU its worker has; under load each
//! batch keeps one thread (plugins/embed/src/model/team.rs).
//!
//! Measured in CPU time per thread of the worker (/proc/PID/task), never in
//! wall time: the compute helpers (threads named `m0-embed-N`) do part of
//! the work of requests sent one at a time, and much less of it while
//! several clients keep both handler threads computing.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::json;

use crate::support::embed::{minilm, post, reference, serve_dir};
use crate::support::{Client, turns, usable_cpus};

/// CPU ticks (user + system) of each thread of `pid`, by thread id, with
/// its name.
fn thread_ticks(pid: i32) -> BTreeMap<u32, (String, u64)> {
    let mut out = BTreeMap::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            continue;
        };
        // "tid (comm) state ..." with fields 14 and 15 utime and stime;
        // comm may hold spaces, so the fields count from its ')'.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let name = stat[open + 1..close].to_string();
        let rest: Vec<&str> = stat[close + 1..].split_whitespace().collect();
        let ticks = |i: usize| rest.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        let tid = t.file_name().to_string_lossy().parse().unwrap_or(0);
        out.insert(tid, (name, ticks(11) + ticks(12)));
    }
    out
}

/// Ticks the helpers and all threads of `pid` spent while `load` ran.
fn helper_share(pid: i32, load: impl FnOnce()) -> (u64, u64) {
    let before = thread_ticks(pid);
    load();
    let after = thread_ticks(pid);
    let (mut helpers, mut all) = (0, 0);
    for (tid, (name, t)) in after {
        let spent = t - before.get(&tid).map_or(0, |(_, b)| *b);
        all += spent;
        if name.starts_with("m0-embed-") {
            helpers += spent;
        }
    }
    (helpers, all)
}

/// `requests` POST /embed of `texts`, one after another on one connection.
fn send(addr: SocketAddr, texts: &[String], requests: usize) {
    let mut c = Client::connect(addr);
    for _ in 0..requests {
        let (status, body, _) = post(&mut c, "/embed", &json!({ "inputs": texts }));
        assert_eq!(status, 200, "{body}");
    }
}

#[test]
fn a_lone_request_computes_on_the_free_cpus_and_a_loaded_worker_keeps_one_thread_a_batch() {
    if usable_cpus() < 2 {
        eprintln!(
            "skipped: this test process may use {} CPU, and a split needs two",
            usable_cpus()
        );
        return;
    }
    let _alone = turns::serial();
    let r = reference();
    // 32 short sentences a request (TEI's default batch limit): products
    // long enough that a helper which wakes late still finds its piece.
    let short: Vec<&String> = r
        .sentences
        .iter()
        .zip(&r.tokens)
        .filter(|&(t, &n)| !t.is_empty() && n <= 32)
        .map(|(t, _)| t)
        .collect();
    let texts: Vec<String> = short
        .iter()
        .cycle()
        .take(32)
        .map(|t| t.to_string())
        .collect();
    // One worker, no M0_EMBED_THREADS: as a user starts it.
    let s = serve_dir(&minilm(), &["--workers", "1"], &[]);
    let worker = s.worker_pids()[0];
    let addr = s.addr;
    send(addr, &texts, 3);

    let (lone_helpers, lone_all) = helper_share(worker, || send(addr, &texts, 16));
    let clients = 6;
    let (busy_helpers, busy_all) = helper_share(worker, || {
        std::thread::scope(|sc| {
            for _ in 0..clients {
                sc.spawn(|| send(addr, &texts, 6));
            }
        });
    });
    let lone = lone_helpers as f64 / lone_all.max(1) as f64;
    let busy = busy_helpers as f64 / busy_all.max(1) as f64;
    eprintln!(
        "helpers' share of the worker's CPU: requests one at a time {lone:.2} ({lone_helpers} of {lone_all} \
         ticks), {clients} clients at once {busy:.2} ({busy_helpers} of {busy_all} ticks)"
    );
    // Alone, the helpers take a real part of every product (about half on
    // two CPUs); under load the batches run one thread each, and a helper
    // works only in the moments when one handler thread waits for requests.
    assert!(
        lone >= 0.2,
        "a lone request stayed on one thread: {lone:.2}"
    );
    assert!(
        busy <= lone / 2.0,
        "under load the passes still split: {busy:.2} against {lone:.2} alone"
    );
}
