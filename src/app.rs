//! Startup, in the order that keeps application code out of the supervisor:
//! parse flags, run the checks (the plugin is only probed, in a child),
//! bind the one listener, then hand over to the supervisor, which forks or
//! spawns the workers that open the plugin.

use std::path::PathBuf;

use crate::checks;
use crate::config::{Cli, Config};
use crate::plugin::init_args::InitArgsOwned;
use crate::plugin::loader::Calls;
use crate::plugin::{Plugin, PluginError, probe};
use crate::process;
use crate::supervisor::{self, Plan};
use crate::worker::{self, WorkerSetup};

/// Returns the process exit code.
pub fn main() -> i32 {
    if let Some(path) = std::env::var_os(probe::PROBE_ENV) {
        // SAFETY: the probe child has no other thread yet; the plugin it
        // probes must not read the key from the environment either.
        unsafe { crate::auth::scrub_environment() };
        probe::run_child(&PathBuf::from(path), init_in_probe);
    }
    let cli = match Cli::from_env() {
        Ok(cli) => cli,
        Err(e) => {
            // --help and --version are not errors.
            if !e.use_stderr() {
                let _ = e.print();
                return process::EXIT_OK;
            }
            let argv: Vec<String> = std::env::args().collect();
            let message = crate::config::usage_message(&e, &argv);
            if argv.iter().any(|a| a == "--doctor") {
                // The doctor still answers in JSON, with the usage error as
                // its failed check.
                println!("{}", crate::doctor::usage_report(&e, &message));
            }
            eprint!("{message}");
            return process::EXIT_USAGE;
        }
    };
    if let Some(crate::config::Command::Completions { shell }) = cli.command {
        return completions(shell);
    }
    crate::log::set_level(cli.log_level);
    crate::log::set_json(cli.log_format == crate::config::LogFormat::Json);
    let mut cfg = Config::from_cli(cli);
    if let Some(index) = process::spawned_index() {
        run_spawned_worker(cfg, index);
    }
    // Before the plugin's probe child or any worker exists: only the
    // supervisor tells systemd the service is ready.
    let notify = crate::sd_notify::take_from_env();
    if cfg.cli.doctor {
        return crate::doctor::run(&cfg, &notify);
    }
    if let Some(message) = notify.unusable_message() {
        crate::log::warn(format_args!("{message}"));
    }
    let notify = match notify {
        crate::sd_notify::Found::Socket(n) => Some(n),
        _ => None,
    };
    // The plugin's init runs once in a throwaway process before anything
    // is bound, as the doctor runs it: an application that cannot start
    // (a typo in the app spec, a missing module) is reported once, with
    // its traceback, and the server exits as the workers would have,
    // instead of every worker printing it while the supervisor respawns
    // them.
    let mut findings = checks::run(&cfg, true);
    for warning in findings.checks.iter().filter(|c| c.warning) {
        crate::log::warn(format_args!(
            "{}; {}",
            warning.detail,
            warning.fix.as_deref().unwrap_or("")
        ));
    }
    if let Some(failed) = findings.failure() {
        return refuse(failed);
    }
    cfg.api_keys = findings.api_keys.take().map(std::sync::Arc::new);
    crate::auth::scrub_keys(&mut cfg.cli.api_key);
    if let Some(keys) = &cfg.api_keys {
        crate::log::info(format_args!(
            "API keys: {}; open without one: the health path, the metrics listener{}",
            keys.describe(),
            keys.open_paths()
                .iter()
                .map(|p| format!(", {p}"))
                .collect::<String>()
        ));
        if findings
            .mode
            .as_ref()
            .is_some_and(|(m, _)| *m == process::Mode::Fork)
        {
            // SAFETY: the supervisor has no other thread; forked workers
            // inherit the keys themselves and need no variable.
            unsafe { crate::auth::scrub_environment() };
        }
    }
    let Some(addr) = findings.addr else {
        return process::EXIT_STARTUP;
    };
    let mut inherited = false;
    let bound = match crate::listener::inherited() {
        Ok(Some(fd)) => {
            inherited = true;
            crate::log::info(format_args!(
                "socket activation: serving the listener systemd passed (descriptor 3); --host and --port do not apply"
            ));
            Ok(fd)
        }
        Ok(None) => crate::listener::bind(addr, cfg.cli.backlog),
        Err(e) => Err(e),
    };
    let listener = match bound {
        Ok(fd) => fd,
        Err(e) => {
            checks::record_bind(&mut findings, Err(e));
            return refuse(findings.failure().expect("just recorded a failure"));
        }
    };
    if let Err(e) = crate::listener::limit_unsent(&listener) {
        // A kernel without TCP_NOTSENT_LOWAT (before 3.12) serves as before.
        crate::log::debug(format_args!("TCP_NOTSENT_LOWAT not set: {e}"));
    }
    let bound = crate::listener::local_addr(&listener).unwrap_or(addr);
    let (Some(plugin_path), Some(descriptor), Some((mode, mode_reason))) =
        (findings.plugin_path, findings.descriptor, findings.mode)
    else {
        return process::EXIT_STARTUP;
    };
    let plan = Plan {
        workers: cfg.cli.workers,
        mode,
        mode_reason,
        plugin_path,
        plugin_name: descriptor.name,
        addr: bound,
        listener_inherited: inherited,
    };
    let metrics = match cfg.cli.metrics {
        Some(at) => match crate::listener::bind(at, 128) {
            Ok(fd) => {
                // Port 0 takes any free port; this line says which.
                let bound = crate::listener::local_addr(&fd).unwrap_or(at);
                crate::log::info(format_args!(
                    "metrics: serving http://{}/metrics",
                    crate::listener::fmt_addr(bound)
                ));
                Some(fd)
            }
            Err(e) => {
                crate::log::error(format_args!(
                    "--metrics {at}: {}; pass a free address and port to --metrics, or drop it",
                    e.message
                ));
                return process::EXIT_STARTUP;
            }
        },
        None => None,
    };
    supervisor::run(&cfg, &plan, listener, metrics, notify)
}

/// The doctor's probe child: the plugin's init with the arguments the
/// first forked worker would get, from this process's own command line.
fn init_in_probe(plugin: &Plugin) -> Result<Calls, PluginError> {
    let cli = Cli::from_env().map_err(|e| PluginError {
        exit_code: process::EXIT_USAGE,
        message: e.to_string(),
        fix: None,
    })?;
    let cfg = Config::from_cli(cli);
    // As the first worker: pinned first when --cpu-affinity asks, so that a
    // runtime sizing itself from the mask reports what worker 0 will run.
    let mask = crate::topology::affinity_list();
    let mut sharing = cfg.cli.workers as usize;
    if cfg.cli.cpu_affinity > 0 {
        let _ = crate::topology::pin(&crate::topology::worker_cpus(
            &mask,
            0,
            cfg.cli.cpu_affinity,
        ));
        sharing =
            crate::topology::workers_per_cpu(mask.len(), cfg.cli.workers, cfg.cli.cpu_affinity);
    }
    let usable = crate::topology::usable_cpus();
    let batching =
        worker::pool::batching::decide(&plugin.descriptor, cfg.cli.no_batch, cfg.cli.batch_wait);
    let plan = worker::pool::sizing::plan(
        &plugin.descriptor,
        cfg.cli.blocking_threads,
        usable,
        sharing,
        batching.limits.is_some(),
    );
    let host = cfg.cli.host.clone();
    let args = InitArgsOwned::new(
        &cfg,
        0,
        false,
        plan.initial as u32,
        plan.max as u32,
        &host,
        cfg.cli.port,
    );
    plugin.init(&crate::plugin::host::HOST, &args.args)
}

fn refuse(check: &checks::Check) -> i32 {
    match &check.fix {
        Some(fix) => crate::log::error(format_args!("{}; {fix}", check.detail)),
        None => crate::log::error(format_args!("{}", check.detail)),
    }
    check.exit.unwrap_or(process::EXIT_STARTUP)
}

/// `m0serve completions SHELL`: the script on standard output.
fn completions(shell: clap_complete::Shell) -> i32 {
    use clap::CommandFactory;
    let mut out = std::io::stdout().lock();
    clap_complete::generate(shell, &mut Cli::command(), "m0serve", &mut out);
    match std::io::Write::flush(&mut out) {
        Ok(()) => process::EXIT_OK,
        Err(e) => {
            eprintln!("m0serve: cannot write the completion script: {e}");
            process::EXIT_STARTUP
        }
    }
}

fn run_spawned_worker(mut cfg: Config, index: u32) -> ! {
    crate::log::set_role(format!("worker {index}"));
    let fail = |message: String| -> ! {
        crate::log::error(format_args!("{message}"));
        process::exit_now(process::EXIT_REFUSED)
    };
    // The supervisor checked the same sources before it started us.
    match crate::auth::load(cfg.cli.key_sources()) {
        Ok(keys) => cfg.api_keys = keys.map(std::sync::Arc::new),
        Err(e) => fail(format!("{}; {}", e.problem, e.fix)),
    }
    crate::auth::scrub_keys(&mut cfg.cli.api_key);
    // SAFETY: this process has no other thread yet.
    unsafe { crate::auth::scrub_environment() };
    let cfg = &cfg;
    let handed = process::adopt(cfg.cli.workers as usize).unwrap_or_else(|e| fail(e));
    worker::run(
        cfg,
        WorkerSetup {
            index,
            workers: cfg.cli.workers,
            listener_fd: handed.listener,
            ready_fd: Some(handed.ready),
            spawned: true,
            plugin_path: handed.plugin_path,
            share: handed.share.map(|s| worker::ShareFds {
                page: s.page,
                recv: s.recv,
                sends: s.sends,
            }),
            metrics: handed
                .metrics
                .map(|(page, listener_fd)| worker::MetricsFds { page, listener_fd }),
            others_serve: handed.others_serve,
        },
    )
}
