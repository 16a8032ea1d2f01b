//! Behind nginx (Debian's `nginx-light`, from tests/install-tools), with the
//! checked-in `deploy/nginx/m0serve.conf` over two instances: rolling
//! restarts (SIGHUP each, then a stop and start of each in turn) while a
//! client sends GETs fail none of them; a kill -9 of one instance's
//! supervisor fails at most the request in flight there. nginx is stopped
//! as nginx is stopped (SIGQUIT), and each test checks that none of its
//! processes outlives it.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::test_dir::TestDir;
use crate::support::{Server, binary, plugin, repo_root};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// A two-worker hello_c on `port`, 0 for one the kernel picks (the first
/// start: a port found free and handed over could be taken in between).
fn instance(port: u16) -> Server {
    let hello = plugin("hello_c");
    let mut cmd = Command::new(binary());
    cmd.args(["--plugin", hello.to_str().unwrap(), "--host", "127.0.0.1"])
        .args(["--port", &port.to_string(), "--workers", "2"])
        .env("M0_LOG_LEVEL", "debug")
        .env_remove("M0_WORKERS");
    Server::start_cmd(cmd)
}

struct Nginx {
    child: Child,
    addr: SocketAddr,
    /// Its prefix (config, pid file, logs, temp files), removed when the
    /// test passes.
    _dir: TestDir,
}

/// The pids of the running processes whose parent is `parent`, with
/// their names (/proc/PID/stat's comm).
fn children_of(parent: u32) -> Vec<(u32, String)> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(e.path().join("stat")) else {
            continue;
        };
        // "PID (COMM) STATE PPID ...": COMM may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let mut rest = stat[close + 1..].split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if ppid == Some(parent) && state != Some("Z") {
            out.push((pid, stat[open + 1..close].to_string()));
        }
    }
    out
}

/// Whether `pid` is a live (not zombie) process named `name`.
fn alive(pid: u32, name: &str) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        let named = stat.contains(&format!("({name})"));
        let state = stat
            .rfind(')')
            .and_then(|i| stat[i + 1..].split_whitespace().next());
        named && state != Some("Z")
    })
}

impl Nginx {
    /// The master's worker processes.
    fn workers(&self) -> Vec<u32> {
        children_of(self.child.id())
            .into_iter()
            .filter(|(_, name)| name == "nginx")
            .map(|(pid, _)| pid)
            .collect()
    }

    fn stop(&mut self) -> Option<std::process::ExitStatus> {
        quit(&mut self.child)
    }
}

/// Stops an nginx master as nginx is stopped: SIGQUIT, a graceful shutdown
/// in which the master tells its workers to finish, waits for each and only
/// then exits (SIGKILL would kill the master alone and leave its workers
/// running, listening, for good). Should it not exit within a minute,
/// SIGTERM (a fast shutdown, which also waits for the workers).
fn quit(master: &mut Child) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = master.try_wait() {
        return Some(status);
    }
    let pid = master.id() as i32;
    // SAFETY: signalling the nginx master this test started and has not
    // reaped, so the pid is still its.
    unsafe { libc::kill(pid, libc::SIGQUIT) };
    let deadline = Instant::now() + Duration::from_secs(60);
    while Instant::now() < deadline {
        if let Ok(Some(status)) = master.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // SAFETY: as above: not yet reaped.
    unsafe { libc::kill(pid, libc::SIGTERM) };
    master.wait().ok()
}

impl Drop for Nginx {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Stops nginx and checks that its master exited and that none of the
/// workers it had outlives it.
fn stop_nginx(mut proxy: Nginx) {
    let workers = proxy.workers();
    assert!(!workers.is_empty(), "nginx has no worker process");
    let status = proxy.stop();
    let left: Vec<u32> = workers.into_iter().filter(|&w| alive(w, "nginx")).collect();
    assert!(
        left.is_empty(),
        "nginx worker process(es) {left:?} outlived their master (which exited {status:?})"
    );
    assert!(
        status.is_some_and(|s| s.success()),
        "nginx did not exit 0 on SIGQUIT: {status:?}"
    );
}

/// nginx in the foreground with the checked-in config, its three ports
/// replaced by the ones given.
fn nginx(a: u16, b: u16) -> Nginx {
    let nginx = support::tools::system_tool("nginx");
    let dir = TestDir::new(&format!("nginx-{a}"));
    std::fs::create_dir_all(dir.join("logs")).unwrap();
    // nginx cannot take port 0 and say which it got: a port found free may
    // be taken before nginx binds it, so an nginx that exits gets another.
    for _ in 0..5 {
        let listen = free_port();
        let site = std::fs::read_to_string(repo_root().join("deploy/nginx/m0serve.conf"))
            .unwrap()
            .replace("127.0.0.1:8001", &format!("127.0.0.1:{a}"))
            .replace("127.0.0.1:8002", &format!("127.0.0.1:{b}"))
            .replace("127.0.0.1:8080", &format!("127.0.0.1:{listen}"));
        let conf = format!(
            "daemon off;\nworker_processes 1;\npid {dir}/nginx.pid;\nerror_log {dir}/logs/error.log warn;\n\
             events {{ worker_connections 1024; }}\n\
             http {{\n access_log off;\n client_body_temp_path {dir}/body;\n proxy_temp_path {dir}/proxy;\n\
             fastcgi_temp_path {dir}/fastcgi;\n uwsgi_temp_path {dir}/uwsgi;\n scgi_temp_path {dir}/scgi;\n{site}\n}}\n",
            dir = dir.display()
        );
        let path = dir.join("nginx.conf");
        std::fs::write(&path, conf).unwrap();
        let mut child = Command::new(&nginx)
            .arg("-p")
            .arg(&*dir)
            .arg("-c")
            .arg(&path)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nginx");
        let addr: SocketAddr = format!("127.0.0.1:{listen}").parse().unwrap();
        for _ in 0..200 {
            if child.try_wait().ok().flatten().is_some() {
                break;
            }
            if TcpStream::connect(addr).is_ok() {
                return Nginx {
                    child,
                    addr,
                    _dir: dir,
                };
            }
            std::thread::sleep(Duration::from_millis(25));
        }
        // It never listened: its master exited, or is stopped here.
        quit(&mut child);
    }
    panic!("nginx did not listen on any of 5 free ports");
}

/// GETs through nginx, one after another over a keep-alive connection
/// (a new one after any error), until `stop`: (sent, failed).
fn client(addr: SocketAddr, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<(usize, usize)> {
    std::thread::spawn(move || {
        let (mut sent, mut failed) = (0, 0);
        let mut conn: Option<TcpStream> = None;
        while !stop.load(Ordering::Relaxed) {
            sent += 1;
            let ok = (|| -> std::io::Result<bool> {
                if conn.is_none() {
                    let s = TcpStream::connect(addr)?;
                    s.set_read_timeout(Some(Duration::from_secs(10)))?;
                    conn = Some(s);
                }
                let s = conn.as_mut().unwrap();
                s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")?;
                let mut buf = [0u8; 4096];
                let mut got = Vec::new();
                while !got.ends_with(b"hello, world\n") && got.len() < 4096 {
                    let n = s.read(&mut buf)?;
                    if n == 0 {
                        return Ok(false);
                    }
                    got.extend_from_slice(&buf[..n]);
                    if got.starts_with(b"HTTP/1.1 5") {
                        return Ok(false);
                    }
                }
                // nginx closes a client's keep-alive connection after
                // `keepalive_requests` (1000), saying so: go on with a new one.
                let head_end = got.windows(4).position(|w| w == b"\r\n\r\n").unwrap_or(0);
                let head = String::from_utf8_lossy(&got[..head_end]).to_ascii_lowercase();
                if head.contains("\r\nconnection: close") {
                    conn = None;
                }
                Ok(got.starts_with(b"HTTP/1.1 200"))
            })();
            if !ok.as_ref().is_ok_and(|ok| *ok) {
                if failed < 3 {
                    eprintln!("GET {sent} failed: {ok:?}");
                }
                failed += 1;
                conn = None;
            }
        }
        (sent, failed)
    })
}

fn replaced(s: &Server, n: usize) {
    assert_eq!(
        s.wait_for_log_count("replaced; old pid", n, Duration::from_secs(30)),
        n,
        "{}",
        s.log()
    );
}

fn stop(mut s: Server) {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|st| st.code()), Some(0), "{}", s.log());
}

#[test]
fn rolling_restarts_behind_nginx_fail_no_request() {
    let _serial = support::one_at_a_time();
    let (mut a, mut b) = (instance(0), instance(0));
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let proxy = nginx(pa, pb);
    let stop_flag = Arc::new(AtomicBool::new(false));
    let load = client(proxy.addr, Arc::clone(&stop_flag));
    std::thread::sleep(Duration::from_millis(300));
    // SIGHUP each: workers replaced one at a time.
    a.signal(libc::SIGHUP);
    replaced(&a, 2);
    b.signal(libc::SIGHUP);
    replaced(&b, 2);
    // A full stop and start of each in turn.
    stop(a);
    std::thread::sleep(Duration::from_millis(300));
    a = instance(pa);
    stop(b);
    std::thread::sleep(Duration::from_millis(300));
    b = instance(pb);
    std::thread::sleep(Duration::from_millis(300));
    stop_flag.store(true, Ordering::Relaxed);
    let (sent, failed) = load.join().unwrap();
    eprintln!("through nginx: {sent} GETs, {failed} failed");
    assert!(sent > 100, "the client sent only {sent}");
    assert_eq!(
        failed,
        0,
        "{failed} of {sent} GETs failed\n{}\n{}",
        a.log(),
        b.log()
    );
    stop_nginx(proxy);
    drop((a, b));
}

#[test]
fn a_killed_instance_fails_at_most_the_request_in_flight() {
    let _serial = support::one_at_a_time();
    let (a, b) = (instance(0), instance(0));
    let (pa, pb) = (a.addr.port(), b.addr.port());
    let proxy = nginx(pa, pb);
    let stop_flag = Arc::new(AtomicBool::new(false));
    let load = client(proxy.addr, Arc::clone(&stop_flag));
    std::thread::sleep(Duration::from_millis(500));
    // SAFETY: killing the supervisor of a server this test started.
    unsafe { libc::kill(a.pid(), libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(1500));
    stop_flag.store(true, Ordering::Relaxed);
    let (sent, failed) = load.join().unwrap();
    eprintln!("through nginx, one instance killed: {sent} GETs, {failed} failed");
    // One client, one request in flight at a time; nginx retries the GET
    // whose upstream died before it answered.
    assert!(failed <= 1, "{failed} of {sent} GETs failed\n{}", b.log());
    assert!(sent > 100, "the client sent only {sent}");
    stop_nginx(proxy);
    drop((a, b));
}
