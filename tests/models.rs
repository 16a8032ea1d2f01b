//! Several models behind one port (#53, ABI 1.6): a plugin gets every ARG,
//! names its models, and says in `admit` which model each request is for;
//! the host then batches only one model's requests together, takes turns
//! between models so that a flood on one does not starve another, and
//! keeps each model's admitted cost apart (`model_in_flight`).
//!
//! The fixture, `tests/c/models_plugin.c`, answers in every response the
//! call that served it and the models of every request in that call. A
//! `/gate` request holds the only handler thread until the test creates
//! the gate file; the fixture's `admit` answers `/stats` at once with the
//! requests admitted so far, so the test knows what has reached the queue
//! (and in which order) without waiting on a clock.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use crate::support::{Client, Server, cc, command, repo_root, scratch_dir, serial};

const WAIT: Duration = Duration::from_secs(20);

/// `tests/c/models_plugin.c`, built once per test binary.
pub fn models_plugin() -> &'static Path {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT.get_or_init(|| {
        let out = scratch_dir("models_plugin").join("libmodels_plugin.so");
        let src = repo_root().join("tests/c/models_plugin.c");
        cc(&["-pedantic", "-shared", src.to_str().unwrap()], &out);
        out
    })
}

/// A file that does not exist until `open`, removed again when dropped.
pub struct Gate(PathBuf);

impl Gate {
    pub fn new(name: &str) -> Gate {
        let path = scratch_dir("gates").join(format!("models-{name}.{}", std::process::id()));
        let _ = std::fs::remove_file(&path);
        Gate(path)
    }

    pub fn open(&self) {
        std::fs::write(&self.0, b"open").expect("create the gate file");
    }

    /// Opens the gate of the calls that hold `hold=NAME`.
    pub fn open_named(&self, name: &str) {
        let mut path = self.0.clone().into_os_string();
        path.push(format!(".{name}"));
        std::fs::write(&path, b"open").expect("create the gate file");
    }

    pub fn arg(&self) -> String {
        format!("gate={}", self.0.display())
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
        let (Some(dir), Some(name)) = (self.0.parent(), self.0.file_name()) else {
            return;
        };
        let prefix = format!("{}.", name.to_string_lossy());
        for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
            if entry.file_name().to_string_lossy().starts_with(&prefix) {
                let _ = std::fs::remove_file(entry.path());
            }
        }
    }
}

/// The fixture with `flags`, then its ARGs.
pub fn start(flags: &[&str], args: &[&str]) -> Server {
    let plugin = models_plugin().to_str().unwrap();
    let mut all = vec!["--plugin", plugin];
    all.extend_from_slice(flags);
    all.extend_from_slice(args);
    let mut cmd = command(&all);
    cmd.env_remove("M0_NO_BATCH");
    Server::start_cmd(cmd)
}

fn get_raw(target: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: t\r\n\r\n").into_bytes()
}

/// The fixture's `/stats`: requests admitted, and each model's cost in
/// flight.
fn stats(s: &Server) -> (u64, Vec<u64>) {
    let text = crate::support::get(s.addr, "/stats").text();
    let field = |k: &str| {
        text.split_whitespace()
            .find_map(|w| w.strip_prefix(k)?.strip_prefix('='))
            .unwrap_or_else(|| panic!("no {k}= in {text:?}"))
            .to_string()
    };
    let in_flight = field("in_flight")
        .split(',')
        .filter(|n| !n.is_empty())
        .map(|n| n.parse().unwrap())
        .collect();
    (field("admitted").parse().unwrap(), in_flight)
}

/// Waits until the fixture has admitted `n` requests.
fn wait_admitted(s: &Server, n: u64) {
    let end = Instant::now() + WAIT;
    loop {
        let (admitted, _) = stats(s);
        if admitted >= n {
            assert_eq!(admitted, n, "more admitted than sent");
            return;
        }
        assert!(
            Instant::now() < end,
            "{admitted} of {n} admitted:\n{}",
            s.log()
        );
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Sends one request on its own connection.
fn send(s: &Server, target: &str) -> Client {
    let mut c = Client::connect(s.addr);
    c.send(&get_raw(target));
    c
}

/// An answer's `key=value` words.
fn field(text: &str, key: &str) -> String {
    text.split_whitespace()
        .find_map(|w| w.strip_prefix(key)?.strip_prefix('='))
        .unwrap_or_else(|| panic!("no {key}= in {text:?}"))
        .to_string()
}

/// Sends `/gate?model=a`, waits until its call holds the only handler
/// thread, and gives back its connection.
fn shut_gate(s: &Server) -> Client {
    let waiting = "waits for the gate";
    let before = s.log_count(waiting);
    let gated = send(s, "/gate?model=a&id=gate");
    assert_eq!(
        s.wait_for_log_count(waiting, before + 1, WAIT),
        before + 1,
        "the /gate call never reached the plugin:\n{}",
        s.log()
    );
    gated
}

#[test]
fn a_batch_holds_one_model_and_a_flood_does_not_starve_another() {
    let _serial = serial();
    let gate = Gate::new("turns");
    let s = start(&["--blocking-threads", "1"], &[&gate.arg(), "a", "b"]);
    let mut gated = shut_gate(&s);
    // Twelve of model a queue behind the gate, then one of model b, then
    // six more of a: each group is admitted before the next is sent, so
    // this is their order in the queue.
    let mut clients: Vec<(String, Client)> = Vec::new();
    for id in 1..=12 {
        clients.push((
            format!("a{id}"),
            send(&s, &format!("/work?model=a&id=a{id}")),
        ));
    }
    wait_admitted(&s, 13);
    clients.push(("b1".into(), send(&s, "/work?model=b&id=b1")));
    wait_admitted(&s, 14);
    for id in 13..=18 {
        clients.push((
            format!("a{id}"),
            send(&s, &format!("/work?model=a&id=a{id}")),
        ));
    }
    wait_admitted(&s, 20);
    gate.open();
    let gate_answer = gated
        .read_response(false)
        .expect("the gate's answer")
        .text();
    assert_eq!(field(&gate_answer, "seq"), "1", "{gate_answer}");
    let mut seq_of = std::collections::BTreeMap::new();
    for (id, c) in &mut clients {
        let r = c
            .read_response(false)
            .unwrap_or_else(|| panic!("no answer to {id}:\n{}", s.log()));
        let text = r.text();
        assert_eq!(r.status, 200, "{id}: {text}");
        assert_eq!(field(&text, "id"), *id, "{text}");
        // The plugin saw one model in the call, the request's own.
        let model = field(&text, "model");
        assert!(
            field(&text, "models").split(',').all(|m| m == model),
            "a call mixed models: {text}"
        );
        assert!(
            field(&text, "size").parse::<usize>().unwrap() <= 4,
            "{text}"
        );
        // request_model outside admit is refused with M0_ERR_STATE.
        assert_eq!(field(&text, "late"), "-101", "{text}");
        seq_of.insert(id.clone(), field(&text, "seq").parse::<u64>().unwrap());
    }
    // The gate's call took model a's turn: b's request goes in the very
    // next call, ahead of the eleven a requests queued before it.
    assert_eq!(seq_of["b1"], 2, "{seq_of:?}");
    // Within a model, arrival order holds.
    let a_seqs: Vec<u64> = (1..=18).map(|i| seq_of[&format!("a{i}")]).collect();
    assert!(a_seqs.windows(2).all(|w| w[0] <= w[1]), "{a_seqs:?}");
    assert!(a_seqs.iter().all(|&n| n > 2), "{a_seqs:?}");
}

#[test]
fn each_model_has_its_own_cost_in_flight() {
    let _serial = serial();
    let gate = Gate::new("budget");
    let s = start(
        &["--blocking-threads", "1"],
        &[&gate.arg(), "budget=2", "a", "b"],
    );
    let mut gated = shut_gate(&s);
    let mut a2 = send(&s, "/work?model=a&id=a2");
    wait_admitted(&s, 2);
    assert_eq!(stats(&s).1, [2, 0]);
    // Model a is at its budget: refused at once, while the gate still holds.
    let mut a3 = send(&s, "/work?model=a&id=a3");
    let refused = a3.read_response(false).expect("a3's answer");
    assert_eq!(refused.status, 429, "{}", refused.text());
    assert_eq!(refused.text(), "over budget model=a in_flight=2");
    // Model b's budget is its own (its call, on a lane, held too).
    let mut b1 = send(&s, "/work?model=b&id=b1&hold=b1");
    wait_admitted(&s, 3);
    assert_eq!(stats(&s).1, [2, 1]);
    gate.open();
    gate.open_named("b1");
    for c in [&mut gated, &mut a2, &mut b1] {
        assert_eq!(c.read_response(false).expect("an answer").status, 200);
    }
    // Every cost is given back once its response is done.
    let end = Instant::now() + WAIT;
    while stats(&s).1 != [0, 0] {
        assert!(Instant::now() < end, "{:?}", stats(&s));
        std::thread::sleep(Duration::from_millis(2));
    }
    let again = crate::support::get(s.addr, "/work?model=a&id=again");
    assert_eq!(again.status, 200, "{}", again.text());
}

#[test]
fn every_arg_reaches_the_plugin_and_names_its_models() {
    // The fixture refuses to start unless `arg` is the first of `args`
    // and each name keeps its id: it serves, so both held.
    let s = start(&[], &["x", "y", "z"]);
    let r = crate::support::get(s.addr, "/work?model=z&id=1");
    assert_eq!((r.status, field(&r.text(), "model")), (200, "z".into()));
    assert_eq!(crate::support::get(s.addr, "/work?model=w").status, 404);
    // A request with no model is served too, in a class of its own.
    let r = crate::support::get(s.addr, "/work?id=2");
    assert_eq!((r.status, field(&r.text(), "model")), (200, "-".into()));
}

#[test]
fn the_start_line_names_the_models_and_is_unchanged_without_any() {
    let s = start(&[], &["bge-small", "bge-reranker"]);
    assert!(
        s.wait_for_log(
            "serving models_plugin 1.0.0 (models bge-small, bge-reranker) with ",
            WAIT
        ),
        "{}",
        s.log()
    );
    let hello = crate::support::hello_c(&[]);
    assert!(
        hello.wait_for_log("serving hello_c ", WAIT),
        "{}",
        hello.log()
    );
    assert!(!hello.log().contains("models"), "{}", hello.log());
}

/// Reads one answer, 200, and gives back its text.
fn answer(s: &Server, c: &mut Client, what: &str) -> String {
    let r = c
        .read_response(false)
        .unwrap_or_else(|| panic!("no answer to {what}:\n{}", s.log()));
    let text = r.text();
    assert_eq!(r.status, 200, "{what}: {text}");
    text
}

/// Waits until the fixture has seen `n` calls return.
fn wait_ended(s: &Server, n: u64) {
    let end = Instant::now() + WAIT;
    loop {
        let text = crate::support::get(s.addr, "/stats").text();
        if field(&text, "ended").parse::<u64>().unwrap() >= n {
            return;
        }
        assert!(Instant::now() < end, "{text}:\n{}", s.log());
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// Waits until `n` calls wait for a gate.
fn wait_holding(s: &Server, n: usize) {
    let waiting = "waits for the gate";
    assert_eq!(
        s.wait_for_log_count(waiting, n, WAIT),
        n,
        "{n} calls never held:\n{}",
        s.log()
    );
}

/// A lane (B11): every handler thread is inside a call of model a that
/// will not end until the test says so; a request of model b still gets
/// its call at once, on one more thread, and is answered while a's call
/// runs. Without the lane it waits for the gate (the fixture's 30 s).
#[test]
fn a_model_with_nothing_running_gets_a_call_beside_a_flood_that_holds_every_thread() {
    let _serial = serial();
    let gate = Gate::new("lane");
    let s = start(&["--blocking-threads", "1"], &[&gate.arg(), "a", "b"]);
    let mut gated = shut_gate(&s);
    let mut queued_a = send(&s, "/work?model=a&id=a1");
    wait_admitted(&s, 2);
    let mut b = send(&s, "/work?model=b&id=b1");
    let text = answer(
        &s,
        &mut b,
        "b1, with a's call holding the pool's one thread",
    );
    // b's call started while a's gate call ran (and nothing of b).
    assert_eq!(field(&text, "beside"), "1,0", "{text}");
    assert_eq!(field(&text, "seq"), "2", "{text}");
    // The lane's thread index keeps M0Request.thread_index's contract:
    // below max_handler_threads (1) + 1.
    assert!(field(&text, "thread").parse::<u32>().unwrap() < 2, "{text}");
    gate.open();
    let gate_text = answer(&s, &mut gated, "the gate");
    assert_eq!(field(&gate_text, "seq"), "1", "{gate_text}");
    // Model a's queued request went to a thread of the pool's own.
    let a1 = answer(&s, &mut queued_a, "a1");
    assert_eq!(field(&a1, "seq"), "3", "{a1}");
}

/// The cap (B11): on a pool of two threads (two calls at once), while
/// model b's call runs beside a flood of model a, a's calls are held to
/// one: a thread freed by a's call does not start another of a's until
/// b's call ends, so b keeps a CPU to itself.
#[test]
fn while_another_model_runs_the_flood_keeps_to_its_share_of_the_calls() {
    let _serial = serial();
    let gate = Gate::new("cap");
    let s = start(&["--blocking-threads", "2"], &[&gate.arg(), "a", "b"]);
    // One at a time, so that each has a call (and a thread) of its own.
    let mut a1 = send(&s, "/work?model=a&id=a1&hold=a1");
    wait_holding(&s, 1);
    let mut a2 = send(&s, "/work?model=a&id=a2&hold=a2");
    wait_holding(&s, 2);
    // Both threads are in a's calls: b's goes on a lane, beside both.
    let mut b1 = send(&s, "/work?model=b&id=b1&hold=b1");
    wait_holding(&s, 3);
    let mut a3 = send(&s, "/work?model=a&id=a3");
    wait_admitted(&s, 4);
    // a1's call ends: its thread finds a3 queued, with a at its share
    // (one call of two slots while b runs) and a2 still running.
    gate.open_named("a1");
    answer(&s, &mut a1, "a1");
    wait_ended(&s, 1);
    gate.open_named("b1");
    let b = answer(&s, &mut b1, "b1");
    assert_eq!(
        field(&b, "beside"),
        "2,0",
        "b1 started beside both of a's calls: {b}"
    );
    assert!(field(&b, "thread").parse::<u32>().unwrap() < 3, "{b}");
    let a = answer(&s, &mut a3, "a3");
    // a3's call began only once b's had ended: a2 still held, b none.
    assert_eq!(
        field(&a, "beside"),
        "1,0",
        "a3 started beside b's call: {a}"
    );
    gate.open_named("a2");
    answer(&s, &mut a2, "a2");
}

/// With one class (a plugin that names no models) the pool never starts
/// a thread above its size: a request waits for the call holding the
/// only thread, as it always did.
#[test]
fn without_models_a_request_waits_for_the_pools_threads() {
    let _serial = serial();
    let gate = Gate::new("one-class");
    let s = start(&["--blocking-threads", "1"], &[&gate.arg()]);
    let waiting = "waits for the gate";
    let mut gated = send(&s, "/gate?id=gate");
    wait_holding(&s, 1);
    let mut other = send(&s, "/work?id=w1");
    wait_admitted(&s, 2);
    // The one thread holds the gate; nothing else has started a call.
    assert_eq!(s.log_count(waiting), 1);
    gate.open();
    let g = answer(&s, &mut gated, "the gate");
    let w = answer(&s, &mut other, "w1");
    assert_eq!(
        (field(&g, "seq"), field(&w, "seq")),
        ("1".into(), "2".into())
    );
    assert_eq!(field(&w, "thread"), field(&g, "thread"), "{g} / {w}");
}
