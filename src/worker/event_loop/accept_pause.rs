//! When `accept` fails (the worker is out of descriptors: EMFILE; the
//! system is: ENFILE; or out of memory), the connection stays in the
//! kernel's backlog, and the listener, which the loop hears edge-triggered,
//! does not fire again for it. Retrying at once would spin; waiting for the
//! next connection would leave the backlog unserved. So the loop retries
//! on a short timer, and at once when one of its connections closes (a
//! descriptor came free), and says so at most once per interval.

use std::io;
use std::time::{Duration, Instant};

/// How soon a failed accept is tried again.
const RETRY: Duration = Duration::from_millis(100);
/// At most one log line per this long while accepts fail.
const REPORT_EVERY: Duration = Duration::from_secs(10);

#[derive(Default)]
pub struct AcceptPause {
    retry_at: Option<Instant>,
    /// Failures since the last line that reported them.
    unreported: u64,
    last_report: Option<Instant>,
}

impl AcceptPause {
    pub fn failed(&mut self, e: &io::Error, now: Instant) {
        self.retry_at = Some(now + RETRY);
        self.unreported += 1;
        if self
            .last_report
            .is_some_and(|at| now.duration_since(at) < REPORT_EVERY)
        {
            return;
        }
        let fix = if e.raw_os_error() == Some(libc::EMFILE) {
            "raise the worker's descriptor limit (ulimit -n; LimitNOFILE= in a systemd unit) or lower the connections it holds (--idle-timeout)"
        } else {
            "the machine is short of descriptors or memory; free some"
        };
        crate::log::warn(format_args!(
            "accept failed: {e} ({} time(s) since the last report); new connections wait in the backlog and are retried every {} ms; {fix}",
            self.unreported,
            RETRY.as_millis()
        ));
        self.unreported = 0;
        self.last_report = Some(now);
    }

    /// An accept succeeded.
    pub fn resumed(&mut self) {
        if self.retry_at.take().is_some() && self.last_report.is_some() {
            crate::log::info(format_args!("accepting connections again"));
        }
    }

    /// A connection closed: its descriptor may be the one a retry needs.
    pub fn descriptor_freed(&mut self, now: Instant) {
        if self.retry_at.is_some() {
            self.retry_at = Some(now);
        }
    }

    pub fn due(&self, now: Instant) -> bool {
        self.retry_at.is_some_and(|at| now >= at)
    }

    /// How long the loop may wait before the next retry.
    pub fn wake_in(&self, now: Instant) -> Option<Duration> {
        self.retry_at.map(|at| at.saturating_duration_since(now))
    }
}
