//! What the processes of one server agree on: how a worker is started
//! (fork, or fork+exec), how a spawned worker recognises itself (the
//! environment and the descriptor numbers the supervisor hands over), and
//! how a worker or a probe child leaves.
//!
//! Here and not in the supervisor so that the checks, the doctor, the
//! plugin probe and the worker can name these without depending on the
//! module that starts processes.
//!
//! A worker or probe child always leaves through `_exit` (`exit_now`):
//! runtimes inside plugins (CPython) must not be torn down by atexit
//! handlers while their threads may still run.

use std::io::Write;
use std::os::fd::RawFd;

/// How the supervisor starts a worker.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// `fork()` alone: the worker inherits the supervisor's memory.
    Fork,
    /// `fork()` and at once `exec` of this binary (`--spawn-workers`, or a
    /// plugin that must start in a fresh process).
    Spawn,
}

/// Fixed descriptor numbers a spawned worker adopts.
pub const SPAWN_LISTEN_FD: RawFd = 3;
pub const SPAWN_READY_FD: RawFd = 4;
/// With accept sharing: the shared page, this worker's channel, then every
/// worker's send side from 7 on.
pub const SPAWN_PAGE_FD: RawFd = 5;
pub const SPAWN_RECV_FD: RawFd = 6;
pub const SPAWN_SENDS_FD: RawFd = 7;
/// Set for a spawned worker that was handed the page and channels.
pub const ENV_SHARE_FDS: &str = "M0_SHARE_FDS";
/// Set for a spawned worker that was handed the metrics page and the
/// metrics listener, at `spawn_metrics_fds(workers)`.
pub const ENV_METRICS_FDS: &str = "M0_METRICS_FDS";

/// With `--metrics`: the metrics page and its listener, after every other
/// descriptor a worker of `workers` may adopt.
pub fn spawn_metrics_fds(workers: usize) -> (RawFd, RawFd) {
    let first = SPAWN_SENDS_FD + workers as RawFd;
    (first, first + 1)
}
/// Environment a spawned worker is recognised by.
pub const ENV_WORKER_INDEX: &str = "M0_WORKER_INDEX";
pub const ENV_WORKER_SPAWNED: &str = "M0_WORKER_SPAWNED";
pub const ENV_PLUGIN_FILE: &str = "M0_PLUGIN_FILE";
/// Set for a spawned worker started while another worker was ready.
pub const ENV_OTHERS_SERVE: &str = "M0_WORKER_OTHERS_SERVE";
/// Test hook: exec this path instead of our own binary.
pub const ENV_SPAWN_EXE: &str = "M0_SPAWN_EXE";

/// Exit code of a stop that `--graceful-timeout` cut short: the server
/// stopped as asked, but requests still in flight were cut off. Not 1,
/// which says the server could not start.
pub const EXIT_GRACEFUL_TIMEOUT: i32 = 3;

/// Flush what we printed and leave without running atexit handlers.
pub fn exit_now(code: i32) -> ! {
    let _ = std::io::stdout().flush();
    let _ = std::io::stderr().flush();
    // SAFETY: _exit has no preconditions; see the module docs for why not exit.
    unsafe { libc::_exit(code) }
}
