//! The pool's queue: jobs in arrival order, taken by model in turn.
//!
//! A plugin that serves several models (ABI 1.6, `M0Host.request_model`)
//! computes one model per call, so a batch holds jobs of one model only
//! (jobs with no model are a class of their own). Which class the next
//! call serves goes round in turn among the classes with jobs queued, so
//! a flood of one model delays a request of another by at most the calls
//! already running: each call after the one that took a flood's jobs
//! looks at the next class first. Within a class jobs keep their arrival
//! order, and a batch never skips a job of its own class (one too large
//! for the batch's bytes ends it), so none waits behind later ones.
//!
//! With one class (every plugin that names no models) this is the plain
//! FIFO it was: the front job, and those behind it while the limits hold.

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
    /// The class the last call was taken from; the next looks past it.
    last_class: usize,
}

impl<T: Queued> JobQueue<T> {
    pub fn with_capacity(capacity: usize) -> JobQueue<T> {
        JobQueue {
            jobs: VecDeque::with_capacity(capacity),
            per_class: [0; CLASSES],
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

    /// The class whose turn it is: the first after the last call's with
    /// jobs queued.
    fn next_class(&self) -> Option<usize> {
        (1..=CLASSES)
            .map(|step| (self.last_class + step) % CLASSES)
            .find(|&c| self.per_class[c] > 0)
    }

    fn remove(&mut self, at: usize) -> Option<T> {
        let job = self.jobs.remove(at)?;
        self.per_class[class(job.model())] -= 1;
        Some(job)
    }

    /// The next single call's job.
    pub fn pop_next(&mut self) -> Option<T> {
        let c = self.next_class()?;
        self.last_class = c;
        let at = self.jobs.iter().position(|j| class(j.model()) == c)?;
        self.remove(at)
    }

    /// Move the next batch into `into`: the first job of the class whose
    /// turn it is always (one larger than the byte limit on its own goes
    /// alone), then each following job of that class while both limits
    /// hold; jobs of other classes stay where they are.
    pub fn take_batch(&mut self, limits: Limits, into: &mut Vec<T>) {
        let Some(first) = self.pop_next() else {
            return;
        };
        let c = class(first.model());
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
        q.take_batch(l, &mut into);
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
        let order: Vec<usize> = std::iter::from_fn(|| q.pop_next().map(|j| j.2)).collect();
        assert_eq!(order, [0, 3, 1, 4, 2]);
    }

    #[test]
    fn a_job_given_back_goes_first_in_its_class() {
        let mut q = queue(&[(1, 1), (1, 1)]);
        q.push_front(J(1, 1, 9));
        assert_eq!(batch(&mut q, limits(2, 100)), [9, 0]);
        assert_eq!(q.len(), 1);
    }
}
