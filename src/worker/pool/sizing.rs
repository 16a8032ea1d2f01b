//! How many handler threads a worker starts with, and the bounds the
//! adaptive controller may move within.
//!
//! The plugin's declaration comes first. A plugin that holds a process-wide
//! lock for the whole call (a GIL) gains nothing from many threads and
//! loses to contention (eight threads were measured to cost 31% of the
//! throughput of one), so
//! it starts at 2: one in the call, one ready to take the lock the moment it
//! is free. A reentrant native plugin starts at the usable CPUs divided by
//! the threads each call computes with. A plugin that takes batches gets a
//! fixed pool of one thread per batch the worker's part of the CPUs can
//! compute at once: a thread more only splits the queue into smaller
//! batches (see `batching.rs`), and workers on the same CPUs would run more
//! batches than there are CPUs. `--blocking-threads` overrides all of these
//! and turns adaptation off.
//!
//! Workers inherit the supervisor's CPUs, so with several they share them:
//! an adaptive pool then starts from the worker's part of the CPUs (at
//! least one thread), and its controller sizes it with its siblings' load
//! from the shared page (`adaptive.rs`). Two workers on two CPUs each
//! starting a lock-holding pool of 2 started four threads for two CPUs.

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
    /// Workers sharing those CPUs (this one included).
    pub workers: usize,
    /// Why this size, for the log and `--doctor`.
    pub reason: String,
}

/// `batching`: the worker hands the plugin batches (`batching::decide`);
/// `workers`: the workers that share `usable_cpus`.
pub fn plan(
    desc: &Descriptor,
    configured: Option<u32>,
    usable_cpus: usize,
    workers: usize,
    batching: bool,
) -> PoolPlan {
    let workers = workers.max(1);
    let mut plan = plan_alone(desc, configured, usable_cpus, workers, batching);
    plan.workers = workers;
    if plan.adaptive && workers > 1 {
        // The worker's part of the CPUs instead of all of them.
        let part = worker_part(usable_cpus, workers);
        let initial = match desc.process_lock {
            ProcessLock::Held => part.min(2),
            ProcessLock::Released => part.max(1),
            ProcessLock::None => (part / desc.compute_threads.max(1) as usize).max(1),
        }
        .clamp(1, plan.max);
        plan.initial = initial;
        plan.reason = format!(
            "adaptive from {initial}: {workers} workers share {usable_cpus} usable CPU(s), so each starts \
             from its part and the pools size together from the shared page (about one runnable thread \
             per CPU across the workers, plus the threads blocked in the plugin)"
        );
    }
    plan
}

/// A worker's part of the CPUs its siblings share with it, rounded up.
fn worker_part(usable_cpus: usize, workers: usize) -> usize {
    usable_cpus.div_ceil(workers).max(1)
}

fn plan_alone(
    desc: &Descriptor,
    configured: Option<u32>,
    usable_cpus: usize,
    workers: usize,
    batching: bool,
) -> PoolPlan {
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
            workers: 1,
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
            workers: 1,
            reason: format!(
                "the plugin is {}: one call at a time",
                desc.call_model_name()
            ),
        };
    }
    if batching {
        return batch_plan(desc, usable_cpus, workers, cap);
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
        workers: 1,
        reason: format!("adaptive from {initial}: {why}"),
    }
}

/// The fixed pool of a batching plugin: under load each thread takes what
/// queued while it computed, so threads beyond the batches the CPUs can
/// compute at once only make batches smaller. Workers that share the CPUs
/// take their part of them, rounded up: two workers of the native embed
/// plugin on two CPUs with two threads each ran four batches on two CPUs,
/// and at 32 connections answered as many sentences as with one thread
/// each, at 1.6x the p99.
fn batch_plan(desc: &Descriptor, usable_cpus: usize, workers: usize, cap: usize) -> PoolPlan {
    let per_call = desc.compute_threads.max(1) as usize;
    let (size, reason) = match desc.process_lock {
        ProcessLock::Held => (
            1,
            "the plugin batches and holds a process-wide lock for each call: one batch at a time, \
             the next forms while it computes"
                .to_string(),
        ),
        _ => {
            let part = worker_part(usable_cpus, workers);
            let size = (part / per_call).clamp(1, cap);
            let cpus = if workers > 1 {
                format!("{part} of the {usable_cpus} usable CPUs that {workers} workers share")
            } else {
                format!("{usable_cpus} usable CPUs")
            };
            (
                size,
                format!(
                    "the plugin batches: {size} batch(es) at once, {per_call} compute thread(s) each on \
                     {cpus}; more threads would only split the batches"
                ),
            )
        }
    };
    PoolPlan {
        initial: size,
        min: size,
        max: size,
        adaptive: false,
        cpus: usable_cpus,
        workers: 1,
        reason,
    }
}

/// The calls the worker's CPUs compute at once, for the cap between models
/// (`job_queue.rs`): a fixed pool's size (a batching plugin's is one batch
/// per CPU of the worker's part; `--blocking-threads` is the user's word),
/// else the worker's part of the usable CPUs per call's compute threads.
pub fn call_slots(plan: &PoolPlan, desc: &Descriptor) -> usize {
    if plan.adaptive {
        worker_part(plan.cpus, plan.workers) / desc.compute_threads.max(1) as usize
    } else {
        plan.initial
    }
    .max(1)
}

/// The most handler threads at once, lanes for models included
/// (`job_queue.rs`): the plan's maximum, and one more where the event loop
/// never calls the plugin (`loop_calls`: neither inline nor loop calls),
/// since a thread index below `max + 1` is then free for it (the contract
/// of `M0Request.thread_index`). A plugin that caps its concurrency gets
/// no more than its plan.
pub fn max_threads(plan: &PoolPlan, desc: &Descriptor, loop_calls: bool) -> usize {
    let free_index = !loop_calls && desc.concurrency_cap() == u32::MAX;
    plan.max + usize::from(free_index)
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
            admit: false,
        }
    }

    #[test]
    fn lock_holders_start_small() {
        let p = plan(
            &desc(CallModel::Reentrant, ProcessLock::Held, 1),
            None,
            8,
            1,
            false,
        );
        assert_eq!(p.initial, 2);
        assert!(p.adaptive);
    }

    #[test]
    fn native_reentrant_starts_at_cpus_over_compute_threads() {
        assert_eq!(
            plan(
                &desc(CallModel::Reentrant, ProcessLock::None, 1),
                None,
                8,
                1,
                false
            )
            .initial,
            8
        );
        assert_eq!(
            plan(
                &desc(CallModel::Reentrant, ProcessLock::None, 4),
                None,
                8,
                1,
                false
            )
            .initial,
            2
        );
        assert_eq!(
            plan(
                &desc(CallModel::Reentrant, ProcessLock::None, 4),
                None,
                2,
                1,
                false
            )
            .initial,
            1
        );
    }

    #[test]
    fn serialized_and_pinned_get_one_thread_even_when_configured() {
        let p = plan(
            &desc(CallModel::Pinned, ProcessLock::None, 1),
            Some(8),
            8,
            1,
            false,
        );
        assert_eq!((p.initial, p.max, p.adaptive), (1, 1, false));
        let p = plan(
            &desc(CallModel::Serialized, ProcessLock::None, 1),
            None,
            8,
            1,
            false,
        );
        assert_eq!(p.initial, 1);
    }

    #[test]
    fn a_batching_plugin_gets_one_thread_per_batch_the_cpus_compute() {
        let native = desc(CallModel::Reentrant, ProcessLock::None, 1);
        let p = plan(&native, None, 4, 1, true);
        assert_eq!((p.initial, p.min, p.max, p.adaptive), (4, 4, 4, false));
        let p = plan(
            &desc(CallModel::Reentrant, ProcessLock::None, 2),
            None,
            4,
            1,
            true,
        );
        assert_eq!(p.initial, 2);
        let p = plan(
            &desc(CallModel::Reentrant, ProcessLock::Held, 1),
            None,
            4,
            1,
            true,
        );
        assert_eq!(p.initial, 1);
        // --blocking-threads still wins.
        assert_eq!(plan(&native, Some(3), 4, 1, true).initial, 3);
    }

    #[test]
    fn workers_on_the_same_cpus_start_from_their_part() {
        let wsgi = desc(CallModel::Reentrant, ProcessLock::Held, 1);
        let p = plan(&wsgi, None, 2, 2, false);
        assert_eq!((p.initial, p.workers, p.adaptive), (1, 2, true));
        assert!(
            p.reason.contains("2 workers share 2 usable CPU(s)"),
            "{}",
            p.reason
        );
        // With CPUs to spare a lock holder keeps its 2.
        assert_eq!(plan(&wsgi, None, 8, 2, false).initial, 2);
        let native = desc(CallModel::Reentrant, ProcessLock::None, 1);
        assert_eq!(plan(&native, None, 8, 2, false).initial, 4);
        assert_eq!(plan(&native, None, 2, 4, false).initial, 1);
        // Fixed sizes are the user's.
        assert_eq!(plan(&wsgi, Some(3), 2, 2, false).initial, 3);
        assert_eq!(plan(&native, Some(3), 4, 2, true).initial, 3);
        // A batching plugin's pool: one batch per CPU of the worker's part,
        // rounded up.
        let p = plan(&native, None, 4, 2, true);
        assert_eq!((p.initial, p.max, p.adaptive), (2, 2, false));
        assert!(
            p.reason
                .contains("2 of the 4 usable CPUs that 2 workers share"),
            "{}",
            p.reason
        );
        assert_eq!(plan(&native, None, 2, 2, true).initial, 1);
        assert_eq!(plan(&native, None, 4, 3, true).initial, 2);
        assert_eq!(plan(&native, None, 2, 4, true).initial, 1);
    }

    #[test]
    fn configured_fixes_the_size() {
        let p = plan(
            &desc(CallModel::Reentrant, ProcessLock::Held, 1),
            Some(8),
            2,
            1,
            false,
        );
        assert_eq!((p.initial, p.min, p.max, p.adaptive), (8, 8, 8, false));
    }

    #[test]
    fn lanes_take_the_loops_index_only_where_the_loop_never_calls() {
        let native = desc(CallModel::Reentrant, ProcessLock::None, 1);
        let batching = plan(&native, None, 2, 1, true);
        assert_eq!(max_threads(&batching, &native, false), 3);
        // An inline or loop-calling worker's loop holds that index.
        assert_eq!(max_threads(&batching, &native, true), 2);
        // A plugin that caps its concurrency never gets a call past its plan.
        let mut capped = native.clone();
        capped.max_concurrency = 2;
        assert_eq!(
            max_threads(&plan(&capped, None, 2, 1, true), &capped, false),
            2
        );
        let serial = desc(CallModel::Serialized, ProcessLock::None, 1);
        assert_eq!(
            max_threads(&plan(&serial, None, 8, 1, false), &serial, false),
            1
        );
    }

    #[test]
    fn the_cap_between_models_counts_the_calls_the_cpus_compute_at_once() {
        let native = desc(CallModel::Reentrant, ProcessLock::None, 1);
        assert_eq!(call_slots(&plan(&native, None, 4, 1, true), &native), 4);
        assert_eq!(call_slots(&plan(&native, Some(3), 4, 1, true), &native), 3);
        // An adaptive pool: the worker's part of the CPUs per call.
        let two = desc(CallModel::Reentrant, ProcessLock::None, 2);
        assert_eq!(call_slots(&plan(&two, None, 8, 2, false), &two), 2);
        assert_eq!(call_slots(&plan(&two, None, 1, 1, false), &two), 1);
    }
}
