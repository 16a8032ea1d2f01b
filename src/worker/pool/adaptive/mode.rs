//! Loop calls as a mode the controller measures against the pool, on a
//! worker with CPUs to spare (see `loop_calls::decide`).
//!
//! With loop calls on, the thread leading the event loop calls the plugin
//! itself while no handler thread is busy: no hop between threads, but one
//! thread computes. With them suspended, every call goes to the pool, whose
//! threads run beside the loop on the worker's other CPUs. Which serves
//! more depends on the app: a GIL-holding hello gains nothing from a second
//! thread and pays the hop on every request (on 2 CPUs the pool served
//! half of what loop calls did), while a view that computes without the
//! GIL gains a CPU per thread. Only measuring tells, so while several calls
//! are in flight the controller runs a window in the other mode and keeps
//! it only when it served more in that window and the next (one window
//! wins by noise alone now and then): the pool must beat loop calls by `GAIN`,
//! loop calls need only come within `KEEP` of the pool (a tie goes to loop
//! calls: fewer threads, fewer switches, the latency of one thread). Losing
//! probes back off as the pool's do, to one per `COOLDOWN_MAX`, so a
//! settled worker spends well under 1% of its time in the other mode. One
//! call at a time leaves the pool nothing to run beside it, so then loop
//! calls resume without a probe.

use std::time::{Duration, Instant};

use super::{COOLDOWN_MAX, COOLDOWN_MIN, Tunable};

/// The pool alone is kept only when it serves this much more.
const GAIN: f64 = 1.04;
/// Loop calls are kept when they serve at least this share of the pool's.
const KEEP: f64 = 0.97;
/// Completions a window needs before a mode is judged on it.
const MIN_SAMPLE: u64 = 40;

/// What one measurement window saw, every call counted (loop calls too).
pub struct Window {
    /// Completions per second.
    pub rate: f64,
    pub completions: u64,
    /// The most calls in flight at once at a tick in the window.
    pub peak_in_flight: usize,
    /// Share of the completions that were loop calls.
    pub loop_share: f64,
}

struct Probe {
    /// The rate of the window before it, in the mode to go back to.
    baseline: f64,
    /// It won one window already: one more to confirm.
    won_once: bool,
}

pub struct Mode {
    /// False where the worker makes no loop calls, or makes them without
    /// measuring (one usable CPU of its own): then nothing here acts.
    measured: bool,
    suspended: bool,
    /// A window in the other mode is running.
    probe: Option<Probe>,
    cooldown: Duration,
    next_probe: Instant,
    pub(super) changes: u32,
    /// Why the worker is in its mode, for the closing line.
    why: String,
}

impl Mode {
    pub fn new(measured: bool, now: Instant) -> Mode {
        Mode {
            measured,
            suspended: false,
            probe: None,
            cooldown: COOLDOWN_MIN,
            next_probe: now + COOLDOWN_MIN,
            changes: 0,
            why: "as started".into(),
        }
    }

    pub fn measured(&self) -> bool {
        self.measured
    }

    /// Whether loop calls are suspended now (a probe of the pool included).
    pub fn suspended(&self) -> bool {
        self.suspended
    }

    /// Judge a window that just ended. True when this window belonged to
    /// the mode (a probe started, ended, or the mode changed): the pool's
    /// own rules then wait for the next one. `pool_probing`: a trial of
    /// another pool size is running, and a mode probe would confound it.
    /// `min_threads`: the pool a probe of it starts with at least.
    pub fn window(
        &mut self,
        w: &Window,
        pool: &mut impl Tunable,
        pool_probing: bool,
        min_threads: usize,
        now: Instant,
    ) -> bool {
        if !self.measured {
            return false;
        }
        if let Some(probe) = self.probe.take() {
            self.verdict(probe, w, pool, now);
            return true;
        }
        if self.suspended && w.completions > 0 && w.peak_in_flight <= 1 {
            self.change(
                pool,
                false,
                now,
                "one call at a time: the pool has nothing to run beside it".into(),
            );
            return true;
        }
        if pool_probing || now < self.next_probe || w.completions < MIN_SAMPLE {
            return false;
        }
        // Loop calls on, but the window was no measure of them: one call at
        // a time, or calls in the pool after a hand-off (a call that
        // blocked or computed for long) and a pool that never ran dry
        // since; loop calls are started again for the next window.
        if !self.suspended && w.loop_share < 0.5 {
            pool.suspend_loop_calls(false, now);
            return false;
        }
        if !self.suspended && w.peak_in_flight < 2 {
            return false;
        }
        self.probe = Some(Probe {
            baseline: w.rate,
            won_once: false,
        });
        let trying_pool = !self.suspended;
        if trying_pool {
            let (_, target) = pool.size();
            if target < min_threads {
                pool.resize(min_threads);
            }
        }
        self.set(pool, trying_pool, now);
        crate::log::debug(format_args!(
            "call path: trying {} for a window ({:.0}/s now)",
            if trying_pool {
                "the pool without loop calls"
            } else {
                "loop calls again"
            },
            w.rate
        ));
        true
    }

    fn verdict(&mut self, probe: Probe, w: &Window, pool: &mut impl Tunable, now: Instant) {
        let baseline = probe.baseline;
        let tried_pool = self.suspended;
        let enough = w.completions >= MIN_SAMPLE;
        let won = enough
            && if tried_pool {
                w.rate > baseline * GAIN
            } else {
                w.rate >= baseline * KEEP
            };
        let (tried, other) = if tried_pool {
            ("the pool alone", "loop calls")
        } else {
            ("loop calls", "the pool alone")
        };
        let rates = format!("{:.0}/s vs {baseline:.0}/s with {other}", w.rate);
        if won && !probe.won_once {
            self.probe = Some(Probe {
                baseline,
                won_once: true,
            });
            return;
        }
        if won {
            self.cooldown = COOLDOWN_MIN;
            self.changes += 1;
            self.why = format!("{tried} served {rates}");
            crate::log::info(format_args!(
                "call path: loop calls {} ({})",
                if tried_pool { "suspended" } else { "resumed" },
                self.why
            ));
        } else {
            self.set(pool, !tried_pool, now);
            crate::log::debug(format_args!(
                "call path: back to {other} ({tried} served {rates}{})",
                if enough { "" } else { ", too few to judge" }
            ));
            if enough {
                self.cooldown = (self.cooldown * 2).min(COOLDOWN_MAX);
            }
        }
        self.next_probe = now + self.cooldown;
    }

    fn change(&mut self, pool: &mut impl Tunable, suspended: bool, now: Instant, why: String) {
        self.set(pool, suspended, now);
        self.changes += 1;
        crate::log::info(format_args!(
            "call path: loop calls {} ({why})",
            if suspended { "suspended" } else { "resumed" }
        ));
        self.why = why;
    }

    fn set(&mut self, pool: &mut impl Tunable, suspended: bool, now: Instant) {
        self.suspended = suspended;
        pool.suspend_loop_calls(suspended, now);
    }

    /// For the closing line: the mode the worker settled in (not the one a
    /// probe was trying at the end) and why.
    pub fn summary(&self) -> String {
        let settled_suspended = self.suspended != self.probe.is_some();
        format!(
            "call path: loop calls {} ({}), {} change(s)",
            if settled_suspended { "suspended" } else { "on" },
            self.why,
            self.changes
        )
    }
}
