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

/// The summed clocks of a set of threads that changes (a pool's), kept as
/// running totals: a thread's time counts from its first reading, and one
/// that leaves takes only what it did since its last reading with it, so
/// the totals never go backwards.
#[derive(Default)]
pub struct ThreadSet {
    threads: Vec<(i32, File, Clock)>,
    total: Clock,
}

impl ThreadSet {
    /// The totals after reading every thread of `tids` once; `None` when
    /// none of them could be read (a kernel without schedstat).
    pub fn read(&mut self, tids: &[i32]) -> Option<Clock> {
        self.threads.retain(|(tid, _, _)| tids.contains(tid));
        let mut read_any = tids.is_empty();
        for &tid in tids {
            match self.threads.iter_mut().find(|(t, _, _)| *t == tid) {
                Some((_, file, last)) => {
                    if let Some(now) = read_clock(file) {
                        self.total.ran += now.ran.saturating_sub(last.ran);
                        self.total.waited += now.waited.saturating_sub(last.waited);
                        *last = now;
                        read_any = true;
                    }
                }
                None => {
                    let Ok(file) = File::open(format!("/proc/self/task/{tid}/schedstat")) else {
                        continue;
                    };
                    if let Some(first) = read_clock(&file) {
                        self.threads.push((tid, file, first));
                        read_any = true;
                    }
                }
            }
        }
        read_any.then_some(self.total)
    }
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
        // Compute for 20 ms of this thread's own CPU time, however long
        // other processes keep it off its CPU.
        let cpu_start = thread_cpu_ns();
        while thread_cpu_ns() < cpu_start + 20_000_000 {
            std::hint::black_box(Instant::now());
        }
        let later = clock.read(tid).unwrap();
        assert!(later.ran >= first.ran + 15_000_000, "{first:?} {later:?}");
    }

    #[test]
    fn a_thread_set_sums_from_each_threads_first_reading_and_never_goes_back() {
        let tid = nix::unistd::gettid().as_raw();
        let mut set = ThreadSet::default();
        // A thread first seen counts nothing it did before.
        assert_eq!(set.read(&[tid]), Some(Clock::default()));
        let cpu_start = thread_cpu_ns();
        while thread_cpu_ns() < cpu_start + 20_000_000 {
            std::hint::black_box(Instant::now());
        }
        let after = set.read(&[tid]).unwrap();
        assert!(after.ran >= 15_000_000, "{after:?}");
        // The thread leaves the set: the totals stay.
        assert_eq!(set.read(&[]), Some(after));
        // A thread that does not exist is not read.
        assert_eq!(set.read(&[i32::MAX]), None);
    }
}
