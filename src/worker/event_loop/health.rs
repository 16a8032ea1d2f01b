//! `--health-path`: the core answers a load balancer's or Kubernetes'
//! probe itself, before any plugin: 200 while the worker serves, 503 once
//! it drains, so the balancer stops sending before connections close.
//!
//! The answer is written by the loop like an inline response: what the
//! socket does not take is flushed when it is writable, and the
//! connection stays open for its next request unless it is draining.

use super::EventLoop;
use super::answer::write_own_answer;
use crate::worker::connection::Ready;

impl EventLoop {
    /// Whether `ready` asks for the health path (exact match of the path,
    /// any query).
    pub(super) fn is_health_probe(&self, key: usize, ready: &Ready) -> bool {
        let (Some(path), Some(conn)) = (&self.health_path, self.conns.get(key)) else {
            return false;
        };
        ready.head.path.get(&conn.rbuf) == path.as_bytes()
    }

    /// Answers the probe. True when the connection is ready for its next
    /// request now.
    pub(super) fn answer_health(&mut self, key: usize, ready: Ready) -> bool {
        let draining = self.drain_deadline.is_some();
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let head = &ready.head;
        let (status, text): (u16, &[u8]) = if draining {
            (503, b"draining\n")
        } else if !crate::plugin::host::READY.load(std::sync::atomic::Ordering::Relaxed) {
            (503, b"not ready\n")
        } else {
            (200, b"ok\n")
        };
        let keep_alive = head.keep_alive && !draining;
        write_own_answer(
            conn,
            head,
            status,
            &[
                (b"Content-Type", b"text/plain; charset=utf-8"),
                (b"Cache-Control", b"no-store"),
            ],
            text,
            keep_alive,
        );
        self.finish_own_answer(key, ready, status, text.len(), keep_alive)
    }
}
