//! A worker process: opens the plugin, starts the handler pool, runs the
//! event loop on the shared listener, drains on SIGTERM, and exits.
//!
//! Where plugin code runs (every call goes through `plugin::call::serve`):
//!
//! | thread | when | why |
//! |---|---|---|
//! | a handler thread (`pool.rs`) | by default | a call may block or compute for long; the loop must keep serving the other connections |
//! | the event loop's thread: inline calls (`event_loop/inline.rs`) | the plugin declares `M0_CAP_INLINE` (its handler never blocks), is reentrant and uncapped, and `--no-inline` is not given | no hand-off at all; a request it would block on comes back as `M0_DEFER` and goes to the pool |
//! | the thread leading the loop: loop calls (`event_loop/loop_calls/`) | any other reentrant, uncapped plugin, while no handler thread is busy; on a worker with CPUs to spare, while the adaptive controller measures that they serve more than the pool alone (`pool/adaptive/mode.rs`) | one thread reads, calls and writes, as bjoern does; a call that blocks for 2 ms or computes for 8 ms has an idle handler thread take the loop over |
//!
//! Thread hooks (`thread_start`, `thread_stop`) run on each of those threads
//! before its first call and after its last.
//!
//! The parts use each other one way: the event loop (`event_loop/`, with
//! inline and loop calls) uses the handler pool (`pool.rs` and `pool/`:
//! the threads, their sizing, the adaptive controller, the batch former,
//! the watcher of loop calls), and the pool never names the loop. The
//! controller reads and moves the pool through its `Tunable` seam, which
//! the loop implements over the pool, its loop calls and the shared page
//! (`event_loop/tunable.rs`).
//!
//! A worker leaves through `process::exit_now` (`_exit`, for the reason
//! given there).

pub mod accept_share;
pub mod access_log;
pub mod connection;
pub mod event_loop;
pub mod loading;
pub mod metrics;
pub mod pool;

use std::os::fd::{FromRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::time::Duration;

use nix::sys::signal::Signal;

use crate::config::Config;
use crate::plugin::init_args::InitArgsOwned;
use crate::plugin::{Plugin, host};
use crate::process::{EXIT_OK, EXIT_REFUSED, EXIT_STARTUP};
use crate::signals::SignalPipe;
use event_loop::loop_calls;
use event_loop::{EventLoop, Exit};
use pool::{Pool, PoolSettings, adaptive, batching, sizing};

/// What a worker is given by the supervisor.
pub struct WorkerSetup {
    pub index: u32,
    pub workers: u32,
    pub listener_fd: RawFd,
    /// Written with the worker's index once it serves.
    pub ready_fd: Option<RawFd>,
    pub spawned: bool,
    pub plugin_path: PathBuf,
    /// The shared page and the accept-sharing channels.
    pub share: Option<ShareFds>,
    /// `--metrics`: the metrics page and the metrics listener.
    pub metrics: Option<MetricsFds>,
    /// Another worker was ready when this one started (a reload's
    /// predecessor, a sibling): while loading, leave the listener to it.
    pub others_serve: bool,
}

/// What a worker adopts for `--metrics`.
pub struct MetricsFds {
    pub page: crate::metrics_page::MetricsPage,
    pub listener_fd: RawFd,
}

/// What a worker adopts for accept sharing.
pub struct ShareFds {
    pub page: crate::shared_page::SharedPage,
    /// This worker's channel, receive side.
    pub recv: std::os::fd::OwnedFd,
    /// Every worker's channel, send side, by index.
    pub sends: Vec<std::os::fd::OwnedFd>,
}

/// Run the worker to the end; never returns.
pub fn run(cfg: &Config, setup: WorkerSetup) -> ! {
    crate::log::set_role(format!("worker {}", setup.index));
    let code = match serve(cfg, setup) {
        Ok(code) => code,
        Err((code, message)) => {
            crate::log::error(format_args!("{message}"));
            code
        }
    };
    crate::process::exit_now(code)
}

fn serve(cfg: &Config, mut setup: WorkerSetup) -> Result<i32, (i32, String)> {
    // A worker whose supervisor is gone (killed with SIGKILL) drains and
    // leaves instead of serving on unsupervised.
    let _ = nix::sys::prctl::set_pdeathsig(Signal::SIGTERM);
    // SIGHUP is the supervisor's (reload); a worker notes and ignores it.
    let signals = SignalPipe::install(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
    ])
    .map_err(|e| (EXIT_STARTUP, format!("cannot install signal handlers: {e}")))?;

    // Pinned before the plugin opens: runtimes size their thread pools
    // from the affinity mask when they load.
    let (pinned, sharing) = pin_to_cpus(cfg.cli.cpu_affinity, setup.index, setup.workers)?;
    let plugin = Plugin::open(&setup.plugin_path).map_err(|e| (e.exit_code, e.to_string()))?;
    // SAFETY: the supervisor handed us this listening socket's descriptor
    // (inherited across fork, or adopted by number after exec); we own it now.
    let std_listener = unsafe { std::net::TcpListener::from_raw_fd(setup.listener_fd) };
    std_listener
        .set_nonblocking(true)
        .map_err(|e| (EXIT_STARTUP, format!("listener: {e}")))?;
    let local = std_listener
        .local_addr()
        .map_err(|e| (EXIT_STARTUP, format!("listener: {e}")))?;

    let usable = crate::topology::usable_cpus();
    let mut batch_plan = batching::decide(&plugin.descriptor, cfg.cli.no_batch, cfg.cli.batch_wait);
    let plan = sizing::plan(
        &plugin.descriptor,
        cfg.cli.blocking_threads,
        usable,
        sharing,
        batch_plan.limits.is_some(),
    );
    let server_ip = local.ip().to_string();
    let init_args = InitArgsOwned::new(
        cfg,
        setup.index,
        setup.spawned,
        plan.initial as u32,
        plan.max as u32,
        &server_ip,
        local.port(),
    );
    let others = loading::Others {
        served_at_start: setup.others_serve,
        page: setup.share.as_ref().map(|s| &s.page),
    };
    let (initialised, held) = loading::during(
        &std_listener,
        cfg.cli.health_path.as_deref(),
        &cfg.limits,
        others,
        || plugin.init(&host::HOST, &init_args.args),
    );
    let calls = match initialised {
        Ok(calls) => calls,
        Err(e) => {
            loading::refuse_held(held);
            return Err((e.exit_code, e.to_string()));
        }
    };
    let listener = mio::net::TcpListener::from_std(std_listener);
    batch_plan.require_entry_point(calls.handle_batch.is_some());

    let poll = mio::Poll::new()
        .map_err(|e| (EXIT_STARTUP, format!("cannot create the event loop: {e}")))?;
    let waker = mio::Waker::new(poll.registry(), event_loop::WAKER)
        .map_err(|e| (EXIT_STARTUP, format!("cannot create the loop waker: {e}")))?;
    let loop_plan = loop_calls::decide(
        &plugin.descriptor,
        cfg.cli.no_inline,
        usable,
        sharing as u32,
        batch_plan.limits.is_some(),
        plan.adaptive,
    );
    let (inline, inline_why) = sizing::inline_calls(&plugin.descriptor, cfg.cli.no_inline);
    let pool = Pool::start(
        PoolSettings {
            threads: plan.initial,
            capacity: cfg.cli.queue_depth as usize,
            calls,
            server_ip: server_ip.clone(),
            server_port: local.port(),
            worker_index: setup.index,
            write_timeout: Config::timeout(cfg.cli.idle_timeout),
            batch: batch_plan.limits,
            max_threads: sizing::max_threads(&plan, &plugin.descriptor, inline || loop_plan.on),
            slots: sizing::call_slots(&plan, &plugin.descriptor),
        },
        waker,
    );
    let controller = adaptive::Controller::new(plan.clone(), loop_plan.measured);
    let share = setup.share.take().map(|fds| {
        accept_share::AcceptShare::new(
            fds.page,
            setup.index as usize,
            fds.recv,
            fds.sends,
            cfg.cli.accept_share,
        )
    });
    let mut event_loop = EventLoop::new(poll, listener, pool, controller, share, cfg, signals)
        .map_err(|e| (EXIT_STARTUP, format!("cannot start the event loop: {e}")))?;
    if let Some(m) = setup.metrics.take() {
        let metrics = metrics::WorkerMetrics::new(
            m.page,
            setup.index as usize,
            &plugin.descriptor.name,
            &plugin.descriptor.version,
        );
        event_loop
            .enable_metrics(metrics, m.listener_fd)
            .map_err(|e| (EXIT_STARTUP, format!("cannot serve --metrics: {e}")))?;
    }
    if let Some(path) = &cfg.cli.access_log {
        let log = access_log::AccessLog::open(path, cfg.cli.access_log_format, setup.index)
            .map_err(|e| {
                (
                    EXIT_REFUSED,
                    format!("cannot open --access-log {path}: {e}"),
                )
            })?;
        event_loop.set_access_log(log);
    }
    for h in held {
        event_loop.admit_held(h.stream, h.peer, h.bytes);
    }
    let admission = event_loop.enable_admission(plugin.descriptor.admit);
    let loop_calls = loop_plan.on;
    if inline {
        event_loop.enable_inline().map_err(|code| {
            (
                1,
                format!("the plugin's thread_start failed on the event-loop thread (code {code})"),
            )
        })?;
    } else if loop_calls {
        event_loop.enable_loop_calls();
    }
    let on_off = |on: bool| if on { "on" } else { "off" };
    // Info says that the worker serves, and what; why it serves the way it
    // does is tuning detail, for whoever asks for debug.
    // The models the plugin registered at init (ABI 1.6), when it did.
    let served = crate::plugin::models::names();
    let models = if served.is_empty() {
        String::new()
    } else {
        format!(" (models {})", served.join(", "))
    };
    crate::log::info(format_args!(
        "pid={}{} serving {} {}{models} with {} handler thread(s)",
        std::process::id(),
        pinned,
        plugin.descriptor.name,
        plugin.descriptor.version,
        plan.initial,
    ));
    crate::log::debug(format_args!(
        "plan: {} handler thread(s) ({}); inline calls {} ({}); loop calls {} ({}); batching {}; admission {}",
        plan.initial,
        plan.reason,
        on_off(inline),
        inline_why,
        on_off(loop_calls),
        loop_plan.why,
        batch_plan.summary(),
        if admission {
            "on (the plugin admits each request before it is queued)"
        } else {
            "off"
        },
    ));
    if let Some(fd) = setup.ready_fd {
        announce_ready(fd, setup.index);
    }
    let (exit, event_loop) = if event_loop.loop_calls_enabled() {
        loop_calls::leader::run(event_loop)
    } else {
        let mut event_loop = event_loop;
        (event_loop.run(), event_loop)
    };
    let exit = exit.map_err(|e| (EXIT_STARTUP, format!("event loop failed: {e}")))?;
    let accepted = event_loop.accepted;
    if let Some((acc, passed, received)) = event_loop.share_counts() {
        crate::log::debug(format_args!(
            "accept sharing: accepted {acc}, passed {passed} to siblings, received {received}"
        ));
    }
    if let Some(line) = event_loop.admission_summary() {
        crate::log::info(format_args!("{line}"));
    }
    let call_path = event_loop.call_path();
    let pool_summary = event_loop.pool_summary();
    let pool = event_loop.into_pool();
    finish(
        exit,
        pool,
        accepted,
        batch_plan.limits.is_some(),
        &format!("{call_path}; {pool_summary}"),
    )
}

/// `--cpu-affinity`: pins this worker and says so for its start line.
/// Returns that phrase and how many workers share each of its CPUs (the
/// worker count when unpinned).
fn pin_to_cpus(
    per_worker: u32,
    index: u32,
    workers: u32,
) -> Result<(String, usize), (i32, String)> {
    if per_worker == 0 {
        return Ok((String::new(), workers as usize));
    }
    let mask = crate::topology::affinity_list();
    let cpus = crate::topology::worker_cpus(&mask, index, per_worker);
    crate::topology::pin(&cpus).map_err(|e| {
        (
            1,
            format!(
                "cannot pin worker {index} to CPU(s) {} (--cpu-affinity {per_worker}): {e}",
                crate::topology::fmt_cpus(&cpus)
            ),
        )
    })?;
    let sharing = crate::topology::workers_per_cpu(mask.len(), workers, per_worker);
    Ok((
        format!(" on CPU(s) {}", crate::topology::fmt_cpus(&cpus)),
        sharing,
    ))
}

fn finish(
    exit: Exit,
    mut pool: Pool,
    accepted: u64,
    batching: bool,
    call_path: &str,
) -> Result<i32, (i32, String)> {
    let completed = pool.stats().completed.load(Ordering::Relaxed);
    let per_request = |ns: u64| ns as f64 / completed.max(1) as f64 / 1000.0;
    let (_, threads) = pool.size();
    crate::log::debug(format_args!(
        "handler pool: {threads} thread(s) at the end; per request {:.1} us queued, {:.1} us in the plugin; \
         {} lock wait(s) totalling {:.1} ms; {} refused with 503; {} answered inline ({} spilled), {} deferred to the pool; {} loop call(s), {} handed over; {call_path}",
        per_request(pool.stats().queue_wait_ns.load(Ordering::Relaxed)),
        per_request(pool.stats().service_ns.load(Ordering::Relaxed)),
        host::LOCK_WAITS.load(Ordering::Relaxed),
        host::LOCK_WAIT_NS.load(Ordering::Relaxed) as f64 / 1e6,
        pool.stats().refused.load(Ordering::Relaxed),
        pool.stats().inline_served.load(Ordering::Relaxed),
        pool.stats().spilled.load(Ordering::Relaxed),
        pool.stats().deferred.load(Ordering::Relaxed),
        pool.stats().loop_calls.load(Ordering::Relaxed),
        pool.stats().handoffs.load(Ordering::Relaxed),
    ));
    if batching {
        crate::log::info(format_args!("{}", pool.stats().batches.summary()));
    }
    let code = match exit {
        Exit::Drained => EXIT_OK,
        Exit::Immediate if pool::fatal_stop_requested() => {
            return Err((EXIT_STARTUP, "a handler thread could not start".into()));
        }
        Exit::Immediate => return Ok(EXIT_OK),
        Exit::DeadlinePassed(n) => {
            // Its threads are inside the plugin and stay there: waiting for
            // them would stretch the timeout the user set.
            crate::log::warn(format_args!(
                "graceful timeout reached with {n} request(s) still in flight; cutting them off"
            ));
            return Ok(crate::process::EXIT_GRACEFUL_TIMEOUT);
        }
    };
    let left = pool.stop(Duration::from_secs(5));
    if left > 0 {
        crate::log::warn(format_args!(
            "{left} handler thread(s) still inside the plugin 5 s after the drain; exiting without them"
        ));
    }
    // shutdown_plugin is only safe once no thread is inside the plugin.
    if left == 0 {
        pool.shutdown_plugin();
        let stats = pool.stats();
        let served = completed
            + stats.inline_served.load(Ordering::Relaxed)
            + stats.loop_calls.load(Ordering::Relaxed);
        crate::log::info(format_args!(
            "drained: {accepted} connection(s) accepted, {served} request(s) served"
        ));
    }
    Ok(code)
}

fn announce_ready(fd: RawFd, index: u32) {
    let bytes = index.to_le_bytes();
    // SAFETY: writing 4 bytes from a local array to the supervisor's pipe;
    // a write of at most PIPE_BUF bytes is atomic.
    unsafe { libc::write(fd, bytes.as_ptr().cast(), bytes.len()) };
    // SAFETY: the descriptor is ours and used only here.
    unsafe { libc::close(fd) };
}
