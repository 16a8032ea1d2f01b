//! `--cors-allow-origin` at the desk (`http/cors.rs`): a preflight is
//! answered here, before the API key check (a browser sends no key with
//! it), and a request from an allowed origin carries the origin to its
//! response, whoever writes it.

use super::FrontDesk;
use crate::http::Span;
use crate::http::cors::{self, Allow};
use crate::http::head::RequestHead;
use crate::http::response::{self, BodyLength};

impl FrontDesk {
    /// The request's `Origin` (a span of `buf`), when the configured
    /// origins allow it.
    pub(super) fn cors_allowed(&self, head: &RequestHead, buf: &[u8]) -> Option<(Allow, Span)> {
        if !self.cors.is_on() {
            return None;
        }
        let origin = head.field(buf, b"origin")?;
        Some((self.cors.allow(origin.get(buf))?, origin))
    }

    /// `OPTIONS` with `Origin` and `Access-Control-Request-Method`.
    pub(super) fn is_preflight(&self, head: &RequestHead, buf: &[u8]) -> bool {
        self.cors.is_on()
            && head.method.get(buf) == b"OPTIONS"
            && head.field(buf, b"origin").is_some()
            && head.field(buf, b"access-control-request-method").is_some()
    }
}

/// 204 with what the browser asked for, for an allowed origin; 403
/// without any CORS header for another. Into `out`: its status and body
/// length.
pub(super) fn write_preflight(
    allowed: Option<(Allow, Span)>,
    head: &RequestHead,
    buf: &[u8],
    keep_alive: bool,
    out: &mut Vec<u8>,
) -> (u16, usize) {
    let mut headers: Vec<(&[u8], &[u8])> = Vec::with_capacity(6);
    let status = match allowed {
        Some((allow, origin)) => {
            headers.push((b"Access-Control-Allow-Origin", allow.value(origin, buf)));
            if let Some(m) = head
                .field(buf, b"access-control-request-method")
                .map(|m| m.get(buf).trim_ascii())
                .filter(|m| !m.is_empty() && m.iter().all(|&b| response::is_tchar(b)))
            {
                headers.push((b"Access-Control-Allow-Methods", m));
            }
            if let Some(h) = head
                .field(buf, b"access-control-request-headers")
                .map(|h| h.get(buf))
                .filter(|h| cors::is_header_list(h))
            {
                headers.push((b"Access-Control-Allow-Headers", h));
            }
            headers.push((b"Access-Control-Max-Age", cors::MAX_AGE));
            204
        }
        None => 403,
    };
    headers.push((b"Vary", b"Origin"));
    let text: &[u8] = if status == 403 {
        b"origin not allowed (--cors-allow-origin)\n"
    } else {
        b""
    };
    out.clear();
    let length = if status == 204 {
        BodyLength::NoBody
    } else {
        BodyLength::Sized(text.len() as u64)
    };
    response::write_head(
        out,
        head.http_minor,
        status,
        None,
        length,
        keep_alive,
        headers.into_iter(),
    );
    out.extend_from_slice(text);
    (status, text.len())
}
