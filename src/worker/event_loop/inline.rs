//! The event loop's side of inline calls (`M0_CAP_INLINE`): what it keeps
//! for calling the plugin itself, the response the socket did not take
//! (spilled, then flushed on WRITABLE), and polling through short idle gaps
//! while the loop is the only thread at work.

use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use mio::{Interest, Token};

use super::EventLoop;
use crate::plugin::call::{CallBuffers, Job};
use crate::plugin::exchange::{self, Outcome};
use crate::worker::connection::Phase;
use crate::worker::pool::schedstat::{Clock, ThreadClock};

/// What the loop keeps for calling the plugin itself.
pub(super) struct InlineCalls {
    pub(super) bufs: CallBuffers,
    /// Spilled bytes of the current call; moved into the connection when
    /// the socket did not take them all.
    pub(super) spilled: Vec<u8>,
}

impl EventLoop {
    /// Call the plugin on this thread from now on (see `M0_CAP_INLINE`).
    /// Fails with the code of the plugin's thread-start hook.
    pub fn enable_inline(&mut self) -> Result<(), i32> {
        let thread_index = self.pool.adopt_loop_thread()?;
        self.inline = Some(InlineCalls {
            bufs: CallBuffers::new(thread_index),
            spilled: Vec::new(),
        });
        Ok(())
    }

    /// Whether the loop's thread calls the plugin itself (inline calls, or
    /// loop calls).
    pub(super) fn calls_on_loop(&self) -> bool {
        self.inline.is_some() || self.loop_calls.is_some()
    }

    /// Poll without blocking for a moment after the last event, when the
    /// loop answers requests itself and no handler thread is working: a
    /// keep-alive client's next request usually comes within tens of
    /// microseconds, and blocking in between costs more than that where an
    /// idle CPU halts (in a VM each halt is an exit to the hypervisor and
    /// each wake an IPI through it: the hello bench measured 0.07 context
    /// switches per request against nginx's 0.03, and 0.80x its req/s at 8
    /// connections). Never while jobs are in flight, whose threads may need
    /// this CPU, nor while the loop's thread has to wait for its CPU (see
    /// `SpinGate`). `--idle-spin-us 0` turns it off.
    pub(super) fn spin_instead_of_blocking(&mut self) -> bool {
        if !self.calls_on_loop() || self.idle_spin.is_zero() {
            return false;
        }
        self.spin_gate.check(self.now);
        self.spin_gate.open
            && self.in_flight == 0
            && self.now.saturating_duration_since(self.last_event) < self.idle_spin
    }

    /// Call the plugin on this thread, when calls are inline: the job back
    /// when no inline call answered it (calls are not inline, or the
    /// plugin deferred it), or whether the connection is ready for its next
    /// request now.
    pub(super) fn try_inline(&mut self, key: usize, job: Job) -> Result<Job, bool> {
        let Some(inline) = &mut self.inline else {
            return Ok(job);
        };
        inline.spilled.clear();
        let outcome = self
            .pool
            .call_inline(&job, &mut inline.bufs, &mut inline.spilled);
        if outcome.deferred {
            return Ok(job);
        }
        Err(self.answered_inline(key, job, outcome))
    }

    /// An inline call answered. True when the connection is ready for its
    /// next request now; otherwise it flushes first, or closes.
    pub(super) fn answered_inline(&mut self, key: usize, job: Job, outcome: Outcome) -> bool {
        self.release_cost(&job);
        let Some(inline) = &mut self.inline else {
            return false;
        };
        let mut spilled = std::mem::take(&mut inline.spilled);
        let ready = self.answered_on_loop(key, job, outcome, &mut spilled);
        if let Some(inline) = &mut self.inline {
            inline.spilled = spilled;
        }
        ready
    }

    /// A request answered on this thread (an inline call, or a refusal by
    /// the plugin's `admit`), with the bytes the socket did not take in
    /// `spilled` (left empty, for reuse). True when the connection is
    /// ready for its next request now.
    pub(super) fn answered_on_loop(
        &mut self,
        key: usize,
        job: Job,
        outcome: Outcome,
        spilled: &mut Vec<u8>,
    ) -> bool {
        self.log_access(&job, &outcome);
        self.recycle(job.buf, job.head);
        let Some(conn) = self.conns.get_mut(key) else {
            spilled.clear();
            return false;
        };
        if spilled.is_empty() {
            return self.after_response(key, outcome.keep_alive);
        }
        // The socket is full: keep the rest and go on when it drains.
        std::mem::swap(&mut conn.out, spilled);
        spilled.clear();
        conn.out_pos = 0;
        let deadline = self.timeouts.idle.map(|t| self.now + t);
        self.flush_when_writable(key, outcome.keep_alive, deadline);
        false
    }

    /// The connection's `out` holds bytes the socket did not take: send
    /// them as it drains (by `deadline`), then go on as `keep_alive` says.
    pub(super) fn flush_when_writable(
        &mut self,
        key: usize,
        keep_alive: bool,
        deadline: Option<Instant>,
    ) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.phase = Phase::Flushing { keep_alive };
        self.sweep.set(key, deadline);
        let registered = self.poll.registry().reregister(
            &mut conn.stream,
            Token(key),
            Interest::READABLE | Interest::WRITABLE,
        );
        if registered.is_err() {
            self.close(key);
        }
    }

    /// Send more of a connection's spilled response.
    pub(super) fn flush(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        let Phase::Flushing { keep_alive } = conn.phase else {
            return;
        };
        let fd = conn.stream.as_raw_fd();
        match exchange::flush_spilled(fd, &conn.out, &mut conn.out_pos) {
            Ok(false) => {}
            Ok(true) => {
                self.out_gone(key);
                if self.after_response(key, keep_alive) {
                    self.drive(key);
                }
            }
            Err(_) => self.close(key),
        }
    }
}

/// The idle spin is for a CPU that would otherwise go idle. Where others
/// want it (two workers on a box whose other CPU runs the client: the
/// loop's thread waited for its CPU 42-47% of the time, against 2.4% for
/// one worker on a CPU of its own) a spin takes their time, and the wsgi
/// bench's p99 doubled. So every `CHECK_EVERY` the loop reads its thread's
/// schedstat, and spins only while it waited less than `max_wait_pct` of
/// the time (`--idle-spin-max-wait`, default a tenth).
pub(super) struct SpinGate {
    clock: ThreadClock,
    last: Option<(i32, Clock, Instant)>,
    max_wait_pct: u32,
    pub(super) open: bool,
}

const CHECK_EVERY: Duration = Duration::from_millis(100);

impl SpinGate {
    pub(super) fn new(max_wait_pct: u32) -> SpinGate {
        SpinGate {
            clock: ThreadClock::default(),
            last: None,
            max_wait_pct,
            // Without schedstat the spin stays on, as before.
            open: true,
        }
    }

    fn check(&mut self, now: Instant) {
        if self.max_wait_pct >= 100
            || self
                .last
                .is_some_and(|(_, _, at)| now.saturating_duration_since(at) < CHECK_EVERY)
        {
            return;
        }
        // The loop may have moved to another thread (loop calls).
        let tid = nix::unistd::gettid().as_raw();
        let Some(clock) = self.clock.read(tid) else {
            return;
        };
        if let Some((last_tid, last, at)) = self.last
            && last_tid == tid
        {
            let elapsed = now.saturating_duration_since(at).as_nanos() as u64;
            let waited = clock.waited.saturating_sub(last.waited);
            self.open = !shares_its_cpu(waited, elapsed, self.max_wait_pct);
        }
        self.last = Some((tid, clock, now));
    }
}

/// Whether a thread that waited `waited` ns for its CPU over `elapsed` ns
/// shares that CPU with others who want it: it waited `max_wait_pct`
/// percent of the time or more.
fn shares_its_cpu(waited: u64, elapsed: u64, max_wait_pct: u32) -> bool {
    waited.saturating_mul(100) >= elapsed.saturating_mul(u64::from(max_wait_pct))
}

#[cfg(test)]
mod tests {
    use super::shares_its_cpu;

    #[test]
    fn a_loop_that_waits_a_tenth_of_the_time_for_its_cpu_stops_spinning() {
        let ms = 1_000_000;
        // One worker pinned to a CPU of its own under load: 2.4 ms per 100.
        assert!(!shares_its_cpu(2_400_000, 100 * ms, 10));
        // Two workers beside the client on two CPUs: 42-47 ms per 100.
        assert!(shares_its_cpu(45 * ms, 100 * ms, 10));
        assert!(shares_its_cpu(10 * ms, 100 * ms, 10));
        assert!(!shares_its_cpu(9 * ms, 100 * ms, 10));
        // A higher bar (--idle-spin-max-wait 50) keeps spinning at 45%.
        assert!(!shares_its_cpu(45 * ms, 100 * ms, 50));
    }

    #[test]
    fn at_100_percent_the_gate_never_closes() {
        let mut gate = super::SpinGate::new(100);
        let start = std::time::Instant::now();
        gate.check(start);
        gate.check(start + std::time::Duration::from_secs(1));
        assert!(gate.open && gate.last.is_none());
    }
}
