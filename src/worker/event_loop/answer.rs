//! What the loop answers itself (the front desk's answers, a scrape):
//! writing the answer into the connection and sending it; and what every
//! response leaves behind, its access-log line and its count in the
//! metrics.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use super::EventLoop;
use super::front_desk::Answer;
use crate::worker::access_log::{AccessLog, Entry};
use crate::worker::connection::Ready;
use crate::worker::metrics::WorkerMetrics;

impl EventLoop {
    /// Sends the answer the loop wrote into the connection's `out` itself
    /// (the front desk's answers, a scrape): at once, or as the socket
    /// drains. True when the connection is ready for its next request now.
    pub(super) fn send_own_answer(&mut self, key: usize, keep_alive: bool) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        match crate::plugin::exchange::flush_spilled(
            conn.stream.as_raw_fd(),
            &conn.out,
            &mut conn.out_pos,
        ) {
            Ok(true) => {
                conn.out.clear();
                conn.out_pos = 0;
                self.after_response(key, keep_alive)
            }
            Ok(false) => {
                let deadline = self.timeouts.idle.map(|t| self.now + t);
                self.flush_when_writable(key, keep_alive, deadline);
                false
            }
            Err(_) => {
                self.close(key);
                false
            }
        }
    }
}

impl EventLoop {
    /// Writes what the front desk answered to `ready` into the connection
    /// and sends it. True when the connection is ready for its next request
    /// now.
    pub(super) fn answer_from_desk(&mut self, key: usize, ready: Ready, answer: Answer) -> bool {
        let draining = self.drain_deadline.is_some();
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let written = answer.write(&ready.head, &conn.rbuf, draining, &mut conn.out);
        conn.out_pos = 0;
        self.finish_own_answer(
            key,
            ready,
            written.status,
            written.body_bytes,
            written.keep_alive,
        )
    }

    /// After the loop wrote its own answer to `ready` into the connection's
    /// `out`: the access-log line and the count, the request's bytes
    /// consumed, and the answer sent. True when the connection is ready for
    /// its next request now.
    pub(super) fn finish_own_answer(
        &mut self,
        key: usize,
        ready: Ready,
        status: u16,
        body_bytes: usize,
        keep_alive: bool,
    ) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let head = &ready.head;
        note(
            &mut self.access_log,
            &self.metrics,
            &Entry {
                client: &conn.peer.ip,
                method: head.method.get(&conn.rbuf),
                target: head.target.get(&conn.rbuf),
                http_minor: head.http_minor,
                status,
                body_bytes: if head.is_head_method {
                    0
                } else {
                    body_bytes as u64
                },
                duration: Duration::ZERO,
                batch: 0,
                model: crate::plugin::models::NO_MODEL,
                referer: b"",
                user_agent: b"",
            },
            self.now,
        );
        conn.rbuf.drain(..ready.consumed);
        self.head_scratch_return(ready.head);
        self.send_own_answer(key, keep_alive)
    }
}

/// A response's line in the access log and its count in the metrics.
pub(super) fn note(
    log: &mut Option<AccessLog>,
    metrics: &Option<WorkerMetrics>,
    entry: &Entry<'_>,
    now: Instant,
) {
    if let Some(m) = metrics {
        m.block()
            .count_response(entry.model, entry.status, entry.duration, entry.body_bytes);
    }
    if let Some(log) = log {
        log.record(entry, now);
    }
}
