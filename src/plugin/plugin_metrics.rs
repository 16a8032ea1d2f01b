//! The plugin's own metrics (ABI 1.6, `M0Host.metric_define` and
//! `M0Host.metric_record`): what each definition says, checked once at
//! init, and where a recorded value goes.
//!
//! Definitions live here, per process, set once and read without a lock.
//! Values go to this worker's series slots in the metrics page
//! (`metrics_page/plugin_series.rs`), installed by the worker when it
//! serves `--metrics`; without the page a record is checked and dropped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Mutex, OnceLock};

use m0serve_abi as abi;

use crate::metrics_page::plugin_series::{self, PluginSeries};

/// What kind of metric, with a histogram's bucket bounds.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Counter,
    Histogram(Vec<f64>),
}

/// One metric as the plugin defined it.
#[derive(Debug, Clone, PartialEq)]
pub struct Definition {
    pub name: String,
    pub help: String,
    pub kind: Kind,
}

const MAX: usize = abi::M0_METRICS_MAX;

static DEFINITIONS: [OnceLock<Definition>; MAX] = [const { OnceLock::new() }; MAX];
/// Held while a definition is looked up and set, so one name gets one id.
static DEFINING: Mutex<()> = Mutex::new(());
/// This worker's series in the metrics page, once it serves `--metrics`.
static SINK: OnceLock<&'static PluginSeries> = OnceLock::new();
/// The series table was found full once (it is said once).
static FULL_SAID: AtomicBool = AtomicBool::new(false);

/// The worker serves `--metrics`: records go to `series` from now on, and
/// the definitions made so far are written there.
pub fn install(series: &'static PluginSeries) {
    let series = *SINK.get_or_init(|| series);
    for (id, d) in definitions() {
        write_definition(series, id, d);
    }
}

fn write_definition(series: &PluginSeries, id: u32, d: &Definition) {
    let (kind, bounds): (u64, &[f64]) = match &d.kind {
        Kind::Counter => (plugin_series::COUNTER, &[]),
        Kind::Histogram(b) => (plugin_series::HISTOGRAM, b),
    };
    series.define(
        id as usize,
        kind,
        d.name.as_bytes(),
        d.help.as_bytes(),
        bounds,
    );
}

/// A Prometheus metric name, at most `M0_METRIC_NAME_MAX` bytes, and not
/// one of the server's own (`m0serve_`).
pub fn is_metric_name(name: &[u8]) -> bool {
    name.len() <= abi::M0_METRIC_NAME_MAX
        && !name.starts_with(b"m0serve_")
        && name
            .first()
            .is_some_and(|&b| b.is_ascii_alphabetic() || b == b'_' || b == b':')
        && name
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b == b'_' || b == b':')
}

/// A Prometheus label name (`[a-zA-Z_][a-zA-Z0-9_]*`), at most 64 bytes,
/// and not `le`, which a histogram's buckets use.
pub fn is_label_name(name: &[u8]) -> bool {
    name.len() <= 64
        && name != b"le"
        && name
            .first()
            .is_some_and(|&b| b.is_ascii_alphabetic() || b == b'_')
        && name.iter().all(|&b| b.is_ascii_alphanumeric() || b == b'_')
}

/// Why a definition is refused, for the log line that says so.
pub fn check(
    kind: u32,
    name: &[u8],
    help: &[u8],
    bounds: &[f64],
) -> Result<Definition, &'static str> {
    if !is_metric_name(name) {
        return Err(
            "a metric name is [a-zA-Z_:][a-zA-Z0-9_:]*, at most 64 bytes, not beginning m0serve_",
        );
    }
    if help.iter().any(|&b| b == b'\n' || b == b'\r') || help.len() > plugin_series::HELP_MAX {
        return Err("a metric's help is one line of at most 512 bytes");
    }
    let kind = match kind {
        abi::M0_METRIC_COUNTER => Kind::Counter,
        abi::M0_METRIC_HISTOGRAM => {
            if bounds.is_empty() || bounds.len() > abi::M0_METRIC_BOUNDS_MAX {
                return Err("a histogram has 1 to 16 bucket bounds");
            }
            if !bounds.iter().all(|b| b.is_finite()) || !bounds.windows(2).all(|w| w[0] < w[1]) {
                return Err("a histogram's bounds are finite and ascending");
            }
            Kind::Histogram(bounds.to_vec())
        }
        _ => return Err("the kind is M0_METRIC_COUNTER or M0_METRIC_HISTOGRAM"),
    };
    Ok(Definition {
        // Checked above: ASCII.
        name: String::from_utf8_lossy(name).into_owned(),
        help: String::from_utf8_lossy(help).into_owned(),
        kind,
    })
}

/// The id of `definition`: the one it already has, or a new one; `None`
/// when its name is defined otherwise, or `M0_METRICS_MAX` are defined.
pub fn define(definition: Definition) -> Result<u32, &'static str> {
    let _held = DEFINING.lock().unwrap_or_else(|e| e.into_inner());
    for (id, slot) in DEFINITIONS.iter().enumerate() {
        match slot.get() {
            Some(known) if known.name == definition.name => {
                return if *known == definition {
                    Ok(id as u32)
                } else {
                    Err("that name is defined already, with another kind, help or bounds")
                };
            }
            Some(_) => continue,
            None => {
                let d = slot.get_or_init(|| definition);
                if let Some(series) = SINK.get() {
                    write_definition(series, id as u32, d);
                }
                return Ok(id as u32);
            }
        }
    }
    Err("a process defines at most 32 metrics")
}

/// The definition of metric `id`.
pub fn definition(id: u32) -> Option<&'static Definition> {
    DEFINITIONS.get(id as usize)?.get()
}

/// The metrics defined so far, by id.
pub fn definitions() -> impl Iterator<Item = (u32, &'static Definition)> {
    DEFINITIONS
        .iter()
        .map_while(OnceLock::get)
        .enumerate()
        .map(|(id, d)| (id as u32, d))
}

/// The longest label value kept; a longer one is refused.
pub const LABEL_VALUE_MAX: usize = 128;

/// `M0Host.metric_record`: check the record and add it to this worker's
/// series (without the metrics page, it is checked and dropped). Returns
/// the ABI code. Allocates nothing: the series' key is made on the stack.
pub fn record<'l>(
    metric: u32,
    labels: impl Iterator<Item = (&'l [u8], &'l [u8])> + Clone,
    value: f64,
) -> i32 {
    let Some(definition) = definition(metric) else {
        return abi::M0_ERR_INVALID;
    };
    let (value_ok, bounds) = match &definition.kind {
        Kind::Counter => (value.is_finite() && value >= 0.0, None),
        Kind::Histogram(bounds) => (!value.is_nan(), Some(&bounds[..])),
    };
    let mut key = [0u8; plugin_series::KEY_MAX];
    let Some(len) = value_ok
        .then(|| series_key(&definition.name, labels, &mut key))
        .flatten()
    else {
        return abi::M0_ERR_INVALID;
    };
    let Some(series) = SINK.get() else {
        return abi::M0_OK;
    };
    match series.record(&key[..len], bounds, value) {
        Ok(()) => abi::M0_OK,
        Err(plugin_series::Full) => {
            if !FULL_SAID.swap(true, Ordering::Relaxed) {
                crate::log::warn(format_args!(
                    "the plugin's metric {} has no room for another series: a worker keeps {} \
                     (each metric name with one set of labels); records of new ones are dropped \
                     (M0_ERR_UNAVAILABLE)",
                    definition.name,
                    plugin_series::SERIES
                ));
            }
            abi::M0_ERR_UNAVAILABLE
        }
    }
}

/// Writes the series' key into `out`: the metric's name, a NUL, then the
/// labels sorted by name as the exposition writes them (`a="x",b="y"`,
/// values escaped); its length, or `None` for a malformed label, one named
/// twice, or a key longer than `out`.
fn series_key<'l>(
    name: &str,
    labels: impl Iterator<Item = (&'l [u8], &'l [u8])> + Clone,
    out: &mut [u8],
) -> Option<usize> {
    let mut sorted: [(&[u8], &[u8]); abi::M0_METRIC_LABELS_MAX] =
        [(&[], &[]); abi::M0_METRIC_LABELS_MAX];
    let mut count = 0;
    for pair in labels {
        *sorted.get_mut(count)? = pair;
        count += 1;
    }
    let sorted = &mut sorted[..count];
    sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
    if sorted.windows(2).any(|w| w[0].0 == w[1].0) {
        return None;
    }
    let mut w = Writer { out, len: 0 };
    w.put(name.as_bytes())?;
    w.put(&[0])?;
    for (i, (label, value)) in sorted.iter().enumerate() {
        if !is_label_name(label)
            || value.len() > LABEL_VALUE_MAX
            || std::str::from_utf8(value).is_err()
        {
            return None;
        }
        if i > 0 {
            w.put(b",")?;
        }
        w.put(label)?;
        w.put(b"=\"")?;
        for &b in value.iter() {
            match b {
                b'\\' => w.put(b"\\\\")?,
                b'"' => w.put(b"\\\"")?,
                b'\n' => w.put(b"\\n")?,
                _ => w.put(&[b])?,
            }
        }
        w.put(b"\"")?;
    }
    Some(w.len)
}

/// Bytes into a fixed buffer; `None` once it is full.
struct Writer<'o> {
    out: &'o mut [u8],
    len: usize,
}

impl Writer<'_> {
    fn put(&mut self, bytes: &[u8]) -> Option<()> {
        let end = self.len.checked_add(bytes.len())?;
        self.out.get_mut(self.len..end)?.copy_from_slice(bytes);
        self.len = end;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_bounds_and_kinds_are_checked() {
        assert!(is_metric_name(b"te_request_count"));
        assert!(is_metric_name(b"a:b_c9"));
        assert!(!is_metric_name(b"9a"));
        assert!(!is_metric_name(b"m0serve_x"));
        assert!(!is_metric_name(b"a-b"));
        assert!(!is_metric_name(b""));
        assert!(is_label_name(b"model"));
        assert!(!is_label_name(b"le"));
        assert!(!is_label_name(b"a:b"));
        assert!(check(abi::M0_METRIC_HISTOGRAM, b"h", b"", &[]).is_err());
        assert!(check(abi::M0_METRIC_HISTOGRAM, b"h", b"", &[2.0, 1.0]).is_err());
        assert!(check(abi::M0_METRIC_HISTOGRAM, b"h", b"", &[f64::NAN]).is_err());
        assert!(check(abi::M0_METRIC_HISTOGRAM, b"h", b"x\ny", &[1.0]).is_err());
        assert!(check(7, b"h", b"", &[]).is_err());
        let counter = check(abi::M0_METRIC_COUNTER, b"unit_c", b"help", &[9.0]).unwrap();
        assert_eq!(
            counter.kind,
            Kind::Counter,
            "a counter's bounds are ignored"
        );
        let id = define(counter.clone()).unwrap();
        assert_eq!(define(counter), Ok(id));
        let other = check(abi::M0_METRIC_COUNTER, b"unit_c", b"other help", &[]).unwrap();
        assert!(define(other).is_err());
        assert_eq!(definition(id).map(|d| d.name.as_str()), Some("unit_c"));
    }

    #[test]
    fn a_series_key_sorts_its_labels_and_escapes_their_values() {
        let mut out = [0u8; plugin_series::KEY_MAX];
        let labels: [(&[u8], &[u8]); 2] = [(b"reason", b"a\"b\\c\nd"), (b"model", b"m")];
        let len = series_key("te_x", labels.iter().copied(), &mut out).unwrap();
        assert_eq!(&out[..len], b"te_x\0model=\"m\",reason=\"a\\\"b\\\\c\\nd\"");
        let twice: [(&[u8], &[u8]); 2] = [(b"a", b"1"), (b"a", b"2")];
        assert_eq!(series_key("x", twice.iter().copied(), &mut out), None);
        let bad: [(&[u8], &[u8]); 1] = [(b"le", b"1")];
        assert_eq!(series_key("x", bad.iter().copied(), &mut out), None);
        let five: [(&[u8], &[u8]); 5] = [
            (b"a", b""),
            (b"b", b""),
            (b"c", b""),
            (b"d", b""),
            (b"e", b""),
        ];
        assert_eq!(series_key("x", five.iter().copied(), &mut out), None);
        let long = [b'v'; 128];
        let big: [(&[u8], &[u8]); 2] = [(b"a", &long), (b"b", &long)];
        assert_eq!(
            series_key("x", big.iter().copied(), &mut out),
            None,
            "over KEY_MAX"
        );
    }
}
