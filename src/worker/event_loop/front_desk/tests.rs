//! The desk's decisions and answers for requests parsed from bytes, with
//! no connection and no loop: what it answers, what passes, and what a
//! request that passes carries.

use std::net::IpAddr;
use std::sync::Arc;

use super::{Answer, Desk, FrontDesk};
use crate::auth::{self, KeySources};
use crate::http::cors::{Allow, Origins};
use crate::http::forwarded::Trusted;
use crate::http::head::{self, Limits, RequestHead};
use crate::plugin::call::Body;
use crate::worker::connection::Ready;

const PEER: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(192, 0, 2, 7));
const PROXY: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(10, 0, 0, 1));

fn desk() -> FrontDesk {
    let keys = auth::load(KeySources {
        keys: &["sk-right".to_string()],
        file: None,
        open_paths: &["/open".to_string()],
    })
    .unwrap();
    FrontDesk {
        health_path: Some("/healthz".into()),
        api_keys: keys.map(Arc::new),
        cors: Origins::from_values(&["https://app.example".to_string()]),
        trusted_proxies: Trusted::parse("10.0.0.1").unwrap(),
    }
}

fn ready(buf: &[u8]) -> Ready {
    let mut head = RequestHead::default();
    assert_eq!(
        head::parse(buf, &Limits::default(), &mut head).ok(),
        Some(true)
    );
    Ready {
        head,
        body: Body::Decoded(Vec::new()),
        consumed: buf.len(),
    }
}

fn check(buf: &[u8], from: IpAddr) -> (Desk, Ready) {
    let mut r = ready(buf);
    let desk = desk().check(&mut r, buf, from, false, &None);
    (desk, r)
}

fn written(answer: Answer, buf: &[u8], r: &Ready, draining: bool) -> (u16, String) {
    let mut out = Vec::new();
    let w = answer.write(&r.head, buf, draining, &mut out);
    (w.status, String::from_utf8_lossy(&out).into_owned())
}

#[test]
fn the_health_path_is_answered_before_the_key_check() {
    let buf = b"GET /healthz?full HTTP/1.1\r\nHost: a\r\n\r\n";
    let (Desk::Answered(answer @ Answer::Health), r) = check(buf, PEER) else {
        panic!("the health path was not answered at the desk");
    };
    let (status, out) = written(answer, buf, &r, true);
    assert_eq!(status, 503);
    assert!(out.ends_with("draining\n"), "{out}");
    assert!(out.contains("Connection: close"), "{out}");
}

#[test]
fn a_preflight_from_an_allowed_origin_gets_what_it_asked_for() {
    let buf = b"OPTIONS /v1/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example\r\n\
                Access-Control-Request-Method: POST\r\n\r\n";
    let (Desk::Answered(answer @ Answer::Preflight(Some(_))), r) = check(buf, PEER) else {
        panic!("the preflight was not answered as allowed");
    };
    let (status, out) = written(answer, buf, &r, false);
    assert_eq!(status, 204);
    assert!(out.contains("Access-Control-Allow-Origin: https://app.example\r\n"));
    assert!(out.contains("Access-Control-Allow-Methods: POST\r\n"));
}

#[test]
fn a_request_without_a_key_is_answered_401_with_its_allowed_origin() {
    let buf = b"POST /v1/x HTTP/1.1\r\nHost: a\r\nOrigin: https://app.example\r\n\
                Content-Length: 0\r\n\r\n";
    let (Desk::Answered(answer @ Answer::Unauthorized(Some((Allow::Origin, _)))), r) =
        check(buf, PEER)
    else {
        panic!("a request without a key was not refused with its origin");
    };
    let (status, out) = written(answer, buf, &r, false);
    assert_eq!(status, 401);
    assert!(out.contains("WWW-Authenticate: Bearer\r\n"));
    assert!(out.contains("Access-Control-Allow-Origin: https://app.example\r\n"));
}

#[test]
fn a_checked_key_is_hidden_and_an_open_paths_authorization_is_not() {
    let buf = b"GET /v1/x HTTP/1.1\r\nHost: a\r\nAuthorization: Bearer sk-right\r\n\r\n";
    let (Desk::Pass(pass), r) = check(buf, PEER) else {
        panic!("a request with a valid key did not pass");
    };
    assert!(r.head.field(buf, b"authorization").is_none());
    assert!(pass.cors.is_none() && pass.client.is_none() && !pass.https);

    let buf = b"GET /open HTTP/1.1\r\nHost: a\r\nAuthorization: Basic app\r\n\r\n";
    let (Desk::Pass(_), r) = check(buf, PEER) else {
        panic!("an open path did not pass");
    };
    assert!(r.head.field(buf, b"authorization").is_some());
}

#[test]
fn only_a_trusted_proxy_names_the_client() {
    let buf = b"GET /open HTTP/1.1\r\nHost: a\r\nX-Forwarded-For: 198.51.100.9\r\n\
                X-Forwarded-Proto: https\r\n\r\n";
    let (Desk::Pass(pass), _) = check(buf, PROXY) else {
        panic!("a proxied request did not pass");
    };
    let client = pass.client.as_ref().map(|p| p.ip.as_str());
    assert_eq!((client, pass.https), (Some("198.51.100.9"), true));
    let (Desk::Pass(pass), _) = check(buf, PEER) else {
        panic!("a request did not pass");
    };
    assert!(pass.client.is_none() && !pass.https);
}

#[test]
fn a_scrape_is_left_to_the_loop() {
    let buf = b"GET /metrics HTTP/1.1\r\nHost: a\r\n\r\n";
    let mut r = ready(buf);
    assert!(matches!(
        desk().check(&mut r, buf, PEER, true, &None),
        Desk::Scrape
    ));
}
