//! `--forwarded-allow-ips`: a trusted proxy's `X-Forwarded-For` /
//! `X-Forwarded-Proto` (or `Forwarded`) become the client's address and
//! scheme, for the WSGI app (REMOTE_ADDR, wsgi.url_scheme) and the core's
//! own view (the access log); from an untrusted peer they change nothing.

use crate::support::wsgi::{WsgiServer, request};

fn environ(srv: &WsgiServer, headers: &[(&str, &str)]) -> (String, String, Option<String>) {
    let r = request(srv.port, "GET", "/environ", headers, b"");
    assert_eq!(r.status, 200, "{}", r.text());
    (
        r.field("REMOTE_ADDR").unwrap(),
        r.field("wsgi.url_scheme").unwrap(),
        r.field("HTTPS"),
    )
}

const PROXIED: [(&str, &str); 2] = [
    // What a client sent itself (6.6.6.6), then what nginx appended.
    ("X-Forwarded-For", "6.6.6.6, 203.0.113.7"),
    ("X-Forwarded-Proto", "https"),
];

#[test]
fn a_trusted_proxy_names_the_client_and_its_scheme() {
    let log = crate::support::scratch_dir("forwarded").join("access.jsonl");
    let _ = std::fs::remove_file(&log);
    // The default trusts the loopback, where a local nginx connects from.
    let mut srv = WsgiServer::start(
        "conformance:application",
        &[
            "--workers",
            "1",
            "--access-log",
            log.to_str().unwrap(),
            "--access-log-format",
            "json",
        ],
    );
    let (addr, scheme, https) = environ(&srv, &PROXIED);
    assert_eq!(addr, "'203.0.113.7'");
    assert_eq!(scheme, "'https'");
    assert_eq!(https.as_deref(), Some("'on'"));
    // RFC 7239's header.
    let (addr, scheme, _) = environ(
        &srv,
        &[("Forwarded", "for=\"[2001:db8::7]:4711\";proto=https")],
    );
    assert_eq!(addr, "'2001:db8::7'");
    assert_eq!(scheme, "'https'");
    // No proxy headers: the connection's own.
    let (addr, scheme, https) = environ(&srv, &[]);
    assert_eq!(
        (addr.as_str(), scheme.as_str(), https),
        ("'127.0.0.1'", "'http'", None)
    );
    // The core's own view: the access log names the proxied client.
    assert_eq!(srv.stop(), Some(0), "{}", srv.log());
    let text = std::fs::read_to_string(&log).unwrap();
    let clients: Vec<String> = text
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap()["client"].to_string())
        .collect();
    assert_eq!(
        clients,
        ["\"203.0.113.7\"", "\"2001:db8::7\"", "\"127.0.0.1\""]
    );
}

#[test]
fn proxy_headers_from_an_untrusted_peer_change_nothing() {
    for trusted in ["10.9.9.9", ""] {
        let srv = WsgiServer::start(
            "conformance:application",
            &["--workers", "1", "--forwarded-allow-ips", trusted],
        );
        let (addr, scheme, https) = environ(&srv, &PROXIED);
        assert_eq!(
            (addr.as_str(), scheme.as_str(), https),
            ("'127.0.0.1'", "'http'", None),
            "trusting {trusted:?}"
        );
    }
}

#[test]
fn a_bad_trust_list_is_a_usage_error() {
    let (code, out) = WsgiServer::fail("conformance", &["--forwarded-allow-ips", "10.0.0.1,nope"]);
    assert_eq!(code, Some(2), "{out}");
    assert!(out.contains("--forwarded-allow-ips"), "{out}");
}
