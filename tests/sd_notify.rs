//! systemd's readiness protocol: with `NOTIFY_SOCKET` set, the supervisor
//! sends `READY=1` once every worker serves, `RELOADING=1` and `READY=1`
//! around a SIGHUP reload, and `STOPPING=1` when a stop begins. The test
//! is systemd here: it binds the datagram socket and reads what arrives.
//!
//! The server's log goes to a file, not a pipe: a line the server wrote
//! before it sent a message is in the file when the message arrives, so
//! what the file holds at each message says what happened before it.

use std::io::Write;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use crate::support::OutputBounded;
use crate::support::{binary, plugin, scratch_dir};

const WAIT: Duration = Duration::from_secs(60);

/// A server whose stdout and stderr go to a file.
struct Logged {
    child: Child,
    log: PathBuf,
}

impl Logged {
    fn start(args: &[&str], env: &[(&str, &str)], log: PathBuf) -> Logged {
        let file = std::fs::File::create(&log).unwrap();
        let hello = plugin("hello_c");
        let mut cmd = Command::new(binary());
        cmd.args(["--host", "127.0.0.1", "--port", "0", "--plugin"])
            .arg(hello)
            .args(args)
            .env_remove("M0_WORKERS")
            .env("M0_LOG_LEVEL", "info")
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .process_group(0);
        for (k, v) in env {
            cmd.env(k, v);
        }
        Logged {
            child: cmd.spawn().expect("spawn m0serve"),
            log,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Waits until a line holds every one of `needles`.
    fn wait_for(&mut self, needles: &[&str]) -> bool {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if self
                .text()
                .lines()
                .any(|l| needles.iter().all(|n| l.contains(n)))
            {
                return true;
            }
            if let Ok(Some(_)) = self.child.try_wait() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        false
    }

    fn signal(&self, signal: i32) {
        // SAFETY: a signal to the child this test started.
        unsafe { libc::kill(self.pid() as i32, signal) };
    }

    fn wait_exit(&mut self) -> Option<ExitStatus> {
        let deadline = Instant::now() + WAIT;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// Worker pids from the supervisor's "worker N pid=P started" lines,
    /// latest per index.
    fn worker_pids(&self) -> Vec<u32> {
        let mut by_index: Vec<(usize, u32)> = Vec::new();
        for line in self.text().lines() {
            let Some(rest) = line.split("supervisor: worker ").nth(1) else {
                continue;
            };
            let mut parts = rest.split_whitespace();
            let (Some(index), Some(pid), Some("started")) =
                (parts.next(), parts.next(), parts.next())
            else {
                continue;
            };
            let index: usize = index.parse().unwrap();
            let pid: u32 = pid.strip_prefix("pid=").unwrap().parse().unwrap();
            by_index.retain(|(i, _)| *i != index);
            by_index.push((index, pid));
        }
        by_index.sort();
        by_index.into_iter().map(|(_, p)| p).collect()
    }
}

impl Drop for Logged {
    fn drop(&mut self) {
        // SAFETY: the child leads its own process group; kill the group.
        unsafe { libc::kill(-(self.pid() as i32), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

/// systemd's side: the socket, and what the log held as each message came.
struct Systemd {
    socket: UnixDatagram,
}

impl Systemd {
    fn at_path(path: &Path) -> Systemd {
        let _ = std::fs::remove_file(path);
        let socket = UnixDatagram::bind(path).unwrap();
        socket.set_read_timeout(Some(WAIT)).unwrap();
        Systemd { socket }
    }

    fn abstract_name(name: &str) -> Systemd {
        let addr = SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let socket = UnixDatagram::bind_addr(&addr).unwrap();
        socket.set_read_timeout(Some(WAIT)).unwrap();
        Systemd { socket }
    }

    /// The next message, and the server's log as it stood when it came.
    fn next(&self, server: &Logged) -> (String, String) {
        let mut buf = [0u8; 4096];
        let n = self
            .socket
            .recv(&mut buf)
            .unwrap_or_else(|e| panic!("no notification came ({e}):\n{}", server.text()));
        let log = server.text();
        (String::from_utf8_lossy(&buf[..n]).into_owned(), log)
    }

    /// Whether no message is waiting.
    fn quiet(&self) -> bool {
        self.socket.set_nonblocking(true).unwrap();
        let mut buf = [0u8; 4096];
        let got = self.socket.recv(&mut buf);
        self.socket.set_nonblocking(false).unwrap();
        match got {
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => true,
            Err(e) => panic!("recv: {e}"),
            Ok(n) => {
                eprintln!("unexpected: {:?}", String::from_utf8_lossy(&buf[..n]));
                false
            }
        }
    }
}

/// The value of `key` in a message of `KEY=VALUE` lines.
fn field<'a>(message: &'a str, key: &str) -> Option<&'a str> {
    message
        .lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix('='))
}

/// The address the ready line names.
fn served_addr(log: &str) -> String {
    let line = log
        .lines()
        .find(|l| l.contains("ready: serving http://"))
        .unwrap_or_else(|| panic!("no ready line:\n{log}"));
    let rest = line.split("http://").nth(1).unwrap();
    rest.split_whitespace().next().unwrap().to_string()
}

/// A fifo that holds worker 1 back until the test opens it: the spawned
/// workers start through `worker.sh`, which waits on it for index 1.
struct Gate {
    fifo: PathBuf,
}

impl Gate {
    fn new(dir: &Path) -> (Gate, PathBuf) {
        let fifo = dir.join("gate");
        let _ = std::fs::remove_file(&fifo);
        let status = Command::new("mkfifo").arg(&fifo).status().unwrap();
        assert!(status.success(), "mkfifo {}", fifo.display());
        let script = dir.join("worker.sh");
        std::fs::write(
            &script,
            format!(
                "#!/bin/sh\nif [ \"$M0_WORKER_INDEX\" = 1 ]; then read go < '{}'; fi\nexec '{}' \"$@\"\n",
                fifo.display(),
                binary().display()
            ),
        )
        .unwrap();
        let status = Command::new("chmod")
            .arg("755")
            .arg(&script)
            .status()
            .unwrap();
        assert!(status.success());
        (Gate { fifo }, script)
    }

    /// Lets the worker waiting on the gate go; waits for it to be there.
    fn open(&self) {
        use std::os::unix::fs::OpenOptionsExt;
        let deadline = Instant::now() + WAIT;
        loop {
            // Non-blocking: opening for writing fails (ENXIO) until the
            // worker has opened its end.
            match std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_NONBLOCK)
                .open(&self.fifo)
            {
                Ok(mut f) => {
                    f.write_all(b"go\n").unwrap();
                    return;
                }
                Err(_) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => panic!("no worker waited at the gate: {e}"),
            }
        }
    }
}

fn environ_of(pid: u32) -> Vec<u8> {
    std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default()
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn ready_reloading_and_stopping_come_when_every_worker_serves_is_replaced_and_stops() {
    let dir = scratch_dir("sd_notify_spawn");
    let systemd = Systemd::at_path(&dir.join("notify"));
    let notify = dir.join("notify");
    let (gate, script) = Gate::new(&dir);
    let mut server = Logged::start(
        &["--workers", "2", "--spawn-workers"],
        &[
            ("NOTIFY_SOCKET", notify.to_str().unwrap()),
            ("M0_SPAWN_EXE", script.to_str().unwrap()),
        ],
        dir.join("server.log"),
    );

    // Worker 0 serves, worker 1 waits at the gate: not every worker
    // serves, so systemd has been told nothing.
    assert!(
        server.wait_for(&["worker 0: ", " serving "]),
        "{}",
        server.text()
    );
    assert!(systemd.quiet(), "a message came before every worker served");
    assert!(
        !server.text().contains("ready: serving"),
        "{}",
        server.text()
    );

    gate.open();
    let (ready, log) = systemd.next(&server);
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    assert_eq!(
        field(&ready, "MAINPID"),
        Some(server.pid().to_string().as_str()),
        "{ready:?}"
    );
    let addr = served_addr(&log);
    let status = field(&ready, "STATUS").unwrap_or_default();
    assert!(
        status.contains(&format!("serving http://{addr}")) && status.contains("2 worker(s)"),
        "{ready:?}"
    );
    assert!(
        log.lines()
            .filter(|l| l.contains("worker ") && l.contains(" serving "))
            .count()
            >= 2,
        "READY=1 came before both workers served:\n{log}"
    );
    // The workers were started without the variable: no plugin can speak
    // for the service (spawned workers show the environment they were
    // exec'd with; forked ones inherit the same environment).
    let workers = server.worker_pids();
    assert_eq!(workers.len(), 2, "{}", server.text());
    for pid in &workers {
        let env = environ_of(*pid);
        assert!(contains(&env, b"M0_WORKER_SPAWNED=1"), "pid {pid}");
        assert!(!contains(&env, b"NOTIFY_SOCKET="), "worker pid {pid}");
    }

    // SIGHUP: RELOADING=1 (with the monotonic time systemd asks for), then
    // READY=1 only once the last slot's new worker serves.
    server.signal(libc::SIGHUP);
    let (reloading, log) = systemd.next(&server);
    assert_eq!(field(&reloading, "RELOADING"), Some("1"), "{reloading:?}");
    assert!(
        field(&reloading, "MONOTONIC_USEC").is_some_and(|v| v.parse::<u64>().is_ok_and(|n| n > 0)),
        "{reloading:?}"
    );
    assert!(field(&reloading, "STATUS").is_some(), "{reloading:?}");
    assert!(log.contains("SIGHUP: replacing"), "{log}");
    assert!(server.wait_for(&["worker 0 replaced"]), "{}", server.text());
    assert!(
        systemd.quiet(),
        "READY=1 came while the new worker 1 was not serving"
    );
    gate.open();
    let (ready, log) = systemd.next(&server);
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    assert_eq!(
        field(&ready, "MAINPID"),
        Some(server.pid().to_string().as_str())
    );
    assert!(log.contains("worker 1 replaced"), "{log}");
    assert!(log.contains("SIGHUP: every worker replaced"), "{log}");

    // SIGTERM: STOPPING=1 as the stop begins, then a clean exit and no
    // further message.
    server.signal(libc::SIGTERM);
    let (stopping, log) = systemd.next(&server);
    assert_eq!(field(&stopping, "STOPPING"), Some("1"), "{stopping:?}");
    assert!(log.contains("stopping: workers finish"), "{log}");
    let status = server.wait_exit();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", server.text());
    assert!(systemd.quiet(), "a message came after STOPPING=1");
}

#[test]
fn an_abstract_socket_is_told_ready_and_stopping_with_forked_workers() {
    let dir = scratch_dir("sd_notify_fork");
    let name = format!("m0serve-test-notify-{}", std::process::id());
    let systemd = Systemd::abstract_name(&name);
    let mut server = Logged::start(
        &["--workers", "2"],
        &[("NOTIFY_SOCKET", &format!("@{name}"))],
        dir.join("server.log"),
    );
    let (ready, log) = systemd.next(&server);
    assert_eq!(field(&ready, "READY"), Some("1"), "{ready:?}");
    assert_eq!(
        field(&ready, "MAINPID"),
        Some(server.pid().to_string().as_str())
    );
    assert!(log.contains("ready: serving"), "{log}");
    assert!(systemd.quiet(), "one READY=1 for one start");
    server.signal(libc::SIGTERM);
    let (stopping, _) = systemd.next(&server);
    assert_eq!(field(&stopping, "STOPPING"), Some("1"), "{stopping:?}");
    assert_eq!(server.wait_exit().and_then(|s| s.code()), Some(0));
    assert!(systemd.quiet(), "a message came after STOPPING=1");
}

#[test]
fn an_unusable_notify_socket_is_named_and_the_server_serves_anyway() {
    let dir = scratch_dir("sd_notify_bad");
    let mut server = Logged::start(
        &["--workers", "1"],
        &[("NOTIFY_SOCKET", "relative/notify")],
        dir.join("server.log"),
    );
    assert!(server.wait_for(&["ready: serving"]), "{}", server.text());
    let log = server.text();
    assert!(
        log.lines()
            .any(|l| l.contains("NOTIFY_SOCKET=\"relative/notify\"") && l.contains("unset")),
        "{log}"
    );
    server.signal(libc::SIGTERM);
    assert_eq!(server.wait_exit().and_then(|s| s.code()), Some(0));
}

#[test]
fn the_doctor_reports_the_notify_socket() {
    let hello = plugin("hello_c");
    let doctor = |value: Option<&str>| -> serde_json::Value {
        let mut cmd = Command::new(binary());
        cmd.args(["--doctor", "--port", "0", "--plugin"])
            .arg(&hello);
        match value {
            Some(v) => cmd.env("NOTIFY_SOCKET", v),
            None => cmd.env_remove("NOTIFY_SOCKET"),
        };
        let out = cmd.output_bounded().unwrap();
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    assert!(doctor(None)["server"]["sd_notify"].is_null());
    let j = doctor(Some("@m0serve-doctor"));
    assert_eq!(j["server"]["sd_notify"], "@m0serve-doctor");
    assert!(
        j["checks"]
            .as_array()
            .unwrap()
            .iter()
            .all(|c| c["name"] != "sd_notify")
    );
    let j = doctor(Some("relative/notify"));
    assert_eq!(j["server"]["sd_notify"], "relative/notify");
    let check = j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == "sd_notify")
        .unwrap_or_else(|| panic!("no sd_notify check: {j:#}"));
    assert_eq!(check["warning"], true);
    assert!(
        check["fix"].as_str().unwrap().contains("NOTIFY_SOCKET"),
        "{check}"
    );
}
