//! The plugin's own metrics in the exposition (ABI 1.6): every worker's
//! series and the retired block's, summed by name and labels, each metric
//! under its `# HELP` and `# TYPE`, histograms with cumulative buckets.

use std::collections::BTreeMap;

use super::Exposition;
use crate::metrics_page::plugin_series::{
    COUNTER, DefinitionView, HISTOGRAM, PluginSeries, Values,
};

/// Renders the series of `blocks` (the retired block first).
pub(super) fn render<'p>(m: &mut Exposition<'_>, blocks: impl Iterator<Item = &'p PluginSeries>) {
    let mut definitions: BTreeMap<String, DefinitionView> = BTreeMap::new();
    // By key: the name, a NUL, the labels; so a metric's series are
    // together, right after its name.
    let mut series: BTreeMap<Vec<u8>, Values> = BTreeMap::new();
    for block in blocks {
        for d in block.definitions() {
            definitions.entry(d.name.clone()).or_insert(d);
        }
        for (key, values) in block.series() {
            series.entry(key).or_insert(Values::ZERO).add(&values);
        }
    }
    let mut current: Option<&DefinitionView> = None;
    for (key, values) in &series {
        let Some(cut) = key.iter().position(|&b| b == 0) else {
            continue;
        };
        let name = String::from_utf8_lossy(&key[..cut]);
        let labels = String::from_utf8_lossy(&key[cut + 1..]);
        let Some(d) = definitions.get(name.as_ref()) else {
            continue;
        };
        if current.is_none_or(|c| c.name != d.name) {
            let kind = if d.kind == HISTOGRAM {
                "histogram"
            } else {
                "counter"
            };
            m.head(&d.name, kind, &d.help.replace('\\', "\\\\"));
            current = Some(d);
        }
        match d.kind {
            COUNTER if labels.is_empty() => m.line(&d.name, values.value),
            COUNTER => m.line(&format!("{}{{{labels}}}", d.name), values.value),
            HISTOGRAM => {
                let labels = if labels.is_empty() {
                    String::new()
                } else {
                    format!("{labels},")
                };
                m.histogram(
                    &d.name,
                    &labels,
                    d.bounds.iter().map(f64::to_string),
                    values.buckets[..=d.bounds.len()].iter().copied(),
                    values.value,
                );
            }
            _ => {}
        }
    }
}
