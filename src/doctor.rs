//! `m0serve --doctor`: the configuration the server would run, as one JSON
//! object on stdout, and the exit code it would exit with. Binds nothing
//! that it keeps and serves nothing; the plugin is probed in a child.

use crate::checks::{self, Findings};
use crate::config::Config;
use crate::json::Json;
use crate::process::{EXIT_USAGE, Mode};

/// FNV-1a of the checked-in header, so a bug report names the exact ABI.
pub fn header_fingerprint() -> String {
    let mut hash: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in include_bytes!("../include/m0serve.h") {
        hash ^= u64::from(b);
        hash = hash.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{hash:016x}")
}

pub fn run(cfg: &Config, notify: &crate::sd_notify::Found) -> i32 {
    let mut findings = checks::run(cfg, true);
    if let crate::sd_notify::Found::Unusable { problem, fix, .. } = notify {
        findings.checks.push(checks::Check {
            name: "sd_notify",
            ok: true,
            detail: problem.clone(),
            fix: Some(fix.clone()),
            exit: None,
            warning: true,
        });
    }
    if findings.failure().is_none()
        && let Some(addr) = findings.addr
    {
        // Bind and release at once: the only way to know the port is free.
        let result = crate::listener::bind(addr, 1)
            .map(|fd| crate::listener::local_addr(&fd).unwrap_or(addr));
        checks::record_bind(&mut findings, result);
    }
    let exit = findings.exit_code();
    println!(
        "{}",
        report(new_json(), cfg, &findings, exit, notify.shown())
    );
    exit
}

/// Indented for a person at a terminal; one line for a program reading a
/// pipe or a file (`jq`, a test, a log collector), as `jq` itself does.
fn new_json() -> Json {
    use std::io::IsTerminal;
    if std::io::stdout().is_terminal() {
        Json::pretty()
    } else {
        Json::new()
    }
}

fn build_section(j: &mut Json) {
    j.begin_object(Some("build"))
        .str("version", env!("CARGO_PKG_VERSION"))
        .str("os", std::env::consts::OS)
        .str("arch", std::env::consts::ARCH)
        .num("abi_major", m0serve_abi::M0_ABI_MAJOR)
        .num("abi_minor", m0serve_abi::M0_ABI_MINOR)
        .str("header_fingerprint", &header_fingerprint())
        .end_object();
}

/// The report for arguments that did not parse: exit 2, one failed check,
/// whose detail is clap's whole complaint (the missing arguments by name)
/// and whose fix names what to pass.
pub fn usage_report(e: &clap::Error, message: &str) -> String {
    use clap::error::{ContextKind, ContextValue, ErrorKind};
    let missing: Vec<String> = match e.get(ContextKind::InvalidArg) {
        Some(ContextValue::Strings(args)) if e.kind() == ErrorKind::MissingRequiredArgument => {
            args.clone()
        }
        _ => Vec::new(),
    };
    let fix = match missing.as_slice() {
        [] => "see m0serve --help".to_string(),
        args => {
            let plugin = args.iter().any(|a| a.starts_with("--plugin"));
            format!(
                "pass {}{}; see m0serve --help",
                args.join(" and "),
                if plugin {
                    " (or set M0_PLUGIN): hello_c, hello_rs, wsgi, embed, pyembed, or a path to a plugin's .so"
                } else {
                    ""
                }
            )
        }
    };
    let mut j = new_json();
    j.begin_object(None)
        .str("m0serve", env!("CARGO_PKG_VERSION"))
        .bool("ok", false)
        .num("exit", EXIT_USAGE);
    build_section(&mut j);
    j.null("plugin").null("topology").null("server");
    j.begin_array("checks")
        .begin_object(None)
        .str("name", "usage")
        .bool("ok", false)
        .str("detail", &usage_detail(message))
        .str("fix", &fix)
        .num("exit", EXIT_USAGE)
        .end_object()
        .end_array()
        .end_object();
    j.finish()
}

/// clap's message on one line: everything before its usage, without the
/// `error: ` it starts with.
fn usage_detail(message: &str) -> String {
    let text: Vec<&str> = message
        .lines()
        .take_while(|l| !l.starts_with("Usage:"))
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    let text = text.join(" ");
    text.strip_prefix("error: ").unwrap_or(&text).to_string()
}

/// The `python` object's members and the facts they come from, stated by a
/// plugin that embeds Python (the WSGI plugin) at init.
const PYTHON_FACTS: [(&str, &str); 10] = [
    ("version", "python.version"),
    ("libpython", "python.libpython"),
    ("executable", "python.executable"),
    ("prefix", "python.prefix"),
    ("base_prefix", "python.base_prefix"),
    ("venv", "python.venv"),
    ("venv_from", "python.venv_source"),
    ("app", "python.app"),
    ("resolved", "python.resolved"),
    ("fork_unsafe", "python.fork_unsafe_modules"),
];

fn report(mut j: Json, cfg: &Config, f: &Findings, exit: i32, sd_notify: Option<&str>) -> String {
    let cli = &cfg.cli;
    j.begin_object(None)
        .str("m0serve", env!("CARGO_PKG_VERSION"))
        .bool("ok", exit == 0)
        .num("exit", exit);

    build_section(&mut j);

    j.begin_object(Some("plugin"))
        .opt_str("requested", cli.plugin.as_deref());
    j.opt_str(
        "file",
        f.plugin_path
            .as_ref()
            .map(|p| p.display().to_string())
            .as_deref(),
    );
    let searched = crate::plugin::loader::search_dirs();
    j.begin_array("searched");
    for dir in &searched {
        j.item_str(&dir.display().to_string());
    }
    j.end_array();
    // The short names `--plugin` would find there.
    j.begin_array("found");
    for name in crate::plugin::catalog::found(&searched).0 {
        j.item_str(&name);
    }
    j.end_array();
    match &f.descriptor {
        Some(d) => {
            j.str("name", &d.name)
                .str("version", &d.version)
                .str("abi", &format!("{}.{}", d.abi_major, d.abi_minor))
                .str("call_model", d.call_model_name())
                .num("max_concurrency", d.max_concurrency)
                .str("process_lock", d.process_lock_name())
                .bool("needs_exec", d.needs_exec)
                .num("compute_threads", d.compute_threads)
                .bool("declares_batch", d.batch)
                .num("max_batch", d.max_batch)
                .bool("declares_inline", d.inline)
                .bool("declares_admit", d.admit);
        }
        None => {
            j.null("name");
        }
    }
    // Every fact the plugin stated, as it stated them.
    j.begin_object(Some("facts"));
    for (key, value) in &f.facts {
        j.str(key, value);
    }
    j.end_object().end_object();

    if f.facts.iter().any(|(k, _)| k.starts_with("python.")) {
        j.begin_object(Some("python"));
        for (name, key) in PYTHON_FACTS {
            match f.fact(key) {
                Some("") if matches!(name, "venv" | "venv_from" | "libpython") => j.null(name),
                Some(v) => j.str(name, v),
                None => continue,
            };
        }
        let imported = f.checks.iter().any(|c| c.name == "plugin-init" && c.ok);
        j.bool("app_imports", imported).end_object();
    } else if f.descriptor.as_ref().is_some_and(|d| d.name == "wsgi") {
        let imported = f.checks.iter().any(|c| c.name == "plugin-init" && c.ok);
        j.begin_object(Some("python"))
            .bool("app_imports", imported)
            .end_object();
    }

    j.begin_object(Some("topology"))
        .num("online_cpus", crate::topology::online_cpus())
        .num("affinity_cpus", crate::topology::affinity_cpus());
    match crate::topology::cgroup_quota_cpus() {
        Some(q) => j.num("cgroup_quota_cpus", q),
        None => j.null("cgroup_quota_cpus"),
    };
    j.num("usable_cpus", f.usable_cpus)
        .num("workers", cli.workers)
        .num("workers_wanted", f.usable_cpus)
        .str(
            "workers_wanted_reason",
            &workers_wanted(f.usable_cpus, cli.workers),
        )
        .num("cpu_affinity", cli.cpu_affinity);
    if cli.cpu_affinity > 0 {
        // Each worker's CPUs, as `taskset -c` writes them, by index.
        let mask = crate::topology::affinity_list();
        j.begin_array("worker_cpus");
        for i in 0..cli.workers {
            let cpus = crate::topology::worker_cpus(&mask, i, cli.cpu_affinity);
            j.item_str(&crate::topology::fmt_cpus(&cpus));
        }
        j.end_array();
    } else {
        j.null("worker_cpus");
    }
    match &f.mode {
        Some((mode, why)) => j
            .str(
                "worker_mode",
                if *mode == Mode::Spawn {
                    "spawn"
                } else {
                    "fork"
                },
            )
            .str("worker_mode_reason", why),
        None => j.null("worker_mode"),
    };
    j.bool("accept_sharing", cli.workers > 1 && cli.accept_share);
    j.begin_object(Some("handler_threads"));
    match &f.pool {
        Some(p) => {
            j.str("source", if p.adaptive { "adaptive" } else { "configured" })
                .num("initial", p.initial)
                .num("min", p.min)
                .num("max", p.max)
                .num("workers_sharing_cpus", p.workers)
                .str("reason", &p.reason);
        }
        None => {
            j.str(
                "source",
                if cli.blocking_threads.is_some() {
                    "configured"
                } else {
                    "adaptive"
                },
            );
            match cli.blocking_threads {
                Some(n) => j.num("initial", n),
                None => j.null("initial"),
            };
        }
    }
    j.end_object();
    match f.descriptor.as_ref() {
        Some(d) => {
            let (on, why) = crate::worker::pool::sizing::inline_calls(d, cli.no_inline);
            j.bool("inline_calls", on).str("inline_reason", why);
            let batching = f.batching.as_ref().is_some_and(|b| b.limits.is_some());
            let adaptive = f
                .pool
                .as_ref()
                .map_or(cli.blocking_threads.is_none(), |p| p.adaptive);
            let decision = crate::worker::event_loop::loop_calls::decide(
                d,
                cli.no_inline,
                f.usable_cpus,
                cli.workers,
                batching,
                adaptive,
            );
            j.bool("loop_calls", decision.on)
                .bool("loop_calls_measured", decision.measured)
                .str("loop_calls_reason", &decision.why);
        }
        None => {
            j.null("inline_calls");
            j.null("loop_calls");
        }
    }
    j.end_object();

    // What the plugin declares about batches is reported under `plugin`;
    // this says what the server does with it.
    match &f.batching {
        Some(plan) => {
            j.begin_object(Some("batching"))
                .bool("on", plan.limits.is_some())
                .str("reason", &plan.reason);
            // null: no limit, or not batching.
            let limit = |j: &mut Json, key: &str, n: Option<usize>| {
                match n {
                    Some(n) if n != usize::MAX => j.num(key, n),
                    _ => j.null(key),
                };
            };
            limit(&mut j, "max_requests", plan.limits.map(|l| l.max_requests));
            limit(&mut j, "max_bytes", plan.limits.map(|l| l.max_bytes));
            match plan.limits {
                Some(l) => j.num("max_wait_ms", l.max_wait.as_secs_f64() * 1000.0),
                None => j.null("max_wait_ms"),
            };
            j.end_object();
        }
        None => {
            j.null("batching");
        }
    }

    j.begin_object(Some("server"))
        .str("host", &cli.host)
        .num("port", cli.port)
        .str("app_dir", &cli.app_dir.display().to_string())
        .opt_str(
            "venv",
            cli.venv
                .as_ref()
                .map(|p| p.display().to_string())
                .as_deref(),
        )
        .opt_str("health_path", cli.health_path.as_deref())
        .str(
            "cors_allow_origin",
            &crate::http::cors::Origins::from_values(&cli.cors_allow_origin).describe(),
        )
        .str("forwarded_allow_ips", &cli.forwarded_allow_ips.describe())
        .opt_str("metrics", cli.metrics.map(|a| a.to_string()).as_deref())
        .opt_str("access_log", cli.access_log.as_deref())
        .str("access_log_format", cli.access_log_format.name())
        .str("log_format", cli.log_format.name())
        .opt_str("sd_notify", sd_notify)
        .num("max_body", cli.max_body)
        .num("max_header_bytes", cli.max_header_bytes)
        .num("max_headers", cli.max_headers)
        .num("max_uri", cli.max_uri)
        .num("header_timeout_s", cli.header_timeout.as_secs_f64())
        .num("body_timeout_s", cli.body_timeout.as_secs_f64())
        .num("body_min_rate", cli.body_min_rate)
        .num("idle_timeout_s", cli.idle_timeout.as_secs_f64())
        .num("graceful_timeout_s", cli.graceful_timeout.as_secs_f64())
        .num("max_keepalive_requests", cli.max_keepalive_requests)
        .num("queue_depth", cli.queue_depth)
        .num("idle_spin_us", cli.idle_spin_us)
        .num("idle_spin_max_wait_pct", cli.idle_spin_max_wait)
        .num("backlog", cli.backlog);
    // How many keys and from where: never the keys.
    match &f.api_keys {
        Some(keys) => {
            j.begin_object(Some("api_keys")).num("count", keys.count());
            j.begin_array("from");
            for source in keys.sources() {
                j.item_str(source);
            }
            j.end_array().begin_array("open_paths");
            for path in keys.open_paths() {
                j.item_str(path);
            }
            j.end_array().end_object();
        }
        None => {
            j.null("api_keys");
        }
    }
    j.end_object();

    j.begin_array("checks");
    for c in &f.checks {
        j.begin_object(None)
            .str("name", c.name)
            .bool("ok", c.ok)
            .str("detail", &c.detail);
        if c.warning {
            j.bool("warning", true);
        }
        if let Some(fix) = &c.fix {
            j.str("fix", fix);
        }
        if let Some(exit) = c.exit {
            j.num("exit", exit);
        }
        j.end_object();
    }
    j.end_array().end_object();
    j.finish()
}

/// What a box of this size wants: one worker per usable CPU. A worker's
/// loop calls and its pool both serve from one process, and an app that
/// holds a process-wide lock (the GIL) runs on one CPU at a time in it.
fn workers_wanted(usable: usize, workers: u32) -> String {
    let have = match (workers as usize).cmp(&usable) {
        std::cmp::Ordering::Less => {
            "fewer: the CPUs past them serve only a worker's handler threads"
        }
        std::cmp::Ordering::Equal => "as configured",
        std::cmp::Ordering::Greater => "more: workers then share CPUs",
    };
    format!(
        "one worker per usable CPU ({usable}; --workers auto): an app that holds a process-wide lock (the GIL) uses one CPU per worker; {workers} configured, {have}"
    )
}
