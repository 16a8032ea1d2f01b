//! `--access-log`: a line per response, JSON or Apache combined, escaped,
//! and nothing lost at SIGTERM; over real sockets with the hello_c plugin.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_json::Value;

use crate::support::OutputBounded;
use crate::support::{Client, Server, command, plugin, raw_exchange, scratch_dir, status_of};

fn log_file(name: &str) -> PathBuf {
    let path = scratch_dir("access_log").join(name);
    let _ = std::fs::remove_file(&path);
    path
}

fn start(log: &Path, format: &str, extra: &[&str]) -> Server {
    let hello = plugin("hello_c");
    let mut args = vec![
        "--plugin",
        hello.to_str().unwrap(),
        "--access-log",
        log.to_str().unwrap(),
        "--access-log-format",
        format,
    ];
    args.extend_from_slice(extra);
    Server::start(&args)
}

/// SIGTERM, exit 0, then the log's lines.
fn stop_and_read(mut s: Server, log: &Path) -> String {
    s.signal(libc::SIGTERM);
    let status = s.wait_exit(Duration::from_secs(30));
    assert_eq!(status.and_then(|st| st.code()), Some(0), "{}", s.log());
    std::fs::read_to_string(log).unwrap()
}

fn json_lines(text: &str) -> Vec<Value> {
    text.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l:?}")))
        .collect()
}

#[test]
fn json_lines_describe_each_response_and_escape_what_the_client_sent() {
    let log = log_file("json.jsonl");
    let s = start(&log, "json", &["--workers", "1"]);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").status, 200);
    let r = c.request("POST", "/echo", &[("User-Agent", "probe \"7\"\\")], b"ping");
    assert_eq!(r.status, 200);
    // A target with a quote and a backslash (bytes past ASCII are refused
    // in a target); a Referer with a tab, a quote and bytes that are not
    // UTF-8.
    let raw = b"GET /x\"y\\z HTTP/1.1\r\nHost: t\r\nReferer: a\tb\"c\xff\xfe\r\nConnection: close\r\n\r\n";
    assert_eq!(status_of(&raw_exchange(s.addr, raw)), 404);
    // Not HTTP at all: the server's own 400, logged without a request line.
    assert_eq!(
        status_of(&raw_exchange(s.addr, b"\x01\x02 nonsense\r\n\r\n")),
        400
    );
    drop(c);
    let text = stop_and_read(s, &log);
    let lines = json_lines(&text);
    assert_eq!(lines.len(), 4, "{text}");
    let (hello, echo, odd, bad) = (&lines[0], &lines[1], &lines[2], &lines[3]);
    assert_eq!(hello["method"], "GET");
    assert_eq!(hello["target"], "/");
    assert_eq!(hello["protocol"], "HTTP/1.1");
    assert_eq!(hello["status"], 200);
    assert_eq!(hello["bytes"], "hello, world\n".len());
    assert_eq!(hello["client"], "127.0.0.1");
    assert_eq!(hello["worker"], 0);
    assert!(hello["duration_us"].is_u64(), "{hello}");
    assert!(hello.get("batch").is_none(), "{hello}");
    assert!(hello["time"].as_str().unwrap().ends_with('Z'), "{hello}");
    assert_eq!(echo["method"], "POST");
    assert_eq!(echo["bytes"], 4);
    assert_eq!(echo["user_agent"], "probe \"7\"\\");
    assert_eq!(odd["target"], "/x\"y\\z", "{odd}");
    assert_eq!(odd["referer"], "a\tb\"c\\xff\\xfe", "{odd}");
    assert_eq!(odd["status"], 404);
    assert_eq!(bad["status"], 400);
    assert_eq!(bad["method"], "-");
}

#[test]
fn combined_lines_are_apaches_with_the_duration_after() {
    let log = log_file("combined.log");
    let s = start(&log, "combined", &["--workers", "1"]);
    let mut c = Client::connect(s.addr);
    assert_eq!(c.get("/").status, 200);
    let raw = b"GET /q?a=\"1\"&b=\\ HTTP/1.0\r\nUser-Agent: curl/8.0 \"x\"\xff\r\n\r\n";
    assert_eq!(status_of(&raw_exchange(s.addr, raw)), 404);
    drop(c);
    let text = stop_and_read(s, &log);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 2, "{text}");
    // client - - [dd/Mon/yyyy:hh:mm:ss +0000] "request" status bytes "referer" "agent" us
    for line in &lines {
        let (head, rest) = line.split_once(" [").unwrap();
        assert_eq!(head, "127.0.0.1 - -", "{line}");
        let (time, rest) = rest.split_once("] ").unwrap();
        assert_eq!(time.len(), "02/Dec/2026:03:14:15 +0000".len(), "{line}");
        assert!(time.ends_with(" +0000"), "{line}");
        assert!(rest.starts_with('"'), "{line}");
        let duration = rest.rsplit(' ').next().unwrap();
        assert!(duration.parse::<u64>().is_ok(), "{line}");
    }
    assert!(
        lines[0].contains("] \"GET / HTTP/1.1\" 200 13 \"-\" \"-\" "),
        "{}",
        lines[0]
    );
    assert!(
        lines[1].contains(r#"] "GET /q?a=\"1\"&b=\\ HTTP/1.0" 404 "#),
        "{}",
        lines[1]
    );
    assert!(
        lines[1].contains(r#" "-" "curl/8.0 \"x\"\xff" "#),
        "{}",
        lines[1]
    );
}

/// Lines are buffered per worker: every response of a run that ends with a
/// SIGTERM right after its last answer is in the log, once, from both
/// workers, and no two lines are mixed.
#[test]
fn nothing_is_lost_at_sigterm_and_the_workers_lines_never_mix() {
    let log = log_file("sigterm.jsonl");
    let s = start(&log, "json", &["--workers", "2"]);
    let per_conn = 100;
    let conns = 6;
    let mut answered = 0;
    for c in 0..conns {
        let mut stream = TcpStream::connect(s.addr).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(15)))
            .unwrap();
        let mut batch = Vec::new();
        for i in 0..per_conn {
            let close = if i + 1 == per_conn {
                "Connection: close\r\n"
            } else {
                ""
            };
            batch.extend_from_slice(
                format!("GET /?c={c}&i={i} HTTP/1.1\r\nHost: t\r\n{close}\r\n").as_bytes(),
            );
        }
        stream.write_all(&batch).unwrap();
        let mut out = Vec::new();
        let _ = stream.read_to_end(&mut out);
        answered += out.windows(15).filter(|w| w == b"HTTP/1.1 200 OK").count();
    }
    assert_eq!(answered, per_conn * conns);
    let text = stop_and_read(s, &log);
    let lines = json_lines(&text);
    assert_eq!(lines.len(), per_conn * conns, "lines lost or doubled");
    let mut seen = std::collections::HashSet::new();
    for l in &lines {
        assert_eq!(l["status"], 200);
        assert!(
            seen.insert(l["target"].as_str().unwrap().to_string()),
            "{l}"
        );
    }
}

#[test]
fn an_access_log_that_cannot_be_opened_is_refused_with_78() {
    let hello = plugin("hello_c");
    let out = command(&[
        "--plugin",
        hello.to_str().unwrap(),
        "--access-log",
        "/nonexistent/dir/access.log",
    ])
    .output_bounded()
    .unwrap();
    assert_eq!(out.status.code(), Some(78));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("--access-log /nonexistent/dir/access.log"),
        "{err}"
    );
}

#[test]
fn a_json_line_names_the_model_the_plugin_gave_the_request() {
    let log = log_file("models.jsonl");
    let s = crate::models::start(
        &[
            "--workers",
            "1",
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "json",
        ],
        &["bge-small", "reranker"],
    );
    let mut c = Client::connect(s.addr);
    for target in ["/work?model=reranker", "/work", "/work?model=bge-small"] {
        assert_eq!(c.get(target).status, 200);
    }
    let lines = json_lines(&stop_and_read(s, &log));
    let models: Vec<(&str, Option<&str>)> = lines
        .iter()
        .map(|l| (l["target"].as_str().unwrap(), l["model"].as_str()))
        .collect();
    assert_eq!(
        models,
        [
            ("/work?model=reranker", Some("reranker")),
            ("/work", None),
            ("/work?model=bge-small", Some("bge-small")),
        ]
    );
    // A request without one has no "model" field at all.
    assert!(lines[1].get("model").is_none(), "{}", lines[1]);
}
