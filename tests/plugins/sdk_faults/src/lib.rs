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
//!
//! With the variable `M0_FAULTS_BATCH` set (read by `describe` and `init`)
//! it also takes batches of up to 8 (`M0_CAP_BATCH`). Each call, a batch or
//! one request through `handle`, takes the next number of a sequence (1 for
//! the first), and these routes come in:
//!
//!   /member?id=N           "id=N size=S pos=P seq=Q": the call's size,
//!                          the request's place in it, the call's number
//!   /gate?id=N             answered as /member, after the whole call has
//!                          waited (30 s at most) for the file named by
//!                          `M0_FAULTS_GATE` to exist; it logs
//!                          "sdk_faults: call Q of S request(s) waits for
//!                          the gate" first
//!   /panic-batch           the batch answers the requests before it, then
//!                          panics; the host answers it and those after
//!
//! Any other request in a batch goes to `handle`.
//!
//! With the variable `M0_FAULTS_MODELS` set it serves several models (ABI
//! 1.6) instead: each ARG names one (`Host::register_model`), it admits
//! every request, setting the model its query names (`/model?name=NAME`,
//! cost 1), defines the counter `sdk_faults_requests_total`, and answers
//!
//!   /model?name=NAME       "model=NAME in_flight=N late=E": the model's cost
//!                          in flight (its own), and the error `set_model`
//!                          gives outside `admit`; it counts the request
//!                          under `{model="NAME"}`

#![deny(unsafe_code)]

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use m0serve_plugin::{
    Admit, Batch, Description, Error, Header, Host, InitArgs, InitError, Length, Metric, ModelId,
    Plugin, Request, Response, Sent,
};

struct Faults {
    fault: String,
    /// `M0_FAULTS_BATCH` was set: the batch routes are on.
    batch: bool,
    /// `M0_FAULTS_GATE`: the file a `/gate` call waits for.
    gate: Option<PathBuf>,
    /// Calls so far.
    calls: AtomicU64,
    host: &'static Host,
    /// `M0_FAULTS_MODELS`: the models each ARG named, and the counter.
    models: Vec<(String, ModelId)>,
    requests: Option<Metric>,
}

fn batching() -> bool {
    std::env::var_os("M0_FAULTS_BATCH").is_some()
}

fn serving_models() -> bool {
    std::env::var_os("M0_FAULTS_MODELS").is_some()
}

impl Faults {
    fn next_call(&self) -> u64 {
        self.calls.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn wait_for_gate(&self, seq: u64, size: usize) {
        self.host.info(&format!(
            "sdk_faults: call {seq} of {size} request(s) waits for the gate"
        ));
        let Some(gate) = &self.gate else { return };
        let deadline = Instant::now() + Duration::from_secs(30);
        while !gate.exists() && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(1));
        }
    }

    /// The model `/model?name=NAME` names.
    fn model_of(&self, req: &Request<'_>) -> Option<&(String, ModelId)> {
        let name = req.query_param("name")?;
        self.models.iter().find(|(n, _)| n.as_bytes() == name)
    }

    /// A `/model` answer.
    fn model(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        let Some((name, id)) = self.model_of(req) else {
            return Err(Error::NOT_FOUND);
        };
        let late = req.set_model(*id).err().map_or(0, Error::code);
        if let Some(metric) = self.requests {
            self.host.record(metric, &[("model", name)], 1.0);
        }
        let in_flight = self.host.model_in_flight(*id);
        resp.text(
            200,
            &format!("model={name} in_flight={in_flight} late={late}\n"),
        )
    }

    /// A `/member` or `/gate` answer.
    fn member(
        &self,
        req: &Request<'_>,
        resp: Response<'_>,
        size: usize,
        pos: usize,
        seq: u64,
    ) -> Result<Sent, Error> {
        let id = String::from_utf8_lossy(req.query_param("id").unwrap_or_default());
        resp.text(200, &format!("id={id} size={size} pos={pos} seq={seq}\n"))
    }
}

impl Plugin for Faults {
    const DESCRIPTION: Description = Description::new(c"sdk_faults", c"0.0.0");

    fn describe() -> Description {
        if serving_models() {
            Self::DESCRIPTION.admits().several_args()
        } else if batching() {
            Self::DESCRIPTION.batch(8)
        } else {
            Self::DESCRIPTION
        }
    }

    fn init(host: &'static Host, args: &InitArgs) -> Result<Self, InitError> {
        match args.arg.as_str() {
            "panic-init" => panic!("boom in init"),
            "refuse-init" => Err(InitError::refused(
                "sdk_faults: ARG refuse-init refuses the configuration; pass another ARG",
            )),
            "fail-init" => Err(InitError::failed(
                "sdk_faults: ARG fail-init fails to start",
            )),
            _ if serving_models() => {
                let mut models = Vec::new();
                for name in &args.args {
                    let id = host.register_model(name).map_err(|e| {
                        InitError::refused(format!("sdk_faults: model {name:?}: {e:?}"))
                    })?;
                    models.push((name.clone(), id));
                }
                let requests = host
                    .define_counter("sdk_faults_requests_total", "Requests by model.")
                    .ok();
                Ok(Faults {
                    fault: String::new(),
                    batch: false,
                    gate: None,
                    calls: AtomicU64::new(0),
                    host,
                    models,
                    requests,
                })
            }
            _ => Ok(Faults {
                fault: args.arg.clone(),
                batch: batching(),
                gate: std::env::var_os("M0_FAULTS_GATE").map(PathBuf::from),
                calls: AtomicU64::new(0),
                host,
                models: Vec::new(),
                requests: None,
            }),
        }
    }

    fn admit(&self, req: &Request<'_>, _resp: Response<'_>, _in_flight: u64) -> Admit {
        match self.model_of(req) {
            Some((_, id)) => match req.set_model(*id) {
                Ok(()) => Admit::Cost(1),
                Err(e) => Admit::Answered(Err(e)),
            },
            None => Admit::Cost(0),
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

    fn handle_batch(&self, batch: Batch<'_>) -> Result<(), Error> {
        let members: Vec<_> = batch.into_iter().collect();
        let (size, seq) = (members.len(), self.next_call());
        if members.iter().any(|(req, _)| req.path() == b"/gate") {
            self.wait_for_gate(seq, size);
        }
        let mut first = Ok(());
        for (pos, (req, resp)) in members.into_iter().enumerate() {
            let sent = match req.path() {
                b"/panic-batch" => panic!("boom in a batch of {size} at {pos}"),
                b"/member" | b"/gate" => self.member(&req, resp, size, pos, seq),
                _ => self.handle(&req, resp),
            };
            if let Err(e) = sent {
                first = first.and(Err(e));
            }
        }
        first
    }

    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
        if self.batch {
            match req.path() {
                b"/panic-batch" => {
                    self.next_call();
                    panic!("boom in a batch of 1 at 0");
                }
                b"/member" => return self.member(req, resp, 1, 0, self.next_call()),
                b"/gate" => {
                    let seq = self.next_call();
                    self.wait_for_gate(seq, 1);
                    return self.member(req, resp, 1, 0, seq);
                }
                _ => {}
            }
        }
        match req.path() {
            b"/" => resp.text(200, "ok\n"),
            b"/model" if !self.models.is_empty() => self.model(req, resp),
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
