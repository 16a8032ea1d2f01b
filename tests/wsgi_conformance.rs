//! PEP 3333 conformance of the WSGI plugin, over real sockets.
//!
//! `m0serve --plugin libm0_wsgi.so --app-dir tests/apps conformance:...`
//! serves tests/apps/conformance.py, plain (`application`) and wrapped in
//! wsgiref.validate (`validated`); every contract test runs in both modes,
//! plain with the app called on the loop's thread, validated on handler
//! threads.

use std::time::{Duration, Instant};

use crate::support::wsgi::{Conn, WsgiServer, eventually, get, request};

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
enum Mode {
    Plain,
    Validated,
}

impl Mode {
    fn spec(self) -> &'static str {
        match self {
            Mode::Plain => "conformance:application",
            Mode::Validated => "conformance:validated",
        }
    }

    fn tag(self, what: &str) -> String {
        format!("{what}-{self:?}").to_lowercase()
    }
}

/// Plain runs on one CPU, where the loop's thread calls the app (loop
/// calls); validated runs with `--no-inline`, where handler threads do.
/// Every paragraph is thus checked on both paths.
fn serve(mode: Mode) -> WsgiServer {
    let (srv, path) = match mode {
        Mode::Plain => (
            WsgiServer::start_on_one_cpu(mode.spec(), &["--workers", "1"]),
            "loop calls on",
        ),
        Mode::Validated => (
            WsgiServer::start(mode.spec(), &["--workers", "1", "--no-inline"]),
            "loop calls off",
        ),
    };
    assert!(srv.wait_log(path, Duration::from_secs(10)), "{}", srv.log());
    srv
}

/// Both modes of one contract paragraph.
macro_rules! both_modes {
    ($name:ident) => {
        mod $name {
            #[test]
            fn plain() {
                super::$name(super::Mode::Plain)
            }
            #[test]
            fn validated() {
                super::$name(super::Mode::Validated)
            }
        }
    };
}

/// close() calls the conformance app counted for `tag`.
fn closes(srv: &WsgiServer, tag: &str) -> u32 {
    get(srv.port, "/stats")
        .field(tag)
        .map(|v| v.parse().unwrap())
        .unwrap_or(0)
}

fn assert_closed_once(srv: &WsgiServer, tag: &str) {
    assert!(
        eventually(Duration::from_secs(10), || closes(srv, tag) >= 1),
        "close() was not called for {tag}"
    );
    assert_eq!(
        closes(srv, tag),
        1,
        "close() called more than once for {tag}"
    );
}

// --- environ ---------------------------------------------------------------

fn environ(mode: Mode) {
    let srv = serve(mode);
    let mut conn = Conn::open(srv.port);
    let client_port = conn.stream().local_addr().unwrap().port();
    let raw = b"POST /environ/caf%C3%A9%20x%2Fy?a=1&b=%20 HTTP/1.1\r\n\
        Host: m0serve.test\r\n\
        X-Custom: v1\r\n\
        X-Custom: v2\r\n\
        Proxy: http://evil.example\r\n\
        X_Under: spoofed\r\n\
        Content-Type: text/x-test\r\n\
        Content-Length: 5\r\n\
        \r\n\
        hello";
    conn.send(raw);
    let r = conn.read_response(false).unwrap();
    assert_eq!(r.status, 200, "{}", r.text());
    let f = |k: &str| {
        r.field(k)
            .unwrap_or_else(|| panic!("{k} missing in:\n{}", r.text()))
    };
    assert_eq!(f("REQUEST_METHOD"), "'POST'");
    assert_eq!(f("SCRIPT_NAME"), "''");
    // Percent-decoded (%2F too), bytes as latin-1 code points.
    assert_eq!(f("PATH_INFO"), r"'/environ/caf\xc3\xa9 x/y'");
    assert_eq!(f("QUERY_STRING"), "'a=1&b=%20'");
    assert_eq!(f("CONTENT_TYPE"), "'text/x-test'");
    assert_eq!(f("CONTENT_LENGTH"), "'5'");
    assert!(f("SERVER_NAME").len() > 2, "SERVER_NAME empty");
    assert_eq!(f("SERVER_PORT"), format!("'{}'", srv.port));
    assert_eq!(f("SERVER_PROTOCOL"), "'HTTP/1.1'");
    assert!(
        f("SERVER_SOFTWARE").starts_with("'m0serve-wsgi/"),
        "{}",
        f("SERVER_SOFTWARE")
    );
    assert_eq!(f("REMOTE_ADDR"), "'127.0.0.1'");
    assert_eq!(f("REMOTE_PORT"), format!("'{client_port}'"));
    assert_eq!(f("HTTP_HOST"), "'m0serve.test'");
    assert_eq!(f("HTTP_X_CUSTOM"), "'v1, v2'");
    for absent in [
        "HTTP_PROXY",
        "HTTP_X_UNDER",
        "HTTP_CONTENT_TYPE",
        "HTTP_CONTENT_LENGTH",
    ] {
        assert!(
            r.field(absent).is_none(),
            "{absent} must not be in the environ"
        );
    }
    assert_eq!(f("wsgi.version"), "(1, 0)");
    assert_eq!(f("wsgi.url_scheme"), "'http'");
    assert_eq!(f("wsgi.multiprocess"), "False", "one worker");
    assert_eq!(f("wsgi.run_once"), "False");
    assert_eq!(f("wsgi.input.methods"), "True");
    assert_eq!(f("wsgi.errors.methods"), "True");
    assert_eq!(f("wsgi.file_wrapper.callable"), "True");
    assert_eq!(f("types.str"), "True", "every CGI value is a str");

    // HTTP/1.0, no body: no CONTENT_LENGTH, empty QUERY_STRING.
    let mut c10 = Conn::open(srv.port);
    c10.send(b"GET /environ HTTP/1.0\r\nHost: x\r\n\r\n");
    let r = c10.read_response(false).unwrap();
    assert_eq!(r.field("SERVER_PROTOCOL").as_deref(), Some("'HTTP/1.0'"));
    assert_eq!(r.field("QUERY_STRING").as_deref(), Some("''"));
    assert!(r.field("CONTENT_LENGTH").is_none());
}
both_modes!(environ);

fn input(mode: Mode) {
    let srv = serve(mode);
    let body = b"ab\ncdef\n\nxyz";
    // The expected values are what io.BytesIO gives for the same calls.
    let cases = [
        ("read-n", r"[b'ab\n', b'cde', b'f\n\n', b'xyz', b'', b'']"),
        ("readline", r"[b'ab\n', b'cdef\n', b'\n', b'xyz', b'']"),
        (
            "readline-n",
            r"[b'ab\n', b'cde', b'f\n', b'\n', b'xyz', b'']",
        ),
        ("readlines", r"[[b'ab\n', b'cdef\n', b'\n', b'xyz'], b'']"),
        ("iter", r"[[b'ab\n', b'cdef\n', b'\n', b'xyz']]"),
    ];
    for (how, want) in cases {
        let r = request(srv.port, "POST", &format!("/input/{how}?n=3"), &[], body);
        assert_eq!(r.status, 200, "{how}: {}", r.text());
        assert_eq!(r.field("got").as_deref(), Some(want), "{how}");
    }
    // read() without a size: allowed by PEP 3333, refused by the validator.
    let r = request(srv.port, "POST", "/input/read", &[], body);
    match mode {
        Mode::Plain => {
            assert_eq!(r.status, 200);
            assert_eq!(
                r.field("got").as_deref(),
                Some(r"[b'ab\ncdef\n\nxyz', b'']")
            );
        }
        Mode::Validated => assert_eq!(r.status, 500, "wsgiref.validate wants read(size)"),
    }
    // A large body, every byte value, round-trips through read(n).
    let big: Vec<u8> = (0..(1 << 20) + 7)
        .map(|i: u32| (i * 7 % 256) as u8)
        .collect();
    let r = request(srv.port, "POST", "/input/echo", &[], &big);
    assert_eq!(r.status, 200);
    assert!(
        r.body == big,
        "echoed body differs ({} bytes back)",
        r.body.len()
    );
    // No body at all: reads give b''.
    let r = request(srv.port, "POST", "/input/read-n?n=3", &[], b"");
    assert_eq!(r.field("got").as_deref(), Some("[b'', b'']"));
}
both_modes!(input);

fn errors_stream(mode: Mode) {
    let srv = serve(mode);
    let token = format!("tok{}", std::process::id());
    let r = get(srv.port, &format!("/errors?token={token}"));
    assert_eq!(r.status, 200);
    for line in [
        format!("conformance wsgi.errors line {token}"),
        format!("conformance writelines {token} a"),
        format!("conformance writelines {token} b"),
    ] {
        assert!(
            srv.wait_log(&line, Duration::from_secs(5)),
            "{line:?} not in the server log:\n{}",
            srv.log()
        );
    }
}
both_modes!(errors_stream);

/// A `logging` handler on wsgi.errors (Flask's default) keeps its records'
/// levels in the server log; what the app writes itself is an error.
fn logging_levels(mode: Mode) {
    let srv = serve(mode);
    let token = format!("lv{}{}", std::process::id(), mode.tag(""));
    let r = get(srv.port, &format!("/logging?token={token}"));
    assert_eq!(r.status, 200);
    for (level, what) in [
        ("[DEBUG] ", "logging debug"),
        ("[INFO] ", "logging info"),
        ("[WARNING] ", "logging warning"),
        ("[ERROR] ", "logging error"),
        ("[ERROR] ", "direct write"),
    ] {
        let line = format!("plugin: conformance {what} {token}");
        assert!(
            srv.wait_log(&line, Duration::from_secs(5)),
            "{line:?} not in the server log:\n{}",
            srv.log()
        );
        let log = srv.log();
        assert!(
            log.lines().any(|l| l.contains(&line) && l.contains(level)),
            "{line:?} is not at {level}in the server log:\n{log}"
        );
    }
}
both_modes!(logging_levels);

/// The app's reason phrase goes out as given; an empty one gets the
/// standard phrase, and one with a control character is refused by
/// start_response (a 500, the worker lives on).
fn reason_phrase(mode: Mode) {
    let srv = serve(mode);
    let r = get(srv.port, "/reason");
    assert_eq!(r.status, 299);
    assert!(
        r.head.starts_with("HTTP/1.1 299 Totally Custom\r\n"),
        "{:?}",
        r.head
    );
    assert_eq!(r.body, b"reason\n");
    let r = get(srv.port, "/reason?status=404%20Nicht%20gefunden");
    assert!(
        r.head.starts_with("HTTP/1.1 404 Nicht gefunden\r\n"),
        "{:?}",
        r.head
    );
    let r = get(srv.port, "/reason?status=200%20");
    assert!(r.head.starts_with("HTTP/1.1 200 OK\r\n"), "{:?}", r.head);
    let r = get(srv.port, "/reason?status=200%20OK%01");
    assert_eq!(r.status, 500, "{:?}", r.head);
    let r = get(srv.port, "/");
    assert!(r.head.starts_with("HTTP/1.1 200 OK\r\n"), "{:?}", r.head);
}
both_modes!(reason_phrase);

// --- start_response ------------------------------------------------------------

fn start_response(mode: Mode) {
    let srv = serve(mode);
    for kind in [
        "cr",
        "lf",
        "crlf",
        "nul",
        "name-lf",
        "name-space",
        "not-latin1",
    ] {
        let r = get(srv.port, &format!("/headers/{kind}"));
        assert_eq!(
            r.status, 500,
            "{kind}: a bad header is an application error"
        );
        assert!(
            !r.head.contains("Injected"),
            "{kind}: split header on the wire:\n{}",
            r.head
        );
        assert!(r.header("x-bad").is_none(), "{kind}: X-Bad was sent");
        assert!(!r.text().contains("should not be sent"));
    }
    let r = get(srv.port, "/headers/latin1");
    assert_eq!(r.status, 200);
    assert_eq!(
        r.header_bytes("x-latin1"),
        Some(&b"caf\xe9"[..]),
        "latin-1 on the wire"
    );

    let r = get(srv.port, "/start/twice");
    assert_eq!(r.status, 500, "a second start_response without exc_info");
    assert!(!r.text().contains("should not be sent"));

    let r = get(srv.port, "/start/exc-before");
    assert_eq!(
        r.status, 503,
        "exc_info before the body replaces the status"
    );
    assert_eq!(r.header("x-replaced").as_deref(), Some("yes"));
    assert!(
        r.header("x-first").is_none(),
        "the first headers are replaced"
    );
    assert_eq!(r.text(), "replaced\n");

    // After the body started, start_response(exc_info) re-raises: the head
    // is out, so the response is cut without a clean end.
    let mut conn = Conn::open(srv.port);
    let r = conn.request("GET", "/start/exc-after", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "partial\n");
    assert!(
        !r.complete,
        "a re-raised error after the head must truncate"
    );
    assert!(conn.closed_by_server(Duration::from_secs(5)));
    assert!(srv.wait_log("too late to replace", Duration::from_secs(5)));

    // write() bytes go first, in order, then the iterable's.
    let r = get(srv.port, "/write");
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "w1-w2-it1-it2\n");
    assert!(r.complete);
    assert_closed_once(&srv, "write");
}
both_modes!(start_response);

// --- the iterable -------------------------------------------------------------

fn iterable(mode: Mode) {
    let srv = serve(mode);

    // Sized: a one-item list (hidden from us by the validator's wrapper).
    let r = get(srv.port, "/body/one-item");
    assert_eq!((r.status, r.text().as_str()), (200, "one piece\n"));
    if mode == Mode::Plain {
        assert_eq!(r.header("content-length").as_deref(), Some("10"));
        assert!(!r.chunked);
    }
    // Sized by the app's Content-Length, whatever the iterable.
    let r = get(srv.port, "/body/content-length?tag=cl");
    assert_eq!(r.text(), "sized by header\n");
    assert_eq!(r.header("content-length").as_deref(), Some("16"));
    assert!(!r.chunked && r.complete);
    assert_closed_once(&srv, "cl");

    // HEAD: the head a GET would get, no body, the connection reusable.
    let mut conn = Conn::open(srv.port);
    let r = conn.request("HEAD", "/body/content-length?tag=head", &[], b"");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-length").as_deref(), Some("16"));
    let r = conn.request("GET", "/body/one-item", &[], b"");
    assert_eq!(r.text(), "one piece\n", "the connection survives a HEAD");
    drop(conn);
    assert_closed_once(&srv, "head");

    let r = get(srv.port, "/body/list");
    assert_eq!(r.text(), "several pieces\n");
    assert!(r.complete);

    let r = get(srv.port, "/body/empty?tag=empty");
    assert_eq!(r.status, 204);
    assert!(r.body.is_empty());
    assert_closed_once(&srv, "empty");

    // Unsized: streamed chunked, each piece as it is produced.
    let mut conn = Conn::open(srv.port);
    let t0 = Instant::now();
    conn.send_request("GET", "/body/stream?tag=stream", &[], b"");
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200);
    assert!(
        head.chunked,
        "an unsized iterable is sent chunked:\n{}",
        head.head
    );
    assert!(head.header("content-length").is_none());
    let first = conn.read_chunk().expect("first chunk");
    let first_at = t0.elapsed();
    assert_eq!(first, b"first\n");
    let second = conn.read_chunk().expect("second chunk");
    let second_at = t0.elapsed();
    assert_eq!(second, b"second\n");
    assert_eq!(
        conn.read_chunk().as_deref(),
        Some(&b""[..]),
        "clean terminator"
    );
    assert!(
        second_at - first_at >= Duration::from_millis(400),
        "the first piece waited for the second ({first_at:?} / {second_at:?})"
    );
    assert_closed_once(&srv, "stream");

    // A generator that raises after the head: truncated, close() called.
    let tag = mode.tag("rah");
    let mut conn = Conn::open(srv.port);
    let r = conn.request(
        "GET",
        &format!("/body/raise-after-head?tag={tag}"),
        &[],
        b"",
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.text(), "before the error\n");
    assert!(!r.complete, "no clean terminator after an error");
    assert!(conn.closed_by_server(Duration::from_secs(5)));
    assert_closed_once(&srv, &tag);

    // Errors before any byte went out: a 500 with nothing of the error.
    for (path, tag) in [
        ("/body/raise-first", "rf"),
        ("/body/not-bytes", "nb"),
        ("/body/no-start", "ns"),
    ] {
        let r = get(srv.port, &format!("{path}?tag={tag}"));
        assert_eq!(r.status, 500, "{path}");
        assert!(!r.text().contains("never"), "{path}");
        assert_closed_once(&srv, tag);
    }
    let r = get(srv.port, "/body/str");
    assert_eq!(r.status, 500, "a str body is an error");
    assert!(!r.text().contains("a str body"));

    // The client goes away mid-stream: iteration stops and close() runs.
    let tag = mode.tag("gone");
    let mut conn = Conn::open(srv.port);
    conn.send_request("GET", &format!("/body/endless?tag={tag}"), &[], b"");
    let head = conn.read_head().unwrap();
    assert_eq!(head.status, 200);
    assert!(conn.read_chunk().is_some());
    conn.shutdown();
    assert_closed_once(&srv, &tag);

    // wsgi.file_wrapper
    let r = get(srv.port, "/file-wrapper");
    assert_eq!(r.status, 200);
    let want: Vec<u8> = (0..10000u32).map(|i| (i % 251) as u8).collect();
    assert!(r.body == want, "file_wrapper body differs");
    assert_closed_once(&srv, "file-wrapper");
}
both_modes!(iterable);

// --- errors never kill the worker ------------------------------------------------

fn survives_errors(mode: Mode) {
    let srv = serve(mode);
    let pid = get(srv.port, "/pid").text();
    let mut conn = Conn::open(srv.port);
    for path in ["/raise", "/body/str", "/start/twice", "/headers/crlf"] {
        let r = get(srv.port, path);
        assert_eq!(r.status, 500, "{path}");
        assert!(
            !r.text().contains("Traceback"),
            "{path}: traceback on the wire"
        );
        assert!(!r.text().contains("SECRET-TRACEBACK-TEXT"));
        // The request after a 500 is served normally, by the same process.
        let r = conn.request("GET", "/pid", &[], b"");
        assert_eq!((r.status, r.text()), (200, pid.clone()), "after {path}");
    }
    assert!(
        srv.wait_log("SECRET-TRACEBACK-TEXT", Duration::from_secs(5)),
        "the traceback goes to the log:\n{}",
        srv.log()
    );
    assert!(srv.log().contains("Traceback (most recent call last)"));
}
both_modes!(survives_errors);

#[test]
fn validate_wrapper_is_engaged() {
    let plain = serve(Mode::Plain);
    assert_eq!(get(plain.port, "/canary").status, 200);
    let validated = serve(Mode::Validated);
    let r = get(validated.port, "/canary");
    assert_eq!(
        r.status, 500,
        "wsgiref.validate must refuse a 200 without Content-Type"
    );
    assert!(validated.wait_log("No Content-Type header found", Duration::from_secs(5)));
}

// --- embedding ---------------------------------------------------------------------

#[test]
fn python_lives_in_the_worker_with_a_kept_thread_state() {
    let srv = WsgiServer::start(
        Mode::Plain.spec(),
        &["--workers", "1", "--blocking-threads", "1"],
    );
    let worker: u32 = get(srv.port, "/pid").text().trim().parse().unwrap();
    assert_ne!(worker, srv.pid(), "the app runs in a worker process");
    let maps = |pid: u32| std::fs::read_to_string(format!("/proc/{pid}/maps")).unwrap_or_default();
    assert!(
        maps(worker).contains("libpython3"),
        "the worker embeds Python"
    );
    assert!(
        !maps(srv.pid()).contains("libpython3"),
        "the supervisor never loads Python"
    );

    // threading.local() lives in the Python thread state: with one handler
    // thread that keeps its state, the count goes on between requests.
    let mut conn = Conn::open(srv.port);
    let mut last = 0;
    for _ in 0..5 {
        let r = conn.request("GET", "/tstate", &[], b"");
        let calls: u32 = r.field("calls").unwrap().parse().unwrap();
        assert!(calls > last, "thread state not kept: {}", r.text());
        last = calls;
    }
    drop(conn);
    let r = get(srv.port, "/signals");
    assert_eq!(r.field("python_sigint_handler").as_deref(), Some("False"));
    assert!(
        srv.wait_log("libpython", Duration::from_secs(5)),
        "init logs the libpython path"
    );
}

#[test]
fn topology_flags_tell_the_truth() {
    let one = WsgiServer::start(
        Mode::Plain.spec(),
        &["--workers", "1", "--blocking-threads", "1"],
    );
    let r = get(one.port, "/environ");
    assert_eq!(r.field("wsgi.multithread").as_deref(), Some("False"));
    assert_eq!(r.field("wsgi.multiprocess").as_deref(), Some("False"));
    let many = WsgiServer::start(
        Mode::Plain.spec(),
        &["--workers", "2", "--blocking-threads", "4"],
    );
    let r = get(many.port, "/environ");
    assert_eq!(r.field("wsgi.multithread").as_deref(), Some("True"));
    assert_eq!(r.field("wsgi.multiprocess").as_deref(), Some("True"));
}

// --- init failures ------------------------------------------------------------------

#[test]
fn an_app_factory_is_called_with_literal_arguments() {
    let srv = WsgiServer::start("factory:create_app('hi', punct='?')", &["--workers", "1"]);
    assert_eq!(get(srv.port, "/").text(), "hi?\n");
    let srv = WsgiServer::start("factory:create_app()", &["--workers", "1"]);
    assert_eq!(get(srv.port, "/").text(), "hello!\n");
    // Arguments are literals, never code; a factory that raises shows its
    // traceback; an unclosed call is not a spec.
    let cases: [(&str, i32, &[&str]); 3] = [
        ("factory:create_app(open('x'))", 1, &["malformed node"]),
        (
            "factory:broken_factory()",
            1,
            &["FACTORY-FAILED", "factory.py"],
        ),
        ("factory:create_app(", 78, &["no closing"]),
    ];
    for (spec, code, needles) in cases {
        let (status, output) = WsgiServer::fail(spec, &[]);
        assert_eq!(status, Some(code), "{spec}: {output}");
        for n in needles {
            assert!(output.contains(n), "{spec}: {n:?} not in:\n{output}");
        }
    }
}

#[test]
fn init_failures_exit_with_a_reason() {
    let cases: [(&str, i32, &[&str]); 5] = [
        (
            "no_such_module_xyz",
            1,
            &[
                "no_such_module_xyz",
                "ModuleNotFoundError",
                "no_such_module_xyz:application",
            ],
        ),
        (
            "broken_import",
            1,
            &["BROKEN-AT-IMPORT", "broken_import.py", "line 3"],
        ),
        ("conformance:no_such_attr", 1, &["no_such_attr"]),
        ("conformance:TEXT", 1, &["not callable"]),
        ("not a spec", 78, &["MODULE[:ATTR]"]),
    ];
    for (spec, code, needles) in cases {
        let (status, output) = WsgiServer::fail(spec, &[]);
        assert_eq!(status, Some(code), "{spec}: exit status; output:\n{output}");
        for n in needles {
            assert!(output.contains(n), "{spec}: {n:?} not in:\n{output}");
        }
        // Checked once before binding: one traceback at most, and no
        // worker started to print it again.
        assert!(output.matches("Traceback").count() <= 1, "{spec}: {output}");
        assert!(!output.contains("worker 0 pid="), "{spec}: {output}");
    }
    // A --venv that is no venv is configuration refused, before any
    // request.
    let (status, output) = WsgiServer::fail("conformance", &["--venv", "/nonexistent-venv"]);
    assert_eq!(status, Some(78), "{output}");
    assert!(output.contains("/nonexistent-venv"), "{output}");
}

/// A WSGI app behind an API key from `M0_API_KEY`: the core answers 401
/// without it (the app has no 401 of its own), the app serves with it,
/// and the app's own environment does not hold the key.
#[test]
fn a_wsgi_app_behind_an_api_key_never_sees_a_request_without_it_nor_the_key() {
    let key = "sk-wsgi-behind-a-key-0192";
    let srv = WsgiServer::start_with_env(
        Mode::Plain.spec(),
        &["--workers", "1"],
        &[("M0_API_KEY", key)],
    );
    let refused = get(srv.port, "/stats");
    assert_eq!(refused.status, 401, "{}", srv.log());
    let auth = format!("Bearer {key}");
    let r = request(
        srv.port,
        "GET",
        "/osenv?M0_API_KEY",
        &[("Authorization", &auth)],
        b"",
    );
    assert_eq!(r.status, 200, "{}", srv.log());
    assert_eq!(String::from_utf8_lossy(&r.body), "M0_API_KEY=None\n");
    // The app's own answer to the path refused above.
    let stats = request(srv.port, "GET", "/stats", &[("Authorization", &auth)], b"");
    assert_eq!(stats.status, 200);
    // The core checked the key and keeps it from the app: no
    // HTTP_AUTHORIZATION in the environ, the key nowhere in it, while the
    // request's other headers arrive.
    let environ = request(
        srv.port,
        "GET",
        "/environ",
        &[("Authorization", &auth), ("X-Other", "kept")],
        b"",
    );
    assert_eq!(environ.status, 200, "{}", srv.log());
    let dump = String::from_utf8_lossy(&environ.body);
    assert!(dump.contains("HTTP_X_OTHER='kept'"), "{dump}");
    assert!(!dump.contains("HTTP_AUTHORIZATION"), "{dump}");
    assert!(!dump.contains(key), "{dump}");
}
