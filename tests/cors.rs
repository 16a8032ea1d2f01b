//! `--cors-allow-origin`: preflights answered by the core, the allowed
//! origin echoed on every response, nothing for other origins; proved on
//! the wire and in a real browser (Debian's chromium, headless).

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::process::Command;

use crate::support;
use crate::support::OutputBounded;
use crate::support::test_dir::TestDir;
use crate::support::venv;
use crate::support::{Client, Server, command, plugin, raw_exchange};

const PAGE_ORIGIN: &str = "http://127.0.0.1:9";

fn hello(extra: &[&str]) -> Server {
    let hello = plugin("hello_c");
    let mut args = vec!["--plugin", hello.to_str().unwrap(), "--workers", "1"];
    args.extend_from_slice(extra);
    Server::start(&args)
}

fn text(addr: SocketAddr, request: &str) -> String {
    String::from_utf8_lossy(&raw_exchange(addr, request.as_bytes())).into_owned()
}

#[test]
fn preflights_are_answered_by_the_core_and_only_allowed_origins_are_echoed() {
    let s = hello(&["--cors-allow-origin", PAGE_ORIGIN]);
    let preflight = |origin: &str| {
        text(
            s.addr,
            &format!(
                "OPTIONS /echo HTTP/1.1\r\nHost: t\r\nOrigin: {origin}\r\nAccess-Control-Request-Method: POST\r\n\
                 Access-Control-Request-Headers: authorization, content-type\r\nConnection: close\r\n\r\n"
            ),
        )
    };
    let ok = preflight(PAGE_ORIGIN);
    assert!(ok.starts_with("HTTP/1.1 204 "), "{ok}");
    for line in [
        format!("Access-Control-Allow-Origin: {PAGE_ORIGIN}\r\n"),
        "Access-Control-Allow-Methods: POST\r\n".into(),
        "Access-Control-Allow-Headers: authorization, content-type\r\n".into(),
        "Access-Control-Max-Age: 600\r\n".into(),
        "Vary: Origin\r\n".into(),
    ] {
        assert!(ok.contains(&line), "{line:?} in {ok}");
    }
    assert!(!ok.contains("Content-Length"), "a 204 has no length: {ok}");
    let other = preflight("http://127.0.0.1:10");
    assert!(other.starts_with("HTTP/1.1 403 "), "{other}");
    assert!(!other.contains("Access-Control-Allow"), "{other}");
    // A plain OPTIONS is the plugin's (hello_c has no such route).
    let plain = text(
        s.addr,
        "OPTIONS / HTTP/1.1\r\nHost: t\r\nOrigin: x\r\nConnection: close\r\n\r\n",
    );
    assert!(!plain.starts_with("HTTP/1.1 204 "), "{plain}");

    // The plugin's responses: the allowed origin echoed, others get nothing.
    let mut c = Client::connect(s.addr);
    let r = c.request("POST", "/echo", &[("Origin", PAGE_ORIGIN)], b"hi");
    assert_eq!(r.text(), "hi");
    assert_eq!(r.header("access-control-allow-origin"), Some(PAGE_ORIGIN));
    assert_eq!(r.header("vary"), Some("Origin"));
    let r = c.request("GET", "/", &[("Origin", "http://elsewhere")], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), None);
    assert_eq!(c.get("/").header("access-control-allow-origin"), None);
}

#[test]
fn any_origin_and_a_key_refusal_a_page_can_read() {
    let dir = TestDir::new("cors_keys");
    let keys = dir.join("keys");
    std::fs::write(&keys, "sk-cors-key-1\n").unwrap();
    std::fs::set_permissions(&keys, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let s = hello(&[
        "--cors-allow-origin",
        "*",
        "--api-key-file",
        keys.to_str().unwrap(),
    ]);
    // The preflight carries no key and is answered.
    let pre = text(
        s.addr,
        "OPTIONS / HTTP/1.1\r\nHost: t\r\nOrigin: https://a.example\r\nAccess-Control-Request-Method: GET\r\nConnection: close\r\n\r\n",
    );
    assert!(
        pre.starts_with("HTTP/1.1 204 ") && pre.contains("Access-Control-Allow-Origin: *\r\n"),
        "{pre}"
    );
    let mut c = Client::connect(s.addr);
    let r = c.request("GET", "/", &[("Origin", "https://a.example")], b"");
    assert_eq!(r.status, 401);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    let r = c.request(
        "GET",
        "/",
        &[
            ("Origin", "https://a.example"),
            ("Authorization", "Bearer sk-cors-key-1"),
        ],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.header("access-control-allow-origin"), Some("*"));
    // A bad value is a usage error naming the flag.
    let out = command(&["--plugin", "hello_c", "--cors-allow-origin", "a.example/x"])
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--cors-allow-origin"));
}

/// Serves `page` at / on `l`, to `n` requests.
fn page_server(l: TcpListener, page: String, n: usize) -> std::thread::JoinHandle<()> {
    std::thread::spawn(move || {
        for stream in l.incoming().take(n) {
            let Ok(mut s) = stream else { continue };
            let mut buf = [0u8; 4096];
            let _ = s.read(&mut buf);
            let _ = write!(
                s,
                "HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{page}",
                page.len()
            );
        }
    })
}

/// The page: fetch /embed, then /v1/embeddings with a key (which makes the
/// browser send a preflight), and write what came back into the DOM.
fn page(server: SocketAddr, key: &str) -> String {
    format!(
        r#"<!doctype html><html><body><pre id="out">pending</pre><script>
const out = document.getElementById("out");
async function run() {{
  const lines = [];
  try {{
    const r = await fetch("http://{server}/embed", {{method: "POST", headers: {{"Content-Type": "application/json"}}, body: JSON.stringify({{inputs: "hello"}})}});
    const v = await r.json();
    lines.push("embed " + r.status + " " + v[0].length);
  }} catch (e) {{ lines.push("embed blocked " + e.name); }}
  try {{
    const r = await fetch("http://{server}/v1/embeddings", {{method: "POST", headers: {{"Content-Type": "application/json", "Authorization": "Bearer {key}"}}, body: JSON.stringify({{input: ["a", "b"], model: "all-MiniLM-L6-v2"}})}});
    const v = await r.json();
    lines.push("openai " + r.status + " " + v.data.length + " " + v.data[0].embedding.length);
  }} catch (e) {{ lines.push("openai blocked " + e.name); }}
  out.textContent = "RESULT\n" + lines.join("\n") + "\nEND";
}}
run();
</script></body></html>"#
    )
}

fn chromium_dom(url: &str) -> String {
    // A fresh profile per page, removed when the page was read.
    let page: String = url
        .rsplit(':')
        .next()
        .unwrap_or("x")
        .chars()
        .filter(char::is_ascii_alphanumeric)
        .collect();
    let dir = TestDir::new(&format!("cors-profile-{page}"));
    let out = Command::new(support::tools::system_tool("chromium"))
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--virtual-time-budget=30000",
        ])
        .arg(format!("--user-data-dir={}", dir.display()))
        .arg("--dump-dom")
        .arg(url)
        .output_bounded()
        .expect("run chromium");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A page from an allowed origin embeds through both APIs, the second with
/// an API key (a preflight first); the same page from another origin is
/// blocked by the browser itself.
#[test]
fn a_browser_page_of_an_allowed_origin_embeds_and_another_origin_is_blocked() {
    support::tools::system_tool("chromium");
    let key = "sk-browser-key-5";
    let (allowed_page, other_page) = {
        // The pages' ports are known before the server starts: it must
        // name the allowed one.
        let a = TcpListener::bind("127.0.0.1:0").unwrap();
        let b = TcpListener::bind("127.0.0.1:0").unwrap();
        (a, b)
    };
    let allowed_origin = format!("http://{}", allowed_page.local_addr().unwrap());
    let p = plugin("embed");
    let minilm = venv::minilm_dir(&venv::embed_venv());
    let mut cmd = command(&[
        "--plugin",
        p.to_str().unwrap(),
        minilm.to_str().unwrap(),
        "--cors-allow-origin",
        &allowed_origin,
        "--api-key-open-path",
        "/embed",
    ]);
    cmd.env("M0_API_KEY", key);
    let s = Server::start_cmd(cmd);
    let html = page(s.addr, key);
    let mut results = Vec::new();
    for listener in [allowed_page, other_page] {
        let url = format!("http://{}/", listener.local_addr().unwrap());
        // Chromium may ask for the page and a favicon.
        let _served = page_server(listener, html.clone(), 2);
        results.push(chromium_dom(&url));
    }
    let allowed = &results[0];
    assert!(allowed.contains("embed 200 384"), "{allowed}\n{}", s.log());
    assert!(
        allowed.contains("openai 200 2 384"),
        "{allowed}\n{}",
        s.log()
    );
    let other = &results[1];
    assert!(other.contains("embed blocked TypeError"), "{other}");
    assert!(other.contains("openai blocked TypeError"), "{other}");
}
