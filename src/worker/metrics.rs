//! A worker's side of `--metrics`: what it adds to its block of the
//! metrics page, what it publishes there every `PUBLISH_EVERY`, and the
//! Prometheus text exposition of the whole server, rendered from every
//! block by whichever worker a scrape reaches.

use std::io::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use super::pool::Pool;
use crate::metrics_page::model_counts::{MODELS, ModelCounts};
use crate::metrics_page::{BATCH_BOUNDS, Block, DURATION_BOUNDS_US, MetricsPage, PUBLISH_EVERY};
use crate::plugin::host::LOCK_WAIT_NS;
use crate::plugin::{models, plugin_metrics};

mod plugin_text;

/// What the worker keeps elsewhere and publishes by difference, so two
/// workers that share a slot for a while (a SIGHUP's old and new) both add
/// to it and neither overwrites the other.
#[derive(Default, Clone, Copy)]
struct Published {
    queue_wait_ns: u64,
    lock_wait_ns: u64,
    refused_busy: u64,
    inline_calls: u64,
    loop_calls: u64,
    handed_over: u64,
    accepted: u64,
    passed: u64,
    received: u64,
    batches: [u64; BATCH_BOUNDS.len() + 1],
    batched_requests: u64,
    batch_waits: u64,
    batch_waits_filled: u64,
    /// Each model's share (by id).
    models: [ModelPublished; MODELS],
}

#[derive(Default, Clone, Copy)]
struct ModelPublished {
    queue_wait_ns: u64,
    batches: [u64; BATCH_BOUNDS.len() + 1],
    batched_requests: u64,
}

/// What the event loop knows that the pool does not.
pub struct LoopCounts {
    pub open_connections: usize,
    pub accepted: u64,
    /// Passed to siblings and received from them (accept sharing).
    pub passed: u64,
    pub received: u64,
}

pub struct WorkerMetrics {
    /// The worker's for the rest of its life: the plugin's metrics are
    /// recorded into it from any thread (`plugin_metrics::install`).
    page: &'static MetricsPage,
    index: usize,
    /// Models whose names are in the block.
    models_named: usize,
    next_publish: Instant,
    last: Published,
    /// `m0serve_build_info`'s labels.
    build_labels: String,
}

impl WorkerMetrics {
    pub fn new(page: MetricsPage, index: usize, plugin: &str, plugin_version: &str) -> Self {
        let build_labels = format!(
            "version=\"{}\",abi=\"{}.{}\",plugin=\"{}\",plugin_version=\"{}\"",
            env!("CARGO_PKG_VERSION"),
            m0serve_abi::M0_ABI_MAJOR,
            m0serve_abi::M0_ABI_MINOR,
            label_value(plugin),
            label_value(plugin_version)
        );
        page.block(index)
            .pid
            .store(u64::from(std::process::id()), Ordering::Relaxed);
        // Never unmapped: plugin threads may record until the process ends.
        let page: &'static MetricsPage = Box::leak(Box::new(page));
        plugin_metrics::install(&page.block(index).plugin);
        let mut metrics = WorkerMetrics {
            page,
            index,
            models_named: 0,
            next_publish: Instant::now(),
            last: Published::default(),
            build_labels,
        };
        metrics.name_models();
        metrics
    }

    /// Writes the names of the models registered since the last time into
    /// their slots, before any of their requests is counted (models are
    /// registered at init, before the worker serves).
    fn name_models(&mut self) {
        let names = models::names();
        let block = self.page.block(self.index);
        for (slot, name) in block.models.iter().zip(&names).skip(self.models_named) {
            slot.name.store(name.as_bytes());
        }
        self.models_named = names.len();
    }

    /// This worker's block, for what it counts as it answers.
    pub fn block(&self) -> &Block {
        self.page.block(self.index)
    }

    pub fn due(&self, now: Instant) -> bool {
        now >= self.next_publish
    }

    pub fn next_publish(&self) -> Instant {
        self.next_publish
    }

    /// Copy the pool's statistics and the gauges into the block.
    pub fn publish(&mut self, pool: &Pool, counts: &LoopCounts, now: Instant) {
        self.next_publish = now + PUBLISH_EVERY;
        if models::count() > self.models_named {
            self.name_models();
        }
        let stats = pool.stats();
        let unmodelled = models::CLASSES - 1;
        let (_, requests, buckets) = stats.batches.snapshot(unmodelled);
        let (batch_waits, batch_waits_filled) = stats.batches.waits();
        let now_values = Published {
            queue_wait_ns: stats.queue_wait_by_class[unmodelled].load(Ordering::Relaxed),
            lock_wait_ns: LOCK_WAIT_NS.load(Ordering::Relaxed),
            refused_busy: stats.refused.load(Ordering::Relaxed),
            inline_calls: stats.inline_served.load(Ordering::Relaxed),
            loop_calls: stats.loop_calls.load(Ordering::Relaxed),
            handed_over: stats.handoffs.load(Ordering::Relaxed),
            accepted: counts.accepted,
            passed: counts.passed,
            received: counts.received,
            batches: buckets,
            batched_requests: requests,
            batch_waits,
            batch_waits_filled,
            models: std::array::from_fn(|m| {
                let (_, requests, buckets) = stats.batches.snapshot(m);
                ModelPublished {
                    queue_wait_ns: stats.queue_wait_by_class[m].load(Ordering::Relaxed),
                    batches: buckets,
                    batched_requests: requests,
                }
            }),
        };
        let last = std::mem::replace(&mut self.last, now_values);
        let block = self.page.block(self.index);
        let add = |to: &AtomicU64, now: u64, before: u64| {
            if now > before {
                to.fetch_add(now - before, Ordering::Relaxed);
            }
        };
        let n = &now_values;
        add(&block.queue_wait_ns, n.queue_wait_ns, last.queue_wait_ns);
        add(&block.lock_wait_ns, n.lock_wait_ns, last.lock_wait_ns);
        add(&block.refused_busy, n.refused_busy, last.refused_busy);
        add(&block.inline_calls, n.inline_calls, last.inline_calls);
        add(&block.loop_calls, n.loop_calls, last.loop_calls);
        add(&block.handed_over, n.handed_over, last.handed_over);
        add(&block.accepted, n.accepted, last.accepted);
        add(&block.passed, n.passed, last.passed);
        add(&block.received, n.received, last.received);
        for (i, slot) in block.batches.iter().enumerate() {
            add(slot, n.batches[i], last.batches[i]);
        }
        add(
            &block.batched_requests,
            n.batched_requests,
            last.batched_requests,
        );
        add(&block.batch_waits, n.batch_waits, last.batch_waits);
        add(
            &block.batch_waits_filled,
            n.batch_waits_filled,
            last.batch_waits_filled,
        );
        for ((to, n), last) in block.models.iter().zip(&n.models).zip(&last.models) {
            add(&to.queue_wait_ns, n.queue_wait_ns, last.queue_wait_ns);
            add(
                &to.batched_requests,
                n.batched_requests,
                last.batched_requests,
            );
            for (i, slot) in to.batches.iter().enumerate() {
                add(slot, n.batches[i], last.batches[i]);
            }
        }
        let (queued, _) = pool.load();
        let (threads, _) = pool.size();
        block
            .open_connections
            .store(counts.open_connections as u64, Ordering::Relaxed);
        block
            .handler_threads
            .store(threads as u64, Ordering::Relaxed);
        block.queued.store(queued as u64, Ordering::Relaxed);
    }

    /// The Prometheus text exposition (version 0.0.4) of every worker.
    pub fn render(&self, out: &mut Vec<u8>) {
        let page = &self.page;
        let blocks: Vec<&Block> = (0..page.workers()).map(|i| page.block(i)).collect();
        let sum = |f: &dyn Fn(&Block) -> &AtomicU64| -> u64 {
            std::iter::once(page.retired())
                .chain(blocks.iter().copied())
                .map(|b| f(b).load(Ordering::Relaxed))
                .sum()
        };
        let mut m = Exposition { out };
        m.head(
            "m0serve_build_info",
            "gauge",
            "The server's version and plugin ABI, and the plugin it serves.",
        );
        m.line(&format!("m0serve_build_info{{{}}}", self.build_labels), 1.0);

        let groups = model_groups(page, &blocks);
        let msum = |group: &[&ModelCounts], f: &dyn Fn(&ModelCounts) -> &AtomicU64| -> u64 {
            group.iter().map(|c| f(c).load(Ordering::Relaxed)).sum()
        };
        m.head(
            "m0serve_requests_total",
            "counter",
            "Responses sent, by status class (the server's own refusals included), and by model for the requests of one.",
        );
        for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
            let n = sum(&|b| &b.responses[i]);
            m.line(
                &format!("m0serve_requests_total{{code=\"{class}\"}}"),
                n as f64,
            );
        }
        for (name, group) in &groups {
            for (i, class) in ["1xx", "2xx", "3xx", "4xx", "5xx"].iter().enumerate() {
                m.line(
                    &format!("m0serve_requests_total{{code=\"{class}\",model=\"{name}\"}}"),
                    msum(group, &|c| &c.responses[i]) as f64,
                );
            }
        }

        m.head(
            "m0serve_request_duration_seconds",
            "histogram",
            "Server time per request, from its dispatch to the end of its response.",
        );
        let seconds = || {
            DURATION_BOUNDS_US
                .iter()
                .map(|b| (*b as f64 / 1e6).to_string())
        };
        m.histogram(
            "m0serve_request_duration_seconds",
            "",
            seconds(),
            (0..=DURATION_BOUNDS_US.len()).map(|i| sum(&|b| &b.duration[i])),
            sum(&|b| &b.duration_sum_us) as f64 / 1e6,
        );
        for (name, group) in &groups {
            m.histogram(
                "m0serve_request_duration_seconds",
                &format!("model=\"{name}\","),
                seconds(),
                (0..=DURATION_BOUNDS_US.len()).map(|i| msum(group, &|c| &c.duration[i])),
                msum(group, &|c| &c.duration_sum_us) as f64 / 1e6,
            );
        }

        let counters: [(&str, &str, Field, f64); 14] = [
            (
                "m0serve_received_bytes_total",
                "Request bytes received (heads and bodies).",
                &|b| &b.bytes_in,
                1.0,
            ),
            (
                "m0serve_sent_bytes_total",
                "Response body bytes sent.",
                &|b| &b.bytes_out,
                1.0,
            ),
            (
                "m0serve_connections_accepted_total",
                "Connections accepted from the listener.",
                &|b| &b.accepted,
                1.0,
            ),
            (
                "m0serve_connections_passed_total",
                "Accepted connections passed to a less-loaded sibling worker.",
                &|b| &b.passed,
                1.0,
            ),
            (
                "m0serve_connections_received_total",
                "Connections received from a sibling worker.",
                &|b| &b.received,
                1.0,
            ),
            (
                "m0serve_queue_wait_seconds_total",
                "Time requests waited in the handler pool's queue.",
                &|b| &b.queue_wait_ns,
                1e-9,
            ),
            (
                "m0serve_lock_wait_seconds_total",
                "Time handler threads waited for the plugin's process-wide lock (the GIL).",
                &|b| &b.lock_wait_ns,
                1e-9,
            ),
            (
                "m0serve_busy_refusals_total",
                "Requests answered 503 because the queue was full.",
                &|b| &b.refused_busy,
                1.0,
            ),
            (
                "m0serve_inline_calls_total",
                "Requests the event loop answered with an inline call.",
                &|b| &b.inline_calls,
                1.0,
            ),
            (
                "m0serve_loop_calls_total",
                "Requests the thread leading the event loop answered itself.",
                &|b| &b.loop_calls,
                1.0,
            ),
            (
                "m0serve_loop_handoffs_total",
                "Loop calls that ran long enough for a handler thread to take the loop over.",
                &|b| &b.handed_over,
                1.0,
            ),
            (
                "m0serve_batched_requests_total",
                "Requests handed to the plugin in handle_batch calls.",
                &|b| &b.batched_requests,
                1.0,
            ),
            (
                "m0serve_batch_waits_total",
                "Batch calls short of the previous call's size that waited for more requests (--batch-wait).",
                &|b| &b.batch_waits,
                1.0,
            ),
            (
                "m0serve_batch_waits_filled_total",
                "Batch waits that the queue filled before they ran out.",
                &|b| &b.batch_waits_filled,
                1.0,
            ),
        ];
        for (name, help, field, scale) in counters {
            m.head(name, "counter", help);
            m.line(name, sum(field) as f64 * scale);
            let by_model: Option<ModelField> = match name {
                "m0serve_queue_wait_seconds_total" => Some(&|c| &c.queue_wait_ns),
                "m0serve_batched_requests_total" => Some(&|c| &c.batched_requests),
                _ => None,
            };
            for (model, group) in groups.iter().filter(|_| by_model.is_some()) {
                let n = by_model.map_or(0, |f| msum(group, f));
                m.line(&format!("{name}{{model=\"{model}\"}}"), n as f64 * scale);
            }
        }

        m.head(
            "m0serve_batch_size",
            "histogram",
            "Requests per handle_batch call.",
        );
        let sizes = || BATCH_BOUNDS.iter().map(u64::to_string);
        m.histogram(
            "m0serve_batch_size",
            "",
            sizes(),
            (0..=BATCH_BOUNDS.len()).map(|i| sum(&|b| &b.batches[i])),
            sum(&|b| &b.batched_requests) as f64,
        );
        for (name, group) in &groups {
            m.histogram(
                "m0serve_batch_size",
                &format!("model=\"{name}\","),
                sizes(),
                (0..=BATCH_BOUNDS.len()).map(|i| msum(group, &|c| &c.batches[i])),
                msum(group, &|c| &c.batched_requests) as f64,
            );
        }

        let gauges: [(&str, &str, Field); 3] = [
            (
                "m0serve_open_connections",
                "Connections open, by worker.",
                &|b| &b.open_connections,
            ),
            (
                "m0serve_handler_threads",
                "Handler threads alive, by worker.",
                &|b| &b.handler_threads,
            ),
            (
                "m0serve_queued_requests",
                "Requests waiting in the handler pool's queue, by worker.",
                &|b| &b.queued,
            ),
        ];
        for (name, help, field) in gauges {
            m.head(name, "gauge", help);
            for (i, b) in blocks.iter().enumerate() {
                m.line(
                    &format!("{name}{{worker=\"{i}\"}}"),
                    field(b).load(Ordering::Relaxed) as f64,
                );
            }
        }

        let (starts, exits, signals) = page.lifecycle();
        m.head(
            "m0serve_worker_starts_total",
            "counter",
            "Worker processes started (respawns and reloads included).",
        );
        m.line("m0serve_worker_starts_total", starts as f64);
        m.head(
            "m0serve_worker_deaths_total",
            "counter",
            "Workers that ended other than by a clean drain, by cause.",
        );
        m.line("m0serve_worker_deaths_total{cause=\"exit\"}", exits as f64);
        m.line(
            "m0serve_worker_deaths_total{cause=\"signal\"}",
            signals as f64,
        );

        let plugin_blocks = std::iter::once(page.retired())
            .chain(blocks.iter().copied())
            .map(|b| &b.plugin);
        plugin_text::render(&mut m, plugin_blocks);
    }
}

/// Each model's slots, by name, over the retired block and every worker's
/// (a model's id may differ between workers; its name does not).
fn model_groups<'p>(
    page: &'p MetricsPage,
    blocks: &[&'p Block],
) -> Vec<(String, Vec<&'p ModelCounts>)> {
    let mut groups: Vec<(String, Vec<&ModelCounts>)> = Vec::new();
    let mut name = [0u8; 128];
    for slot in std::iter::once(page.retired())
        .chain(blocks.iter().copied())
        .flat_map(|b| &b.models)
    {
        let len = slot.name.load_into(&mut name);
        if len == 0 {
            continue;
        }
        // Registered names need no escaping (visible ASCII, no quote or
        // backslash); one from elsewhere is escaped all the same.
        let name = label_value(&String::from_utf8_lossy(&name[..len]));
        match groups.iter_mut().find(|(n, _)| *n == name) {
            Some((_, group)) => group.push(slot),
            None => groups.push((name, vec![slot])),
        }
    }
    groups
}

/// One number of a block.
type Field<'f> = &'f dyn Fn(&Block) -> &AtomicU64;
/// One number of a model's slot.
type ModelField<'f> = &'f dyn Fn(&ModelCounts) -> &AtomicU64;

struct Exposition<'a> {
    out: &'a mut Vec<u8>,
}

impl Exposition<'_> {
    fn head(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }

    fn line(&mut self, series: &str, value: f64) {
        let _ = writeln!(self.out, "{series} {value}");
    }

    /// A histogram's series: its buckets cumulative (`counts` one per
    /// bound, then the one above them all), `+Inf`, `_sum` and `_count`.
    /// `labels` is empty or ends with a comma.
    fn histogram(
        &mut self,
        name: &str,
        labels: &str,
        bounds: impl Iterator<Item = String>,
        counts: impl Iterator<Item = u64>,
        sum: f64,
    ) {
        let mut cumulative = 0;
        let mut counts = counts;
        for bound in bounds {
            cumulative += counts.next().unwrap_or(0);
            self.line(
                &format!("{name}_bucket{{{labels}le=\"{bound}\"}}"),
                cumulative as f64,
            );
        }
        cumulative += counts.sum::<u64>();
        self.line(
            &format!("{name}_bucket{{{labels}le=\"+Inf\"}}"),
            cumulative as f64,
        );
        let labels = labels.trim_end_matches(',');
        let braced = if labels.is_empty() {
            String::new()
        } else {
            format!("{{{labels}}}")
        };
        self.line(&format!("{name}_sum{braced}"), sum);
        self.line(&format!("{name}_count{braced}"), cumulative as f64);
    }
}

/// A label value as the exposition format escapes it.
fn label_value(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}
