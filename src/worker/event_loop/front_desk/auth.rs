//! API keys (`auth.rs`): a request without `Authorization: Bearer <key>`
//! is answered 401 at the desk, before any plugin sees it. The health path
//! (answered before this check) and the metrics listener stay open, as do
//! the paths given with `--api-key-open-path`.

use super::{FrontDesk, write_own_answer};
use crate::http::Span;
use crate::http::cors::Allow;
use crate::http::head::RequestHead;

const BODY: &[u8] = br#"{"error":{"message":"a valid API key is required: send Authorization: Bearer <key>","type":"authentication_error","code":"invalid_api_key"}}"#;

impl FrontDesk {
    /// Whether the request (`head`, in `buf`) may go on to the plugin: no
    /// keys are set, its path is open, or it sends a valid key. Once the
    /// core has checked a key, the plugin does not see it (it leaves
    /// `head`): an app that logs or echoes its headers cannot leak the key.
    /// On an open path (`--api-key-open-path`, the health path) nothing was
    /// checked, and an app's own Authorization reaches it unchanged.
    pub(super) fn check_key(&self, head: &mut RequestHead, buf: &[u8]) -> bool {
        let Some(keys) = &self.api_keys else {
            return true;
        };
        if keys.is_open(head.path.get(buf)) {
            return true;
        }
        let authorization = head.field(buf, b"authorization");
        if !keys.authorizes(authorization.map(|v| v.get(buf))) {
            return false;
        }
        head.headers
            .retain(|(n, _)| !n.get(buf).eq_ignore_ascii_case(b"authorization"));
        true
    }
}

/// 401 with `WWW-Authenticate: Bearer` and a JSON body; the connection
/// stays open for a request with a key. Into `out`: its status and body
/// length.
pub(super) fn write_unauthorized(
    cors: Option<(Allow, Span)>,
    head: &RequestHead,
    buf: &[u8],
    keep_alive: bool,
    out: &mut Vec<u8>,
) -> (u16, usize) {
    let mut headers: Vec<(&[u8], &[u8])> = vec![
        (b"Content-Type", b"application/json"),
        (b"WWW-Authenticate", b"Bearer"),
    ];
    // A page of an allowed origin may read why it was refused.
    if let Some((allow, origin)) = cors {
        headers.push((b"Access-Control-Allow-Origin", allow.value(origin, buf)));
        headers.push((b"Vary", b"Origin"));
    }
    write_own_answer(out, head, 401, &headers, BODY, keep_alive);
    (401, BODY.len())
}
