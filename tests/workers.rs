//! Worker processes under the supervisor: respawn, the rapid-crash rule,
//! graceful stop, SIGHUP, spawn mode, and the one-listener rule.

use std::collections::HashSet;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Client, Server, bad_plugin, command, plugin};

fn hello_args(extra: &[&str]) -> Vec<String> {
    let mut v = vec![
        "--plugin".to_string(),
        plugin("hello_c").display().to_string(),
    ];
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}

fn start(extra: &[&str]) -> Server {
    let args = hello_args(extra);
    Server::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

fn pid_of(c: &mut Client) -> i32 {
    c.get("/pid").text().trim().parse().expect("a pid")
}

/// Keep-alive connections until one lands on each of `n` workers.
fn one_connection_per_worker(s: &Server, n: usize) -> Vec<(i32, Client)> {
    let mut found: Vec<(i32, Client)> = Vec::new();
    for _ in 0..200 {
        let mut c = Client::connect(s.addr);
        let pid = pid_of(&mut c);
        if !found.iter().any(|(p, _)| *p == pid) {
            found.push((pid, c));
        }
        if found.len() == n {
            return found;
        }
    }
    panic!(
        "200 connections reached only {} of {n} workers",
        found.len()
    );
}

#[test]
fn killed_worker_is_replaced_and_the_others_are_undisturbed() {
    let s = start(&["--workers", "2"]);
    let mut conns = one_connection_per_worker(&s, 2);
    let (victim, _) = conns.remove(0);
    let (survivor, mut survivor_conn) = conns.remove(0);
    // SAFETY: killing a worker process of the server this test started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    assert!(
        s.wait_for_log(
            &format!("pid={victim} was killed by SIGKILL"),
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    // The other worker's keep-alive connection never noticed.
    for _ in 0..20 {
        assert_eq!(pid_of(&mut survivor_conn), survivor);
    }
    assert!(s.wait_for_log("worker 0 pid=", Duration::from_secs(10)));
    // A replacement serves: new connections reach a pid that is neither.
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut seen = HashSet::new();
    while Instant::now() < deadline && seen.len() < 2 {
        let pid = pid_of(&mut Client::connect(s.addr));
        assert_ne!(pid, victim, "a dead worker answered");
        seen.insert(pid);
    }
    assert!(
        seen.iter().any(|p| *p != survivor),
        "no replacement worker answered: {seen:?}\n{}",
        s.log()
    );
}

#[test]
fn crash_route_takes_down_one_worker_which_returns() {
    let s = start(&["--workers", "2"]);
    let out = support::raw_exchange(s.addr, b"GET /crash HTTP/1.1\r\nHost: t\r\n\r\n");
    assert!(
        out.is_empty(),
        "a crashed worker answered: {}",
        String::from_utf8_lossy(&out)
    );
    assert!(
        s.wait_for_log("was killed by SIGKILL", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    assert!(s.wait_for_log("replacing it", Duration::from_secs(10)));
    assert_eq!(support::get(s.addr, "/").status, 200);
    // The replacement's "started" line can trail "replacing it" on the pipe.
    assert_eq!(
        s.wait_for_log_count(" started", 3, Duration::from_secs(10)),
        3,
        "{}",
        s.log()
    );
}

#[test]
fn a_plugin_that_crashes_in_init_is_reported_once_before_binding() {
    let p = bad_plugin("crash_in_init", &["-DCRASH_IN_INIT"]);
    let out = command(&["--plugin", p.to_str().unwrap(), "--workers", "2"])
        .output_bounded()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert_eq!(err.matches("crashed while starting").count(), 1, "{err}");
    // Found by the check before binding: no worker was ever started.
    assert!(!err.contains("worker 0"), "{err}");
}

#[test]
fn workers_that_all_die_at_start_stop_the_server_with_1() {
    let p = bad_plugin("crash_in_worker_init", &["-DCRASH_IN_WORKER_INIT"]);
    let mut cmd = command(&["--plugin", p.to_str().unwrap(), "--workers", "2"]);
    let out = cmd.output_bounded().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(
            "5 workers in a row died within 1s of starting (the last was killed by SIGABRT)"
        ),
        "{err}"
    );
}

#[test]
fn sigterm_finishes_requests_in_flight_then_exits_0() {
    let mut s = start(&["--workers", "1"]);
    let addr = s.addr;
    // A slow request in flight.
    let slow = std::thread::spawn(move || support::get(addr, "/sleep?ms=1000"));
    // A large upload half sent.
    let body: Vec<u8> = (0..2_000_000u32).map(|i| (i % 253) as u8).collect();
    let mut upload = TcpStream::connect(addr).unwrap();
    upload
        .write_all(
            format!(
                "POST /echo HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n\r\n",
                body.len()
            )
            .as_bytes(),
        )
        .unwrap();
    upload.write_all(&body[..1_000_000]).unwrap();
    // An idle keep-alive connection, which the drain closes.
    let mut idle = Client::connect(addr);
    assert_eq!(idle.get("/").status, 200);
    // A connection accepted before the signal whose first request comes
    // after it: not idle but early, so it is answered, then closed.
    let mut early = Client::connect(addr);
    std::thread::sleep(Duration::from_millis(200));
    s.signal(libc::SIGTERM);
    std::thread::sleep(Duration::from_millis(200));
    let first = early.get("/");
    assert_eq!(first.status, 200);
    assert_eq!(first.header("connection"), Some("close"));
    // New connections are no longer accepted by the worker... and the rest
    // of the upload still arrives and is answered whole.
    let reader = {
        let mut stream = upload.try_clone().unwrap();
        std::thread::spawn(move || {
            let mut out = Vec::new();
            stream
                .set_read_timeout(Some(Duration::from_secs(20)))
                .unwrap();
            let _ = stream.read_to_end(&mut out);
            out
        })
    };
    upload.write_all(&body[1_000_000..]).unwrap();
    let out = reader.join().unwrap();
    let head_end = out
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a response head")
        + 4;
    let head = String::from_utf8_lossy(&out[..head_end]);
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(head.contains("Connection: close"), "{head}");
    assert_eq!(
        &out[head_end..],
        &body[..],
        "the upload's echo is not whole"
    );
    let slow = slow.join().unwrap();
    assert_eq!((slow.status, slow.text().as_str()), (200, "slept\n"));
    assert!(idle.is_closed(Duration::from_secs(5)));
    let status = s
        .wait_exit(Duration::from_secs(20))
        .expect("the server exits");
    assert_eq!(status.code(), Some(0), "{}", s.log());
}

/// Send `/sleep?ms=MS` on a fresh connection and read until the server
/// closes it: the raw bytes (empty when cut off with no response).
fn slow_request(addr: std::net::SocketAddr, ms: u64) -> std::thread::JoinHandle<Vec<u8>> {
    std::thread::spawn(move || {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream
            .write_all(
                format!("GET /sleep?ms={ms} HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        out
    })
}

#[test]
fn ctrl_c_to_the_process_group_drains_and_a_second_one_stops_at_once() {
    // A terminal's Ctrl-C sends SIGINT to every process of the group:
    // the supervisor and its workers together.
    let ctrl_c = |s: &Server| {
        // SAFETY: signalling the process group of a server this test started.
        unsafe { libc::kill(-s.pid(), libc::SIGINT) };
    };
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let mut args = vec!["--workers", "2"];
        args.extend_from_slice(mode);
        let mut s = start(&args);
        let slow = slow_request(s.addr, 1500);
        std::thread::sleep(Duration::from_millis(300));
        ctrl_c(&s);
        let out = slow.join().unwrap();
        let text = String::from_utf8_lossy(&out);
        assert!(
            text.starts_with("HTTP/1.1 200") && text.ends_with("slept\n"),
            "{mode:?}: the request in flight was cut by one Ctrl-C: {text:?}\n{}",
            s.log()
        );
        let status = s.wait_exit(Duration::from_secs(20)).expect("exits");
        assert_eq!(status.code(), Some(0), "{mode:?}: {}", s.log());
    }

    // Two Ctrl-Cs: the second stops at once, cutting what is in flight.
    let mut s = start(&["--workers", "2"]);
    let slow = slow_request(s.addr, 20_000);
    std::thread::sleep(Duration::from_millis(300));
    ctrl_c(&s);
    assert!(
        s.wait_for_log("stopping: workers finish", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    ctrl_c(&s);
    assert!(
        s.wait_exit(Duration::from_secs(15)).is_some(),
        "{}",
        s.log()
    );
    let out = slow.join().unwrap();
    assert!(
        !String::from_utf8_lossy(&out).contains("slept"),
        "the second Ctrl-C waited for the request\n{}",
        s.log()
    );
    // The last lines may still be on their way from the pipe.
    assert!(
        s.wait_for_log("second stop signal", Duration::from_secs(10)),
        "{}",
        s.log()
    );
}

#[test]
fn graceful_timeout_cuts_requests_off_at_the_timeout_and_exits_3() {
    let mut s = start(&["--workers", "2", "--graceful-timeout", "1"]);
    let slow = slow_request(s.addr, 30_000);
    std::thread::sleep(Duration::from_millis(300));
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(20)).expect("exits");
    // The documented code for a stop that cut requests off; not 1, which
    // says the server could not start.
    assert_eq!(status.code(), Some(3), "{}", s.log());
    let out = slow.join().unwrap();
    assert!(
        !String::from_utf8_lossy(&out).contains("slept"),
        "the request ran to its end"
    );
    let log = s.log();
    assert!(
        log.contains("cut requests off at --graceful-timeout 1s"),
        "{log}"
    );
    // The worker left at its own deadline: the supervisor's backstop kill,
    // two seconds later, never fired.
    assert!(!log.contains("killing it"), "{log}");
}

#[test]
fn the_log_level_hides_the_tuning_detail_by_default() {
    let run = |level: Option<&str>| {
        let args = hello_args(&["--workers", "1"]);
        let mut cmd = command(&args.iter().map(String::as_str).collect::<Vec<_>>());
        match level {
            Some(l) => cmd.env("M0_LOG_LEVEL", l),
            None => cmd.env_remove("M0_LOG_LEVEL"),
        };
        let mut s = Server::start_cmd(cmd);
        assert_eq!(support::get(s.addr, "/").status, 200);
        s.signal(libc::SIGTERM);
        assert_eq!(
            s.wait_exit(Duration::from_secs(20)).and_then(|e| e.code()),
            Some(0)
        );
        s.log()
    };
    let default = run(None);
    assert!(default.contains("ready: serving"), "{default}");
    assert!(!default.contains("at the end; per request"), "{default}");
    let debug = run(Some("debug"));
    assert!(
        debug.contains("[DEBUG] worker 0: handler pool: "),
        "{debug}"
    );
    let bad = command(&["--plugin", "hello_c", "--log-level", "loud"])
        .output_bounded()
        .unwrap();
    assert_eq!(bad.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("error, warn, info or debug"));
}

#[test]
fn new_connections_are_refused_once_a_full_stop_begins() {
    let mut s = start(&["--workers", "2"]);
    let addr = s.addr;
    let slow = slow_request(addr, 5000);
    std::thread::sleep(Duration::from_millis(300));
    s.signal(libc::SIGTERM);
    // The listener closes as the stop begins: while the request is still
    // in flight, a new connection is refused by the kernel, not left in a
    // backlog no one serves until the exit resets it.
    let mut refused = false;
    while !slow.is_finished() {
        match TcpStream::connect(addr) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                refused = true;
                break;
            }
            _ => std::thread::sleep(Duration::from_millis(20)),
        }
    }
    let out = slow.join().unwrap();
    assert!(
        refused,
        "connections were still taken while a request drained\n{}",
        s.log()
    );
    assert!(
        String::from_utf8_lossy(&out).starts_with("HTTP/1.1 200"),
        "the request in flight was not finished\n{}",
        s.log()
    );
    let status = s.wait_exit(Duration::from_secs(20)).expect("exits");
    assert_eq!(status.code(), Some(0), "{}", s.log());
}

#[test]
fn sighup_replaces_workers_without_a_failed_request() {
    let s = start(&["--workers", "2"]);
    support::sighup_under_load(
        &s,
        b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n",
        b"hello, world\n",
        Duration::from_secs(15),
    );
}

#[test]
fn spawn_mode_workers_are_exec_images_that_adopt_the_listener() {
    let s = start(&["--workers", "2", "--spawn-workers"]);
    let pids = s.worker_pids();
    assert_eq!(pids.len(), 2);
    let exe = std::fs::canonicalize(support::binary()).unwrap();
    for pid in &pids {
        assert_eq!(std::fs::read_link(format!("/proc/{pid}/exe")).unwrap(), exe);
        let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
        assert!(
            environ
                .split(|&b| b == 0)
                .any(|kv| kv == b"M0_WORKER_SPAWNED=1"),
            "worker {pid} has no spawn marker"
        );
        // Only the adopted descriptors crossed exec: the listener (3), the
        // ready pipe (4, closed after use), nothing stray.
        let fds: Vec<i32> = std::fs::read_dir(format!("/proc/{pid}/fd"))
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect();
        assert!(fds.contains(&3), "worker {pid} fds: {fds:?}");
    }
    assert!(
        s.log().contains("spawn mode (--spawn-workers)"),
        "{}",
        s.log()
    );
    let mut seen = HashSet::new();
    for _ in 0..100 {
        seen.insert(pid_of(&mut Client::connect(s.addr)));
        if seen.len() == 2 {
            break;
        }
    }
    assert!(
        seen.iter().all(|p| pids.contains(p)),
        "{seen:?} vs {pids:?}"
    );
}

#[test]
fn exec_failure_in_spawn_mode_is_reported_with_78() {
    let args = hello_args(&["--spawn-workers"]);
    let mut cmd = command(&args.iter().map(String::as_str).collect::<Vec<_>>());
    cmd.env("M0_SPAWN_EXE", "/nonexistent/m0serve");
    let out = cmd.output_bounded().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("exec of /nonexistent/m0serve failed"), "{err}");
}

#[test]
fn a_second_server_on_the_same_port_exits_1_naming_the_port() {
    let s = start(&[]);
    let port = s.addr.port().to_string();
    let args = hello_args(&[]);
    let mut cmd = std::process::Command::new(support::binary());
    cmd.args(&args)
        .args(["--host", "127.0.0.1", "--port", &port]);
    let out = cmd.output_bounded().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("port {port}")) && err.contains("--port"),
        "{err}"
    );
    assert_eq!(support::get(s.addr, "/").status, 200);
}

#[test]
fn startup_output_names_the_supervisor_each_worker_and_the_ready_banner() {
    let s = start(&["--workers", "3"]);
    let log = s.log();
    assert!(
        log.contains(&format!(
            "] [{}] [INFO] supervisor: pid={} starting 3 worker(s) in fork mode",
            s.pid(),
            s.pid()
        )),
        "{log}"
    );
    assert_eq!(s.worker_pids().len(), 3);
    assert!(
        log.contains("with plugin hello_c (3 worker(s), fork mode)"),
        "{log}"
    );
}

#[test]
fn as_pid_1_in_a_container_it_serves_reaps_and_exits_0_on_sigterm() {
    // A new PID namespace makes the supervisor PID 1, as in a container.
    let mut cmd = std::process::Command::new("unshare");
    cmd.args(["--pid", "--fork", "--mount-proc"])
        .arg(support::binary());
    cmd.args(hello_args(&[
        "--workers",
        "2",
        "--host",
        "127.0.0.1",
        "--port",
        "0",
    ]));
    let mut s = Server::start_cmd(cmd);
    assert!(
        s.log().contains("] [1] [INFO] supervisor: pid=1 starting"),
        "{}",
        s.log()
    );
    assert_eq!(support::get(s.addr, "/").status, 200);
    // The supervisor's pid outside the namespace: unshare's only child.
    let children =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", s.pid())).unwrap();
    let supervisor: i32 = children
        .split_whitespace()
        .next()
        .expect("unshare has a child")
        .parse()
        .unwrap();
    // Only the two workers remain below it: the plugin probe was reaped.
    let below =
        std::fs::read_to_string(format!("/proc/{0}/task/{0}/children", supervisor)).unwrap();
    assert_eq!(
        below.split_whitespace().count(),
        2,
        "children of PID 1: {below}"
    );
    // SAFETY: signalling the supervisor this test started.
    unsafe { libc::kill(supervisor, libc::SIGTERM) };
    let status = s
        .wait_exit(Duration::from_secs(20))
        .expect("exits on SIGTERM");
    assert_eq!(status.code(), Some(0), "{}", s.log());
}

#[test]
fn workers_leave_when_the_supervisor_is_killed() {
    let s = start(&["--workers", "2"]);
    let pids = s.worker_pids();
    assert_eq!(pids.len(), 2);
    s.signal(libc::SIGKILL);
    let deadline = Instant::now() + Duration::from_secs(10);
    // A worker that outlived its supervisor would be reparented, not gone.
    let alive = |pid: &i32| {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| !st.contains(") Z "))
    };
    while Instant::now() < deadline && pids.iter().any(alive) {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        !pids.iter().any(alive),
        "workers outlived the supervisor: {pids:?}"
    );
}

/// Keep-alive clients that send their next request as soon as they have
/// an answer, and never retry: one that reads no answer to a request it
/// sent counts a failure. A connection the server answers with
/// `Connection: close` is replaced by a new one, as a client must.
fn busy_clients(
    addr: std::net::SocketAddr,
    n: usize,
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
) -> Vec<std::thread::JoinHandle<(usize, usize)>> {
    use std::sync::atomic::Ordering;
    (0..n)
        .map(|_| {
            let stop = std::sync::Arc::clone(&stop);
            std::thread::spawn(move || {
                let (mut ok, mut failed) = (0, 0);
                let mut conn: Option<Client> = None;
                while !stop.load(Ordering::Relaxed) {
                    let c = match conn.as_mut() {
                        Some(c) => c,
                        None => match TcpStream::connect(addr) {
                            Ok(s) => {
                                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                                conn.insert(Client::from_stream(s))
                            }
                            // Refused once a stop has closed the listener:
                            // no request was sent.
                            Err(_) => break,
                        },
                    };
                    if c.stream
                        .write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
                        .is_err()
                    {
                        failed += 1;
                        conn = None;
                        continue;
                    }
                    match c.read_response(false) {
                        Some(r) if r.status == 200 => {
                            ok += 1;
                            if r.header("connection") == Some("close") {
                                conn = None;
                            }
                        }
                        _ => {
                            failed += 1;
                            conn = None;
                        }
                    }
                }
                (ok, failed)
            })
        })
        .collect()
}

#[test]
fn busy_keep_alive_clients_lose_no_request_to_a_reload_or_a_stop() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let mut s = start(&["--workers", "2"]);
    let stop = Arc::new(AtomicBool::new(false));
    let clients = busy_clients(s.addr, 8, Arc::clone(&stop));
    std::thread::sleep(Duration::from_millis(500));
    s.reload_and_wait(2);
    std::thread::sleep(Duration::from_millis(300));
    // Then a stop with the clients still sending: each ends when its
    // reconnect is refused.
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(30));
    stop.store(true, Ordering::Relaxed);
    let (mut ok, mut failed) = (0, 0);
    for c in clients {
        let (o, f) = c.join().unwrap();
        ok += o;
        failed += f;
    }
    assert_eq!(status.and_then(|st| st.code()), Some(0), "{}", s.log());
    assert!(ok > 100, "only {ok} requests answered");
    assert_eq!(
        failed,
        0,
        "{failed} of {} requests failed\n{}",
        ok + failed,
        s.log()
    );
}
