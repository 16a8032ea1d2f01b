//! `--metrics`: the whole server's Prometheus exposition, checked by
//! `promtool` and scraped by a real Prometheus server; counters that do not
//! go backwards when a worker dies; a plugin's models as a `model` label
//! and its own counters and histograms (ABI 1.6), summed over the workers.
//! Prometheus comes from Debian's `prometheus` package (tests/install-tools).

use std::net::{SocketAddr, TcpListener};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::support;
use crate::support::test_dir::TestDir;
use crate::support::{Client, Server, plugin};

/// Debian's `prometheus` package's `promtool` or `prometheus`.
fn prometheus_tool(name: &str) -> std::path::PathBuf {
    support::tools::system_tool(name)
}

fn free_addr() -> SocketAddr {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap()
}

/// A two-worker hello_c with `--metrics` on a port the kernel picks (a
/// port found free and handed over could be taken by another test in
/// between); the address comes from the server's "metrics: serving" line.
fn serve(extra: &[&str]) -> (Server, SocketAddr) {
    let hello = plugin("hello_c");
    let mut args = vec![
        "--plugin",
        hello.to_str().unwrap(),
        "--workers",
        "2",
        "--metrics",
        "127.0.0.1:0",
    ];
    args.extend_from_slice(extra);
    let s = Server::start(&args);
    let metrics = s.metrics_addr();
    (s, metrics)
}

fn scrape(metrics: SocketAddr) -> String {
    let r = Client::connect(metrics).get("/metrics");
    assert_eq!(r.status, 200);
    assert!(
        r.header("content-type")
            .is_some_and(|t| t.starts_with("text/plain; version=0.0.4")),
        "{:?}",
        r.header("content-type")
    );
    r.text()
}

/// The value of one series (name with its labels, exactly as written).
fn value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' '))
        .unwrap_or_else(|| panic!("no {series} in:\n{text}"))
        .parse()
        .unwrap()
}

/// A scrape once `series` reads `expected`: a response reaches its client
/// a moment before its worker counts it, and a scrape may come to another
/// worker in between. Never more than expected on the way.
fn settled(metrics: SocketAddr, series: &str, expected: f64) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = scrape(metrics);
        let got = value(&text, series);
        assert!(got <= expected, "{series} is {got}, more than {expected}");
        if got == expected || Instant::now() > deadline {
            assert_eq!(got, expected, "{series}");
            return text;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn promtool_check(text: &str) {
    use std::io::Write;
    let mut child = Command::new(prometheus_tool("promtool"))
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "promtool check metrics failed:\n{}{}\n{text}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Requests over a few keep-alive connections: `ok` to `/`, `missing` to
/// a path hello_c answers 404. Returns the body bytes received.
fn load(addr: SocketAddr, ok: usize, missing: usize) -> usize {
    let mut clients: Vec<Client> = (0..4).map(|_| Client::connect(addr)).collect();
    let mut bytes = 0;
    for i in 0..ok {
        let r = clients[i % 4].get("/");
        assert_eq!(r.status, 200);
        bytes += r.body.len();
    }
    for i in 0..missing {
        let r = clients[i % 4].get("/nope");
        assert_eq!(r.status, 404);
        bytes += r.body.len();
    }
    bytes
}

fn exposition_passes_promtool_and_counts_every_response(extra: &[&str]) {
    prometheus_tool("promtool");
    let (s, metrics) = serve(extra);
    let bytes = load(s.addr, 50, 7);
    settled(metrics, "m0serve_requests_total{code=\"2xx\"}", 50.0);
    let text = settled(metrics, "m0serve_requests_total{code=\"4xx\"}", 7.0);
    promtool_check(&text);
    assert_eq!(value(&text, "m0serve_request_duration_seconds_count"), 57.0);
    assert_eq!(
        value(
            &text,
            "m0serve_request_duration_seconds_bucket{le=\"+Inf\"}"
        ),
        57.0
    );
    assert_eq!(value(&text, "m0serve_sent_bytes_total"), bytes as f64);
    assert!(
        text.contains("plugin=\"hello_c\"") && text.contains("abi=\"1."),
        "{text}"
    );
    for worker in ["0", "1"] {
        value(
            &text,
            &format!("m0serve_handler_threads{{worker=\"{worker}\"}}"),
        );
    }
    assert_eq!(value(&text, "m0serve_worker_starts_total"), 2.0);
    // Another path on the metrics listener is not the plugin's either.
    assert_eq!(Client::connect(metrics).get("/").status, 404);
}

#[test]
fn the_exposition_passes_promtool_and_counts_every_response() {
    exposition_passes_promtool_and_counts_every_response(&[]);
}

#[test]
fn spawned_workers_count_into_the_same_page() {
    exposition_passes_promtool_and_counts_every_response(&["--spawn-workers"]);
}

#[test]
fn counters_do_not_go_backwards_when_a_worker_dies() {
    let (s, metrics) = serve(&[]);
    let _ = load(s.addr, 40, 0);
    settled(metrics, "m0serve_requests_total{code=\"2xx\"}", 40.0);
    let victim = s.worker_pids()[0];
    // SAFETY: killing a worker of a server this test started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    assert_eq!(
        s.wait_for_log_count("started", 3, Duration::from_secs(20)),
        3,
        "{}",
        s.log()
    );
    assert!(
        s.wait_for_log_count("ready", 2, Duration::from_secs(20)) >= 1,
        "{}",
        s.log()
    );
    let text = scrape(metrics);
    assert_eq!(value(&text, "m0serve_requests_total{code=\"2xx\"}"), 40.0);
    assert_eq!(
        value(&text, "m0serve_worker_deaths_total{cause=\"signal\"}"),
        1.0
    );
    assert_eq!(value(&text, "m0serve_worker_starts_total"), 3.0);
    let _ = load(s.addr, 10, 0);
    settled(metrics, "m0serve_requests_total{code=\"2xx\"}", 50.0);
}

/// The models fixture (`tests/c/models_plugin.c`) serving models a and b
/// on two workers, with `--metrics`.
fn serve_models(extra: &[&str]) -> (Server, SocketAddr) {
    let mut flags = vec!["--workers", "2", "--metrics", "127.0.0.1:0"];
    flags.extend_from_slice(extra);
    let s = crate::models::start(&flags, &["a", "b"]);
    let metrics = s.metrics_addr();
    (s, metrics)
}

/// `a` requests of model a, `b` of model b and `none` with no model, over
/// a few keep-alive connections.
fn load_models(addr: SocketAddr, a: usize, b: usize, none: usize) {
    let mut clients: Vec<Client> = (0..4).map(|_| Client::connect(addr)).collect();
    let targets = std::iter::repeat_n("/work?model=a", a)
        .chain(std::iter::repeat_n("/work?model=b", b))
        .chain(std::iter::repeat_n("/work", none));
    for (i, target) in targets.enumerate() {
        let r = clients[i % 4].get(target);
        assert_eq!(r.status, 200, "{target}: {}", r.text());
    }
}

/// Each `le` bucket of the histogram series `name` with `labels` (ending
/// in a comma, or empty), in order: cumulative, ending at `+Inf`, which is
/// its `_count`.
fn buckets(text: &str, name: &str, labels: &str) -> Vec<f64> {
    let prefix = format!("{name}_bucket{{{labels}le=");
    let found: Vec<f64> = text
        .lines()
        .filter_map(|l| l.strip_prefix(&prefix))
        .map(|rest| rest.rsplit(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(!found.is_empty(), "no {prefix} in:\n{text}");
    assert!(
        found.windows(2).all(|w| w[0] <= w[1]),
        "{name}{{{labels}}} buckets are not cumulative: {found:?}"
    );
    let braced = format!("{{{}}}", labels.trim_end_matches(','));
    let braced = if braced == "{}" {
        String::new()
    } else {
        braced
    };
    assert_eq!(
        found.last().copied(),
        Some(value(text, &format!("{name}_count{braced}"))),
        "{text}"
    );
    found
}

#[test]
fn models_label_the_servers_series_and_the_plugins_own_are_summed_over_workers() {
    prometheus_tool("promtool");
    let (s, metrics) = serve_models(&[]);
    load_models(s.addr, 30, 12, 5);
    let requests = "models_plugin_requests_total";
    settled(metrics, &format!("{requests}{{model=\"a\"}}"), 30.0);
    settled(metrics, &format!("{requests}{{model=\"b\"}}"), 12.0);
    settled(metrics, "m0serve_batched_requests_total{model=\"a\"}", 30.0);
    settled(metrics, "m0serve_batched_requests_total{model=\"b\"}", 12.0);
    let text = settled(metrics, "m0serve_batched_requests_total", 5.0);
    promtool_check(&text);
    // The server's own series: a request with a model counts under its
    // label only, so each family sums to every request once.
    assert_eq!(
        value(&text, "m0serve_requests_total{code=\"2xx\",model=\"a\"}"),
        30.0
    );
    assert_eq!(
        value(&text, "m0serve_requests_total{code=\"2xx\",model=\"b\"}"),
        12.0
    );
    assert_eq!(value(&text, "m0serve_requests_total{code=\"2xx\"}"), 5.0);
    assert_eq!(
        value(&text, "m0serve_request_duration_seconds_count{model=\"a\"}"),
        30.0
    );
    buckets(&text, "m0serve_request_duration_seconds", "model=\"b\",");
    assert_eq!(value(&text, "m0serve_batch_size_sum{model=\"a\"}"), 30.0);
    buckets(&text, "m0serve_batch_size", "model=\"a\",");
    value(&text, "m0serve_queue_wait_seconds_total{model=\"a\"}");
    // The plugin's histogram: one observation per call, of its size, in
    // cumulative buckets over the bounds it defined (1, 2, 4).
    assert!(
        text.contains("# TYPE models_plugin_batch_size histogram")
            && text.contains("# HELP models_plugin_batch_size Requests per call, by model."),
        "{text}"
    );
    let a = buckets(&text, "models_plugin_batch_size", "model=\"a\",");
    assert_eq!(a.len(), 4, "{a:?}");
    assert_eq!(
        value(&text, "models_plugin_batch_size_sum{model=\"a\"}"),
        30.0
    );
    assert_eq!(
        a[3],
        value(&text, "m0serve_batch_size_count{model=\"a\"}"),
        "one observation per call"
    );
    assert_eq!(value(&text, &format!("{requests}{{model=\"-\"}}")), 5.0);

    // A worker killed: nothing it counted goes, and its replacement adds
    // to the same series.
    let victim = s.worker_pids()[0];
    // SAFETY: killing a worker of a server this test started.
    unsafe { libc::kill(victim, libc::SIGKILL) };
    assert_eq!(
        s.wait_for_log_count("started", 3, Duration::from_secs(20)),
        3,
        "{}",
        s.log()
    );
    let text = scrape(metrics);
    assert_eq!(value(&text, &format!("{requests}{{model=\"a\"}}")), 30.0);
    assert_eq!(
        value(&text, "models_plugin_batch_size_sum{model=\"a\"}"),
        30.0
    );
    assert_eq!(
        value(&text, "m0serve_requests_total{code=\"2xx\",model=\"a\"}"),
        30.0
    );
    assert_eq!(
        value(&text, "m0serve_batched_requests_total{model=\"a\"}"),
        30.0
    );
    load_models(s.addr, 10, 0, 0);
    settled(metrics, &format!("{requests}{{model=\"a\"}}"), 40.0);
    settled(metrics, "models_plugin_batch_size_sum{model=\"a\"}", 40.0);
    let text = settled(
        metrics,
        "m0serve_requests_total{code=\"2xx\",model=\"a\"}",
        40.0,
    );
    promtool_check(&text);
}

/// A Prometheus server started here scrapes a two-worker server under a
/// little load: the target is up and the request counter it stored is the
/// number of requests sent, exactly; and, from a second server, the
/// models fixture's own histogram, bucket by bucket.
#[test]
fn a_real_prometheus_scrapes_the_server_and_counts_what_was_sent() {
    let (s, metrics) = serve(&[]);
    let (models, models_metrics) = serve_models(&[]);
    let dir = TestDir::new("prometheus");
    let config = dir.join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: m0serve\n    static_configs:\n      - targets: ['{metrics}', '{models_metrics}']\n"
        ),
    )
    .unwrap();
    let (prom, web) = start_prometheus(&config, &dir);
    let api = |path: &str| -> serde_json::Value {
        match std::net::TcpStream::connect(web) {
            Ok(_) => {
                let r = Client::connect(web).get(path);
                serde_json::from_str(&r.text()).unwrap_or(serde_json::Value::Null)
            }
            Err(_) => serde_json::Value::Null,
        }
    };
    let until = |what: &str, f: &mut dyn FnMut() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(90);
        while !f() {
            assert!(Instant::now() < deadline, "prometheus never saw {what}");
            std::thread::sleep(Duration::from_millis(250));
        }
    };
    until("both targets up", &mut || {
        let targets = api("/api/v1/targets");
        let up = |i: usize| targets["data"]["activeTargets"][i]["health"] == "up";
        up(0) && up(1)
    });
    let sent = 120;
    let _ = load(s.addr, sent, 0);
    let query = "/api/v1/query?query=sum(m0serve_requests_total%7Bcode%3D%222xx%22%7D)";
    until(&format!("a count of {sent} requests"), &mut || {
        let v = api(query);
        let got = v["data"]["result"][0]["value"][1].as_str().unwrap_or("");
        assert!(
            got.parse::<usize>().map_or(true, |n| n <= sent),
            "prometheus counted {got} of {sent} requests"
        );
        got == sent.to_string()
    });
    load_models(models.addr, 20, 0, 0);
    let query = "/api/v1/query?query=sum(models_plugin_batch_size_sum%7Bmodel%3D%22a%22%7D)";
    until("the plugin's histogram sum of 20", &mut || {
        let v = api(query);
        v["data"]["result"][0]["value"][1].as_str() == Some("20")
    });
    // Every bucket the plugin defined, and +Inf, stored as its own series.
    let query = "/api/v1/query?query=count(models_plugin_batch_size_bucket%7Bmodel%3D%22a%22%7D)";
    let v = api(query);
    assert_eq!(v["data"]["result"][0]["value"][1], "4", "{v}");
    drop((prom, s, models));
}

/// A Prometheus server this test started, killed (and reaped) when
/// dropped, the test passed or not: nothing it started outlives it.
struct Prometheus(Child);

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Prometheus on a port found free: another process may take the port
/// between the probe and Prometheus' bind, so a Prometheus that exits, or a
/// port whose answer is not Prometheus', gets another port.
fn start_prometheus(config: &std::path::Path, dir: &std::path::Path) -> (Prometheus, SocketAddr) {
    for _ in 0..5 {
        let web = free_addr();
        let mut prom = Prometheus(
            Command::new(prometheus_tool("prometheus"))
                .arg(format!("--config.file={}", config.display()))
                .arg(format!(
                    "--storage.tsdb.path={}",
                    dir.join("data").display()
                ))
                .arg(format!("--web.listen-address={web}"))
                .arg("--log.level=warn")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .expect("start prometheus"),
        );
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if prom.0.try_wait().ok().flatten().is_some() {
                break;
            }
            if std::net::TcpStream::connect(web).is_ok() {
                let r = Client::connect(web).get("/-/ready");
                if r.status == 200 && r.text().contains("Prometheus") {
                    return (prom, web);
                }
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        drop(prom);
    }
    panic!("prometheus did not start on any of 5 free ports");
}
