//! A plugin on the SDK that misbehaves on request, so the tests can check
//! that each fault gets the status and log line a C plugin's would.
//!
//! ARG picks a fault in a hook: `panic-init`, `refuse-init`, `fail-init`,
//! `panic-thread-start`, `panic-thread-stop`, `panic-shutdown`. Routes:
//!
//!   GET /                  "ok"
//!   GET /panic             panics before the response starts
//!   GET /panic-after-head  starts a 10-byte response, writes 3, panics
//!   GET /error/NNN         returns the SDK error for status NNN
//!   GET /bad-header        a header value with CR LF in it
//!   GET /host-header       a Content-Length header (the host owns it)
//!   GET /bad-status        status 99
//!   GET /overwrite         declares 5 bytes, writes 10
//!   GET /short             declares 10 bytes, writes 3, finishes
//!   GET /defer             returns DEFER from a handler thread

#![deny(unsafe_code)]

use m0serve_plugin::{
    Description, Error, Header, Host, InitArgs, InitError, Length, Plugin, Request, Response, Sent,
};

struct Faults {
    fault: String,
}

impl Plugin for Faults {
    const DESCRIPTION: Description = Description::new(c"sdk_faults", c"0.0.0");

    fn init(_host: &'static Host, args: &InitArgs) -> Result<Self, InitError> {
        match args.arg.as_str() {
            "panic-init" => panic!("boom in init"),
            "refuse-init" => Err(InitError::refused(
                "sdk_faults: ARG refuse-init refuses the configuration; pass another ARG",
            )),
            "fail-init" => Err(InitError::failed(
                "sdk_faults: ARG fail-init fails to start",
            )),
            _ => Ok(Faults {
                fault: args.arg.clone(),
            }),
        }
    }

    fn thread_start(&self, index: u32) -> Result<(), Error> {
        if self.fault == "panic-thread-start" {
            panic!("boom in thread_start {index}");
        }
        Ok(())
    }

    fn thread_stop(&self, index: u32) {
        if self.fault == "panic-thread-stop" {
            panic!("boom in thread_stop {index}");
        }
    }

    fn shutdown(&self) {
        if self.fault == "panic-shutdown" {
            panic!("boom in shutdown");
        }
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        match req.path() {
            b"/" => resp.text(200, "ok\n"),
            b"/panic" => panic!("boom before the head"),
            b"/panic-after-head" => {
                let mut body = resp.start(200, &[], Length::Exact(10))?;
                body.write(b"abc")?;
                panic!("boom after the head");
            }
            b"/bad-header" => resp.send(200, &[Header::new("X-Bad", "a\r\nb")], b"no"),
            b"/host-header" => resp.send(200, &[Header::new("Content-Length", "2")], b"no"),
            b"/bad-status" => resp.send(99, &[], b"no"),
            b"/overwrite" => {
                let mut body = resp.start(200, &[], Length::Exact(5))?;
                body.write(b"0123456789")?;
                body.finish()
            }
            b"/short" => {
                let mut body = resp.start(200, &[], Length::Exact(10))?;
                body.write(b"abc")?;
                body.finish()
            }
            b"/defer" => Err(Error::DEFER),
            path => Err(match path.strip_prefix(b"/error/") {
                Some(b"400") => Error::BAD_REQUEST,
                Some(b"404") => Error::NOT_FOUND,
                Some(b"413") => Error::TOO_LARGE,
                Some(b"422") => Error::UNPROCESSABLE,
                Some(b"503") => Error::UNAVAILABLE,
                Some(b"504") => Error::TIMEOUT,
                Some(_) => Error::INTERNAL,
                None => Error::NOT_FOUND,
            }),
        }
    }
}

m0serve_plugin::export!(Faults);
