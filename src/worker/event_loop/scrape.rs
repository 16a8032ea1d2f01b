//! `--metrics`: the loop's side. Every worker accepts on the metrics
//! listener; a connection from it is answered by the loop itself (no
//! plugin: the front desk leaves its requests here) with the whole
//! server's exposition, rendered from the metrics page. The loop also counts each response into its block and publishes
//! the pool's statistics there every `PUBLISH_EVERY`.

use std::io;
use std::os::fd::{FromRawFd, RawFd};
use std::time::Instant;

use mio::Interest;
use mio::net::TcpListener;

use super::front_desk::write_own_answer;
use super::{ACCEPT_BATCH, EventLoop, METRICS};
use crate::worker::connection::Ready;
use crate::worker::metrics::{LoopCounts, WorkerMetrics};

impl EventLoop {
    /// Count into `metrics` and serve its listener (`listener_fd`, this
    /// worker's own descriptor from now on).
    pub fn enable_metrics(&mut self, metrics: WorkerMetrics, listener_fd: RawFd) -> io::Result<()> {
        // SAFETY: the supervisor handed this process the metrics listener's
        // descriptor (inherited across fork, or adopted by number after
        // exec); this worker owns it from here.
        let std_listener = unsafe { std::net::TcpListener::from_raw_fd(listener_fd) };
        std_listener.set_nonblocking(true)?;
        let mut listener = TcpListener::from_std(std_listener);
        self.poll
            .registry()
            .register(&mut listener, METRICS, Interest::READABLE)?;
        self.metrics_listener = Some(listener);
        self.metrics = Some(metrics);
        Ok(())
    }

    pub(super) fn accept_scrapers(&mut self) {
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = self.metrics_listener.as_ref() else {
                return;
            };
            match listener.accept() {
                Ok((stream, addr)) => self.admit_as(stream, addr, None, true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(_) => return,
            }
        }
    }

    /// The drain lets the metrics listener go with the main one.
    pub(super) fn close_metrics_listener(&mut self) {
        if let Some(mut listener) = self.metrics_listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
    }

    /// Publish what the block does not count as it goes, when it is due.
    pub(super) fn publish_metrics(&mut self, now: Instant) {
        let Some(metrics) = &mut self.metrics else {
            return;
        };
        if !metrics.due(now) {
            return;
        }
        let (passed, received) = self.share_counts().map_or((0, 0), |(_, p, r)| (p, r));
        let Some(metrics) = &mut self.metrics else {
            return;
        };
        let counts = LoopCounts {
            open_connections: self.conns.len(),
            accepted: self.accepted,
            passed,
            received,
        };
        metrics.publish(&self.pool, &counts, now);
    }

    /// Answers a request on a metrics connection: the exposition on
    /// `GET /metrics`, 404 elsewhere. True when the connection is ready for
    /// its next request now.
    pub(super) fn answer_scrape(&mut self, key: usize, ready: Ready) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let head = &ready.head;
        let mut body = Vec::new();
        let status = match &self.metrics {
            Some(m) if head.path.get(&conn.rbuf) == b"/metrics" => {
                m.render(&mut body);
                200
            }
            _ => {
                body.extend_from_slice(b"this listener serves GET /metrics only\n");
                404
            }
        };
        let keep_alive = head.keep_alive && self.drain_deadline.is_none();
        conn.out_pos = 0;
        write_own_answer(
            &mut conn.out,
            head,
            status,
            &[(b"Content-Type", b"text/plain; version=0.0.4; charset=utf-8")],
            &body,
            keep_alive,
        );
        conn.rbuf.drain(..ready.consumed);
        self.head_scratch_return(ready.head);
        self.send_own_answer(key, keep_alive)
    }
}
