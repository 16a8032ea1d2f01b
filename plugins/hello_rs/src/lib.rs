//! hello_rs: the example native plugin in Rust, on the `m0serve-plugin`
//! SDK, with the routes of hello_c and no `unsafe`:
//!
//!   GET  /              "hello, world"
//!   POST /echo          the request body back
//!   GET  /headers       the request headers, one "name: value" per line
//!   GET  /status/NNN    an empty response with that status
//!   GET  /stream        several chunks with no declared length (chunked)
//!   GET  /sleep?ms=N    blocks a handler thread N ms, then answers
//!   GET  /pid           the worker's process id (which worker served you)
//!   GET  /crash         kills its own process (for the supervisor's tests)

#![deny(unsafe_code)]

use std::io::Read;
use std::time::Duration;

use m0serve_plugin::{
    Description, Error, Header, Host, InitArgs, InitError, Length, Plugin, Request, Response, Sent,
};

struct Hello;

const TEXT: [Header<'static>; 1] = [Header::new("Content-Type", "text/plain")];

impl Plugin for Hello {
    // No mutable state and nothing blocks but /sleep, which defers when
    // called on the event loop: the loop answers the rest itself.
    const DESCRIPTION: Description = Description::new(c"hello_rs", c"1.0.0").inline();

    fn init(host: &'static Host, _args: &InitArgs) -> Result<Self, InitError> {
        // Tell --doctor which route may block. A host before 1.2 has no
        // facts, and that is no reason not to start.
        let _ = host.fact("hello_rs.blocking_routes", "/sleep");
        Ok(Hello)
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        match req.path() {
            b"/" => resp.send(200, &TEXT, b"hello, world\n"),
            b"/echo" => echo(req, resp),
            b"/headers" => {
                let mut out = Vec::new();
                for (name, value) in req.headers() {
                    out.extend_from_slice(name);
                    out.extend_from_slice(b": ");
                    out.extend_from_slice(value);
                    out.push(b'\n');
                }
                resp.send(200, &TEXT, &out)
            }
            b"/stream" => {
                let mut body = resp.start(200, &[], Length::Unknown)?;
                for i in 0..5 {
                    body.write(format!("chunk {i}\n").as_bytes())?;
                }
                body.finish()
            }
            b"/sleep" if req.on_loop() => Err(Error::DEFER),
            b"/sleep" => {
                let ms = req.query_param("ms").map(leading_number).unwrap_or(100);
                std::thread::sleep(Duration::from_millis(ms));
                resp.send(200, &TEXT, b"slept\n")
            }
            b"/pid" => resp.send(200, &TEXT, format!("{}\n", std::process::id()).as_bytes()),
            // Not a clean exit: the supervisor must see a worker die.
            b"/crash" => std::process::abort(),
            path => match path.strip_prefix(b"/status/") {
                Some(digits) if digits.len() == 3 && digits.iter().all(u8::is_ascii_digit) => {
                    resp.send(leading_number(digits) as u16, &[], b"")
                }
                _ => Err(Error::NOT_FOUND),
            },
        }
    }
}

/// Streams the body through in pieces: no buffer sized by the client.
fn echo(req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
    let mut out = resp.start(200, &[], Length::Exact(req.content_length()))?;
    let mut body = req.body();
    let mut buf = [0u8; 16384];
    loop {
        match body.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => out.write(&buf[..n])?,
        }
    }
    out.finish()
}

/// The decimal digits at the start of `s` (hello_c's reading of `?ms=`).
fn leading_number(s: &[u8]) -> u64 {
    s.iter()
        .take_while(|b| b.is_ascii_digit())
        .fold(0u64, |n, d| {
            n.saturating_mul(10).saturating_add(u64::from(d - b'0'))
        })
}

m0serve_plugin::export!(Hello);
