//! Dynamic batching (#16): a plugin that declares `M0_CAP_BATCH` gets the
//! requests already queued in one `handle_batch` call, within its
//! `max_batch` and `max_batch_bytes`, each from another connection; what a
//! call leaves unanswered gets the status of its return code, alone;
//! `--no-batch` turns it off; the drain's closing line counts the calls.
//!
//! The fixture, `tests/c/batch_plugin.c`, names in every answer the call
//! that served it (its sequence number and size). To fill batches without
//! timing, a `/gate` request holds the only handler thread until the test
//! creates the gate file; the requests sent meanwhile queue behind it. The
//! assertions read counts, ids and orders only: the one pause (the requests
//! being read off their sockets while the gate is shut) can only change how
//! the queued requests split into batches, which is asserted within bounds.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Client, Server, cc, command, plugin, repo_root, scratch_dir, serial};

const MAX_BATCH: usize = 8;
const MAX_BATCH_BYTES: usize = 1000;
/// How long the requests sent behind a shut gate have to reach the queue.
/// Were it too short, fewer would be queued and batches smaller: no
/// assertion depends on it but "some batch held more than one".
const SETTLE: Duration = Duration::from_millis(300);
const WAIT: Duration = Duration::from_secs(20);

/// `tests/c/batch_plugin.c`, built once per test binary.
fn batch_plugin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = scratch_dir("batch_plugin").join("libbatch_plugin.so");
        let src = repo_root().join("tests/c/batch_plugin.c");
        cc(&["-pedantic", "-shared", src.to_str().unwrap()], &out);
        out
    })
}

/// A file that does not exist until `open`, removed again when dropped.
struct Gate(PathBuf);

impl Gate {
    fn new(name: &str) -> Gate {
        let path = scratch_dir("gates").join(format!("{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Gate(path)
    }

    fn open(&self) {
        std::fs::write(&self.0, b"open").expect("create the gate file");
    }

    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// The server's command: the fixture with `extra` flags, the gate as ARG,
/// batching not turned off by the environment.
fn fixture_command(gate: &Gate, extra: &[&str]) -> Command {
    let mut args = vec!["--plugin", batch_plugin().to_str().unwrap()];
    args.extend_from_slice(extra);
    args.push(gate.arg());
    let mut cmd = command(&args);
    cmd.env_remove("M0_NO_BATCH");
    cmd
}

fn start(gate: &Gate, extra: &[&str]) -> Server {
    Server::start_cmd(fixture_command(gate, extra))
}

/// One request as it goes on the wire.
fn post(target: &str, body: &[u8]) -> Vec<u8> {
    let mut raw = format!(
        "POST {target} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .into_bytes();
    raw.extend_from_slice(body);
    raw
}

/// A request of a run: its path, id and body.
#[derive(Debug, Clone)]
struct Req {
    path: &'static str,
    id: usize,
    body: Vec<u8>,
}

impl Req {
    fn new(path: &'static str, id: usize, body_len: usize) -> Req {
        Req {
            path,
            id,
            body: vec![b'a' + (id % 26) as u8; body_len],
        }
    }

    fn raw(&self) -> Vec<u8> {
        post(&format!("{}?id={}", self.path, self.id), &self.body)
    }
}

/// A response: status and body text, with the fixture's fields.
#[derive(Debug, Clone)]
struct Answer {
    status: u16,
    text: String,
}

impl Answer {
    fn of(r: support::Response) -> Answer {
        Answer {
            status: r.status,
            text: r.text(),
        }
    }

    fn field(&self, key: &str) -> Option<&str> {
        self.text
            .split_whitespace()
            .find_map(|f| f.strip_prefix(key)?.strip_prefix('='))
    }

    fn num(&self, key: &str) -> u64 {
        self.field(key)
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no number {key}= in {self:?}"))
    }

    fn id(&self) -> usize {
        self.num("id") as usize
    }

    fn size(&self) -> usize {
        self.num("size") as usize
    }

    fn seq(&self) -> u64 {
        self.num("seq")
    }
}

/// Sends `/gate?id=0`, waits until its call is inside the plugin, sends
/// each of `reqs` on its own connection, lets them reach the queue, opens
/// the gate and reads every answer: the gate's first, then one per request
/// in the order given.
fn gated_run(server: &Server, gate: &Gate, reqs: &[Req]) -> (Answer, Vec<Answer>) {
    let waiting = "waits for the gate";
    let before = server.log_count(waiting);
    let mut gated = Client::connect(server.addr);
    gated.send(&post("/gate?id=0", b""));
    assert_eq!(
        server.wait_for_log_count(waiting, before + 1, WAIT),
        before + 1,
        "the /gate call never reached the plugin:\n{}",
        server.log()
    );
    let mut clients: Vec<Client> = reqs
        .iter()
        .map(|r| {
            let mut c = Client::connect(server.addr);
            c.send(&r.raw());
            c
        })
        .collect();
    std::thread::sleep(SETTLE);
    gate.open();
    let gate_answer = Answer::of(gated.read_response(false).expect("the gate's answer"));
    let answers = clients
        .iter_mut()
        .zip(reqs)
        .map(|(c, r)| {
            let resp = c
                .read_response(false)
                .unwrap_or_else(|| panic!("no answer to {r:?}:\n{}", server.log()));
            Answer::of(resp)
        })
        .collect();
    (gate_answer, answers)
}

/// A call as its 200 answers describe it.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct Call {
    /// Requests in the call, as its answers say.
    size: usize,
    /// Its answers that were 200.
    answered: usize,
}

/// The calls the 200 answers name, by sequence number; every answer of a
/// call agrees on its size, and no call has more answers than its size.
fn calls<'a>(answers: impl IntoIterator<Item = &'a Answer>) -> BTreeMap<u64, Call> {
    let mut calls: BTreeMap<u64, Call> = BTreeMap::new();
    for a in answers.into_iter().filter(|a| a.status == 200) {
        let call = calls.entry(a.seq()).or_insert(Call {
            size: a.size(),
            answered: 0,
        });
        assert_eq!(call.size, a.size(), "answers of call {} disagree", a.seq());
        call.answered += 1;
        assert!(
            call.answered <= call.size,
            "call {} answered more than its {} requests",
            a.seq(),
            call.size
        );
    }
    calls
}

fn sizes(calls: &BTreeMap<u64, Call>) -> Vec<usize> {
    calls.values().map(|c| c.size).collect()
}

/// Every answer is 200 with its own id and body length.
fn assert_served(reqs: &[Req], answers: &[Answer]) {
    for (r, a) in reqs.iter().zip(answers) {
        assert_eq!(a.status, 200, "{r:?}: {a:?}");
        assert_eq!(a.id(), r.id, "{r:?} got another's answer: {a:?}");
        assert_eq!(a.num("bytes") as usize, r.body.len(), "{r:?}: {a:?}");
    }
}

/// Every call the answers name was answered whole, the sequence numbers
/// run 1..=calls with none missing, and the sizes add up to `total`.
fn assert_complete(calls: &BTreeMap<u64, Call>, total: usize) {
    for (seq, c) in calls {
        assert_eq!(c.answered, c.size, "call {seq} answered in part: {calls:?}");
    }
    let seqs: Vec<u64> = calls.keys().copied().collect();
    assert_eq!(
        seqs,
        (1..=calls.len() as u64).collect::<Vec<_>>(),
        "calls missing: {calls:?}"
    );
    assert_eq!(
        calls.values().map(|c| c.size).sum::<usize>(),
        total,
        "{calls:?}"
    );
}

#[test]
fn sequential_requests_arrive_one_at_a_time() {
    let _serial = serial();
    let gate = Gate::new("sequential");
    let s = start(&gate, &[]);
    let mut c = Client::connect(s.addr);
    for id in 1..=10 {
        let body = format!("request {id}");
        let a = Answer::of(c.request("POST", &format!("/work?id={id}"), &[], body.as_bytes()));
        assert_eq!(a.status, 200, "{a:?}");
        assert_eq!(
            (a.id(), a.size(), a.seq(), a.num("bytes") as usize),
            (id, 1, id as u64, body.len()),
            "{a:?}"
        );
    }
}

#[test]
fn requests_queued_behind_a_gate_arrive_in_batches_within_the_limit() {
    let _serial = serial();
    let gate = Gate::new("queued");
    let s = start(&gate, &["--blocking-threads", "1"]);
    assert!(
        s.log()
            .contains("batching on (up to 8 requests, 1000 bytes per call; "),
        "{}",
        s.log()
    );
    let reqs: Vec<Req> = (1..=64)
        .map(|id| Req::new("/work", id, 1 + id % 10))
        .collect();
    let (gated, answers) = gated_run(&s, &gate, &reqs);
    assert_eq!((gated.status, gated.size(), gated.seq()), (200, 1, 1));
    assert_served(&reqs, &answers);
    let calls = calls(std::iter::once(&gated).chain(&answers));
    assert_complete(&calls, 65);
    let sizes = sizes(&calls);
    eprintln!("call sizes: {sizes:?}");
    assert!(
        sizes.iter().all(|&n| n <= MAX_BATCH),
        "a batch over max_batch: {sizes:?}"
    );
    assert!(
        sizes.iter().any(|&n| n > 1),
        "64 requests queued behind the gate, yet every call had one: {sizes:?}"
    );
}

#[test]
fn the_byte_limit_splits_batches_and_a_large_request_goes_alone() {
    let _serial = serial();
    let gate = Gate::new("bytes");
    let s = start(&gate, &["--blocking-threads", "1"]);
    let large = 13;
    let reqs: Vec<Req> = (1..=24)
        .map(|id| Req::new("/work", id, if id == large { 5000 } else { 300 }))
        .collect();
    let (gated, answers) = gated_run(&s, &gate, &reqs);
    assert_served(&reqs, &answers);
    let calls = calls(std::iter::once(&gated).chain(&answers));
    assert_complete(&calls, 25);
    let large_answer = &answers[large - 1];
    assert_eq!(
        large_answer.size(),
        1,
        "the 5000-byte request shared its call: {large_answer:?}"
    );
    let sizes = sizes(&calls);
    eprintln!("call sizes: {sizes:?}");
    for &n in sizes.iter().filter(|&&n| n > 1) {
        assert!(
            n * 300 <= MAX_BATCH_BYTES,
            "a call of {n} requests of 300 bytes is over {MAX_BATCH_BYTES}: {sizes:?}"
        );
    }
    assert!(
        sizes.iter().any(|&n| n > 1),
        "23 small requests queued behind the gate, yet every call had one: {sizes:?}"
    );
}

#[test]
fn pipelined_requests_keep_their_order() {
    let _serial = serial();
    let gate = Gate::new("pipelined");
    let s = start(&gate, &["--blocking-threads", "1"]);
    let mut gated = Client::connect(s.addr);
    gated.send(&post("/gate?id=0", b""));
    assert!(s.wait_for_log("waits for the gate", WAIT), "{}", s.log());
    // 20 requests on one connection in one write, and 7 on their own
    // connections beside them, all queued behind the gate.
    let mut piped = Client::connect(s.addr);
    let raw: Vec<u8> = (1..=20)
        .flat_map(|id| post(&format!("/work?id={id}"), format!("p{id}").as_bytes()))
        .collect();
    piped.send(&raw);
    let mut others: Vec<Client> = (21..=27)
        .map(|id| {
            let mut c = Client::connect(s.addr);
            c.send(&post(&format!("/work?id={id}"), b"other"));
            c
        })
        .collect();
    std::thread::sleep(SETTLE);
    gate.open();
    assert_eq!(Answer::of(gated.read_response(false).unwrap()).status, 200);
    let piped_answers: Vec<Answer> = (0..20)
        .map(|_| Answer::of(piped.read_response(false).expect("a pipelined answer")))
        .collect();
    let ids: Vec<usize> = piped_answers.iter().map(Answer::id).collect();
    assert_eq!(ids, (1..=20).collect::<Vec<_>>(), "{piped_answers:?}");
    // One request of a connection at a time: each pipelined one in a later
    // call than the one before it, never two in one call.
    let seqs: Vec<u64> = piped_answers.iter().map(Answer::seq).collect();
    assert!(
        seqs.windows(2).all(|w| w[0] < w[1]),
        "pipelined requests shared a call or ran out of order: {seqs:?}"
    );
    for (c, id) in others.iter_mut().zip(21..) {
        let a = Answer::of(c.read_response(false).unwrap());
        assert_eq!((a.status, a.id()), (200, id), "{a:?}");
    }
}

#[test]
fn a_bad_or_unanswered_request_fails_alone() {
    let _serial = serial();
    let gate = Gate::new("bad");
    let s = start(&gate, &["--blocking-threads", "1"]);
    let path = |id: usize| match id % 3 {
        1 => "/bad",
        2 => "/skip",
        _ => "/work",
    };
    let reqs: Vec<Req> = (1..=24).map(|id| Req::new(path(id), id, 10)).collect();
    let (_, answers) = gated_run(&s, &gate, &reqs);
    for (r, a) in reqs.iter().zip(&answers) {
        match r.path {
            "/bad" => assert_eq!(
                (a.status, a.text.clone()),
                (400, format!("bad id={}", r.id))
            ),
            "/skip" => assert_eq!(a.status, 500, "{r:?}: {a:?}"),
            _ => {
                assert_eq!(a.status, 200, "{r:?}: {a:?}");
                assert_eq!(a.id(), r.id, "{r:?}: {a:?}");
            }
        }
    }
    assert!(
        s.wait_for_log("returned without responding", WAIT),
        "no warning for the unanswered requests:\n{}",
        s.log()
    );
    // A call whose 200 answers are fewer than its size also held /bad or
    // /skip requests: those failed, the others in it were served.
    let calls = calls(&answers);
    eprintln!("calls with a 200 answer: {calls:?}");
    let mixed = calls
        .values()
        .filter(|c| c.answered < c.size && c.answered > 0)
        .count();
    assert!(
        mixed > 0,
        "no call held both a served and a failed request, so nothing shows a \
         failure staying alone (with the gate and one handler thread, the \
         queued requests should have been batched): {calls:?}"
    );
}

#[test]
fn a_failing_batch_answers_its_members_500_and_the_worker_serves_on() {
    let _serial = serial();
    let gate = Gate::new("fail");
    let s = start(&gate, &["--blocking-threads", "1"]);
    let worker = s.worker_pids();
    let fail = 20;
    let reqs: Vec<Req> = (1..=40)
        .map(|id| Req::new(if id == fail { "/fail" } else { "/work" }, id, 10))
        .collect();
    let (gated, answers) = gated_run(&s, &gate, &reqs);
    assert_eq!(answers[fail - 1].status, 500, "{:?}", answers[fail - 1]);
    let mut failed_others = 0;
    for (r, a) in reqs.iter().zip(&answers).filter(|(r, _)| r.id != fail) {
        match a.status {
            200 => assert_eq!(a.id(), r.id, "{a:?}"),
            500 => failed_others += 1,
            _ => panic!("{r:?}: {a:?}"),
        }
    }
    // Calls before this one: the failing call is the one number among them
    // that is answered in part, or not at all.
    let stats = Answer::of(support::get(s.addr, "/stats"));
    let before = stats.num("calls") - 1;
    let calls = calls(std::iter::once(&gated).chain(&answers));
    let partial: Vec<(u64, Call)> = calls
        .iter()
        .filter(|(_, c)| c.answered < c.size)
        .map(|(&seq, &c)| (seq, c))
        .collect();
    eprintln!("calls with a 200 answer: {calls:?}; {failed_others} other(s) failed");
    let unseen: Vec<u64> = (1..=before).filter(|q| !calls.contains_key(q)).collect();
    match (&partial[..], &unseen[..]) {
        // The members before /fail kept their 200; it and those after it
        // got 500.
        ([(_, c)], []) => assert_eq!(
            c.size - c.answered,
            1 + failed_others,
            "500s outside the failing call: {calls:?}"
        ),
        // /fail came first in its call: all of it got 500.
        ([], [_]) => assert!(
            failed_others < MAX_BATCH,
            "500s outside the failing call: {calls:?}"
        ),
        _ => panic!(
            "not exactly one failing call: partly answered {partial:?}, unseen {unseen:?}, {calls:?}"
        ),
    }
    // Every other call was answered whole.
    let served_whole: usize = calls
        .values()
        .filter(|c| c.answered == c.size)
        .map(|c| c.size)
        .sum();
    let in_failing = 41 - served_whole;
    assert!((1..=MAX_BATCH).contains(&in_failing), "{calls:?}");
    assert!(
        in_failing > 1,
        "/fail had a call of its own, so nothing shows how a failing batch \
         answers its members (with the gate and one handler thread, the \
         queued requests should have been batched): {calls:?}"
    );
    // The same worker serves on.
    let after = Answer::of(support::get(s.addr, "/work?id=99"));
    assert_eq!((after.status, after.id()), (200, 99), "{after:?}");
    assert_eq!(s.worker_pids(), worker, "{}", s.log());
    assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
}

/// `--doctor` for the fixture with `extra` flags and `env`.
fn doctor(extra: &[&str], env: &[(&str, &str)]) -> serde_json::Value {
    let gate = Gate::new("doctor");
    let mut args = vec!["--doctor"];
    args.extend_from_slice(extra);
    let mut cmd = fixture_command(&gate, &args);
    cmd.envs(env.iter().copied());
    let out = cmd.output_bounded().expect("run --doctor");
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "doctor printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

#[test]
fn no_batch_turns_batching_off() {
    let _serial = serial();
    let gate = Gate::new("no_batch");
    let s = start(&gate, &["--blocking-threads", "1", "--no-batch"]);
    assert!(s.log().contains("batching off ("), "{}", s.log());
    let reqs: Vec<Req> = (1..=16).map(|id| Req::new("/work", id, 10)).collect();
    let (gated, answers) = gated_run(&s, &gate, &reqs);
    assert_served(&reqs, &answers);
    let calls = calls(std::iter::once(&gated).chain(&answers));
    assert_complete(&calls, 17);
    assert!(
        sizes(&calls).iter().all(|&n| n == 1),
        "batched with --no-batch: {calls:?}"
    );
    drop(s);

    let on = doctor(&[], &[]);
    let b = &on["batching"];
    assert_eq!(b["on"], true, "{on:#}");
    assert_eq!(
        (&b["max_requests"], &b["max_bytes"]),
        (&8.into(), &1000.into()),
        "{on:#}"
    );
    assert!(
        b["reason"].as_str().is_some_and(|r| !r.is_empty()),
        "{on:#}"
    );
    assert_eq!(b["max_wait_ms"], 2.0, "the default --batch-wait: {on:#}");
    for (flags, env) in [
        (&["--batch-wait", "0.5"][..], &[][..]),
        (&[][..], &[("M0_BATCH_WAIT", "0.5")][..]),
    ] {
        let j = doctor(flags, env);
        assert_eq!(
            j["batching"]["max_wait_ms"], 0.5,
            "{flags:?} {env:?}: {j:#}"
        );
    }
    for (flags, env) in [
        (&["--no-batch"][..], &[][..]),
        (&[][..], &[("M0_NO_BATCH", "1")][..]),
    ] {
        let off = doctor(flags, env);
        let b = &off["batching"];
        assert_eq!(b["on"], false, "{flags:?} {env:?}: {off:#}");
        assert!(
            b["reason"].as_str().is_some_and(|r| !r.is_empty()),
            "{off:#}"
        );
    }
}

#[test]
fn with_batching_on_the_pool_is_fixed_at_the_usable_cpus_per_compute_thread() {
    let _serial = serial();
    let j = doctor(&[], &[]);
    let usable = &j["topology"]["usable_cpus"];
    let threads = &j["topology"]["handler_threads"];
    assert!(usable.as_u64().is_some_and(|n| n >= 1), "{j:#}");
    // The fixture computes with one thread per call.
    for key in ["initial", "min", "max"] {
        assert_eq!(&threads[key], usable, "handler_threads.{key}: {j:#}");
    }
    assert_ne!(threads["source"], "adaptive", "{j:#}");
}

/// Workers that share the CPUs split them: each runs one batch per CPU of
/// its part (rounded up), not one per CPU of the machine, in `--doctor` and
/// in each worker's start line.
#[test]
fn workers_that_share_the_cpus_run_one_batch_per_cpu_of_their_part() {
    let _serial = serial();
    let j = doctor(&["--workers", "2"], &[]);
    let usable = j["topology"]["usable_cpus"].as_u64().expect("usable_cpus") as usize;
    let part = usable.div_ceil(2);
    let threads = &j["topology"]["handler_threads"];
    for key in ["initial", "min", "max"] {
        assert_eq!(threads[key], part, "handler_threads.{key}: {j:#}");
    }
    let gate = Gate::new("shared_cpus");
    let s = start(&gate, &["--workers", "2"]);
    let line = format!("{part} handler thread(s) (the plugin batches: {part} batch(es) at once");
    assert_eq!(s.wait_for_log_count(&line, 2, WAIT), 2, "{}", s.log());
}

/// The closing line's counts: (calls, requests, mean, sizes histogram).
fn closing_line(log: &str) -> (u64, u64, f64, Vec<u64>) {
    let line = log
        .lines()
        .find(|l| l.contains("batching: ") && l.contains(" call(s) for "))
        .unwrap_or_else(|| panic!("no closing batching line:\n{log}"));
    let rest = line.split("batching: ").nth(1).unwrap();
    let words: Vec<&str> = rest.split_whitespace().collect();
    // "{calls} call(s) for {items} request(s), mean {mean}; sizes 1:a 2-3:b ..."
    let calls = words[0].parse().unwrap_or_else(|_| panic!("{line}"));
    let items = words[3].parse().unwrap_or_else(|_| panic!("{line}"));
    let mean = words[6]
        .trim_end_matches(';')
        .parse()
        .unwrap_or_else(|_| panic!("{line}"));
    let buckets = ["1", "2-3", "4-7", "8-15", "16-31", "32-63", "64+"];
    let hist = buckets
        .iter()
        .map(|b| {
            words
                .iter()
                .find_map(|w| w.strip_prefix(&format!("{b}:")))
                .and_then(|n| n.trim_end_matches([',', ';']).parse().ok())
                .unwrap_or_else(|| panic!("no bucket {b} in {line}"))
        })
        .collect();
    (calls, items, mean, hist)
}

/// The histogram bucket of a call of `n` requests.
fn bucket(n: usize) -> usize {
    match n {
        1 => 0,
        2..=3 => 1,
        4..=7 => 2,
        8..=15 => 3,
        16..=31 => 4,
        32..=63 => 5,
        _ => 6,
    }
}

#[test]
fn the_closing_line_counts_batches() {
    let _serial = serial();
    let gate = Gate::new("closing");
    let mut s = start(&gate, &["--blocking-threads", "1"]);
    let reqs: Vec<Req> = (1..=24).map(|id| Req::new("/work", id, 10)).collect();
    let (gated, answers) = gated_run(&s, &gate, &reqs);
    assert_served(&reqs, &answers);
    let calls = calls(std::iter::once(&gated).chain(&answers));
    assert_complete(&calls, 25);
    // /stats comes alone: one more call, of one.
    let stats = Answer::of(support::get(s.addr, "/stats"));
    assert_eq!(stats.num("calls"), calls.len() as u64 + 1, "{stats:?}");
    let mut expected = vec![0u64; 7];
    for c in calls.values() {
        expected[bucket(c.size)] += 1;
    }
    expected[0] += 1;
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|st| st.code()), Some(0), "{}", s.log());
    let (n, items, mean, hist) = closing_line(&s.log());
    assert_eq!(items, 26, "every request is counted once: {}", s.log());
    assert_eq!(n, stats.num("calls"), "the plugin saw {stats:?}");
    assert_eq!(hist.iter().sum::<u64>(), n, "{hist:?}");
    assert_eq!(hist, expected, "the sizes the answers name: {calls:?}");
    assert!(
        (mean - items as f64 / n as f64).abs() < 0.006,
        "mean {mean} for {items} in {n}"
    );
}

/// The SDK fault fixture with batches on (`M0_FAULTS_BATCH`), its gate at
/// `gate`.
fn sdk_faults(gate: &Gate) -> Server {
    let p = plugin("sdk_faults");
    let mut cmd = command(&["--plugin", p.to_str().unwrap(), "--blocking-threads", "1"]);
    cmd.env_remove("M0_NO_BATCH")
        .env("M0_FAULTS_BATCH", "1")
        .env("M0_FAULTS_GATE", gate.arg());
    Server::start_cmd(cmd)
}

/// An answer of the fault fixture's `/member` or `/gate`.
struct Member {
    id: usize,
    size: usize,
    pos: usize,
    seq: u64,
}

fn member(a: &Answer) -> Member {
    Member {
        id: a.id(),
        size: a.size(),
        pos: a.num("pos") as usize,
        seq: a.seq(),
    }
}

fn get_answer(addr: SocketAddr, target: &str) -> Answer {
    Answer::of(support::get(addr, target))
}

#[test]
fn a_panic_in_an_sdk_plugins_batch_fails_the_rest_of_its_batch_and_the_worker_serves_on() {
    let _serial = serial();
    let gate = Gate::new("sdk_panic");
    let s = sdk_faults(&gate);
    let worker = s.worker_pids();
    let mut gated = Client::connect(s.addr);
    gated.send(b"GET /gate?id=0 HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(s.wait_for_log("waits for the gate", WAIT), "{}", s.log());
    let panicker = 6;
    let mut clients: Vec<Client> = (1..=16)
        .map(|id| {
            let path = if id == panicker {
                "/panic-batch"
            } else {
                "/member"
            };
            let mut c = Client::connect(s.addr);
            c.send(format!("GET {path}?id={id} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
            c
        })
        .collect();
    std::thread::sleep(SETTLE);
    gate.open();
    let gated = Answer::of(gated.read_response(false).expect("the gate's answer"));
    assert_eq!((gated.status, member(&gated).size), (200, 1), "{gated:?}");
    let answers: Vec<Answer> = clients
        .iter_mut()
        .map(|c| Answer::of(c.read_response(false).expect("an answer")))
        .collect();
    assert_eq!(
        answers[panicker - 1].status,
        500,
        "{:?}",
        answers[panicker - 1]
    );
    // Positions answered in each call; the one after every call so far.
    let mut by_seq: BTreeMap<u64, (usize, Vec<usize>)> = BTreeMap::new();
    let mut failed_others = 0;
    for (id, a) in (1..).zip(&answers).filter(|(id, _)| *id != panicker) {
        match a.status {
            200 => {
                let m = member(a);
                assert_eq!(m.id, id, "{a:?}");
                let call = by_seq.entry(m.seq).or_insert((m.size, Vec::new()));
                assert_eq!(call.0, m.size, "{a:?}");
                call.1.push(m.pos);
            }
            500 => failed_others += 1,
            _ => panic!("{id}: {a:?}"),
        }
    }
    let after = get_answer(s.addr, "/member?id=99");
    assert_eq!(after.status, 200, "{after:?}");
    let last = member(&after).seq;
    let mut partial = Vec::new();
    for (seq, (size, positions)) in &mut by_seq {
        positions.sort();
        if positions.len() < *size {
            // The panicking call answered those before the panicker: a
            // prefix of its members.
            assert_eq!(
                *positions,
                (0..positions.len()).collect::<Vec<_>>(),
                "call {seq}"
            );
            partial.push((*size, positions.len()));
        } else {
            assert_eq!(*positions, (0..*size).collect::<Vec<_>>(), "call {seq}");
        }
    }
    eprintln!("positions answered per call: {by_seq:?}; {failed_others} other(s) failed");
    let unseen = (2..last).filter(|q| !by_seq.contains_key(q)).count();
    let panicking_size = match (&partial[..], unseen) {
        ([(size, answered)], 0) => {
            assert_eq!(size - answered, 1 + failed_others, "{by_seq:?}");
            *size
        }
        ([], 1) => 1 + failed_others,
        _ => panic!("not exactly one panicking call: {by_seq:?}, {unseen} unseen"),
    };
    assert!(
        panicking_size > 1,
        "the panicking request had a call of its own, so nothing shows the \
         rest of a batch failing with it (with the gate and one handler \
         thread, the queued requests should have been batched): {by_seq:?}"
    );
    assert!(
        s.wait_for_log(
            "sdk_faults: panicked in handle_batch: boom in a batch of",
            WAIT
        ),
        "{}",
        s.log()
    );
    assert_eq!(s.worker_pids(), worker, "{}", s.log());
    assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
}

/// The access log gives each response the size of the call that answered
/// it, as the answer itself says.
#[test]
fn the_access_log_names_each_responses_batch_size() {
    let _serial = serial();
    let gate = Gate::new("access_log");
    let log = scratch_dir("batching_access_log").join("access.jsonl");
    let _ = std::fs::remove_file(&log);
    let log_arg = log.to_str().unwrap();
    let mut s = start(
        &gate,
        &[
            "--blocking-threads",
            "1",
            "--access-log",
            log_arg,
            "--access-log-format",
            "json",
        ],
    );
    let reqs: Vec<Req> = (1..=16).map(|id| Req::new("/work", id, 3)).collect();
    let (_, answers) = gated_run(&s, &gate, &reqs);
    assert_served(&reqs, &answers);
    s.signal(libc::SIGTERM);
    assert_eq!(s.wait_exit(WAIT).and_then(|st| st.code()), Some(0));
    let text = std::fs::read_to_string(&log).unwrap();
    let lines: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert_eq!(lines.len(), reqs.len() + 1, "{text}");
    for (r, a) in reqs.iter().zip(&answers) {
        let target = format!("/work?id={}", r.id);
        let line = lines
            .iter()
            .find(|l| l["target"] == target.as_str())
            .unwrap_or_else(|| panic!("no line for {target}:\n{text}"));
        assert_eq!(line["batch"], a.size() as u64, "{line}");
        assert_eq!(line["status"], 200);
    }
    assert!(
        lines.iter().any(|l| l["batch"].as_u64() > Some(1)),
        "no batch of more than one:\n{text}"
    );
}

/// `clients` connections, each sending `/slow` requests one after another
/// (the next when the last is answered), the first alone for a head start
/// of half a call; the size of every call that answered, in call order.
fn closed_loop_sizes(server: &Server, clients: usize, rounds: usize) -> Vec<usize> {
    let run = |id: usize| {
        let mut c = Client::connect(server.addr);
        (0..rounds)
            .map(|_| {
                c.send(&post(&format!("/slow?id={id}"), b""));
                let a = Answer::of(c.read_response(false).expect("an answer to /slow"));
                assert_eq!(a.status, 200, "{a:?}");
                (a.seq(), a.size())
            })
            .collect::<Vec<_>>()
    };
    let answers: Vec<(u64, usize)> = std::thread::scope(|s| {
        let first = s.spawn(|| run(0));
        std::thread::sleep(Duration::from_millis(50));
        let rest: Vec<_> = (1..clients).map(|id| s.spawn(move || run(id))).collect();
        std::iter::once(first)
            .chain(rest)
            .flat_map(|h| h.join().expect("a client thread"))
            .collect()
    });
    let by_call: BTreeMap<u64, usize> = answers.into_iter().collect();
    by_call.into_values().collect()
}

/// A server with `args` under `closed_loop_sizes`, stopped cleanly: the
/// sizes of its calls, every request counted once, and its log.
fn closed_loop_run(
    gate: &Gate,
    args: &[&str],
    clients: usize,
    rounds: usize,
) -> (Vec<usize>, String) {
    let mut s = start(gate, args);
    let sizes = closed_loop_sizes(&s, clients, rounds);
    s.signal(libc::SIGTERM);
    assert_eq!(
        s.wait_exit(WAIT).and_then(|st| st.code()),
        Some(0),
        "{}",
        s.log()
    );
    assert_eq!(sizes.iter().sum::<usize>(), clients * rounds, "{sizes:?}");
    (sizes, s.log())
}

/// Clients that send again when answered, one of them ahead of the others,
/// split into two alternating calls for good when each call takes only
/// what is queued (`--batch-wait 0`): a call of one, then the other seven,
/// and again. With the wait, a call that would hold fewer than the last
/// one held plus the requests queued behind it waits for the rest, and the
/// calls hold all eight. Counts only: the
/// wait is bounded by an eighth of the fixture's 100 ms call (12.5 ms),
/// which the seven clients' next requests need far less than.
#[test]
fn a_short_batch_waits_for_the_clients_the_last_call_answered() {
    let _serial = serial();
    let gate = Gate::new("gather");
    let clients = MAX_BATCH;
    let rounds = 10;
    let sizes_of = |wait: &str| {
        closed_loop_run(
            &gate,
            &["--blocking-threads", "1", "--batch-wait", wait],
            clients,
            rounds,
        )
    };
    let (greedy, log) = sizes_of("0");
    assert!(
        log.contains("a call takes what is queued: --batch-wait 0"),
        "{log}"
    );
    assert_eq!(short_call_waits(&log).0, 0, "{log}");
    let (waiting, log) = sizes_of("50");
    assert!(
        log.contains("a call short of the last one's size waits up to 50 ms for the rest"),
        "{log}"
    );
    let (waits, filled) = short_call_waits(&log);
    assert!(
        waits > 0 && filled > 0,
        "the closing line counts the waits: {log}"
    );
    // The first two calls are the head start's (one, then the rest).
    let ones = |sizes: &[usize]| sizes[2..].iter().filter(|&&n| n == 1).count();
    let mean = |sizes: &[usize]| sizes.len() as f64 / clients as f64;
    assert!(
        ones(&greedy) * 3 >= greedy.len() - 2,
        "without the wait the calls should keep alternating one and seven: {greedy:?}"
    );
    assert!(
        ones(&waiting) * 4 <= waiting.len() - 2,
        "with the wait the calls should merge: {waiting:?}"
    );
    // The head start's client is back by the time the other seven's first
    // call ends, and every call after holds all eight: the requests queued
    // behind a call count with the clients it answered (counting only the
    // answered, a call of seven waited for seven and the eighth missed
    // every call in turn).
    let full = waiting[1..].iter().filter(|&&n| n == clients).count();
    assert!(
        full * 4 >= (waiting.len() - 1) * 3,
        "with the wait the calls should hold all {clients}: {waiting:?}"
    );
    assert!(
        waiting.len() * 3 <= greedy.len() * 2,
        "merged calls are fewer: {} with the wait, {} without ({:.2} vs {:.2} calls per client \
         request): {waiting:?} vs {greedy:?}",
        waiting.len(),
        greedy.len(),
        mean(&waiting),
        mean(&greedy)
    );
}

/// The same clients in a pool of two threads: a request that arrives while
/// one thread computes goes to the other thread, beside that call, so no
/// call waits for a fuller batch (one that did merged both threads' clients
/// into one call on one CPU of two). Counts from the closing line: a pool
/// of one thread, run first on the same load, does wait.
#[test]
fn a_pool_of_two_threads_never_holds_a_call_back_for_more() {
    let _serial = serial();
    let gate = Gate::new("gather_two");
    let clients = MAX_BATCH;
    let rounds = 10;
    let waits_of = |threads: &str| {
        let (sizes, log) = closed_loop_run(
            &gate,
            &["--blocking-threads", threads, "--batch-wait", "50"],
            clients,
            rounds,
        );
        (short_call_waits(&log).0, sizes, log)
    };
    let (one, sizes, log) = waits_of("1");
    assert!(
        one > 0,
        "a one-thread pool waits on this load: {sizes:?}\n{log}"
    );
    let (two, sizes, log) = waits_of("2");
    assert_eq!(
        two, 0,
        "a two-thread pool never waits (calls {sizes:?}):\n{log}"
    );
}

/// (waits, filled) of the closing line's "N short call(s) waited for more,
/// M filled".
fn short_call_waits(log: &str) -> (u64, u64) {
    let line = log
        .lines()
        .find(|l| l.contains(" short call(s) waited for more, "))
        .unwrap_or_else(|| panic!("no short-call count in the closing line:\n{log}"));
    let rest = line.split("; ").last().unwrap_or_default();
    let words: Vec<&str> = rest.split_whitespace().collect();
    // "{waits} short call(s) waited for more, {filled} filled"
    let waits = words[0].parse().unwrap_or_else(|_| panic!("{line}"));
    let filled = words[6].parse().unwrap_or_else(|_| panic!("{line}"));
    (waits, filled)
}
