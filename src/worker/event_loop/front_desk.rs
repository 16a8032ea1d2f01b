//! The front desk: the checks a request meets before any plugin sees it,
//! with the settings they read. A request on the metrics listener is a
//! scrape. On the main listener the health path, a CORS preflight and a
//! request without a valid API key are answered here; any other request
//! passes on with what its job carries: the CORS decision, the client and
//! scheme a trusted proxy names, and no checked key.
//!
//! The desk decides and says what to write (`Answer`); it holds no
//! connection. The loop writes the answer into the connection and sends
//! it like its other own answers, so one the socket does not take at once
//! is flushed the same way.

use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use crate::auth::ApiKeys;
use crate::config::Config;
use crate::http::Span;
use crate::http::cors::{Allow, Origins};
use crate::http::forwarded::Trusted;
use crate::http::head::RequestHead;
use crate::http::response::{self, BodyLength};
use crate::plugin::call::Peer;
use crate::worker::connection::Ready;
use crate::worker::metrics::WorkerMetrics;

mod auth;
mod cors;
mod forwarded;
mod health;

/// The front desk's settings, read from the configuration once.
pub(super) struct FrontDesk {
    /// `--health-path`.
    health_path: Option<String>,
    /// API keys: a request without one is answered 401.
    api_keys: Option<Arc<ApiKeys>>,
    /// `--cors-allow-origin`.
    cors: Origins,
    /// `--forwarded-allow-ips`.
    trusted_proxies: Trusted,
}

/// What the desk made of a request.
pub(super) enum Desk {
    /// On to the plugin.
    Pass(Pass),
    /// Answered here: the loop writes it (`Answer::write`) and sends it.
    Answered(Answer),
    /// A request on the metrics listener: the loop answers it from its
    /// metrics (`scrape.rs`).
    Scrape,
}

/// What a request that passes the desk carries to its job.
pub(super) struct Pass {
    /// The request's `Origin` (its span) when `--cors-allow-origin` allows
    /// it: the response says so, whoever writes it.
    pub(super) cors: Option<(Allow, Span)>,
    /// The client a trusted proxy names, in place of the connection's peer.
    pub(super) client: Option<Arc<Peer>>,
    /// A trusted proxy says the client used https.
    pub(super) https: bool,
}

/// An answer the desk gives itself.
pub(super) enum Answer {
    /// The health path (`health.rs`).
    Health,
    /// A CORS preflight, with its origin when allowed (`cors.rs`).
    Preflight(Option<(Allow, Span)>),
    /// No valid API key, with the request's origin when CORS allows it
    /// (`auth.rs`).
    Unauthorized(Option<(Allow, Span)>),
}

/// An answer as written: what its access-log line and sending need.
pub(super) struct Written {
    pub(super) status: u16,
    /// The body's length, as if sent (a HEAD request's is counted as none
    /// by whoever logs it).
    pub(super) body_bytes: usize,
    pub(super) keep_alive: bool,
}

impl FrontDesk {
    pub(super) fn new(cfg: &Config) -> FrontDesk {
        FrontDesk {
            health_path: cfg.cli.health_path.clone(),
            api_keys: cfg.api_keys.clone(),
            cors: Origins::from_values(&cfg.cli.cors_allow_origin),
            trusted_proxies: cfg.cli.forwarded_allow_ips.clone(),
        }
    }

    /// Checks `ready`, whose bytes are in `buf`, from a connection with
    /// peer `from` (`scraper`: one from the metrics listener). Counts the
    /// request's bytes into `metrics`, unless it is a scrape, and takes a
    /// checked API key out of its headers when it passes.
    pub(super) fn check(
        &self,
        ready: &mut Ready,
        buf: &[u8],
        from: IpAddr,
        scraper: bool,
        metrics: &Option<WorkerMetrics>,
    ) -> Desk {
        if scraper {
            return Desk::Scrape;
        }
        count_received(metrics, ready.consumed);
        let head = &mut ready.head;
        if self.is_health_probe(head, buf) {
            return Desk::Answered(Answer::Health);
        }
        let cors = self.cors_allowed(head, buf);
        if self.is_preflight(head, buf) {
            return Desk::Answered(Answer::Preflight(cors));
        }
        if !self.check_key(head, buf) {
            return Desk::Answered(Answer::Unauthorized(cors));
        }
        let (client, https) = self.proxy_headers(head, buf, from);
        Desk::Pass(Pass {
            cors,
            client,
            https,
        })
    }
}

impl Answer {
    /// Writes the answer to `head` (a request in `buf`) into `out`, which
    /// it empties first. The connection stays open for the next request
    /// when the client keeps it alive, unless the worker is `draining`.
    pub(super) fn write(
        self,
        head: &RequestHead,
        buf: &[u8],
        draining: bool,
        out: &mut Vec<u8>,
    ) -> Written {
        let keep_alive = head.keep_alive && !draining;
        let (status, body_bytes) = match self {
            Answer::Health => health::write(head, draining, keep_alive, out),
            Answer::Preflight(allowed) => {
                cors::write_preflight(allowed, head, buf, keep_alive, out)
            }
            Answer::Unauthorized(cors) => {
                auth::write_unauthorized(cors, head, buf, keep_alive, out)
            }
        };
        Written {
            status,
            body_bytes,
            keep_alive,
        }
    }
}

/// An answer given before any plugin, into `out` (emptied first): the
/// body only for a method other than HEAD.
pub(super) fn write_own_answer(
    out: &mut Vec<u8>,
    head: &RequestHead,
    status: u16,
    headers: &[(&[u8], &[u8])],
    body: &[u8],
    keep_alive: bool,
) {
    out.clear();
    response::write_head(
        out,
        head.http_minor,
        status,
        None,
        BodyLength::Sized(body.len() as u64),
        keep_alive,
        headers.iter().copied(),
    );
    if !head.is_head_method {
        out.extend_from_slice(body);
    }
}

/// Request bytes received, counted as each request reaches the desk.
fn count_received(metrics: &Option<WorkerMetrics>, bytes: usize) {
    if let Some(m) = metrics {
        m.block()
            .bytes_in
            .fetch_add(bytes as u64, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests;
