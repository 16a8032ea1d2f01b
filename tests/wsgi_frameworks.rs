//! One framework contract, the same assertions for Flask and Django, served
//! by the WSGI plugin from a venv the test creates (target/
//! wsgi-frameworks-venv, pinned by tests/requirements-frameworks.txt).

use std::time::Duration;

use crate::support::wsgi::{Conn, WsgiServer, framework_venv, get, request};

fn contract(spec: &str) {
    let venv = framework_venv();
    let venv_arg = venv.to_str().unwrap();
    let srv = WsgiServer::start(spec, &["--workers", "1", "--venv", venv_arg]);

    // The venv is the interpreter's prefix and executable.
    let r = get(srv.port, "/python");
    assert_eq!(r.status, 200, "{}", r.text());
    let venv_canon = std::fs::canonicalize(&venv).unwrap();
    let prefix = r.field("prefix").unwrap();
    assert!(
        prefix == venv_arg || std::fs::canonicalize(&prefix).ok() == Some(venv_canon.clone()),
        "sys.prefix {prefix} is not the venv {venv_arg}"
    );
    assert!(
        r.field("executable").unwrap().starts_with(&prefix),
        "{}",
        r.text()
    );

    // Root page.
    let r = get(srv.port, "/");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "framework contract root\n");
    assert!(r.header("content-type").unwrap().starts_with("text/plain"));

    // Two Set-Cookie headers on one response, kept apart.
    let r = get(srv.port, "/cookies/set");
    assert_eq!(r.status, 200);
    let cookies = r.all("set-cookie");
    assert_eq!(cookies.len(), 2, "{}", r.head);
    assert!(cookies[0].starts_with("first=1"), "{cookies:?}");
    assert!(cookies[1].starts_with("second=2"), "{cookies:?}");

    // Cookies echoed, sent as two Cookie headers (joined with "; ").
    let r = request(
        srv.port,
        "GET",
        "/cookies/echo",
        &[("Cookie", "b=2; a=1"), ("Cookie", "c=3")],
        b"",
    );
    assert_eq!(r.text(), "a=1;b=2;c=3\n");

    // POST echo of 256 KiB, on a keep-alive connection, twice.
    let big: Vec<u8> = (0..256 * 1024u32)
        .map(|i| (i.wrapping_mul(2654435761) >> 13) as u8)
        .collect();
    let mut conn = Conn::open(srv.port);
    for _ in 0..2 {
        let r = conn.request(
            "POST",
            "/echo",
            &[("Content-Type", "application/octet-stream")],
            &big,
        );
        assert_eq!(r.status, 200);
        assert_eq!(r.body.len(), big.len());
        assert!(r.body == big, "256 KiB echo differs");
    }

    // All 256 byte values, both ways.
    let all: Vec<u8> = (0..=255u8).collect();
    let r = conn.request(
        "POST",
        "/echo",
        &[("Content-Type", "application/octet-stream")],
        &all,
    );
    assert!(r.body == all, "byte values changed on the way back");
    let r = conn.request("GET", "/bytes", &[], b"");
    assert!(r.body == all, "byte values changed on the way out");
    assert_eq!(r.header("content-length").as_deref(), Some("256"));

    // Query parsing.
    let r = get(srv.port, "/query?a=1&b=x%20y&b=z&c=&d=%C3%A9");
    assert_eq!(r.text(), "a=['1']\nb=['x y', 'z']\nc=['']\nd=['\\xe9']\n");

    // An exception: the framework's 500, no traceback on the wire, the
    // traceback in the log; the worker goes on.
    let r = get(srv.port, "/boom");
    assert_eq!(r.status, 500);
    assert!(
        !r.text().contains("SECRET-BOOM-TEXT"),
        "traceback on the wire"
    );
    assert!(
        srv.wait_log("SECRET-BOOM-TEXT", Duration::from_secs(5)),
        "{}",
        srv.log()
    );

    // An unrouted path: the framework's own 404.
    let r = get(srv.port, "/no/such/route");
    assert_eq!(r.status, 404);
    assert!(r.text().contains("Not Found"), "{}", r.text());

    assert_eq!(
        get(srv.port, "/").status,
        200,
        "served normally after the 500"
    );
}

#[test]
fn flask_contract() {
    contract("flask_app:app");
}

/// Flask's `app.logger` (its default handler writes to wsgi.errors): a
/// warning is logged as a warning, an error as an error (so `--log-level`
/// filters them as such).
#[test]
fn flask_app_logger_keeps_its_levels() {
    let venv = framework_venv();
    let venv_arg = venv.to_str().unwrap();
    let srv = WsgiServer::start("flask_app:app", &["--workers", "1", "--venv", venv_arg]);
    let mark = format!("m{}", std::process::id());
    assert_eq!(get(srv.port, &format!("/log?mark={mark}")).status, 200);
    let error = format!("flask error {mark}");
    assert!(
        srv.wait_log(&error, Duration::from_secs(5)),
        "{}",
        srv.log()
    );
    let log = srv.log();
    let line = |needle: &str| log.lines().find(|l| l.contains(needle)).map(str::to_owned);
    assert!(
        line(&error).is_some_and(|l| l.contains("[ERROR] ") && l.contains(": plugin: ")),
        "{log}"
    );
    assert!(
        line(&format!("flask warning {mark}"))
            .is_some_and(|l| l.contains("[WARNING] ") && l.contains(": plugin: ")),
        "{log}"
    );
}

#[test]
fn django_contract() {
    contract("django_app.wsgi:application");
}
