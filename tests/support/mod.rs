//! Test support: start the real `m0serve` binary on a free port, read its
//! log, and talk HTTP/1.1 to it over real sockets.
//!
//! Every server is started in its own process group and killed with the
//! group when the `Server` is dropped, so a failed test leaves no workers.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

pub use turns::{one_at_a_time, serial};

pub mod embed;
pub mod test_dir;
pub mod tools;
pub mod turns;
pub mod venv;
pub mod wsgi;

pub fn binary() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_m0serve"))
}

/// A server running the hello_c example plugin, with `extra` flags.
pub fn hello_c(extra: &[&str]) -> Server {
    let p = plugin("hello_c");
    let mut args = vec!["--plugin", p.to_str().unwrap()];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// The workspace's Rust plugins, by short name, and their packages.
/// Integration tests of the root package do not build other workspace
/// members by themselves (`cargo test --workspace` builds a cdylib only as
/// a test harness), so `plugin` builds these first.
const RUST_PLUGINS: [(&str, &str); 5] = [
    ("hello_rs", "hello-rs"),
    ("sdk_faults", "sdk-faults"),
    ("embed", "m0-embed-cdylib"),
    ("wsgi", "m0-wsgi"),
    ("pyembed", "m0-pyembed"),
];

/// Builds (or brings up to date) `package` for this test profile, once per
/// test binary.
fn build_package(package: &str) {
    static BUILT: Mutex<Vec<String>> = Mutex::new(Vec::new());
    let mut built = BUILT.lock().unwrap_or_else(|e| e.into_inner());
    if built.iter().any(|p| p == package) {
        return;
    }
    let release = binary()
        .parent()
        .and_then(|d| d.file_name())
        .is_some_and(|n| n == "release");
    let mut cmd = Command::new(env!("CARGO"));
    cmd.args(["build", "--quiet", "-p", package])
        .current_dir(repo_root());
    if release {
        cmd.arg("--release");
    }
    let status = cmd
        .status()
        .unwrap_or_else(|e| panic!("run cargo build -p {package}: {e}"));
    assert!(status.success(), "cargo build -p {package} failed");
    built.push(package.to_string());
}

/// A plugin built beside the binary (`libNAME.so`); the workspace's Rust
/// plugins are built first.
pub fn plugin(name: &str) -> PathBuf {
    if let Some((_, package)) = RUST_PLUGINS.iter().find(|(n, _)| *n == name) {
        build_package(package);
    }
    let dir = binary()
        .parent()
        .expect("binary has a directory")
        .to_path_buf();
    for candidate in [format!("lib{name}.so"), format!("libm0_{name}.so")] {
        let path = dir.join(candidate);
        if path.is_file() {
            return path;
        }
    }
    panic!(
        "plugin {name} is not built beside {}; run cargo build --workspace",
        binary().display()
    )
}

/// What a `--doctor` run printed: its exit code and its JSON (a test fails
/// at once, with both streams, when stdout holds none).
pub fn doctor_json(out: &std::process::Output) -> (Option<i32>, serde_json::Value) {
    let text = String::from_utf8_lossy(&out.stdout);
    let j = serde_json::from_str(text.trim()).unwrap_or_else(|e| {
        panic!(
            "no JSON ({e}):\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), j)
}

/// The names of the checks a `--doctor` report marks as warnings.
pub fn doctor_warnings(j: &serde_json::Value) -> Vec<String> {
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|c| c["warning"] == true)
        .map(|c| c["name"].as_str().unwrap().to_string())
        .collect()
}

/// One request on a new connection (`Connection: close`): `Ok` when the
/// reply starts `HTTP/1.1 200` and ends with `tail`, else what happened.
/// New connections each time, so refused connects show.
pub fn fresh_request(addr: SocketAddr, request: &[u8], tail: &[u8]) -> Result<(), String> {
    let mut c = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let sent = c.write_all(request);
    let mut out = Vec::new();
    let read = c.read_to_end(&mut out);
    if out.starts_with(b"HTTP/1.1 200") && out.ends_with(tail) {
        Ok(())
    } else {
        Err(format!(
            "send {sent:?}, read {read:?}: {:?}",
            String::from_utf8_lossy(&out)
        ))
    }
}

/// Two clients loop on `request` (see [`fresh_request`]) while the server
/// gets a SIGHUP; asserts that no request failed, that the loop ran, and
/// that every worker was replaced (the last within `replaced_within`).
pub fn sighup_under_load(s: &Server, request: &[u8], tail: &[u8], replaced_within: Duration) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let before = s.worker_pids();
    let stop = AtomicBool::new(false);
    let (ok, failures) = std::thread::scope(|scope| {
        let load: Vec<_> = (0..2)
            .map(|_| {
                scope.spawn(|| {
                    let (mut ok, mut failures) = (0u32, Vec::new());
                    let deadline = Instant::now() + replaced_within + Duration::from_secs(5);
                    while !stop.load(Ordering::Relaxed) && Instant::now() < deadline {
                        match fresh_request(s.addr, request, tail) {
                            Ok(()) => ok += 1,
                            Err(e) => failures.push(e),
                        }
                    }
                    (ok, failures)
                })
            })
            .collect();
        std::thread::sleep(Duration::from_millis(300));
        s.signal(libc::SIGHUP);
        let replaced = s.wait_for_log("worker 1 replaced", replaced_within);
        std::thread::sleep(Duration::from_millis(500));
        stop.store(true, Ordering::Relaxed);
        assert!(replaced, "{}", s.log());
        let (mut ok, mut failures) = (0, Vec::new());
        for h in load {
            let (o, f) = h.join().unwrap();
            ok += o;
            failures.extend(f);
        }
        (ok, failures)
    });
    assert!(
        failures.is_empty(),
        "{} failed of {}: {:?}",
        failures.len(),
        ok + failures.len() as u32,
        &failures[..failures.len().min(5)]
    );
    assert!(ok > 10, "the load loop barely ran: {ok}");
    let after = s.worker_pids();
    assert!(
        before.iter().all(|p| !after.contains(p)),
        "workers not replaced: {before:?} -> {after:?}"
    );
}

pub fn repo_root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

pub struct Server {
    child: Child,
    pub addr: SocketAddr,
    log: Arc<Mutex<String>>,
    /// Counts the server for the test that started it (`turns`).
    _ticket: turns::Ticket,
}

/// A command for the binary with `--host 127.0.0.1 --port 0` added.
pub fn command(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(["--host", "127.0.0.1", "--port", "0"]).args(args);
    cmd.env_remove("M0_WORKERS")
        .env_remove("M0_BLOCKING_THREADS");
    // Many tests count from the workers' statistics, which are debug lines;
    // `workers::the_log_level_hides_the_tuning_detail_by_default` checks
    // the default.
    cmd.env("M0_LOG_LEVEL", "debug");
    // The embedding tests compare scores and vectors with f32 references
    // within f32's error: on a CPU with bf16 `auto` would compute in bf16
    // and fail them. bf16 has tests of its own (embed_dtype), which set
    // the variable themselves.
    cmd.env("M0_EMBED_DTYPE", "float32");
    cmd
}

/// Run `cmd` on one CPU, the first this test may use (as `taskset -c N`
/// would): each of its workers then has one CPU of its own.
pub fn pin_to_one_cpu(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: an all-zero cpu_set_t is the empty set; the call fills it.
    let cpu = unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::sched_getaffinity(0, size, &mut set);
        (0..libc::CPU_SETSIZE as usize)
            .find(|&c| libc::CPU_ISSET(c, &set))
            .unwrap_or(0)
    };
    // SAFETY: the closure makes one system call on its own stack data,
    // which is async-signal-safe between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(cpu, &mut set);
            if libc::sched_setaffinity(0, size, &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The CPUs this process may run on (its affinity), in order.
pub fn affinity_cpus() -> Vec<usize> {
    let size = std::mem::size_of::<libc::cpu_set_t>();
    // SAFETY: an all-zero cpu_set_t is the empty set; the call fills it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        assert_eq!(libc::sched_getaffinity(0, size, &mut set), 0);
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// The CPUs the cgroup's quota (`cpu.max`) grants, rounded up; `None`
/// without a quota.
fn cpu_quota() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/fs/cgroup/cpu.max").ok()?;
    let mut parts = text.split_whitespace();
    let quota: f64 = parts.next()?.parse().ok()?;
    let period: f64 = parts.next()?.parse().ok()?;
    Some((quota / period).ceil() as usize)
}

/// CPUs this process may use, as the server counts them (affinity, then a
/// cgroup quota).
pub fn usable_cpus() -> usize {
    let affinity = affinity_cpus().len();
    affinity.min(cpu_quota().unwrap_or(usize::MAX)).max(1)
}

/// Run `cmd` on the first `n` CPUs this test may use (as `taskset -c`
/// would), so the server has exactly `n` usable CPUs whatever the box
/// has. `Err(k)` when this process may use only `k` < `n` CPUs, by
/// affinity or by its cgroup's CPU quota.
pub fn pin_to_cpus(cmd: &mut Command, n: usize) -> Result<(), usize> {
    use std::os::unix::process::CommandExt;
    let size = std::mem::size_of::<libc::cpu_set_t>();
    let cpus: Vec<usize> = affinity_cpus().into_iter().take(n).collect();
    let usable = cpus.len().min(cpu_quota().unwrap_or(usize::MAX));
    if usable < n {
        return Err(usable);
    }
    // SAFETY: the closure makes one system call on its own stack data,
    // which is async-signal-safe between fork and exec.
    unsafe {
        cmd.pre_exec(move || {
            let mut set: libc::cpu_set_t = std::mem::zeroed();
            for &c in &cpus {
                libc::CPU_SET(c, &mut set);
            }
            if libc::sched_setaffinity(0, size, &set) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

impl Server {
    /// Start with `args` and wait for the ready line.
    pub fn start(args: &[&str]) -> Server {
        Server::start_cmd(command(args))
    }

    pub fn start_cmd(cmd: Command) -> Server {
        Server::try_start(cmd)
            .unwrap_or_else(|(log, status)| panic!("server did not start ({status:?}):\n{log}"))
    }

    /// Start and wait for the ready line; on failure give back the log and
    /// the exit status.
    pub fn try_start(cmd: Command) -> Result<Server, (String, Option<ExitStatus>)> {
        Server::try_start_within(cmd, Duration::from_secs(60))
    }

    /// `try_start`, waiting up to `wait` for the ready line (a command that
    /// builds the server first needs minutes).
    pub fn try_start_within(
        cmd: Command,
        wait: Duration,
    ) -> Result<Server, (String, Option<ExitStatus>)> {
        Server::try_start_when(cmd, wait, ready_addr)
    }

    /// Start and wait until `addr_in` finds the server's address in its
    /// log (the ready line for `try_start_within`; a plugin's own line for
    /// a server whose workers are still loading).
    pub fn try_start_when(
        mut cmd: Command,
        wait: Duration,
        addr_in: impl Fn(&str) -> Option<SocketAddr>,
    ) -> Result<Server, (String, Option<ExitStatus>)> {
        use std::os::unix::process::CommandExt;
        let ticket = turns::ticket();
        cmd.stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0);
        let mut child = cmd.spawn().expect("spawn m0serve");
        let log = Arc::new(Mutex::new(String::new()));
        for stream in [
            Box::new(child.stderr.take().expect("stderr")) as Box<dyn Read + Send>,
            Box::new(child.stdout.take().expect("stdout")) as Box<dyn Read + Send>,
        ] {
            let log = Arc::clone(&log);
            std::thread::spawn(move || {
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { break };
                    let mut l = log.lock().unwrap();
                    l.push_str(&line);
                    l.push('\n');
                }
            });
        }
        let deadline = Instant::now() + wait;
        loop {
            let ready = addr_in(&log.lock().unwrap());
            if let Some(addr) = ready {
                return Ok(Server {
                    child,
                    addr,
                    log,
                    _ticket: ticket,
                });
            }
            if let Ok(Some(status)) = child.try_wait() {
                std::thread::sleep(Duration::from_millis(100));
                return Err((log.lock().unwrap().clone(), Some(status)));
            }
            if Instant::now() > deadline {
                let _ = child.kill();
                return Err((log.lock().unwrap().clone(), None));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn log(&self) -> String {
        self.log.lock().unwrap().clone()
    }

    /// Wait until a log line contains `needle` (true) or `timeout` passes.
    pub fn wait_for_log(&self, needle: &str, timeout: Duration) -> bool {
        self.wait_for_log_count(needle, 1, timeout) >= 1
    }

    /// Wait until at least `n` log lines contain `needle`, or `timeout`
    /// passes; returns the count then, so the caller asserts the exact number.
    pub fn wait_for_log_count(&self, needle: &str, n: usize, timeout: Duration) -> usize {
        let deadline = Instant::now() + timeout;
        loop {
            let count = self.log_count(needle);
            if count >= n || Instant::now() >= deadline {
                return count;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Count of lines in the log containing `needle`.
    pub fn log_count(&self, needle: &str) -> usize {
        self.log().lines().filter(|l| l.contains(needle)).count()
    }

    pub fn signal(&self, signal: i32) {
        // SAFETY: sending a signal to a child we started.
        unsafe { libc::kill(self.pid(), signal) };
    }

    /// SIGTERM, wait until the supervisor has exited, and the whole log,
    /// the workers' closing lines included.
    pub fn stop_and_log(&mut self) -> String {
        self.signal(libc::SIGTERM);
        assert!(
            self.wait_exit(Duration::from_secs(30)).is_some(),
            "{}",
            self.log()
        );
        self.log()
    }

    /// Wait for the supervisor to exit.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        while Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                std::thread::sleep(Duration::from_millis(50));
                return Some(status);
            }
            std::thread::sleep(Duration::from_millis(10));
        }
        None
    }

    /// SIGHUP, then wait until every one of `workers` is replaced and each
    /// replaced worker has drained (a "drained:" line apiece).
    pub fn reload_and_wait(&self, workers: usize) {
        self.signal(libc::SIGHUP);
        for index in 0..workers {
            assert!(
                self.wait_for_log(&format!("worker {index} replaced"), Duration::from_secs(30)),
                "{}",
                self.log()
            );
        }
        assert_eq!(
            self.wait_for_log_count("drained:", workers, Duration::from_secs(30)),
            workers,
            "{}",
            self.log()
        );
    }

    /// The `--metrics` listener's address, from the server's
    /// "metrics: serving" line (a port the kernel picked, with port 0).
    pub fn metrics_addr(&self) -> SocketAddr {
        let log = self.log();
        log.lines()
            .find_map(|l| l.split("metrics: serving http://").nth(1))
            .and_then(|rest| rest.strip_suffix("/metrics"))
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("no metrics address in:\n{log}"))
    }

    /// Worker pids from the supervisor's "worker N pid=P started" lines,
    /// latest per index.
    pub fn worker_pids(&self) -> Vec<i32> {
        let mut by_index: Vec<(usize, i32)> = Vec::new();
        for line in self.log().lines() {
            let Some(rest) = line.split("supervisor: worker ").nth(1) else {
                continue;
            };
            if !rest.ends_with("started") {
                continue;
            }
            let mut parts = rest.split_whitespace();
            let index: usize = parts
                .next()
                .and_then(|s| s.parse().ok())
                .unwrap_or(usize::MAX);
            let pid: i32 = parts
                .next()
                .and_then(|s| s.strip_prefix("pid="))
                .and_then(|s| s.parse().ok())
                .unwrap_or(0);
            by_index.retain(|(i, _)| *i != index);
            by_index.push((index, pid));
        }
        by_index.sort();
        by_index.into_iter().map(|(_, p)| p).collect()
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        // SAFETY: the child leads its own process group; kill the group.
        unsafe { libc::kill(-self.pid(), libc::SIGKILL) };
        let _ = self.child.wait();
    }
}

fn ready_addr(log: &str) -> Option<SocketAddr> {
    // The first line that holds an address after it: a script that starts
    // the server may say the words before the server does.
    log.lines()
        .filter_map(|l| l.split("ready: serving http://").nth(1))
        .find_map(|rest| rest.split_whitespace().next()?.parse().ok())
}

/// A parsed HTTP response.
#[derive(Debug, Clone)]
pub struct Response {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
    pub chunked: bool,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

/// A client connection that reads responses one at a time.
pub struct Client {
    pub stream: TcpStream,
    buf: Vec<u8>,
}

impl Client {
    pub fn connect(addr: SocketAddr) -> Client {
        let stream = TcpStream::connect(addr).expect("connect");
        stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        stream.set_nodelay(true).unwrap();
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    /// A client over a stream the caller connected.
    pub fn from_stream(stream: TcpStream) -> Client {
        let _ = stream.set_nodelay(true);
        Client {
            stream,
            buf: Vec::new(),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send");
    }

    /// `GET path` with keep-alive.
    pub fn get(&mut self, path: &str) -> Response {
        self.send(format!("GET {path} HTTP/1.1\r\nHost: t\r\n\r\n").as_bytes());
        self.read_response(false).expect("a response")
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.try_request(method, path, headers, body)
            .expect("a response")
    }

    /// `request`, or `None` when no reply came (the connection closed, or
    /// the read timed out).
    pub fn try_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Option<Response> {
        let mut req = format!(
            "{method} {path} HTTP/1.1\r\nHost: t\r\nContent-Length: {}\r\n",
            body.len()
        );
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send(&bytes);
        self.read_response(method == "HEAD")
    }

    fn fill(&mut self) -> bool {
        let mut chunk = [0u8; 65536];
        match self.stream.read(&mut chunk) {
            Ok(0) | Err(_) => false,
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                true
            }
        }
    }

    /// Read one response; None when the connection closed first.
    pub fn read_response(&mut self, head_request: bool) -> Option<Response> {
        let head_end = loop {
            if let Some(p) = self.buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break p + 4;
            }
            if !self.fill() {
                return None;
            }
        };
        let head = String::from_utf8_lossy(&self.buf[..head_end]).into_owned();
        self.buf.drain(..head_end);
        let mut lines = head.split("\r\n");
        let status_line = lines.next()?;
        let status: u16 = status_line.split(' ').nth(1)?.parse().ok()?;
        let headers: Vec<(String, String)> = lines
            .filter(|l| !l.is_empty())
            .filter_map(|l| {
                l.split_once(':')
                    .map(|(n, v)| (n.trim().to_string(), v.trim().to_string()))
            })
            .collect();
        let get = |n: &str| {
            headers
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(n))
                .map(|(_, v)| v.clone())
        };
        let chunked = get("transfer-encoding").is_some_and(|v| v.eq_ignore_ascii_case("chunked"));
        let no_body =
            head_request || status == 204 || status == 304 || (100..200).contains(&status);
        let body = if no_body {
            Vec::new()
        } else if chunked {
            self.read_chunked()?
        } else if let Some(len) = get("content-length") {
            let len: usize = len.parse().ok()?;
            while self.buf.len() < len {
                if !self.fill() {
                    return None;
                }
            }
            self.buf.drain(..len).collect()
        } else {
            while self.fill() {}
            std::mem::take(&mut self.buf)
        };
        Some(Response {
            status,
            headers,
            body,
            chunked,
        })
    }

    fn read_line(&mut self) -> Option<String> {
        loop {
            if let Some(p) = self.buf.windows(2).position(|w| w == b"\r\n") {
                let line = String::from_utf8_lossy(&self.buf[..p]).into_owned();
                self.buf.drain(..p + 2);
                return Some(line);
            }
            if !self.fill() {
                return None;
            }
        }
    }

    fn read_chunked(&mut self) -> Option<Vec<u8>> {
        let mut body = Vec::new();
        loop {
            let line = self.read_line()?;
            let size = usize::from_str_radix(line.split(';').next()?.trim(), 16).ok()?;
            if size == 0 {
                // Trailers, then the empty line.
                while !self.read_line()?.is_empty() {}
                return Some(body);
            }
            while self.buf.len() < size + 2 {
                if !self.fill() {
                    return None;
                }
            }
            body.extend(self.buf.drain(..size));
            self.buf.drain(..2);
        }
    }

    /// True when the server has closed the connection (EOF, reset or
    /// nothing more within `timeout`... reported as false).
    pub fn is_closed(&mut self, timeout: Duration) -> bool {
        self.stream.set_read_timeout(Some(timeout)).unwrap();
        let mut b = [0u8; 1];
        let closed = match self.stream.read(&mut b) {
            Ok(0) => true,
            Ok(_) => {
                self.buf.push(b[0]);
                false
            }
            Err(e) => matches!(e.kind(), std::io::ErrorKind::ConnectionReset),
        };
        self.stream
            .set_read_timeout(Some(Duration::from_secs(30)))
            .unwrap();
        closed
    }
}

/// Send raw bytes on a new connection and read until the server closes.
pub fn raw_exchange(addr: SocketAddr, bytes: &[u8]) -> Vec<u8> {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .unwrap();
    stream.write_all(bytes).expect("send");
    let mut out = Vec::new();
    let _ = stream.read_to_end(&mut out);
    out
}

/// The status code of the first response in `bytes`.
pub fn status_of(bytes: &[u8]) -> u16 {
    let text = String::from_utf8_lossy(bytes);
    text.split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn get(addr: SocketAddr, path: &str) -> Response {
    Client::connect(addr).get(path)
}

/// A directory for this test binary's build products.
pub fn scratch_dir(name: &str) -> PathBuf {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Compile C with the flags the header promises to be clean under, into a
/// file of this process's and then renamed over `out`: under nextest each
/// test is its own process, and two that built one plugin into the same
/// path at once had a server open it half-written (`dlopen failed`). A
/// server that opened the old file keeps it; the rename only swaps names.
pub fn cc(args: &[&str], out: &std::path::Path) {
    let mut partial = out.as_os_str().to_owned();
    partial.push(format!(".partial.{}", std::process::id()));
    let partial = PathBuf::from(partial);
    let status = Command::new("cc")
        .args([
            "-std=c11",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-fvisibility=hidden",
            "-I",
        ])
        .arg(repo_root().join("include"))
        .args(args)
        .arg("-o")
        .arg(&partial)
        .status()
        .expect("run cc");
    assert!(status.success(), "cc {args:?} failed");
    std::fs::rename(&partial, out)
        .unwrap_or_else(|e| panic!("rename {} to {}: {e}", partial.display(), out.display()));
}

/// `tests/c/bad_plugin.c` built with `defines` choosing its defect.
pub fn bad_plugin(name: &str, defines: &[&str]) -> PathBuf {
    let out = scratch_dir("bad_plugins").join(format!("lib{name}.so"));
    let src = repo_root().join("tests/c/bad_plugin.c");
    let mut args = vec!["-shared", src.to_str().unwrap()];
    args.extend_from_slice(defines);
    cc(&args, &out);
    out
}

/// `cmd.output()`, bounded: a process expected to exit (a refused start,
/// `--doctor`) that serves instead is killed after `timeout` and the test
/// fails with what it wrote, rather than hanging the suite.
pub fn output_within(cmd: &mut Command, timeout: Duration) -> std::process::Output {
    // As Command::output: no stdin (a read sees its end at once).
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let drain = |r: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut r) = r {
                let _ = r.read_to_end(&mut buf);
            }
            buf
        })
    };
    let out = drain(
        child
            .stdout
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let err = drain(
        child
            .stderr
            .take()
            .map(|r| Box::new(r) as Box<dyn Read + Send>),
    );
    let deadline = Instant::now() + timeout;
    let status = loop {
        if let Some(status) = child.try_wait().expect("wait") {
            break Some(status);
        }
        if Instant::now() >= deadline {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let (stdout, stderr) = (out.join().unwrap(), err.join().unwrap());
    let Some(status) = status else {
        panic!(
            "still running after {timeout:?}, killed: {}{}",
            String::from_utf8_lossy(&stderr),
            String::from_utf8_lossy(&stdout)
        );
    };
    std::process::Output {
        status,
        stdout,
        stderr,
    }
}

/// How long [`OutputBounded::output_bounded`] waits: a debug build on a
/// busy 2-CPU box loads a model and answers `--doctor` in well under it,
/// and a hang costs this instead of the rest of CI's 90 minutes.
pub const OUTPUT_TIMEOUT: Duration = Duration::from_secs(600);

/// `Command::output` for processes a test expects to exit, bounded by
/// [`OUTPUT_TIMEOUT`] ([`output_within`]): a server that starts serving
/// where it should have refused fails its test instead of hanging the
/// suite until CI's limit. Never an `Err`: a spawn that fails panics, as
/// every caller unwrapped it.
pub trait OutputBounded {
    fn output_bounded(&mut self) -> std::io::Result<std::process::Output>;
}

impl OutputBounded for Command {
    fn output_bounded(&mut self) -> std::io::Result<std::process::Output> {
        Ok(output_within(self, OUTPUT_TIMEOUT))
    }
}
