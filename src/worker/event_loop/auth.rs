//! API keys (`auth.rs`): a request without `Authorization: Bearer <key>`
//! is answered 401 by the loop, before any plugin sees it. The health path
//! (answered before this check) and the metrics listener stay open, as do
//! the paths given with `--api-key-open-path`.

use super::EventLoop;
use super::answer::write_own_answer;
use crate::http::Span;
use crate::http::cors::Allow;
use crate::worker::connection::Ready;

const BODY: &[u8] = br#"{"error":{"message":"a valid API key is required: send Authorization: Bearer <key>","type":"authentication_error","code":"invalid_api_key"}}"#;

impl EventLoop {
    /// Whether `ready` may go on to the plugin.
    pub(super) fn is_authorized(&self, key: usize, ready: &Ready) -> bool {
        let Some(keys) = &self.api_keys else {
            return true;
        };
        let Some(conn) = self.conns.get(key) else {
            return false;
        };
        let buf = &conn.rbuf;
        if keys.is_open(ready.head.path.get(buf)) {
            return true;
        }
        let authorization = ready.head.field(buf, b"authorization");
        keys.authorizes(authorization.map(|v| v.get(buf)))
    }

    /// Once the core has checked a request's key, the plugin does not see
    /// it: an app that logs or echoes its headers cannot leak the key. On
    /// an open path (`--api-key-open-path`, the health path) nothing was
    /// checked, and an app's own Authorization reaches it unchanged.
    pub(super) fn hide_checked_key(&self, key: usize, ready: &mut Ready) {
        let (Some(keys), Some(conn)) = (&self.api_keys, self.conns.get(key)) else {
            return;
        };
        let buf = &conn.rbuf;
        if keys.is_open(ready.head.path.get(buf)) {
            return;
        }
        ready
            .head
            .headers
            .retain(|(n, _)| !n.get(buf).eq_ignore_ascii_case(b"authorization"));
    }

    /// 401 with `WWW-Authenticate: Bearer` and a JSON body; the connection
    /// stays open for a request with a key. True when it is ready for its
    /// next request now.
    pub(super) fn answer_unauthorized(
        &mut self,
        key: usize,
        ready: Ready,
        cors: Option<(Allow, Span)>,
    ) -> bool {
        let draining = self.drain_deadline.is_some();
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let head = &ready.head;
        let keep_alive = head.keep_alive && !draining;
        // A page of an allowed origin may read why it was refused.
        let origin = cors.map(|(allow, span)| allow.value(span, &conn.rbuf).to_vec());
        let mut headers: Vec<(&[u8], &[u8])> = vec![
            (b"Content-Type", b"application/json"),
            (b"WWW-Authenticate", b"Bearer"),
        ];
        if let Some(origin) = &origin {
            headers.push((b"Access-Control-Allow-Origin", origin));
            headers.push((b"Vary", b"Origin"));
        }
        write_own_answer(conn, head, 401, &headers, BODY, keep_alive);
        self.finish_own_answer(key, ready, 401, BODY.len(), keep_alive)
    }
}
