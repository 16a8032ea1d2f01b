//! What the tests of the WSGI plugin share (`wsgi_conformance`,
//! `wsgi_frameworks`, `wsgi_leak` and the core's tests run over WSGI apps): a raw HTTP/1.1 client
//! that sees the wire as it is (chunk boundaries, a missing terminator, the
//! exact header lines), the location of the plugin, and the framework venv.

use std::io::{self, BufRead, BufReader, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use super::venv;

use super as support;

/// How long a test waits on one read before calling the server stuck.
pub const READ_TIMEOUT: Duration = Duration::from_secs(20);

/// One response as it came off the wire.
#[derive(Debug, Default)]
pub struct Response {
    pub status: u16,
    /// Header lines in order; values as raw bytes (latin-1 on the wire).
    pub headers: Vec<(String, Vec<u8>)>,
    pub body: Vec<u8>,
    pub chunked: bool,
    /// Chunked: the zero-length terminator arrived. Sized: all bytes came.
    /// Close-delimited: always true once EOF is seen.
    pub complete: bool,
    /// The head as text (lossy), for assertion messages.
    pub head: String,
}

impl Response {
    pub fn header(&self, name: &str) -> Option<String> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
    }

    pub fn header_bytes(&self, name: &str) -> Option<&[u8]> {
        self.headers
            .iter()
            .find(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_slice())
    }

    pub fn all(&self, name: &str) -> Vec<String> {
        self.headers
            .iter()
            .filter(|(n, _)| n.eq_ignore_ascii_case(name))
            .map(|(_, v)| String::from_utf8_lossy(v).into_owned())
            .collect()
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// Lines `KEY=VALUE` of the conformance app's answers, as a lookup.
    pub fn field(&self, key: &str) -> Option<String> {
        self.text().lines().find_map(|l| {
            let (k, v) = l.split_once('=')?;
            (k == key).then(|| v.to_owned())
        })
    }
}

/// A client connection (keep-alive capable).
pub struct Conn {
    reader: BufReader<TcpStream>,
}

impl Conn {
    pub fn open(port: u16) -> Conn {
        let stream = TcpStream::connect(("127.0.0.1", port)).expect("connect to m0serve");
        stream.set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        stream.set_nodelay(true).unwrap();
        Conn {
            reader: BufReader::with_capacity(64 * 1024, stream),
        }
    }

    pub fn stream(&self) -> &TcpStream {
        self.reader.get_ref()
    }

    pub fn send(&mut self, raw: &[u8]) {
        self.reader.get_mut().write_all(raw).expect("send request");
    }

    /// Sends `METHOD path` with extra header lines and a body.
    pub fn send_request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) {
        let mut req = format!("{method} {path} HTTP/1.1\r\nHost: m0serve.test\r\n");
        for (n, v) in headers {
            req.push_str(&format!("{n}: {v}\r\n"));
        }
        if !body.is_empty() || method == "POST" || method == "PUT" {
            req.push_str(&format!("Content-Length: {}\r\n", body.len()));
        }
        req.push_str("\r\n");
        let mut bytes = req.into_bytes();
        bytes.extend_from_slice(body);
        self.send(&bytes);
    }

    /// Reads the status line and headers.
    pub fn read_head(&mut self) -> io::Result<Response> {
        let mut head = Vec::new();
        loop {
            let mut line = Vec::new();
            let n = self.reader.read_until(b'\n', &mut line)?;
            if n == 0 {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    format!(
                        "connection closed before a complete head: {:?}",
                        String::from_utf8_lossy(&head)
                    ),
                ));
            }
            head.extend_from_slice(&line);
            if line == b"\r\n" || line == b"\n" {
                break;
            }
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut parsed = httparse::Response::new(&mut headers);
        let status = parsed
            .parse(&head)
            .map_err(|e| io::Error::new(io::ErrorKind::InvalidData, format!("{e}: {head:?}")))?;
        assert!(status.is_complete(), "incomplete head {head:?}");
        let mut resp = Response {
            status: parsed.code.unwrap_or(0),
            head: String::from_utf8_lossy(&head).into_owned(),
            ..Response::default()
        };
        for h in parsed.headers.iter() {
            resp.headers.push((h.name.to_owned(), h.value.to_vec()));
        }
        resp.chunked = resp
            .header("transfer-encoding")
            .is_some_and(|te| te.eq_ignore_ascii_case("chunked"));
        Ok(resp)
    }

    /// Reads one chunk of a chunked body: `Some(data)`, `Some(empty)` for
    /// the terminator, `None` when the connection ended first.
    pub fn read_chunk(&mut self) -> Option<Vec<u8>> {
        let mut line = String::new();
        match self.reader.read_line(&mut line) {
            Ok(0) | Err(_) => return None,
            Ok(_) => {}
        }
        let size_text = line.trim_end().split(';').next().unwrap_or("");
        let size = usize::from_str_radix(size_text, 16).ok()?;
        let mut data = vec![0; size];
        self.reader.read_exact(&mut data).ok()?;
        let mut crlf = [0u8; 2];
        self.reader.read_exact(&mut crlf).ok()?;
        if &crlf != b"\r\n" {
            return None;
        }
        if size == 0 {
            // No trailers are expected: the terminator ends here.
            return Some(Vec::new());
        }
        Some(data)
    }

    /// Reads the body that follows `resp`'s head.
    pub fn read_body(&mut self, resp: &mut Response, head_request: bool) {
        if head_request || resp.status == 204 || resp.status == 304 || resp.status < 200 {
            resp.complete = true;
            return;
        }
        if resp.chunked {
            loop {
                match self.read_chunk() {
                    Some(c) if c.is_empty() => {
                        resp.complete = true;
                        return;
                    }
                    Some(c) => resp.body.extend_from_slice(&c),
                    None => return,
                }
            }
        }
        if let Some(len) = resp.header("content-length") {
            let len: usize = len.trim().parse().expect("numeric Content-Length");
            let mut body = vec![0; len];
            let mut got = 0;
            while got < len {
                match self.reader.read(&mut body[got..]) {
                    Ok(0) | Err(_) => break,
                    Ok(n) => got += n,
                }
            }
            body.truncate(got);
            resp.complete = got == len;
            resp.body = body;
            return;
        }
        let mut body = Vec::new();
        let ok = self.reader.read_to_end(&mut body).is_ok();
        resp.body = body;
        resp.complete = ok;
    }

    pub fn read_response(&mut self, head_request: bool) -> io::Result<Response> {
        let mut resp = self.read_head()?;
        self.read_body(&mut resp, head_request);
        Ok(resp)
    }

    pub fn request(
        &mut self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        self.send_request(method, path, headers, body);
        self.read_response(method == "HEAD")
            .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
    }

    /// True when the server closed the connection (EOF within `wait`).
    pub fn closed_by_server(&mut self, wait: Duration) -> bool {
        self.stream().set_read_timeout(Some(wait)).unwrap();
        let mut b = [0u8; 1];
        let r = matches!(self.reader.read(&mut b), Ok(0) | Err(_));
        self.stream().set_read_timeout(Some(READ_TIMEOUT)).unwrap();
        r
    }

    pub fn shutdown(self) {
        let _ = self.reader.get_ref().shutdown(Shutdown::Both);
    }
}

/// One request on a fresh connection.
pub fn get(port: u16, path: &str) -> Response {
    Conn::open(port).request("GET", path, &[], b"")
}

pub fn request(
    port: u16,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Response {
    Conn::open(port).request(method, path, headers, body)
}

/// Polls `f` until it is true or `within` passes.
pub fn eventually(within: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + within;
    loop {
        if f() {
            return true;
        }
        if Instant::now() > end {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// The directory of the test binary's profile (`target/debug`).
fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    // target/<profile>/deps/<test binary>
    exe.parent()
        .and_then(Path::parent)
        .expect("test binary lives in target/<profile>/deps")
        .to_path_buf()
}

/// `tests/apps`, the `--app-dir` of every WSGI test.
/// `m0serve --plugin wsgi --app-dir tests/apps EXTRA pool_app:application`.
pub fn pool_app_command(extra: &[&str]) -> Command {
    let plugin = plugin();
    let apps = apps_dir();
    let mut args = vec![
        "--plugin",
        plugin.to_str().unwrap(),
        "--app-dir",
        apps.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push("pool_app:application");
    support::command(&args)
}

pub fn apps_dir() -> PathBuf {
    repo().join("tests/apps")
}

/// The plugin, built (or brought up to date) for this test profile first:
/// integration tests of the root package do not build other workspace
/// members by themselves.
pub fn plugin() -> PathBuf {
    static PLUGIN: OnceLock<PathBuf> = OnceLock::new();
    PLUGIN
        .get_or_init(|| {
            let dir = profile_dir();
            let release = dir.file_name().is_some_and(|n| n == "release");
            let mut cmd = Command::new(env!("CARGO"));
            cmd.args(["build", "--quiet", "-p", "m0-wsgi"])
                .current_dir(repo());
            if release {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("run cargo build -p m0-wsgi");
            assert!(status.success(), "cargo build -p m0-wsgi failed");
            let so = dir.join("libm0_wsgi.so");
            assert!(so.exists(), "{} missing after the build", so.display());
            so
        })
        .clone()
}

/// The interpreter the plugin embeds (pinned in .cargo/config.toml).
pub fn python() -> String {
    std::env::var("PYO3_PYTHON").unwrap_or_else(|_| "python3.11".into())
}

/// A venv with tests/requirements-frameworks.txt installed, under the target
/// dir; rebuilt when the requirements change, shared across test binaries.
pub fn framework_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        venv::make_venv(
            "wsgi-frameworks-venv",
            "tests/requirements-frameworks.txt",
            &[],
        )
    })
    .clone()
}

/// Resident set size of a process, in KiB (from /proc).
pub fn rss_kib(pid: u32) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status.lines().find_map(|l| {
        l.strip_prefix("VmRSS:")?
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    })
}

/// An m0serve serving a WSGI app from tests/apps (the core's test support
/// starts it on a free port and kills its process group on drop).
pub struct WsgiServer {
    pub port: u16,
    server: support::Server,
}

fn wsgi_command(spec: &str, extra: &[&str]) -> Command {
    let plugin = plugin();
    let apps = apps_dir();
    let mut args: Vec<&str> = vec![
        "--plugin",
        plugin.to_str().unwrap(),
        "--app-dir",
        apps.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    args.push(spec);
    let mut cmd = support::command(&args);
    // The venv comes from --venv in these tests, never from the caller.
    cmd.env_remove("VIRTUAL_ENV").env_remove("M0_VENV");
    cmd
}

impl WsgiServer {
    pub fn start(spec: &str, extra: &[&str]) -> WsgiServer {
        let server = support::Server::start_cmd(wsgi_command(spec, extra));
        WsgiServer {
            port: server.addr.port(),
            server,
        }
    }

    /// Like `start`, with `env` set for the server.
    pub fn start_with_env(spec: &str, extra: &[&str], env: &[(&str, &str)]) -> WsgiServer {
        let mut cmd = wsgi_command(spec, extra);
        cmd.envs(env.iter().copied());
        let server = support::Server::start_cmd(cmd);
        WsgiServer {
            port: server.addr.port(),
            server,
        }
    }

    /// Like `start`, on one CPU (see `support::pin_to_one_cpu`).
    pub fn start_on_one_cpu(spec: &str, extra: &[&str]) -> WsgiServer {
        let mut cmd = wsgi_command(spec, extra);
        support::pin_to_one_cpu(&mut cmd);
        let server = support::Server::start_cmd(cmd);
        WsgiServer {
            port: server.addr.port(),
            server,
        }
    }

    /// Runs a server that must fail to start: its exit status and log.
    pub fn fail(spec: &str, extra: &[&str]) -> (Option<i32>, String) {
        match support::Server::try_start(wsgi_command(spec, extra)) {
            Err((log, status)) => (status.and_then(|s| s.code()), log),
            Ok(server) => (None, format!("it started:\n{}", server.log())),
        }
    }

    /// The supervisor's pid.
    pub fn pid(&self) -> u32 {
        self.server.pid() as u32
    }

    pub fn log(&self) -> String {
        self.server.log()
    }

    pub fn wait_log(&self, needle: &str, within: Duration) -> bool {
        self.server.wait_for_log(needle, within)
    }

    /// SIGTERM, then the exit code once it drained.
    pub fn stop(&mut self) -> Option<i32> {
        self.server.signal(libc::SIGTERM);
        self.server
            .wait_exit(Duration::from_secs(30))
            .and_then(|s| s.code())
    }
}
