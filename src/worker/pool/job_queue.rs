//! The pool's queue: jobs in arrival order, taken by model in turn.
//!
//! A plugin that serves several models (ABI 1.6, `M0Host.request_model`)
//! computes one model per call, so a batch holds jobs of one model only
//! (jobs with no model are a class of their own). Which class the next
//! call serves goes round in turn among the classes with jobs queued.
//! Within a class jobs keep their arrival order, and a batch never skips
//! a job of its own class (one too large for the batch's bytes ends it),
//! so none waits behind later ones.
//!
//! Turns alone only help once a thread is free: a flood of long calls
//! (an embedder's 32-sentence batches) holds every thread, and a short
//! request of another model (a rerank) waited for one of them to end,
//! 5-6x its latency alone. So the queue also counts the calls running
//! per class, for two rules the pool applies (`pool.rs`):
//!
//! - A lane: a class with jobs queued and no call running may start one
//!   call on a thread above the pool's size (`lane_class`), so its call
//!   starts now instead of after a running one ends.
//! - The cap: while two or more classes are active (calls running or
//!   jobs queued), a class starts a new call only while its running
//!   calls are fewer than `max(1, slots - other active classes)`
//!   (`may_start`), `slots` being the calls the worker's CPUs compute at
//!   once; so once a flood's call ends, the newcomer keeps a CPU to itself
//!   instead of sharing it with the flood's next call.
//!
//! With one class (every plugin that names no models) neither rule ever
//! applies, and this is the plain FIFO it was: the front job, and those
//! behind it while the limits hold.

use std::collections::VecDeque;

use super::batching::Limits;
use crate::plugin::call::Job;
use crate::plugin::models::{CLASSES, class};

/// What the queue needs to know of a job.
pub trait Queued {
    /// The model id (`models::NO_MODEL` or any id past the last: none).
    fn model(&self) -> u32;
    /// What the batch's byte limit counts.
    fn bytes(&self) -> usize;
}

impl Queued for Job {
    fn model(&self) -> u32 {
        self.model
    }
    fn bytes(&self) -> usize {
        self.body_len()
    }
}

pub struct JobQueue<T> {
    jobs: VecDeque<T>,
    /// Jobs queued per class.
    per_class: [usize; CLASSES],
    /// Calls running per class (`started` .. `finished`).
    running: [usize; CLASSES],
    /// The class the last call was taken from; the next looks past it.
    last_class: usize,
}

impl<T: Queued> JobQueue<T> {
    pub fn with_capacity(capacity: usize) -> JobQueue<T> {
        JobQueue {
            jobs: VecDeque::with_capacity(capacity),
            per_class: [0; CLASSES],
            running: [0; CLASSES],
            last_class: CLASSES - 1,
        }
    }

    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    pub fn push_back(&mut self, job: T) {
        self.per_class[class(job.model())] += 1;
        self.jobs.push_back(job);
    }

    /// A job that was taken before anything queued now (a leader's calls
    /// given back): it goes first in its class.
    pub fn push_front(&mut self, job: T) {
        self.per_class[class(job.model())] += 1;
        self.jobs.push_front(job);
    }

    /// Jobs queued of `class`.
    pub fn queued(&self, class: usize) -> usize {
        self.per_class[class]
    }

    /// Calls running of `class`.
    pub fn running(&self, class: usize) -> usize {
        self.running[class]
    }

    /// A call of `class` starts (its jobs taken).
    pub fn started(&mut self, class: usize) {
        self.running[class] += 1;
    }

    /// A call of `class` ended.
    pub fn finished(&mut self, class: usize) {
        self.running[class] -= 1;
    }

    /// Whether some class other than `class` has a call running.
    fn others_running(&self, class: usize) -> bool {
        self.running
            .iter()
            .enumerate()
            .any(|(c, &n)| c != class && n > 0)
    }

    /// Classes with calls running or jobs queued.
    fn active(&self) -> usize {
        (0..CLASSES)
            .filter(|&c| self.running[c] > 0 || self.per_class[c] > 0)
            .count()
    }

    /// The cap: whether `class` may start a call beside the others, on a
    /// worker whose CPUs compute `slots` calls at once. Always, while it is
    /// the only class active.
    pub fn may_start(&self, class: usize, slots: usize) -> bool {
        let active = self.active();
        active < 2 || self.running[class] < slots.saturating_sub(active - 1).max(1)
    }

    /// Whether a job just queued of `class` needs a lane: nothing of its
    /// class running or queued before it, while another class's calls run.
    /// Never with one class.
    pub fn wants_lane(&self, class: usize) -> bool {
        self.running[class] == 0 && self.per_class[class] == 1 && self.others_running(class)
    }

    /// The class a lane serves: the next in turn with jobs queued and no
    /// call running, while another class's calls run. Never with one class.
    pub fn lane_class(&self) -> Option<usize> {
        self.in_turn(|c| self.running[c] == 0 && self.others_running(c))
    }

    /// The class whose turn it is among those `may_start` lets start a call.
    pub fn next_class(&self, slots: usize) -> Option<usize> {
        self.in_turn(|c| self.may_start(c, slots))
    }

    /// The first class after the last call's with jobs queued for which
    /// `ok` holds.
    fn in_turn(&self, ok: impl Fn(usize) -> bool) -> Option<usize> {
        (1..=CLASSES)
            .map(|step| (self.last_class + step) % CLASSES)
            .find(|&c| self.per_class[c] > 0 && ok(c))
    }

    fn remove(&mut self, at: usize) -> Option<T> {
        let job = self.jobs.remove(at)?;
        self.per_class[class(job.model())] -= 1;
        Some(job)
    }

    /// The next single call's job, of class `c` (`next_class`, `lane_class`).
    pub fn pop_next(&mut self, c: usize) -> Option<T> {
        let at = self.jobs.iter().position(|j| class(j.model()) == c)?;
        self.last_class = c;
        self.remove(at)
    }

    /// Move the next batch of class `c` into `into`: its first job always
    /// (one larger than the byte limit on its own goes alone), then each
    /// following job of that class while both limits hold; jobs of other
    /// classes stay where they are.
    pub fn take_batch(&mut self, c: usize, limits: Limits, into: &mut Vec<T>) {
        let Some(first) = self.pop_next(c) else {
            return;
        };
        let mut bytes = first.bytes();
        into.push(first);
        let mut left = self.per_class[c];
        // Jobs of other classes before `at` stay; with one class it is 0.
        let mut at = 0;
        while into.len() < limits.max_requests && left > 0 {
            let Some(next) = self.jobs.get(at) else { break };
            if class(next.model()) != c {
                at += 1;
                continue;
            }
            let Some(total) = bytes
                .checked_add(next.bytes())
                .filter(|&t| t <= limits.max_bytes)
            else {
                break;
            };
            bytes = total;
            into.extend(self.remove(at));
            left -= 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// (model, bytes, arrival number)
    #[derive(Debug, Clone, Copy, PartialEq)]
    struct J(u32, usize, usize);

    impl Queued for J {
        fn model(&self) -> u32 {
            self.0
        }
        fn bytes(&self) -> usize {
            self.1
        }
    }

    const NONE: u32 = u32::MAX;

    fn limits(max_requests: usize, max_bytes: usize) -> Limits {
        Limits {
            max_requests,
            max_bytes,
            max_wait: Duration::ZERO,
        }
    }

    fn queue(jobs: &[(u32, usize)]) -> JobQueue<J> {
        let mut q = JobQueue::with_capacity(jobs.len());
        for (i, &(m, b)) in jobs.iter().enumerate() {
            q.push_back(J(m, b, i));
        }
        q
    }

    fn batch(q: &mut JobQueue<J>, l: Limits) -> Vec<usize> {
        let mut into = Vec::new();
        if let Some(c) = q.next_class(2) {
            q.take_batch(c, l, &mut into);
        }
        into.iter().map(|j| j.2).collect()
    }

    #[test]
    fn one_class_is_first_in_first_out_within_the_limits() {
        let mut q = queue(&[(NONE, 10), (NONE, 10), (NONE, 50), (NONE, 1)]);
        assert_eq!(batch(&mut q, limits(8, 30)), [0, 1]);
        // The one too large for the bytes ends a batch, never skipped.
        assert_eq!(batch(&mut q, limits(8, 30)), [2]);
        assert_eq!(batch(&mut q, limits(8, 30)), [3]);
        assert!(q.is_empty());
    }

    #[test]
    fn a_batch_holds_one_model_and_models_take_turns() {
        // A flood of model 0, one request of model 1 behind five of it.
        let mut q = queue(&[
            (0, 1),
            (0, 1),
            (0, 1),
            (0, 1),
            (0, 1),
            (1, 1),
            (0, 1),
            (0, 1),
        ]);
        assert_eq!(batch(&mut q, limits(2, 100)), [0, 1]);
        // Model 1's turn comes next, ahead of the flood's later arrivals.
        assert_eq!(batch(&mut q, limits(2, 100)), [5]);
        assert_eq!(batch(&mut q, limits(2, 100)), [2, 3]);
        assert_eq!(batch(&mut q, limits(2, 100)), [4, 6]);
        assert_eq!(batch(&mut q, limits(2, 100)), [7]);
        assert!(q.is_empty());
    }

    #[test]
    fn jobs_with_no_model_are_a_class_of_their_own() {
        let mut q = queue(&[(NONE, 1), (3, 1), (NONE, 1), (3, 1)]);
        let first = batch(&mut q, limits(8, 100));
        let second = batch(&mut q, limits(8, 100));
        let mut both = [first.clone(), second.clone()];
        both.sort();
        assert_eq!(both, [vec![0, 2], vec![1, 3]]);
        assert!(q.is_empty());
    }

    #[test]
    fn single_calls_take_turns_too_and_keep_order_within_a_model() {
        let mut q = queue(&[(2, 1), (2, 1), (2, 1), (5, 1), (5, 1)]);
        let order: Vec<usize> =
            std::iter::from_fn(|| q.pop_next(q.next_class(2)?).map(|j| j.2)).collect();
        assert_eq!(order, [0, 3, 1, 4, 2]);
    }

    #[test]
    fn a_job_given_back_goes_first_in_its_class() {
        let mut q = queue(&[(1, 1), (1, 1)]);
        q.push_front(J(1, 1, 9));
        assert_eq!(batch(&mut q, limits(2, 100)), [9, 0]);
        assert_eq!(q.len(), 1);
    }

    #[test]
    fn one_class_never_wants_a_lane_nor_meets_the_cap() {
        let mut q = queue(&[(NONE, 1), (NONE, 1), (NONE, 1)]);
        let c = class(NONE);
        for _ in 0..2 {
            q.started(c);
        }
        // Two calls running on a worker of one slot, and more queued.
        assert!(q.may_start(c, 1));
        assert_eq!(q.next_class(1), Some(c));
        assert_eq!(q.lane_class(), None);
        q.push_back(J(NONE, 1, 9));
        assert!(!q.wants_lane(c));
    }

    #[test]
    fn a_model_with_nothing_running_gets_a_lane_beside_a_flood() {
        let mut q = queue(&[(0, 1), (0, 1)]);
        q.started(0);
        q.started(0);
        assert_eq!(q.lane_class(), None, "model 0 runs already");
        q.push_back(J(1, 1, 2));
        assert!(q.wants_lane(1));
        assert_eq!(q.lane_class(), Some(1));
        // A second job of model 1 needs no second lane.
        q.push_back(J(1, 1, 3));
        assert!(!q.wants_lane(1));
        q.started(1);
        assert_eq!(q.lane_class(), None, "model 1 runs now");
    }

    #[test]
    fn the_flood_yields_the_cpus_while_another_model_runs() {
        let mut q = queue(&[(0, 1), (0, 1), (1, 1)]);
        // Two slots: model 0 runs one call, model 1 one.
        q.started(0);
        q.started(1);
        assert!(!q.may_start(0, 2), "model 0 at its share of two slots");
        assert!(!q.may_start(1, 2));
        assert_eq!(q.next_class(2), None, "each runs its share of two slots");
        // Four slots: model 0 may run three beside model 1.
        assert!(q.may_start(0, 4));
        q.started(0);
        q.started(0);
        assert!(!q.may_start(0, 4));
        // Model 1 done and nothing of it queued: model 0 alone again.
        let _ = q.pop_next(1);
        q.finished(1);
        assert!(q.may_start(0, 2) && q.may_start(0, 1));
    }
}
