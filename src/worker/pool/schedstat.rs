//! A thread's CPU accounting from the kernel's scheduler
//! (`/proc/self/task/TID/schedstat`): time on a CPU, and time runnable but
//! waiting for one. The loop calls' watcher reads the leader's to tell a
//! call that blocks from one kept off its CPU; the idle spin reads its own
//! to stop spinning on a CPU that others need; the adaptive controller
//! reads the handler threads' (`ThreadSet`) to tell threads that wait for a
//! CPU from threads blocked in the plugin.

use std::fs::File;
use std::os::unix::fs::FileExt;

/// Nanoseconds since the thread started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Clock {
    pub ran: u64,
    pub waited: u64,
}

/// Keeps the file of the thread last read open (one `pread` per reading).
#[derive(Default)]
pub struct ThreadClock {
    file: Option<(i32, File)>,
}

impl ThreadClock {
    /// The clock of thread `tid` of this process; `None` without schedstat
    /// (a kernel built without it) or once the thread has gone.
    pub fn read(&mut self, tid: i32) -> Option<Clock> {
        if tid == 0 {
            return None;
        }
        if self.file.as_ref().is_none_or(|(t, _)| *t != tid) {
            self.file = File::open(format!("/proc/self/task/{tid}/schedstat"))
                .ok()
                .map(|f| (tid, f));
        }
        let (_, file) = self.file.as_ref()?;
        read_clock(file)
    }
}

fn read_clock(file: &File) -> Option<Clock> {
    let mut buf = [0u8; 96];
    let n = file.read_at(&mut buf, 0).ok()?;
    let text = std::str::from_utf8(&buf[..n]).ok()?;
    let mut fields = text.split_ascii_whitespace().map(|f| f.parse::<u64>().ok());
    Some(Clock {
        ran: fields.next()??,
        waited: fields.next()??,
    })
}

/// The clock of the calling thread; `None` without schedstat.
pub fn own_clock() -> Option<Clock> {
    read_clock(&File::open("/proc/thread-self/schedstat").ok()?)
}

/// The summed clocks of a set of threads that changes (a pool's), kept as
/// running totals that never go backwards. Every thread's whole time on a
/// CPU lands in the totals, in the reading after it happened:
/// - a thread first seen counts everything since its start, since it joined
///   after the set's last reading (a pool thread registers at its start; a
///   thread that registered during a window and counted only from its first
///   reading had that window's work missing, and read as blocked);
/// - a thread that leaves hands over its last clock as it goes
///   (`departed`), so its time since the set's last reading is not lost.
#[derive(Default)]
pub struct ThreadSet {
    threads: Vec<(i32, File, Clock)>,
    total: Clock,
}

impl ThreadSet {
    /// The totals after taking the clocks of the threads that left since
    /// the last reading (`departed`: each one's tid and last clock, read by
    /// itself as it left) and reading every thread of `tids` once; `None`
    /// when none could be read (a kernel without schedstat). A tid in both
    /// is a new thread that the kernel gave a departed one's id.
    pub fn read(&mut self, tids: &[i32], departed: &[(i32, Clock)]) -> Option<Clock> {
        for &(tid, last_clock) in departed {
            let since = match self.threads.iter().position(|(t, _, _)| *t == tid) {
                Some(i) => self.threads.swap_remove(i).2,
                None => Clock::default(),
            };
            add(&mut self.total, last_clock, since);
        }
        self.threads.retain(|(tid, _, _)| tids.contains(tid));
        let mut read_any = tids.is_empty() || !departed.is_empty();
        for &tid in tids {
            match self.threads.iter_mut().find(|(t, _, _)| *t == tid) {
                Some((_, file, last)) => {
                    if let Some(now) = read_clock(file) {
                        let since = std::mem::replace(last, now);
                        add(&mut self.total, now, since);
                        read_any = true;
                    }
                }
                None => {
                    let Ok(file) = File::open(format!("/proc/self/task/{tid}/schedstat")) else {
                        continue;
                    };
                    if let Some(first) = read_clock(&file) {
                        add(&mut self.total, first, Clock::default());
                        self.threads.push((tid, file, first));
                        read_any = true;
                    }
                }
            }
        }
        read_any.then_some(self.total)
    }
}

fn add(total: &mut Clock, now: Clock, since: Clock) {
    total.ran += now.ran.saturating_sub(since.ran);
    total.waited += now.waited.saturating_sub(since.waited);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Instant;

    /// This thread's CPU time, from the clock the kernel keeps for it.
    fn thread_cpu_ns() -> u64 {
        let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_THREAD_CPUTIME_ID).unwrap();
        t.tv_sec() as u64 * 1_000_000_000 + t.tv_nsec() as u64
    }

    #[test]
    fn a_thread_that_computes_is_seen_to_run() {
        let tid = nix::unistd::gettid().as_raw();
        let mut clock = ThreadClock::default();
        let first = clock.read(tid).expect("schedstat of this thread");
        compute_for(20_000_000);
        let later = clock.read(tid).unwrap();
        assert!(later.ran >= first.ran + 15_000_000, "{first:?} {later:?}");
    }

    /// Computes for `ns` of this thread's own CPU time, however long other
    /// processes keep it off its CPU.
    fn compute_for(ns: u64) {
        let cpu_start = thread_cpu_ns();
        while thread_cpu_ns() < cpu_start + ns {
            std::hint::black_box(Instant::now());
        }
    }

    #[test]
    fn a_thread_set_counts_each_thread_from_its_start_to_its_departure() {
        use std::sync::mpsc::channel;
        let mut set = ThreadSet::default();
        assert_eq!(set.read(&[], &[]), Some(Clock::default()));
        let (to_test, from_thread) = channel();
        let (to_thread, from_test) = channel::<()>();
        let thread = std::thread::spawn(move || {
            // 20 ms before the set first reads this thread: it joined the
            // set after the set's last reading, so all of it counts.
            compute_for(20_000_000);
            to_test
                .send((nix::unistd::gettid().as_raw(), None))
                .unwrap();
            from_test.recv().unwrap();
            // 20 ms after the set's last reading of it, then it leaves with
            // its last clock.
            compute_for(20_000_000);
            let tid = nix::unistd::gettid().as_raw();
            to_test.send((tid, own_clock())).unwrap();
        });
        let (tid, _) = from_thread.recv().unwrap();
        let joined = set.read(&[tid], &[]).unwrap();
        assert!(joined.ran >= 15_000_000, "{joined:?}");
        to_thread.send(()).unwrap();
        let (_, last_clock) = from_thread.recv().unwrap();
        thread.join().unwrap();
        let departed = [(tid, last_clock.expect("the thread's own schedstat"))];
        let left = set.read(&[], &departed).unwrap();
        assert!(left.ran >= joined.ran + 15_000_000, "{joined:?} {left:?}");
        // Gone from the set: the totals stay.
        assert_eq!(set.read(&[], &[]), Some(left));
        // A thread that does not exist is not read.
        assert_eq!(set.read(&[i32::MAX], &[]), None);
    }
}
