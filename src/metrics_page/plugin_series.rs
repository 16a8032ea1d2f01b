//! The plugin's own metrics in a worker's block (ABI 1.6,
//! `M0Host.metric_define` / `metric_record`): the definitions it made and a
//! fixed number of series, each a metric name with one set of labels.
//!
//! A series is found by its key (the metric's name, a NUL, then its labels
//! as the exposition writes them) in an open-addressed table: the first
//! record of a key claims a free slot (compare-and-swap), writes the key
//! and publishes the slot with Release; every later record of it adds to
//! its atomics, from any thread, without a lock. A reader (a scrape, in any
//! worker) takes only published slots, with Acquire. Slots are never given
//! back: a key keeps its slot for the life of the page, so a worker that
//! replaces a dead one (or shares its slot after a SIGHUP) adds to the same
//! series, and the supervisor folds a dead worker's values into the
//! retired block by swapping them out, as it does the core's counters.

use std::sync::atomic::{AtomicU64, Ordering};

use super::text::Text;

/// Series one worker holds.
pub const SERIES: usize = 256;
/// Definitions one worker holds (ABI `M0_METRICS_MAX`).
pub const DEFINITIONS: usize = 32;
/// The longest key: the name, a NUL and the labels' text.
pub const KEY_MAX: usize = 256;
/// The most bucket bounds of a histogram (ABI `M0_METRIC_BOUNDS_MAX`).
pub const BOUNDS_MAX: usize = 16;
/// The longest help text kept.
pub const HELP_MAX: usize = 512;

const FREE: u64 = 0;
const CLAIMED: u64 = 1;
const READY: u64 = 2;
/// Claimed and not published within `CLAIM_SPINS`: passed over from then on.
const ABANDONED: u64 = 3;

/// How long a reader waits for a claimed slot to be published, in spins
/// (far more than the few stores it takes).
const CLAIM_SPINS: u32 = 1 << 16;

pub const COUNTER: u64 = 1;
pub const HISTOGRAM: u64 = 2;

#[repr(C)]
struct Definition {
    /// 0 while unset; `COUNTER` or `HISTOGRAM`, stored last with Release.
    kind: AtomicU64,
    name: Text<8>,
    help: Text<{ HELP_MAX / 8 }>,
    bound_count: AtomicU64,
    bounds: [AtomicU64; BOUNDS_MAX],
}

#[repr(C)]
struct Series {
    state: AtomicU64,
    hash: AtomicU64,
    key: Text<{ KEY_MAX / 8 }>,
    /// A counter's value or a histogram's sum, as f64 bits.
    value: AtomicU64,
    /// A histogram's observations per bucket (not cumulative), the last
    /// for those above every bound.
    buckets: [AtomicU64; BOUNDS_MAX + 1],
}

/// One block's plugin metrics.
#[repr(C)]
pub struct PluginSeries {
    definitions: [Definition; DEFINITIONS],
    series: [Series; SERIES],
}

/// A definition as a reader sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct DefinitionView {
    pub name: String,
    pub help: String,
    pub kind: u64,
    pub bounds: Vec<f64>,
}

/// A series' values as a reader sees them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Values {
    pub value: f64,
    pub buckets: [u64; BOUNDS_MAX + 1],
}

impl Values {
    pub const ZERO: Values = Values {
        value: 0.0,
        buckets: [0; BOUNDS_MAX + 1],
    };

    pub fn add(&mut self, other: &Values) {
        self.value += other.value;
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
    }
}

/// The table has no free slot for a new key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Full;

/// FNV-1a: a key's starting slot.
fn hash(key: &[u8]) -> u64 {
    key.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// Adds `v` to the f64 in `bits`.
fn add_f64(bits: &AtomicU64, v: f64) {
    if v == 0.0 {
        return;
    }
    let _ = bits.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |old| {
        Some((f64::from_bits(old) + v).to_bits())
    });
}

impl PluginSeries {
    /// Writes definition `slot` (the owner, at init; the same content may
    /// be written twice, by a SIGHUP's old and new worker).
    pub fn define(&self, slot: usize, kind: u64, name: &[u8], help: &[u8], bounds: &[f64]) {
        let Some(d) = self.definitions.get(slot) else {
            return;
        };
        d.name.store(name);
        d.help.store(help);
        let bounds = &bounds[..bounds.len().min(BOUNDS_MAX)];
        for (to, b) in d.bounds.iter().zip(bounds) {
            to.store(b.to_bits(), Ordering::Relaxed);
        }
        d.bound_count.store(bounds.len() as u64, Ordering::Relaxed);
        d.kind.store(kind, Ordering::Release);
    }

    /// Every definition set, in slot order.
    pub fn definitions(&self) -> Vec<DefinitionView> {
        self.definitions
            .iter()
            .filter_map(|d| {
                let kind = d.kind.load(Ordering::Acquire);
                (kind != 0).then(|| {
                    let count = (d.bound_count.load(Ordering::Relaxed) as usize).min(BOUNDS_MAX);
                    DefinitionView {
                        name: String::from_utf8_lossy(&d.name.to_vec()).into_owned(),
                        help: String::from_utf8_lossy(&d.help.to_vec()).into_owned(),
                        kind,
                        bounds: d.bounds[..count]
                            .iter()
                            .map(|b| f64::from_bits(b.load(Ordering::Relaxed)))
                            .collect(),
                    }
                })
            })
            .collect()
    }

    /// The slot of `key`, claiming a free one for a new key.
    fn slot(&self, key: &[u8]) -> Result<&Series, Full> {
        let h = hash(key);
        let start = (h % SERIES as u64) as usize;
        for i in 0..SERIES {
            let s = &self.series[(start + i) % SERIES];
            let mut spins = 0u32;
            loop {
                match s.state.load(Ordering::Acquire) {
                    READY if s.hash.load(Ordering::Relaxed) == h && s.key.holds(key) => {
                        return Ok(s);
                    }
                    READY | ABANDONED => break,
                    FREE => {
                        if s.state
                            .compare_exchange(FREE, CLAIMED, Ordering::Acquire, Ordering::Acquire)
                            .is_ok()
                        {
                            s.hash.store(h, Ordering::Relaxed);
                            s.key.store(key);
                            s.state.store(READY, Ordering::Release);
                            return Ok(s);
                        }
                        // Another thread claimed it: look again once it
                        // is published (it may be this very key).
                    }
                    // Being published by another thread: a few stores
                    // away. A worker killed between its claim and its
                    // publish leaves the slot claimed for good: past the
                    // bound it is marked abandoned, and its key goes on to
                    // the next slot (a claimer that was only slow publishes
                    // it after all; a key in two slots is summed by every
                    // reader, and by the fold).
                    _ if spins < CLAIM_SPINS => {
                        spins += 1;
                        std::hint::spin_loop();
                    }
                    _ => {
                        let _ = s.state.compare_exchange(
                            CLAIMED,
                            ABANDONED,
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                        );
                        break;
                    }
                }
            }
        }
        Err(Full)
    }

    /// Adds `value` to the counter series `key` (`bounds` None), or
    /// observes it on the histogram series `key` over `bounds`.
    pub fn record(&self, key: &[u8], bounds: Option<&[f64]>, value: f64) -> Result<(), Full> {
        let s = self.slot(key)?;
        if let Some(bounds) = bounds {
            let bucket = bounds
                .iter()
                .position(|&b| value <= b)
                .unwrap_or(bounds.len())
                .min(BOUNDS_MAX);
            s.buckets[bucket].fetch_add(1, Ordering::Relaxed);
        }
        add_f64(&s.value, value);
        Ok(())
    }

    /// Every published series: its key and values.
    pub fn series(&self) -> impl Iterator<Item = (Vec<u8>, Values)> + '_ {
        self.series
            .iter()
            .filter(|s| s.state.load(Ordering::Acquire) == READY)
            .map(|s| {
                let values = Values {
                    value: f64::from_bits(s.value.load(Ordering::Relaxed)),
                    buckets: std::array::from_fn(|i| s.buckets[i].load(Ordering::Relaxed)),
                };
                (s.key.to_vec(), values)
            })
    }

    /// Adds a whole series' values (the supervisor, folding).
    fn add_values(&self, key: &[u8], v: &Values) -> Result<(), Full> {
        let s = self.slot(key)?;
        for (to, n) in s.buckets.iter().zip(&v.buckets) {
            if *n > 0 {
                to.fetch_add(*n, Ordering::Relaxed);
            }
        }
        add_f64(&s.value, v.value);
        Ok(())
    }

    /// Moves this block's values into `retired` (a worker has ended): the
    /// keys stay, their values start again from zero. Definitions
    /// `retired` lacks are copied. Returns the series `retired` had no
    /// room for, whose values are lost.
    pub fn fold_into(&self, retired: &PluginSeries) -> usize {
        let known = retired.definitions();
        let mut free = retired
            .definitions
            .iter()
            .enumerate()
            .filter(|(_, d)| d.kind.load(Ordering::Acquire) == 0)
            .map(|(i, _)| i);
        for d in self.definitions() {
            if !known.iter().any(|k| k.name == d.name) {
                if let Some(slot) = free.next() {
                    retired.define(
                        slot,
                        d.kind,
                        d.name.as_bytes(),
                        d.help.as_bytes(),
                        &d.bounds,
                    );
                }
            }
        }
        let mut lost = 0;
        for s in &self.series {
            if s.state.load(Ordering::Acquire) != READY {
                continue;
            }
            let values = Values {
                value: f64::from_bits(s.value.swap(0, Ordering::Relaxed)),
                buckets: std::array::from_fn(|i| s.buckets[i].swap(0, Ordering::Relaxed)),
            };
            if retired.add_values(&s.key.to_vec(), &values).is_err() {
                lost += 1;
            }
        }
        lost
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn table() -> Box<PluginSeries> {
        // SAFETY: PluginSeries is atomics only, for which all zeroes is a
        // valid (empty) value, as in the zero-filled memfd.
        unsafe { Box::<PluginSeries>::new_zeroed().assume_init() }
    }

    #[test]
    fn series_are_found_by_key_and_histograms_fill_their_buckets() {
        let t = table();
        t.define(0, HISTOGRAM, b"h", b"help", &[1.0, 2.0]);
        t.record(b"c\0a=\"1\"", None, 2.5).unwrap();
        t.record(b"c\0a=\"1\"", None, 1.0).unwrap();
        t.record(b"c\0a=\"2\"", None, 1.0).unwrap();
        for v in [0.5, 1.5, 1.5, 9.0] {
            t.record(b"h\0", Some(&[1.0, 2.0]), v).unwrap();
        }
        let all: std::collections::BTreeMap<Vec<u8>, Values> = t.series().collect();
        assert_eq!(all.len(), 3);
        assert_eq!(all[&b"c\0a=\"1\"".to_vec()].value, 3.5);
        let h = all[&b"h\0".to_vec()];
        assert_eq!((h.value, &h.buckets[..3]), (12.5, &[1, 2, 1][..]));
        assert_eq!(t.definitions()[0].bounds, [1.0, 2.0]);
    }

    #[test]
    fn the_table_fills_up_and_then_refuses_new_keys_only() {
        let t = table();
        for i in 0..SERIES {
            t.record(format!("c\0i=\"{i}\"").as_bytes(), None, 1.0)
                .unwrap();
        }
        assert_eq!(t.record(b"c\0new=\"1\"", None, 1.0), Err(Full));
        assert_eq!(t.record(b"c\0i=\"7\"", None, 1.0), Ok(()));
    }

    #[test]
    fn a_slot_claimed_and_never_published_is_passed_over() {
        let t = table();
        let key = b"c\0";
        let first = (hash(key) % SERIES as u64) as usize;
        // As a worker killed between its claim and its publish leaves it.
        t.series[first].state.store(CLAIMED, Ordering::Relaxed);
        t.record(key, None, 2.0).unwrap();
        assert_eq!(t.series[first].state.load(Ordering::Relaxed), ABANDONED);
        t.record(key, None, 1.0).unwrap();
        let all: Vec<_> = t.series().collect();
        assert_eq!(
            all,
            [(
                key.to_vec(),
                Values {
                    value: 3.0,
                    ..Values::ZERO
                }
            )]
        );
    }

    #[test]
    fn folding_moves_the_values_and_keeps_the_keys() {
        let (worker, retired) = (table(), table());
        worker.define(3, COUNTER, b"c", b"help", &[]);
        worker.record(b"c\0", None, 4.0).unwrap();
        retired.record(b"c\0", None, 1.0).unwrap();
        assert_eq!(worker.fold_into(&retired), 0);
        let r: Vec<_> = retired.series().collect();
        assert_eq!(
            r,
            [(
                b"c\0".to_vec(),
                Values {
                    value: 5.0,
                    ..Values::ZERO
                }
            )]
        );
        assert_eq!(retired.definitions()[0].name, "c");
        let w: Vec<_> = worker.series().collect();
        assert_eq!(w, [(b"c\0".to_vec(), Values::ZERO)]);
        // Folding again adds nothing, and copies no definition twice.
        worker.fold_into(&retired);
        assert_eq!(retired.series().next().unwrap().1.value, 5.0);
        assert_eq!(retired.definitions().len(), 1);
    }
}
