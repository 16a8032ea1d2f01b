//! The startup checks, in order. One list, two callers: the server refuses
//! by the first failed check before it binds, and `--doctor` prints the same
//! list and exits with the first failure's code, so the two cannot disagree.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use crate::config::Config;
use crate::listener::BindError;
use crate::plugin::descriptor::ProcessLock;
use crate::plugin::{Descriptor, probe, resolve};
use crate::process::{EXIT_OK, EXIT_REFUSED, EXIT_STARTUP, EXIT_USAGE, Mode};
use crate::worker::pool::batching;
use crate::worker::pool::sizing::{self, PoolPlan};

/// How long a plugin may take to load in the probe.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);
/// With the plugin's init: it may load or compile a model (MAX compiles
/// for minutes on a cold cache).
const INIT_PROBE_TIMEOUT: Duration = Duration::from_secs(600);

#[derive(Debug, Clone)]
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
    /// For failures and warnings: what to change.
    pub fix: Option<String>,
    /// For failures: the exit code.
    pub exit: Option<i32>,
    /// A warning: reported, never fails.
    pub warning: bool,
}

impl Check {
    fn pass(name: &'static str, detail: impl Into<String>) -> Check {
        Check {
            name,
            ok: true,
            detail: detail.into(),
            fix: None,
            exit: None,
            warning: false,
        }
    }
    fn fail(
        name: &'static str,
        exit: i32,
        detail: impl Into<String>,
        fix: impl Into<String>,
    ) -> Check {
        Check {
            name,
            ok: false,
            detail: detail.into(),
            fix: Some(fix.into()),
            exit: Some(exit),
            warning: false,
        }
    }
    fn warn(name: &'static str, detail: impl Into<String>, fix: impl Into<String>) -> Check {
        Check {
            name,
            ok: true,
            detail: detail.into(),
            fix: Some(fix.into()),
            exit: None,
            warning: true,
        }
    }
}

/// Everything the checks found out, for the server and the doctor.
#[derive(Debug, Default)]
pub struct Findings {
    pub checks: Vec<Check>,
    pub addr: Option<SocketAddr>,
    pub plugin_path: Option<PathBuf>,
    pub descriptor: Option<Descriptor>,
    pub mode: Option<(Mode, String)>,
    pub pool: Option<PoolPlan>,
    pub batching: Option<batching::Plan>,
    pub usable_cpus: usize,
    /// The facts the plugin stated in that init (`M0Host::fact`).
    pub facts: Vec<(String, String)>,
    /// `--api-key` and friends, loaded (never printed).
    pub api_keys: Option<crate::auth::ApiKeys>,
}

impl Findings {
    /// The value of the fact the plugin stated under `key`.
    pub fn fact(&self, key: &str) -> Option<&str> {
        self.facts
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }

    /// The first failed check.
    pub fn failure(&self) -> Option<&Check> {
        self.checks.iter().find(|c| !c.ok)
    }

    pub fn exit_code(&self) -> i32 {
        self.failure().and_then(|c| c.exit).unwrap_or(EXIT_OK)
    }

    fn push(&mut self, check: Check) -> bool {
        let ok = check.ok;
        self.checks.push(check);
        ok
    }
}

/// Run every check up to the first failure. The port check is left to the
/// caller: the server binds for real, the doctor binds and releases.
/// `with_init` (the doctor) also runs the plugin's init in the probe; the
/// server's workers run it for real and exit with the same code.
pub fn run(cfg: &Config, with_init: bool) -> Findings {
    let cli = &cfg.cli;
    let mut f = Findings {
        usable_cpus: crate::topology::usable_cpus(),
        ..Findings::default()
    };

    let ip = match crate::listener::parse_host(&cli.host) {
        Ok(ip) => ip,
        Err(e) => {
            f.push(Check::fail(
                "host",
                EXIT_USAGE,
                e,
                "pass --host with an IP address",
            ));
            return f;
        }
    };
    f.addr = Some(SocketAddr::new(ip, cli.port));
    f.push(Check::pass(
        "host",
        format!(
            "listen on {}",
            crate::listener::fmt_addr(SocketAddr::new(ip, cli.port))
        ),
    ));
    if cli.cpu_affinity > 0 && !f.push(cpu_affinity_check(cli.cpu_affinity, cli.workers)) {
        return f;
    }

    if !cli.app_dir.is_dir() {
        f.push(Check::fail(
            "app-dir",
            EXIT_STARTUP,
            format!("--app-dir {} is not a directory", cli.app_dir.display()),
            "pass --app-dir with an existing directory (default: the current directory)",
        ));
        return f;
    }
    f.push(Check::pass("app-dir", cli.app_dir.display().to_string()));

    if let Some(venv) = &cli.venv
        && let Some(problem) = venv_problem(venv)
    {
        f.push(Check::fail(
            "venv",
            EXIT_REFUSED,
            format!("{} {}: {problem}", venv_source(), venv.display()),
            "create it with python3.11 -m venv PATH and pass that path, or drop the setting \
             (the plugin then uses $VIRTUAL_ENV, else the Python it was built with)",
        ));
        return f;
    }

    if let Some(path) = cli.access_log.as_deref().filter(|p| *p != "-") {
        // Opened (and created) here as the workers will open it, so a path
        // that cannot be written stops the start instead of every worker.
        if let Err(e) = crate::worker::access_log::open_append(path) {
            f.push(Check::fail(
                "access-log",
                EXIT_REFUSED,
                format!("--access-log {path} cannot be opened for appending: {e}"),
                "pass a writable file (its directory must exist), or - for standard output",
            ));
            return f;
        }
    }

    match crate::auth::load(cli.key_sources()) {
        Ok(Some(keys)) => {
            f.push(Check::pass("api-keys", keys.describe()));
            if keys.from_command_line() {
                f.push(Check::warn(
                    "api-keys",
                    "--api-key on the command line: other users of this machine see it in ps",
                    "pass the keys in --api-key-file (chmod 600) or M0_API_KEY instead",
                ));
            }
            f.api_keys = Some(keys);
        }
        Ok(None) => {}
        Err(e) => {
            f.push(Check::fail("api-keys", EXIT_REFUSED, e.problem, e.fix));
            return f;
        }
    }

    let Some(spec) = cli.plugin.as_deref() else {
        f.push(Check::fail(
            "plugin",
            EXIT_USAGE,
            "no plugin given",
            "pass --plugin with a path or a short name, e.g. --plugin hello_c",
        ));
        return f;
    };
    let path = std::env::var_os(crate::process::ENV_PLUGIN_FILE).map(PathBuf::from);
    let path = match path.map(Ok).unwrap_or_else(|| resolve(spec)) {
        Ok(p) => p,
        Err(e) => {
            let fix = e
                .fix
                .unwrap_or_else(|| "build the plugin or fix the path".into());
            f.push(Check::fail("plugin", e.exit_code, e.message, fix));
            return f;
        }
    };
    f.push(Check::pass(
        "plugin",
        format!("{spec} resolves to {}", path.display()),
    ));
    f.plugin_path = Some(path.clone());

    let report = if with_init {
        probe::probe_with_init(&path, INIT_PROBE_TIMEOUT)
    } else {
        probe::Report {
            descriptor: probe::probe(&path, PROBE_TIMEOUT),
            init: None,
            facts: Vec::new(),
            handle_batch: None,
        }
    };
    f.facts = report.facts;
    let handle_batch = report.handle_batch;
    let descriptor = match report.descriptor {
        Ok(d) => d,
        Err(e) => {
            let fix = e
                .fix
                .unwrap_or_else(|| "rebuild the plugin against include/m0serve.h".into());
            f.push(Check::fail("plugin-abi", e.exit_code, e.message, fix));
            return f;
        }
    };
    f.push(Check::pass(
        "plugin-abi",
        format!(
            "{} {} speaks ABI {}.{}",
            descriptor.name, descriptor.version, descriptor.abi_major, descriptor.abi_minor
        ),
    ));
    if cli.args.len() > 1 && descriptor.abi_minor < 6 {
        // Before 1.6 a plugin sees only the first ARG: the rest would be
        // dropped without a word.
        f.push(Check::fail(
            "plugin-args",
            EXIT_REFUSED,
            format!(
                "plugin {} takes one ARG (it is built for m0serve ABI {}.{}; several ARGs \
                 need 1.6), and the command line gives {}: {}",
                descriptor.name,
                descriptor.abi_major,
                descriptor.abi_minor,
                cli.args.len(),
                cli.args.join(" ")
            ),
            "pass one ARG after --plugin, or rebuild the plugin against this m0serve's \
             include/m0serve.h to take several",
        ));
        f.descriptor = Some(descriptor);
        return f;
    }
    match report.init {
        Some(Err(e)) => {
            let fix = e.fix.unwrap_or_else(|| {
                if e.exit_code == EXIT_REFUSED {
                    "change the configuration the plugin names".into()
                } else {
                    "fix the application or its arguments".into()
                }
            });
            f.push(Check::fail("plugin-init", e.exit_code, e.message, fix));
            f.descriptor = Some(descriptor);
            return f;
        }
        Some(Ok(())) => {
            f.push(Check::pass(
                "plugin-init",
                "the plugin started in a throwaway process",
            ));
        }
        None => {}
    }

    let mode = if cli.spawn_workers {
        (Mode::Spawn, "--spawn-workers".to_string())
    } else if descriptor.needs_exec {
        (
            Mode::Spawn,
            format!(
                "plugin {} must start in a freshly exec'd process",
                descriptor.name
            ),
        )
    } else {
        (Mode::Fork, "default".to_string())
    };
    f.push(Check::pass(
        "worker-mode",
        format!(
            "{} ({})",
            if mode.0 == Mode::Spawn {
                "spawn"
            } else {
                "fork"
            },
            mode.1
        ),
    ));
    f.mode = Some(mode);

    let fork_unsafe = f
        .fact("python.fork_unsafe_modules")
        .filter(|v| !v.is_empty())
        .map(str::to_string);
    // Runtimes that do not survive fork() (torch, grpc, MAX) are safe here
    // in either mode: a worker starts Python and imports them only after
    // its fork, from a supervisor that never loaded them, and nothing
    // forks a worker afterwards. Said, so a user who knows the warning
    // from gunicorn's `--preload` need not wonder.
    if let Some(modules) = fork_unsafe {
        f.push(Check::pass(
            "fork-unsafe-runtime",
            format!(
                "the application imports {modules}, which does not survive fork(); each worker \
                 imports it after its own fork, from a supervisor that never loads it, so \
                 forked workers are safe (no --spawn-workers needed)"
            ),
        ));
    }
    let mut batch_plan = batching::decide(&descriptor, cli.no_batch, cli.batch_wait);
    // Known only after an init; without one, as declared.
    batch_plan.require_entry_point(handle_batch.unwrap_or(true));
    // Pinned workers plan for their own CPUs and the workers beside them.
    let (worker_cpus, sharing) = match cli.cpu_affinity {
        0 => (f.usable_cpus, cli.workers as usize),
        n => {
            let mask = crate::topology::affinity_list().len();
            (
                f.usable_cpus.min(n as usize),
                crate::topology::workers_per_cpu(mask, cli.workers, n),
            )
        }
    };
    let plan = sizing::plan(
        &descriptor,
        cli.blocking_threads,
        worker_cpus,
        sharing,
        batch_plan.limits.is_some(),
    );
    f.batching = Some(batch_plan);
    f.push(Check::pass("handler-threads", plan.reason.clone()));
    if descriptor.process_lock == ProcessLock::Held && !plan.adaptive && plan.initial > 2 {
        f.push(Check::warn(
            "lock-held-pool",
            format!(
                "plugin {} holds a process-wide lock for each call, and --blocking-threads {} gives it more \
                 threads than can ever run at once",
                descriptor.name, plan.initial
            ),
            "use --blocking-threads 1 or 2 (or leave it unset), and scale with --workers",
        ));
    }
    if descriptor.compute_threads > 1 && cli.workers as usize > f.usable_cpus {
        f.push(Check::warn(
            "workers-vs-cpus",
            format!(
                "{} workers on {} usable CPUs, and plugin {} computes with {} threads per call",
                cli.workers, f.usable_cpus, descriptor.name, descriptor.compute_threads
            ),
            "use at most as many --workers as usable CPUs",
        ));
    }
    f.pool = Some(plan);
    f.descriptor = Some(descriptor);
    f
}

/// Record the outcome of binding (or the doctor's trial bind).
pub fn record_bind(f: &mut Findings, result: Result<SocketAddr, BindError>) {
    let check = match result {
        Ok(addr) => Check::pass(
            "port",
            format!("{} is free", crate::listener::fmt_addr(addr)),
        ),
        Err(e) => Check::fail("port", e.exit_code, e.message, e.fix),
    };
    f.push(check);
}

/// What is wrong with a `--venv` path, if anything: it must be a folder
/// with the `pyvenv.cfg` that `python -m venv` writes.
/// `--cpu-affinity N` (N > 0): refused when it asks for more CPUs than
/// the server may run on; otherwise says where each worker runs.
fn cpu_affinity_check(per_worker: u32, workers: u32) -> Check {
    let mask = crate::topology::affinity_list();
    if per_worker as usize > mask.len() {
        return Check::fail(
            "cpu-affinity",
            EXIT_REFUSED,
            format!(
                "--cpu-affinity {per_worker} (M0_CPU_AFFINITY) asks for {per_worker} CPUs per worker, but the \
                 server may run on {} (CPUs {})",
                mask.len(),
                crate::topology::fmt_cpus(&mask)
            ),
            format!(
                "pass --cpu-affinity {} or less, or 0 to leave the workers unpinned",
                mask.len()
            ),
        );
    }
    let shown = workers.min(8);
    let mut each: Vec<String> = (0..shown)
        .map(|i| {
            let cpus = crate::topology::worker_cpus(&mask, i, per_worker);
            format!("worker {i} on CPU(s) {}", crate::topology::fmt_cpus(&cpus))
        })
        .collect();
    if workers > shown {
        each.push(format!("and {} more, in turn", workers - shown));
    }
    Check::pass("cpu-affinity", each.join("; "))
}

fn venv_problem(venv: &Path) -> Option<&'static str> {
    if !venv.exists() {
        Some("no such directory")
    } else if !venv.is_dir() {
        Some("not a directory")
    } else if !venv.join("pyvenv.cfg").is_file() || !venv.join("bin").is_dir() {
        Some("not a Python virtual environment (no pyvenv.cfg and bin/)")
    } else {
        None
    }
}

/// The flag or the variable that set `--venv`, as the user gave it.
fn venv_source() -> &'static str {
    let on_command_line = std::env::args().any(|a| a == "--venv" || a.starts_with("--venv="));
    if on_command_line || std::env::var_os("M0_VENV").is_none() {
        "--venv"
    } else {
        "M0_VENV"
    }
}
