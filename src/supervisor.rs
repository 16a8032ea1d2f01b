//! The supervisor: starts the workers, watches them, replaces the ones that
//! die, and stops them on a signal. Single-threaded and small; it never
//! opens a plugin.
//!
//! Workers are forked (default) or forked and at once exec'd
//! (`--spawn-workers`, or a plugin that declares it needs a fresh process);
//! the exec, and what a spawned worker is handed, is `process::spawn`.

use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::signal::{Signal, kill};
use nix::sys::wait::{WaitPidFlag, WaitStatus, waitpid};
use nix::unistd::{ForkResult, Pid, fork};

use crate::config::Config;
use crate::metrics_page::{Death, MetricsPage};
use crate::process::{
    self, EXIT_GRACEFUL_TIMEOUT, EXIT_OK, EXIT_REFUSED, EXIT_STARTUP, Handover, Mode,
};
use crate::sd_notify::{self, Notifier};
use crate::shared_page::{LEAVING, SharedPage};
use crate::signals::{STOP_SIGNALS, SignalPipe};
use crate::worker::{self, WorkerSetup};
use std::sync::atomic::Ordering;

/// A death within this long of the start counts as a rapid crash.
const RAPID: Duration = Duration::from_secs(1);
const RAPID_LIMIT: u32 = 5;

pub struct Plan {
    pub workers: u32,
    pub mode: Mode,
    /// Why this mode, for the banner.
    pub mode_reason: String,
    pub plugin_path: PathBuf,
    pub plugin_name: String,
    pub addr: std::net::SocketAddr,
    /// The listener came from systemd (socket activation): it outlives
    /// this server, and the next one takes over its backlog.
    pub listener_inherited: bool,
}

struct Slot {
    pid: Option<Pid>,
    started: Instant,
    ready: bool,
}

struct Supervisor<'a> {
    cfg: &'a Config,
    plan: &'a Plan,
    /// Closed when a full stop begins (see `begin_stop`).
    listener: Option<OwnedFd>,
    ready_read: OwnedFd,
    ready_write: OwnedFd,
    signals: SignalPipe,
    /// The shared page and each worker's channel (receive, send), created
    /// once so a respawned worker takes over its predecessor's channel.
    share: Option<(SharedPage, Vec<(OwnedFd, OwnedFd)>)>,
    /// `--metrics`: the page every worker counts into, and its listener
    /// (closed with the main one when a full stop begins).
    metrics: Option<(MetricsPage, Option<OwnedFd>)>,
    slots: Vec<Slot>,
    /// Replaced by SIGHUP, draining; not respawned.
    retiring: Vec<Pid>,
    stopping: Option<Instant>,
    announced: bool,
    respawns: u32,
    rapid_deaths: u32,
    exit_code: i32,
    /// SIGHUP: slots still to replace, and the one waiting for its new worker.
    reload_queue: Vec<usize>,
    reload_waiting: Option<(usize, Pid)>,
    /// While a reload starts a replacement: the worker it replaces was
    /// ready (and serves until the replacement is).
    replacing_ready: bool,
    /// `NOTIFY_SOCKET`: systemd, told of readiness, reloads and the stop.
    notify: Option<Notifier>,
    /// A SIGHUP told systemd `RELOADING=1` and owes it a `READY=1`.
    reloading: bool,
}

/// Run the workers until stopped; returns the process exit code.
pub fn run(
    cfg: &Config,
    plan: &Plan,
    listener: OwnedFd,
    metrics: Option<OwnedFd>,
    notify: Option<Notifier>,
) -> i32 {
    crate::log::set_role("supervisor".into());
    let signals = match SignalPipe::install(&[
        Signal::SIGTERM,
        Signal::SIGINT,
        Signal::SIGQUIT,
        Signal::SIGHUP,
        Signal::SIGCHLD,
    ]) {
        Ok(s) => s,
        Err(e) => {
            crate::log::error(format_args!("cannot install signal handlers: {e}"));
            return EXIT_STARTUP;
        }
    };
    let (ready_read, ready_write) = match nix::unistd::pipe2(OFlag::O_CLOEXEC | OFlag::O_NONBLOCK) {
        Ok(p) => p,
        Err(e) => {
            crate::log::error(format_args!("cannot create the ready pipe: {e}"));
            return EXIT_STARTUP;
        }
    };
    let mode = match plan.mode {
        Mode::Fork => "fork",
        Mode::Spawn => "spawn",
    };
    crate::log::info(format_args!(
        "pid={} starting {} worker(s) in {mode} mode ({})",
        std::process::id(),
        plan.workers,
        plan.mode_reason
    ));
    let metrics = match metrics.map(|l| MetricsPage::create(plan.workers as usize).map(|p| (p, l)))
    {
        Some(Err(e)) => {
            crate::log::error(format_args!("cannot create the metrics page: {e}"));
            return EXIT_STARTUP;
        }
        Some(Ok((page, listener))) => Some((page, Some(listener))),
        None => None,
    };
    let now = Instant::now();
    let mut sup = Supervisor {
        cfg,
        plan,
        listener: Some(listener),
        ready_read,
        ready_write,
        signals,
        share: create_share(plan.workers as usize),
        metrics,
        slots: (0..plan.workers)
            .map(|_| Slot {
                pid: None,
                started: now,
                ready: false,
            })
            .collect(),
        retiring: Vec::new(),
        stopping: None,
        announced: false,
        respawns: 0,
        rapid_deaths: 0,
        exit_code: EXIT_OK,
        reload_queue: Vec::new(),
        reload_waiting: None,
        replacing_ready: false,
        notify,
        reloading: false,
    };
    for index in 0..plan.workers as usize {
        if sup.stopping.is_some() {
            break;
        }
        sup.start_worker(index);
    }
    sup.watch()
}

impl Supervisor<'_> {
    fn start_worker(&mut self, index: usize) -> Option<Pid> {
        let started = match self.plan.mode {
            Mode::Fork => self.fork_worker(index),
            Mode::Spawn => self.spawn_worker(index),
        };
        match started {
            Ok(pid) => {
                if let Some((page, _)) = &self.metrics {
                    page.worker_started(index);
                }
                crate::log::info(format_args!("worker {index} pid={pid} started"));
                self.slots[index] = Slot {
                    pid: Some(pid),
                    started: Instant::now(),
                    ready: false,
                };
                Some(pid)
            }
            Err((code, message)) => {
                crate::log::error(format_args!("cannot start worker {index}: {message}"));
                self.begin_stop(code);
                None
            }
        }
    }

    /// Whether a worker other than the one about to start in `index` is
    /// serving: a ready sibling, or the predecessor a reload replaces (it
    /// serves until its replacement is ready).
    fn others_serve(&self, index: usize) -> bool {
        let sibling = self
            .slots
            .iter()
            .enumerate()
            .any(|(j, s)| j != index && s.ready && s.pid.is_some());
        sibling || self.replacing_ready
    }

    /// The listening socket, while the server is not stopping.
    fn listener(&self) -> Result<&OwnedFd, (i32, String)> {
        self.listener.as_ref().ok_or((
            EXIT_STARTUP,
            "the server is stopping: no worker is started".to_string(),
        ))
    }

    fn fork_worker(&mut self, index: usize) -> Result<Pid, (i32, String)> {
        let listener_fd = self.listener()?.as_raw_fd();
        // SAFETY: the supervisor is single-threaded, so the child may run
        // ordinary code after fork.
        match unsafe { fork() } {
            Ok(ForkResult::Parent { child }) => Ok(child),
            Ok(ForkResult::Child) => {
                crate::signals::reset_to_default(&STOP_SIGNALS);
                let setup = WorkerSetup {
                    index: index as u32,
                    workers: self.plan.workers,
                    listener_fd,
                    ready_fd: Some(self.ready_write.as_raw_fd()),
                    spawned: false,
                    plugin_path: self.plan.plugin_path.clone(),
                    share: self.share_for(index),
                    metrics: self.metrics_for(),
                    others_serve: self.others_serve(index),
                };
                worker::run(self.cfg, setup)
            }
            Err(e) => Err((EXIT_STARTUP, format!("fork failed: {e}"))),
        }
    }

    fn spawn_worker(&mut self, index: usize) -> Result<Pid, (i32, String)> {
        process::spawn(&Handover {
            index,
            workers: self.slots.len(),
            listener: self.listener()?,
            ready: &self.ready_write,
            share: self
                .share
                .as_ref()
                .map(|(page, channels)| (page, channels.as_slice())),
            metrics: self
                .metrics
                .as_ref()
                .and_then(|(page, listener)| Some((page, listener.as_ref()?))),
            plugin_path: &self.plan.plugin_path,
            others_serve: self.others_serve(index),
        })
    }

    fn watch(&mut self) -> i32 {
        use nix::poll::{PollFd, PollFlags, PollTimeout, poll};
        use std::os::fd::BorrowedFd;
        loop {
            self.reap();
            self.read_ready();
            if let Some(code) = self.finished() {
                return code;
            }
            if let Some(deadline) = self.stopping
                && Instant::now() >= deadline
            {
                self.kill_stragglers();
            }
            let sig_fd = self.signals.read_fd();
            let ready_fd = self.ready_read.as_raw_fd();
            // SAFETY: both descriptors are owned by self and stay open.
            let (a, b) = unsafe {
                (
                    BorrowedFd::borrow_raw(sig_fd),
                    BorrowedFd::borrow_raw(ready_fd),
                )
            };
            let mut fds = [
                PollFd::new(a, PollFlags::POLLIN),
                PollFd::new(b, PollFlags::POLLIN),
            ];
            let _ = poll(&mut fds, PollTimeout::from(200u16));
            for signo in self.signals.drain() {
                self.on_signal(signo);
            }
        }
    }

    fn on_signal(&mut self, signo: i32) {
        match Signal::try_from(signo) {
            Ok(Signal::SIGTERM | Signal::SIGINT | Signal::SIGQUIT) => {
                if self.stopping.is_some() {
                    crate::log::info(format_args!(
                        "second stop signal: stopping the workers at once"
                    ));
                    self.signal_all(Signal::SIGTERM);
                } else {
                    crate::log::info(format_args!(
                        "stopping: workers finish the requests in flight"
                    ));
                    self.begin_stop(EXIT_OK);
                }
            }
            Ok(Signal::SIGHUP) if self.stopping.is_none() => {
                crate::log::info(format_args!("SIGHUP: replacing the workers one at a time"));
                // Before the first READY=1 systemd still counts the service
                // as starting: a reload then is no reload to it.
                if self.announced && !self.reloading {
                    self.reloading = true;
                    self.notify(&format!(
                        "RELOADING=1\nMONOTONIC_USEC={}\nSTATUS=reloading: replacing the workers one at a time",
                        sd_notify::monotonic_usec()
                    ));
                }
                self.reload_queue = (0..self.slots.len()).rev().collect();
                self.next_reload();
            }
            _ => {}
        }
    }

    fn begin_stop(&mut self, code: i32) {
        if self.exit_code == EXIT_OK {
            self.exit_code = code;
        }
        if self.stopping.is_some() {
            return;
        }
        self.stopping =
            Some(Instant::now() + self.cfg.cli.graceful_timeout + Duration::from_secs(2));
        self.reload_queue.clear();
        self.reloading = false;
        self.notify("STOPPING=1\nSTATUS=stopping: workers finish the requests in flight");
        // Once this copy and the workers' (each closes its own when its
        // drain begins) are gone, the kernel refuses new connections at
        // once; kept open, it would accept them into a backlog that no one
        // serves and reset them at exit. A SIGHUP reload keeps it: the new
        // workers need it.
        // Before anyone lets go of the listener, it stops completing new
        // handshakes (the workers then drain a backlog that can no longer
        // grow): a connection that completed between a worker's last
        // accept and the listener's close was reset, failing a request the
        // client had already sent. A listener systemd holds is left alone:
        // its backlog is the next server's.
        if let Some(listener) = &self.listener
            && !self.plan.listener_inherited
            && let Err(e) = crate::listener::refuse_new_connections(listener)
        {
            crate::log::debug(format_args!("cannot stop the listener's handshakes: {e}"));
        }
        self.listener = None;
        if let Some((_, listener)) = &mut self.metrics {
            *listener = None;
        }
        self.signal_all(Signal::SIGTERM);
    }

    fn signal_all(&self, signal: Signal) {
        for pid in self
            .slots
            .iter()
            .filter_map(|s| s.pid)
            .chain(self.retiring.iter().copied())
        {
            let _ = kill(pid, signal);
        }
    }

    fn kill_stragglers(&mut self) {
        for (index, slot) in self.slots.iter().enumerate() {
            if let Some(pid) = slot.pid {
                crate::log::error(format_args!(
                    "worker {index} pid={pid} still busy after --graceful-timeout {}s; killing it",
                    self.cfg.cli.graceful_timeout.as_secs_f64()
                ));
                let _ = kill(pid, Signal::SIGKILL);
            }
        }
        for pid in &self.retiring {
            let _ = kill(*pid, Signal::SIGKILL);
        }
        if self.exit_code == EXIT_OK {
            self.exit_code = EXIT_GRACEFUL_TIMEOUT;
        }
        self.stopping = Some(Instant::now() + Duration::from_secs(3600));
    }

    /// The exit code once stopping and every worker is gone.
    fn finished(&self) -> Option<i32> {
        let all_gone = self.slots.iter().all(|s| s.pid.is_none()) && self.retiring.is_empty();
        (self.stopping.is_some() && all_gone).then_some(self.exit_code)
    }

    fn read_ready(&mut self) {
        let mut buf = [0u8; 64];
        loop {
            match nix::unistd::read(&self.ready_read, &mut buf) {
                Ok(n) if n >= 4 => {
                    for word in buf[..n - n % 4].chunks(4) {
                        let index =
                            u32::from_le_bytes([word[0], word[1], word[2], word[3]]) as usize;
                        if let Some(slot) = self.slots.get_mut(index) {
                            slot.ready = true;
                        }
                        if matches!(self.reload_waiting, Some((i, _)) if i == index) {
                            self.finish_reload_step();
                        }
                    }
                }
                Err(nix::errno::Errno::EINTR) => continue,
                _ => break,
            }
        }
        if !self.announced && self.stopping.is_none() && self.slots.iter().all(|s| s.ready) {
            self.announced = true;
            let p = self.plan;
            let mode = if p.mode == Mode::Spawn {
                "spawn"
            } else {
                "fork"
            };
            crate::log::info(format_args!(
                "ready: serving http://{} with plugin {} ({} worker(s), {mode} mode)",
                crate::listener::fmt_addr(p.addr),
                p.plugin_name,
                p.workers
            ));
            self.notify_ready("");
        }
    }

    /// `READY=1` with the main pid (the supervisor, which systemd started)
    /// and what `systemctl status` should show.
    fn notify_ready(&self, after: &str) {
        let p = self.plan;
        self.notify(&format!(
            "READY=1\nMAINPID={}\nSTATUS={}",
            std::process::id(),
            sd_notify::status_line(&format!(
                "serving http://{} with plugin {} ({} worker(s)){after}",
                crate::listener::fmt_addr(p.addr),
                p.plugin_name,
                p.workers
            ))
        ));
    }

    /// A message to systemd, when it asked for them; a failed send is
    /// logged and the server goes on (systemd then counts the service by
    /// its own timeouts).
    fn notify(&self, state: &str) {
        let Some(n) = &self.notify else { return };
        if let Err(e) = n.send(state) {
            let first = state.lines().next().unwrap_or(state);
            crate::log::warn(format_args!(
                "cannot tell systemd {first} through {}={}: {e}",
                sd_notify::ENV_NOTIFY_SOCKET,
                n.shown()
            ));
        }
    }

    /// A SIGHUP's last slot is replaced (or the reload was given up):
    /// systemd is told the service is ready again.
    fn finish_reload(&mut self, after: &str) {
        if self.reloading {
            self.reloading = false;
            self.notify_ready(after);
        }
    }

    fn next_reload(&mut self) {
        if self.reload_waiting.is_some() || self.stopping.is_some() {
            return;
        }
        let Some(index) = self.reload_queue.pop() else {
            if self.reloading {
                crate::log::info(format_args!("SIGHUP: every worker replaced"));
            }
            self.finish_reload("");
            return;
        };
        let Some(old) = self.slots[index].pid else {
            self.start_worker(index);
            return self.next_reload();
        };
        self.retiring.push(old);
        self.slots[index].pid = None;
        self.replacing_ready = self.slots[index].ready;
        let started = self.start_worker(index);
        self.replacing_ready = false;
        if started.is_some() {
            self.reload_waiting = Some((index, old));
        }
    }

    /// The replacement for a slot is serving: drain the old worker.
    fn finish_reload_step(&mut self) {
        if let Some((index, old)) = self.reload_waiting.take() {
            crate::log::info(format_args!(
                "worker {index} replaced; old pid={old} drains"
            ));
            let _ = kill(old, Signal::SIGTERM);
            self.next_reload();
        }
    }

    fn reap(&mut self) {
        loop {
            let status = match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(s) => s,
            };
            let (pid, code, signal) = match status {
                WaitStatus::Exited(pid, code) => (pid, Some(code), None),
                WaitStatus::Signaled(pid, sig, _) => (pid, None, Some(sig)),
                _ => continue,
            };
            if let Some(i) = self.retiring.iter().position(|&p| p == pid) {
                self.retiring.swap_remove(i);
                continue;
            }
            // As PID 1 we also reap orphans that are not our workers.
            let Some(index) = self.slots.iter().position(|s| s.pid == Some(pid)) else {
                continue;
            };
            self.on_worker_exit(index, pid, code, signal);
        }
    }

    fn on_worker_exit(
        &mut self,
        index: usize,
        pid: Pid,
        code: Option<i32>,
        signal: Option<Signal>,
    ) {
        if let Some((page, _)) = &self.metrics {
            let death = match (code, signal) {
                (Some(EXIT_OK), _) => Death::Clean,
                (Some(_), _) => Death::Exit,
                _ => Death::Signal,
            };
            let lost = page.worker_ended(index, death);
            if lost > 0 {
                crate::log::warn(format_args!(
                    "--metrics: {lost} of worker {index}'s plugin series had no room in the \
                     retired block ({} series): their counts are lost",
                    crate::metrics_page::plugin_series::SERIES
                ));
            }
        }
        if let Some((page, _)) = &self.share {
            // Until its replacement has loaded (it claims the line then),
            // siblings must not hand this slot connections: they would
            // wait in its channel through the replacement's whole init.
            let line = page.line(index);
            if line.pid.load(Ordering::SeqCst) == pid.as_raw() as u64 {
                line.state.store(LEAVING, Ordering::SeqCst);
            }
        }
        let lived = self.slots[index].started.elapsed();
        self.slots[index].pid = None;
        self.slots[index].ready = false;
        let how = match (code, signal) {
            (Some(c), _) => format!("exited with status {c}"),
            (_, Some(s)) => format!("was killed by {s}"),
            _ => "ended".to_string(),
        };
        if self.reload_waiting.is_some_and(|(i, _)| i == index) {
            // The replacement died before it was ready: keep the old worker.
            if let Some((_, old)) = self.reload_waiting.take()
                && let Some(pos) = self.retiring.iter().position(|&p| p == old)
            {
                self.retiring.swap_remove(pos);
                self.slots[index] = Slot {
                    pid: Some(old),
                    started: Instant::now(),
                    ready: true,
                };
                crate::log::error(format_args!(
                    "new worker {index} pid={pid} {how} before it was ready; keeping the old one"
                ));
                self.reload_queue.clear();
                self.finish_reload(&format!(
                    "; the reload stopped: new worker {index} {how} before it was ready"
                ));
                return;
            }
        }
        if self.stopping.is_some() {
            if code == Some(EXIT_GRACEFUL_TIMEOUT) {
                crate::log::warn(format_args!(
                    "worker {index} pid={pid} cut requests off at --graceful-timeout {}s",
                    self.cfg.cli.graceful_timeout.as_secs_f64()
                ));
            } else if code != Some(EXIT_OK) {
                crate::log::warn(format_args!(
                    "worker {index} pid={pid} {how} while stopping"
                ));
            }
            if self.exit_code == EXIT_OK {
                self.exit_code = match code {
                    Some(EXIT_OK) => EXIT_OK,
                    Some(EXIT_GRACEFUL_TIMEOUT) => EXIT_GRACEFUL_TIMEOUT,
                    _ => EXIT_STARTUP,
                };
            }
            return;
        }
        if code == Some(EXIT_REFUSED) {
            crate::log::error(format_args!(
                "worker {index} pid={pid} refused the configuration (exit {EXIT_REFUSED}); stopping"
            ));
            self.begin_stop(EXIT_REFUSED);
            return;
        }
        crate::log::warn(format_args!(
            "worker {index} pid={pid} {how} after {:.2}s; replacing it",
            lived.as_secs_f64()
        ));
        if code != Some(EXIT_OK) {
            self.respawns += 1;
            self.rapid_deaths = if lived < RAPID {
                self.rapid_deaths + 1
            } else {
                0
            };
            if self.rapid_deaths >= RAPID_LIMIT {
                crate::log::error(format_args!(
                    "{RAPID_LIMIT} workers in a row died within {}s of starting (the last {how}); giving up",
                    RAPID.as_secs()
                ));
                self.begin_stop(EXIT_STARTUP);
                return;
            }
            let budget = self.plan.workers * 10;
            if self.respawns > budget {
                crate::log::error(format_args!(
                    "{} worker deaths exceed the respawn budget of {budget} (workers x 10); the last {how}; giving up",
                    self.respawns
                ));
                self.begin_stop(EXIT_STARTUP);
                return;
            }
        }
        self.start_worker(index);
    }
}

/// The page and one SOCK_SEQPACKET pair per worker; None (and no sharing)
/// with one worker or when the kernel refuses.
fn create_share(workers: usize) -> Option<(SharedPage, Vec<(OwnedFd, OwnedFd)>)> {
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};
    if workers < 2 {
        return None;
    }
    let made = (|| -> std::io::Result<_> {
        let page = SharedPage::create(workers)?;
        let mut channels = Vec::with_capacity(workers);
        for _ in 0..workers {
            let pair = socketpair(
                AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_CLOEXEC | SockFlag::SOCK_NONBLOCK,
            )?;
            channels.push(pair);
        }
        Ok((page, channels))
    })();
    match made {
        Ok(share) => Some(share),
        Err(e) => {
            crate::log::warn(format_args!(
                "accept sharing is off: cannot create its page or channels ({e})"
            ));
            None
        }
    }
}

impl Supervisor<'_> {
    /// A forked worker's own mapping of the metrics page, and the
    /// listener it inherited.
    fn metrics_for(&self) -> Option<worker::MetricsFds> {
        let (page, listener) = self.metrics.as_ref()?;
        let listener = listener.as_ref()?;
        let page_fd = page.fd_owned().try_clone().ok()?;
        // SAFETY: a fresh duplicate of the page's memfd, owned from here.
        let page = unsafe {
            MetricsPage::adopt(std::os::fd::IntoRawFd::into_raw_fd(page_fd), page.workers())
        }
        .ok()?;
        Some(worker::MetricsFds {
            page,
            listener_fd: listener.as_raw_fd(),
        })
    }

    /// A forked worker's own copies of the page and channels.
    fn share_for(&self, index: usize) -> Option<worker::ShareFds> {
        let (page, channels) = self.share.as_ref()?;
        let dup = |fd: &OwnedFd| fd.try_clone().ok();
        let page_fd = dup(page.fd_owned())?;
        // SAFETY: a fresh duplicate of the page's memfd, owned from here.
        let page = unsafe {
            SharedPage::adopt(std::os::fd::IntoRawFd::into_raw_fd(page_fd), channels.len())
        }
        .ok()?;
        let recv = dup(&channels[index].0)?;
        let sends = channels
            .iter()
            .map(|(_, send)| dup(send))
            .collect::<Option<Vec<_>>>()?;
        Some(worker::ShareFds { page, recv, sends })
    }
}
