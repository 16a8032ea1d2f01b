//! `--cors-allow-origin` on the loop (`http/cors.rs`): a preflight is
//! answered here, before the API key check (a browser sends no key with
//! it), and a request from an allowed origin carries the origin to its
//! response, whoever writes it.

use super::EventLoop;
use crate::http::Span;
use crate::http::cors::{self, Allow};
use crate::http::response::{self, BodyLength};
use crate::worker::connection::Ready;

impl EventLoop {
    /// The request's `Origin`, when the configured origins allow it.
    pub(super) fn cors_allowed(&self, key: usize, ready: &Ready) -> Option<(Allow, Span)> {
        if !self.cors.is_on() {
            return None;
        }
        let buf = &self.conns.get(key)?.rbuf;
        let origin = ready.head.field(buf, b"origin")?;
        Some((self.cors.allow(origin.get(buf))?, origin))
    }

    /// `OPTIONS` with `Origin` and `Access-Control-Request-Method`.
    pub(super) fn is_preflight(&self, key: usize, ready: &Ready) -> bool {
        let Some(conn) = self.conns.get(key).filter(|_| self.cors.is_on()) else {
            return false;
        };
        let buf = &conn.rbuf;
        ready.head.method.get(buf) == b"OPTIONS"
            && ready.head.field(buf, b"origin").is_some()
            && ready
                .head
                .field(buf, b"access-control-request-method")
                .is_some()
    }

    /// 204 with what the browser asked for, for an allowed origin; 403
    /// without any CORS header for another. True when the connection is
    /// ready for its next request now.
    pub(super) fn answer_preflight(&mut self, key: usize, ready: Ready) -> bool {
        let allowed = self.cors_allowed(key, &ready);
        let draining = self.drain_deadline.is_some();
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let buf = &conn.rbuf;
        let head = &ready.head;
        let keep_alive = head.keep_alive && !draining;
        let mut headers: Vec<(&[u8], &[u8])> = Vec::with_capacity(6);
        let status = match allowed {
            Some((allow, origin)) => {
                headers.push((b"Access-Control-Allow-Origin", allow.value(origin, buf)));
                if let Some(m) = ready
                    .head
                    .field(buf, b"access-control-request-method")
                    .map(|m| m.get(buf).trim_ascii())
                    .filter(|m| !m.is_empty() && m.iter().all(|&b| response::is_tchar(b)))
                {
                    headers.push((b"Access-Control-Allow-Methods", m));
                }
                if let Some(h) = ready
                    .head
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
        let mut out = std::mem::take(&mut conn.out);
        out.clear();
        let length = if status == 204 {
            BodyLength::NoBody
        } else {
            BodyLength::Sized(text.len() as u64)
        };
        response::write_head(
            &mut out,
            head.http_minor,
            status,
            None,
            length,
            keep_alive,
            headers.into_iter(),
        );
        out.extend_from_slice(text);
        conn.out = out;
        conn.out_pos = 0;
        self.finish_own_answer(key, ready, status, text.len(), keep_alive)
    }
}
