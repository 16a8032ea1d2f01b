//! What the processes of one server agree on: how a process leaves (the
//! exit codes, and `_exit`), how a worker is started (fork, or fork+exec),
//! and the whole contract of a spawned worker, both sides of it: which
//! descriptors the supervisor hands over at which numbers, the environment
//! that says what was handed, and how the worker adopts them.
//!
//! Both sides of the exec contract live here so that a change to one is
//! seen beside the other; the supervisor decides when to spawn, the
//! startup of a spawned worker (`app`) decides what to do with what it was
//! handed.
//!
//! A worker or probe child always leaves through `_exit` (`exit_now`):
//! runtimes inside plugins (CPython) must not be torn down by atexit
//! handlers while their threads may still run.

use std::ffi::{CString, OsString};
use std::io::Write;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};

use nix::fcntl::{FcntlArg, FdFlag, OFlag, fcntl};
use nix::sys::wait::waitpid;
use nix::unistd::{ForkResult, Pid, fork};

use crate::metrics_page::MetricsPage;
use crate::shared_page::SharedPage;
use crate::signals::STOP_SIGNALS;

// ---------------------------------------------------------------------------
// Exit codes: the only values the server, a worker or a probe child exits
// with (`m0serve --help` lists them for the user).

/// Stopped cleanly, as asked; also `--help`, `--version` and a `--doctor`
/// run whose checks all passed.
pub const EXIT_OK: i32 = 0;
/// The server could not start or keep running: a plugin not found or
/// failing to start, a port in use, a system call that failed, workers
/// that keep dying.
pub const EXIT_STARTUP: i32 = 1;
/// A flag, or its `M0_*` variable, that does not parse.
pub const EXIT_USAGE: i32 = 2;
/// A stop that `--graceful-timeout` cut short: the server stopped as
/// asked, but requests still in flight were cut off. Not 1, which says the
/// server could not start.
pub const EXIT_GRACEFUL_TIMEOUT: i32 = 3;
/// The configuration is refused and a restart would not help: a plugin of
/// another ABI, a plugin that refuses its argument or settings, a `--venv`
/// that is not one, an exec that failed. A worker that exits with it stops
/// the server instead of being replaced.
pub const EXIT_REFUSED: i32 = 78;
/// A spawned child whose exec failed leaves with this (the shell's "cannot
/// execute"); the supervisor reads the reason from the error pipe and
/// reaps the child itself, so the server never exits with it.
const EXIT_EXEC_FAILED: i32 = 127;

/// Flush what we printed and leave without running atexit handlers.
pub fn exit_now(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; see the module docs for why not exit.
    unsafe { libc::_exit(code) }
}

/// How the supervisor starts a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `fork()` alone: the worker inherits the supervisor's memory.
    Fork,
    /// `fork()` and at once `exec` of this binary (`--spawn-workers`, or a
    /// plugin that must start in a fresh process).
    Spawn,
}

// ---------------------------------------------------------------------------
// The exec contract: numbers and names.

/// Fixed descriptor numbers a spawned worker adopts.
const SPAWN_LISTEN_FD: RawFd = 3;
const SPAWN_READY_FD: RawFd = 4;
/// With accept sharing: the shared page, this worker's channel, then every
/// worker's send side from 7 on.
const SPAWN_PAGE_FD: RawFd = 5;
const SPAWN_RECV_FD: RawFd = 6;
const SPAWN_SENDS_FD: RawFd = 7;
/// Set for a spawned worker that was handed the page and channels.
const ENV_SHARE_FDS: &str = "M0_SHARE_FDS";
/// Set for a spawned worker that was handed the metrics page and the
/// metrics listener, at `spawn_metrics_fds(workers)`.
const ENV_METRICS_FDS: &str = "M0_METRICS_FDS";

/// With `--metrics`: the metrics page and its listener, after every other
/// descriptor a worker of `workers` may adopt.
fn spawn_metrics_fds(workers: usize) -> (RawFd, RawFd) {
    let first = SPAWN_SENDS_FD + workers as RawFd;
    (first, first + 1)
}
/// Environment a spawned worker is recognised by.
const ENV_WORKER_INDEX: &str = "M0_WORKER_INDEX";
const ENV_WORKER_SPAWNED: &str = "M0_WORKER_SPAWNED";
/// The plugin file the supervisor resolved, for a spawned worker to open;
/// the checks take it, when set, instead of resolving `--plugin`.
pub const ENV_PLUGIN_FILE: &str = "M0_PLUGIN_FILE";
/// Set for a spawned worker started while another worker was ready.
const ENV_OTHERS_SERVE: &str = "M0_WORKER_OTHERS_SERVE";
/// Test hook: exec this path instead of our own binary.
const ENV_SPAWN_EXE: &str = "M0_SPAWN_EXE";

// ---------------------------------------------------------------------------
// The supervisor's side.

/// What the supervisor hands one spawned worker.
pub struct Handover<'a> {
    pub index: usize,
    /// Workers in the server: where the metrics descriptors go.
    pub workers: usize,
    pub listener: &'a OwnedFd,
    /// The write end of the pipe a worker says it is ready on.
    pub ready: &'a OwnedFd,
    /// With accept sharing: the page and every worker's channel (receive,
    /// send); the worker gets its own receive side and every send side.
    pub share: Option<(&'a SharedPage, &'a [(OwnedFd, OwnedFd)])>,
    /// With `--metrics`: the page and the metrics listener.
    pub metrics: Option<(&'a MetricsPage, &'a OwnedFd)>,
    pub plugin_path: &'a Path,
    /// Another worker serves while this one starts.
    pub others_serve: bool,
}

/// Fork and exec this binary as worker `h.index`, its descriptors at their
/// fixed numbers. Between fork and exec the child runs only
/// async-signal-safe calls: the argument and environment arrays, and high
/// copies of the descriptors it adopts, are all prepared before the fork.
/// An exec that fails is reported here, with its errno, as refused.
pub fn spawn(h: &Handover) -> Result<Pid, (i32, String)> {
    let exe: PathBuf = std::env::var_os(ENV_SPAWN_EXE)
        .map(PathBuf::from)
        .or_else(|| std::env::current_exe().ok())
        .ok_or((EXIT_STARTUP, "cannot find this binary to exec".to_string()))?;
    let c_exe = CString::new(exe.as_os_str().as_bytes())
        .map_err(|_| (EXIT_STARTUP, "binary path has a NUL".to_string()))?;
    let argv: Vec<CString> = std::env::args_os()
        .filter_map(|a| CString::new(a.as_bytes()).ok())
        .collect();
    let mut envp: Vec<CString> = std::env::vars_os()
        .filter(|(k, _)| {
            ![
                ENV_WORKER_INDEX,
                ENV_WORKER_SPAWNED,
                ENV_PLUGIN_FILE,
                ENV_SHARE_FDS,
                ENV_METRICS_FDS,
                ENV_OTHERS_SERVE,
            ]
            .iter()
            .any(|n| k == *n)
        })
        .filter_map(|(k, v)| {
            let mut kv = k;
            kv.push("=");
            kv.push(v);
            CString::new(kv.as_bytes()).ok()
        })
        .collect();
    envp.push(CString::new(format!("{ENV_WORKER_INDEX}={}", h.index)).unwrap_or_default());
    envp.push(CString::new(format!("{ENV_WORKER_SPAWNED}=1")).unwrap_or_default());
    if h.others_serve {
        envp.push(CString::new(format!("{ENV_OTHERS_SERVE}=1")).unwrap_or_default());
    }
    let mut plugin_kv = OsString::from(format!("{ENV_PLUGIN_FILE}="));
    plugin_kv.push(h.plugin_path.as_os_str());
    envp.extend(CString::new(plugin_kv.as_bytes()).ok());
    let argv_ptrs: Vec<*const libc::c_char> = argv
        .iter()
        .map(|a| a.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();

    // High copies, so the child's dup2 onto 3 and 4 cannot clobber a
    // source that happens to be 3 or 4.
    let high = |fd: &OwnedFd| {
        fcntl(fd, FcntlArg::F_DUPFD_CLOEXEC(100))
            .map(|raw| {
                // SAFETY: F_DUPFD_CLOEXEC returned a new descriptor we own.
                unsafe { OwnedFd::from_raw_fd(raw) }
            })
            .map_err(|e| (EXIT_STARTUP, format!("dup: {e}")))
    };
    // (high copy, the number the worker adopts it at)
    let mut moves: Vec<(OwnedFd, RawFd)> = vec![
        (high(h.listener)?, SPAWN_LISTEN_FD),
        (high(h.ready)?, SPAWN_READY_FD),
    ];
    if let Some((page, channels)) = h.share {
        moves.push((high(page.fd_owned())?, SPAWN_PAGE_FD));
        moves.push((high(&channels[h.index].0)?, SPAWN_RECV_FD));
        for (j, (_, send)) in channels.iter().enumerate() {
            moves.push((high(send)?, SPAWN_SENDS_FD + j as RawFd));
        }
        envp.push(CString::new(format!("{ENV_SHARE_FDS}=1")).unwrap_or_default());
    }
    if let Some((page, listener)) = h.metrics {
        let (page_at, listener_at) = spawn_metrics_fds(h.workers);
        moves.push((high(page.fd_owned())?, page_at));
        moves.push((high(listener)?, listener_at));
        envp.push(CString::new(format!("{ENV_METRICS_FDS}=1")).unwrap_or_default());
    }
    let raw_moves: Vec<(RawFd, RawFd)> = moves
        .iter()
        .map(|(copy, to)| (copy.as_raw_fd(), *to))
        .collect();
    let first_free = raw_moves.iter().map(|(_, to)| *to).max().unwrap_or(4) as u32 + 1;
    let envp_ptrs: Vec<*const libc::c_char> = envp
        .iter()
        .map(|e| e.as_ptr())
        .chain(std::iter::once(std::ptr::null()))
        .collect();
    let (err_read, err_write) = nix::unistd::pipe2(OFlag::O_CLOEXEC)
        .map_err(|e| (EXIT_STARTUP, format!("cannot create a pipe: {e}")))?;
    let err_write_fd = err_write.as_raw_fd();
    // SAFETY: between fork and exec the child calls only async-signal-safe
    // functions (sigaction, dup2, syscall, execve, write, _exit) on data
    // prepared above.
    let forked = unsafe { fork() };
    match forked {
        Ok(ForkResult::Child) => {
            crate::signals::reset_to_default(&STOP_SIGNALS);
            // SAFETY: async-signal-safe calls on descriptors we own.
            unsafe {
                for &(from, to) in &raw_moves {
                    libc::dup2(from, to);
                }
                // Everything above the adopted descriptors closes at exec,
                // the error pipe included (its EOF means exec worked).
                libc::syscall(
                    libc::SYS_close_range,
                    first_free,
                    u32::MAX,
                    libc::CLOSE_RANGE_CLOEXEC,
                );
                libc::execve(c_exe.as_ptr(), argv_ptrs.as_ptr(), envp_ptrs.as_ptr());
                let errno = *libc::__errno_location();
                let bytes = errno.to_le_bytes();
                libc::write(err_write_fd, bytes.as_ptr().cast(), bytes.len());
                libc::_exit(EXIT_EXEC_FAILED);
            }
        }
        Ok(ForkResult::Parent { child }) => {
            drop(err_write);
            drop(moves);
            let mut bytes = [0u8; 4];
            let n = loop {
                match nix::unistd::read(&err_read, &mut bytes) {
                    Err(nix::errno::Errno::EINTR) => continue,
                    other => break other.unwrap_or(0),
                }
            };
            if n == 4 {
                let _ = waitpid(child, None);
                let errno = nix::errno::Errno::from_raw(i32::from_le_bytes(bytes));
                return Err((
                    EXIT_REFUSED,
                    format!("exec of {} failed: {errno}", exe.display()),
                ));
            }
            Ok(child)
        }
        Err(e) => Err((EXIT_STARTUP, format!("fork failed: {e}"))),
    }
}

// ---------------------------------------------------------------------------
// The spawned worker's side.

/// The worker index this process was spawned as, or None when it was not
/// spawned (the supervisor, the doctor, a forked worker's parent).
pub fn spawned_index() -> Option<u32> {
    std::env::var_os(ENV_WORKER_INDEX).map(|index| index.to_string_lossy().parse().unwrap_or(0))
}

/// What a spawned worker adopts.
pub struct Adopted {
    pub listener: RawFd,
    pub ready: RawFd,
    pub share: Option<AdoptedShare>,
    /// The metrics page and the metrics listener.
    pub metrics: Option<(MetricsPage, RawFd)>,
    pub plugin_path: PathBuf,
    pub others_serve: bool,
}

/// With accept sharing: the page, this worker's channel (receive side),
/// and every worker's send side by index.
pub struct AdoptedShare {
    pub page: SharedPage,
    pub recv: OwnedFd,
    pub sends: Vec<OwnedFd>,
}

/// In a spawned worker: take the descriptors by number, mark them
/// close-on-exec again so the application's subprocesses inherit nothing,
/// and read what the environment says. The error names what is missing.
pub fn adopt(workers: usize) -> Result<Adopted, String> {
    let with_share = std::env::var_os(ENV_SHARE_FDS).is_some();
    let with_metrics = std::env::var_os(ENV_METRICS_FDS).is_some();
    let (metrics_page_fd, metrics_listener_fd) = spawn_metrics_fds(workers);
    let mut fds = vec![SPAWN_LISTEN_FD, SPAWN_READY_FD];
    if with_share {
        fds.extend([SPAWN_PAGE_FD, SPAWN_RECV_FD]);
        fds.extend((0..workers as RawFd).map(|j| SPAWN_SENDS_FD + j));
    }
    if with_metrics {
        fds.extend([metrics_page_fd, metrics_listener_fd]);
    }
    for fd in fds {
        // SAFETY: the supervisor put these descriptors at these numbers
        // before exec; the fcntl below fails cleanly if one is missing.
        let borrowed = unsafe { std::os::fd::BorrowedFd::borrow_raw(fd) };
        fcntl(borrowed, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map_err(|e| format!("spawned worker: descriptor {fd} was not handed over ({e})"))?;
    }
    let metrics = if with_metrics {
        // SAFETY: the supervisor put the page's memfd at this number before
        // exec (checked above); owned once from here.
        let page = unsafe { MetricsPage::adopt(metrics_page_fd, workers) }
            .map_err(|e| format!("spawned worker: {e}"))?;
        Some((page, metrics_listener_fd))
    } else {
        None
    };
    let share = if with_share {
        // SAFETY: adopting descriptors the supervisor placed at these numbers
        // (checked above); each is owned once from here.
        let (page, recv, sends) = unsafe {
            let page = SharedPage::adopt(SPAWN_PAGE_FD, workers)
                .map_err(|e| format!("spawned worker: {e}"))?;
            let recv = OwnedFd::from_raw_fd(SPAWN_RECV_FD);
            let sends = (0..workers as RawFd)
                .map(|j| OwnedFd::from_raw_fd(SPAWN_SENDS_FD + j))
                .collect();
            (page, recv, sends)
        };
        Some(AdoptedShare { page, recv, sends })
    } else {
        None
    };
    let Some(plugin_path) = std::env::var_os(ENV_PLUGIN_FILE) else {
        return Err(format!("spawned worker started without {ENV_PLUGIN_FILE}"));
    };
    Ok(Adopted {
        listener: SPAWN_LISTEN_FD,
        ready: SPAWN_READY_FD,
        share,
        metrics,
        plugin_path: PathBuf::from(plugin_path),
        others_serve: std::env::var_os(ENV_OTHERS_SERVE).is_some(),
    })
}
