//! The metrics page (`--metrics`): every worker's counters and gauges in a
//! sealed memfd that the supervisor maps before the workers start
//! (inherited across fork, adopted by descriptor after exec).
//!
//! Each worker writes only its own block: counters it adds to as it
//! answers (uncontended atomics on lines no other process writes) and what
//! it publishes every `PUBLISH_EVERY`. Whichever worker a scrape reaches
//! reads every block and renders the whole server. When a worker dies the
//! supervisor folds its counters into the `retired` block before its
//! replacement starts, so no counter goes backwards.
//!
//! A block also holds each model's share of its counters
//! (`model_counts.rs`) and the plugin's own metrics (`plugin_series.rs`),
//! both ABI 1.6, folded the same way.

pub mod model_counts;
pub mod plugin_series;
pub mod text;

use std::os::fd::{OwnedFd, RawFd};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::memfd_map::{self, MemfdMap};
use model_counts::{MODELS, ModelCounts};
use plugin_series::PluginSeries;

/// How often a worker copies what it keeps elsewhere (pool statistics,
/// gauges) into its block.
pub const PUBLISH_EVERY: Duration = Duration::from_millis(100);

/// Upper bounds of the request-duration buckets, in microseconds
/// (Prometheus's default buckets from 0.5 ms to 10 s).
pub const DURATION_BOUNDS_US: [u64; 14] = [
    500, 1_000, 2_500, 5_000, 10_000, 25_000, 50_000, 100_000, 250_000, 500_000, 1_000_000,
    2_500_000, 5_000_000, 10_000_000,
];
/// Upper bounds of the batch-size buckets (requests per `handle_batch`).
pub const BATCH_BOUNDS: [u64; 6] = [1, 3, 7, 15, 31, 63];

/// One worker's numbers. Counters only grow while the worker lives; gauges
/// are its latest published values.
#[repr(C, align(64))]
pub struct Block {
    /// Responses by status class: 1xx .. 5xx.
    pub responses: [AtomicU64; 5],
    /// Responses per duration bucket (not cumulative), the last for
    /// everything above the largest bound.
    pub duration: [AtomicU64; DURATION_BOUNDS_US.len() + 1],
    pub duration_sum_us: AtomicU64,
    pub bytes_in: AtomicU64,
    pub bytes_out: AtomicU64,
    pub accepted: AtomicU64,
    pub passed: AtomicU64,
    pub received: AtomicU64,
    pub queue_wait_ns: AtomicU64,
    pub lock_wait_ns: AtomicU64,
    pub refused_busy: AtomicU64,
    pub inline_calls: AtomicU64,
    pub loop_calls: AtomicU64,
    pub handed_over: AtomicU64,
    /// `handle_batch` calls per size bucket, the last above the largest.
    pub batches: [AtomicU64; BATCH_BOUNDS.len() + 1],
    pub batched_requests: AtomicU64,
    /// Short batch calls that waited for more requests, and those of them
    /// the queue filled before the wait ran out (`--batch-wait`).
    pub batch_waits: AtomicU64,
    pub batch_waits_filled: AtomicU64,
    // Gauges.
    pub open_connections: AtomicU64,
    pub handler_threads: AtomicU64,
    pub queued: AtomicU64,
    pub pid: AtomicU64,
    /// Each model's share of the counts above (by the worker's model id).
    pub models: [ModelCounts; MODELS],
    /// The plugin's own metrics.
    pub plugin: PluginSeries,
}

impl Block {
    /// The counters, in a fixed order (for folding and summing).
    pub fn counters(&self) -> impl Iterator<Item = &AtomicU64> {
        self.responses
            .iter()
            .chain(&self.duration)
            .chain([
                &self.duration_sum_us,
                &self.bytes_in,
                &self.bytes_out,
                &self.accepted,
                &self.passed,
                &self.received,
                &self.queue_wait_ns,
                &self.lock_wait_ns,
                &self.refused_busy,
                &self.inline_calls,
                &self.loop_calls,
                &self.handed_over,
            ])
            .chain(&self.batches)
            .chain([
                &self.batched_requests,
                &self.batch_waits,
                &self.batch_waits_filled,
            ])
    }

    fn gauges(&self) -> [&AtomicU64; 4] {
        [
            &self.open_connections,
            &self.handler_threads,
            &self.queued,
            &self.pid,
        ]
    }

    /// Count a response: its status, its time and its bytes, in the
    /// slot of its model (the worker's id; any other value: none).
    pub fn count_response(&self, model: u32, status: u16, duration: Duration, bytes_out: u64) {
        let class = usize::from(status / 100).clamp(1, 5) - 1;
        let us = duration.as_micros().min(u128::from(u64::MAX)) as u64;
        let bucket = DURATION_BOUNDS_US
            .iter()
            .position(|&b| us <= b)
            .unwrap_or(DURATION_BOUNDS_US.len());
        let (responses, durations, sum) = match self.models.get(model as usize) {
            Some(m) => (&m.responses, &m.duration, &m.duration_sum_us),
            None => (&self.responses, &self.duration, &self.duration_sum_us),
        };
        responses[class].fetch_add(1, Ordering::Relaxed);
        durations[bucket].fetch_add(1, Ordering::Relaxed);
        sum.fetch_add(us, Ordering::Relaxed);
        self.bytes_out.fetch_add(bytes_out, Ordering::Relaxed);
    }
}

#[repr(C, align(64))]
struct Header {
    /// `memfd_map`'s stamp: written when the page is made, checked when
    /// a process adopts it.
    magic: AtomicU64,
    workers: AtomicU64,
    worker_starts: AtomicU64,
    /// Workers that exited with a status other than 0 (78 and the
    /// graceful-timeout code included).
    deaths_exit: AtomicU64,
    /// Workers killed by a signal (a crash, the OOM killer, kill -9).
    deaths_signal: AtomicU64,
}

const MAGIC: u64 = 0x6d30_6d65_7472_0002; // "m0metr" v2: model slots and plugin series

/// What the supervisor records of a worker's end.
pub enum Death {
    /// Exited 0: a drain (SIGHUP, a stop), not counted as a death.
    Clean,
    Exit,
    Signal,
}

pub struct MetricsPage {
    map: MemfdMap,
    workers: usize,
}

fn page_len(workers: usize) -> usize {
    // The header, the retired block, one block per worker.
    memfd_map::page_len(size_of::<Header>(), workers + 1, size_of::<Block>())
}

impl MetricsPage {
    /// Create, size, seal and map a page for `workers` (the supervisor).
    pub fn create(workers: usize) -> std::io::Result<MetricsPage> {
        Ok(MetricsPage {
            map: MemfdMap::create_stamped(c"m0serve-metrics", page_len(workers), MAGIC, workers)?,
            workers,
        })
    }

    /// Map a page adopted by descriptor number (a spawned worker, or a
    /// forked one's duplicate).
    ///
    /// # Safety
    /// `fd` must be the page's memfd, owned by the caller from now on.
    pub unsafe fn adopt(fd: RawFd, workers: usize) -> std::io::Result<MetricsPage> {
        // SAFETY: per the contract, fd is the page's memfd, ours now.
        let map = unsafe {
            MemfdMap::adopt_stamped(fd, page_len(workers), MAGIC, workers, "metrics page")
        }?;
        Ok(MetricsPage { map, workers })
    }

    pub fn fd_owned(&self) -> &OwnedFd {
        self.map.fd_owned()
    }

    pub fn workers(&self) -> usize {
        self.workers
    }

    fn header(&self) -> &Header {
        // SAFETY: the page starts with its Header, made of atomics.
        unsafe { self.map.at::<Header>(0) }
    }

    fn block_at(&self, slot: usize) -> &Block {
        let offset = std::mem::size_of::<Header>() + slot * std::mem::size_of::<Block>();
        // SAFETY: every process lays the page out the same way: the Header,
        // then Blocks of atomics (the retired one first).
        unsafe { self.map.at::<Block>(offset) }
    }

    /// The counters of workers that have died.
    pub fn retired(&self) -> &Block {
        self.block_at(0)
    }

    pub fn block(&self, index: usize) -> &Block {
        assert!(index < self.workers, "worker index {index} out of range");
        self.block_at(index + 1)
    }

    /// The supervisor starts a worker in slot `index`.
    pub fn worker_started(&self, index: usize) {
        self.header().worker_starts.fetch_add(1, Ordering::Relaxed);
        let _ = index;
    }

    /// The supervisor reaped the worker of slot `index`: its counters go to
    /// `retired`, and the slot starts from zero for the next one. Returns
    /// the plugin's series the retired block had no room for (their
    /// counts are lost).
    pub fn worker_ended(&self, index: usize, death: Death) -> usize {
        match death {
            Death::Clean => {}
            Death::Exit => {
                self.header().deaths_exit.fetch_add(1, Ordering::Relaxed);
            }
            Death::Signal => {
                self.header().deaths_signal.fetch_add(1, Ordering::Relaxed);
            }
        }
        let block = self.block(index);
        for (retired, mine) in self.retired().counters().zip(block.counters()) {
            retired.fetch_add(mine.swap(0, Ordering::Relaxed), Ordering::Relaxed);
        }
        for gauge in block.gauges() {
            gauge.store(0, Ordering::Relaxed);
        }
        let mut name = [0u8; 128];
        for m in &block.models {
            let len = m.name.load_into(&mut name);
            if len == 0 {
                continue;
            }
            // A retired block with every slot named keeps no more models:
            // 16 is what one worker may register, and workers serve the
            // same ones.
            if let Some(to) = model_counts::slot_for(&self.retired().models, &name[..len]) {
                m.fold_into(to);
            }
        }
        block.plugin.fold_into(&self.retired().plugin)
    }

    /// Worker starts, deaths by exit status, deaths by signal.
    pub fn lifecycle(&self) -> (u64, u64, u64) {
        let h = self.header();
        (
            h.worker_starts.load(Ordering::Relaxed),
            h.deaths_exit.load(Ordering::Relaxed),
            h.deaths_signal.load(Ordering::Relaxed),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dead_workers_counters_are_folded_and_its_slot_starts_over() {
        let page = MetricsPage::create(2).unwrap();
        page.block(1)
            .count_response(u32::MAX, 200, Duration::from_millis(3), 13);
        page.block(1)
            .count_response(u32::MAX, 503, Duration::from_secs(20), 0);
        page.block(1).models[2].name.store(b"m");
        page.block(1)
            .count_response(2, 200, Duration::from_millis(3), 5);
        page.block(1).open_connections.store(7, Ordering::Relaxed);
        page.worker_ended(1, Death::Signal);
        let r = page.retired();
        assert_eq!(r.responses[1].load(Ordering::Relaxed), 1);
        assert_eq!(r.responses[4].load(Ordering::Relaxed), 1);
        assert_eq!(r.duration[3].load(Ordering::Relaxed), 1, "3 ms is <= 5 ms");
        assert_eq!(
            r.duration[DURATION_BOUNDS_US.len()].load(Ordering::Relaxed),
            1
        );
        assert_eq!(r.bytes_out.load(Ordering::Relaxed), 18);
        // The model's counts went to the retired slot of its name.
        assert!(r.models[0].name.holds(b"m"));
        assert_eq!(r.models[0].responses[1].load(Ordering::Relaxed), 1);
        assert_eq!(
            page.block(1).models[2].responses[1].load(Ordering::Relaxed),
            0
        );
        assert!(
            page.block(1)
                .counters()
                .all(|c| c.load(Ordering::Relaxed) == 0)
        );
        assert_eq!(page.block(1).open_connections.load(Ordering::Relaxed), 0);
        assert_eq!(page.lifecycle(), (0, 0, 1));
    }
}
