//! How many handler threads a worker starts with, and the bounds the
//! adaptive controller may move within.
//!
//! The plugin's declaration comes first. A plugin that holds a process-wide
//! lock for the whole call (a GIL) gains nothing from many threads and
//! loses to contention (eight threads were measured to cost 31% of the
//! throughput of one), so
//! it starts at 2: one in the call, one ready to take the lock the moment it
//! is free. A reentrant native plugin starts at the usable CPUs divided by
//! the threads each call computes with. `--blocking-threads` overrides both
//! and turns adaptation off.

use crate::plugin::descriptor::{Descriptor, ProcessLock};

/// Upper bound for the adaptive pool: enough for views that block on I/O.
pub const ADAPTIVE_MAX: usize = 64;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PoolPlan {
    pub initial: usize,
    pub min: usize,
    pub max: usize,
    pub adaptive: bool,
    /// CPUs this worker may use (affinity and cgroup quota).
    pub cpus: usize,
    /// Why this size, for the log and `--doctor`.
    pub reason: String,
}

pub fn plan(desc: &Descriptor, configured: Option<u32>, usable_cpus: usize) -> PoolPlan {
    let cap = desc.concurrency_cap() as usize;
    if let Some(n) = configured {
        let n = n as usize;
        let size = n.min(cap).max(1);
        let reason = if size < n {
            format!(
                "configured {n}, capped at {size} by the plugin's {} call model",
                desc.call_model_name()
            )
        } else {
            "configured with --blocking-threads".to_string()
        };
        return PoolPlan {
            initial: size,
            min: size,
            max: size,
            adaptive: false,
            cpus: usable_cpus,
            reason,
        };
    }
    if cap == 1 {
        return PoolPlan {
            initial: 1,
            min: 1,
            max: 1,
            adaptive: false,
            cpus: usable_cpus,
            reason: format!(
                "the plugin is {}: one call at a time",
                desc.call_model_name()
            ),
        };
    }
    let max = ADAPTIVE_MAX.min(cap);
    let (initial, why) = match desc.process_lock {
        ProcessLock::Held => (
            2,
            "the plugin holds a process-wide lock for each call".to_string(),
        ),
        ProcessLock::Released => (
            usable_cpus.max(2),
            format!("the plugin releases its lock; {usable_cpus} usable CPUs"),
        ),
        ProcessLock::None => {
            let per_call = desc.compute_threads.max(1) as usize;
            (
                (usable_cpus / per_call).max(1),
                format!("{usable_cpus} usable CPUs, {per_call} compute thread(s) per call"),
            )
        }
    };
    let initial = initial.min(max).max(1);
    PoolPlan {
        initial,
        min: 1,
        max,
        adaptive: true,
        cpus: usable_cpus,
        reason: format!("adaptive from {initial}: {why}"),
    }
}

/// Whether the event loop calls the plugin itself (`M0_CAP_INLINE`), and
/// why, for the log and `--doctor`.
pub fn inline_calls(desc: &Descriptor, no_inline: bool) -> (bool, &'static str) {
    match desc.inline_calls() {
        (true, _) if no_inline => (false, "turned off with --no-inline"),
        decision => decision,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::plugin::descriptor::CallModel;

    fn desc(call_model: CallModel, lock: ProcessLock, compute: u32) -> Descriptor {
        Descriptor {
            name: "t".into(),
            version: "1".into(),
            abi_major: 1,
            abi_minor: 0,
            call_model,
            max_concurrency: 0,
            process_lock: lock,
            needs_exec: false,
            compute_threads: compute,
            batch: false,
            max_batch: 0,
            max_batch_bytes: 0,
            reports_lock_wait: false,
            inline: false,
        }
    }

    #[test]
    fn lock_holders_start_small() {
        let p = plan(&desc(CallModel::Reentrant, ProcessLock::Held, 1), None, 8);
        assert_eq!(p.initial, 2);
        assert!(p.adaptive);
    }

    #[test]
    fn native_reentrant_starts_at_cpus_over_compute_threads() {
        assert_eq!(
            plan(&desc(CallModel::Reentrant, ProcessLock::None, 1), None, 8).initial,
            8
        );
        assert_eq!(
            plan(&desc(CallModel::Reentrant, ProcessLock::None, 4), None, 8).initial,
            2
        );
        assert_eq!(
            plan(&desc(CallModel::Reentrant, ProcessLock::None, 4), None, 2).initial,
            1
        );
    }

    #[test]
    fn serialized_and_pinned_get_one_thread_even_when_configured() {
        let p = plan(&desc(CallModel::Pinned, ProcessLock::None, 1), Some(8), 8);
        assert_eq!((p.initial, p.max, p.adaptive), (1, 1, false));
        let p = plan(&desc(CallModel::Serialized, ProcessLock::None, 1), None, 8);
        assert_eq!(p.initial, 1);
    }

    #[test]
    fn configured_fixes_the_size() {
        let p = plan(
            &desc(CallModel::Reentrant, ProcessLock::Held, 1),
            Some(8),
            2,
        );
        assert_eq!((p.initial, p.min, p.max, p.adaptive), (8, 8, 8, false));
    }
}
