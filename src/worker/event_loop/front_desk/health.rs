//! `--health-path`: the core answers a load balancer's or Kubernetes'
//! probe itself, before any plugin: 200 while the worker serves, 503 once
//! it drains, so the balancer stops sending before connections close.
//! The connection stays open for its next request unless it is draining.

use super::{FrontDesk, write_own_answer};
use crate::http::head::RequestHead;

impl FrontDesk {
    /// Whether `head` (of a request in `buf`) asks for the health path
    /// (exact match of the path, any query).
    pub(super) fn is_health_probe(&self, head: &RequestHead, buf: &[u8]) -> bool {
        self.health_path
            .as_ref()
            .is_some_and(|path| head.path.get(buf) == path.as_bytes())
    }
}

/// The probe's answer, into `out`: its status and body length.
pub(super) fn write(
    head: &RequestHead,
    draining: bool,
    keep_alive: bool,
    out: &mut Vec<u8>,
) -> (u16, usize) {
    let (status, text): (u16, &[u8]) = if draining {
        (503, b"draining\n")
    } else if !crate::plugin::host::READY.load(std::sync::atomic::Ordering::Relaxed) {
        (503, b"not ready\n")
    } else {
        (200, b"ok\n")
    };
    write_own_answer(
        out,
        head,
        status,
        &[
            (b"Content-Type", b"text/plain; charset=utf-8"),
            (b"Cache-Control", b"no-store"),
        ],
        text,
        keep_alive,
    );
    (status, text.len())
}
