//! Signals as bytes on a pipe (the self-pipe trick), so both the supervisor
//! and the worker loop see them as ordinary readable events.
//!
//! Handlers rather than a blocked mask plus signalfd: a blocked mask is
//! inherited by every process the application starts, and an application's
//! subprocess that cannot be stopped by SIGTERM is a bug we would have made.

use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::atomic::{AtomicI32, Ordering};

use nix::fcntl::OFlag;
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

static PIPE_WRITE: AtomicI32 = AtomicI32::new(-1);

extern "C" fn on_signal(signo: libc::c_int) {
    let fd = PIPE_WRITE.load(Ordering::Relaxed);
    if fd >= 0 {
        let byte = signo as u8;
        // SAFETY: write(2) is async-signal-safe; errno is saved and restored
        // so the interrupted code does not see ours.
        unsafe {
            let saved = *libc::__errno_location();
            libc::write(fd, (&byte as *const u8).cast(), 1);
            *libc::__errno_location() = saved;
        }
    }
}

/// The read end of the signal pipe.
pub struct SignalPipe {
    read: OwnedFd,
    _write: OwnedFd,
}

pub const STOP_SIGNALS: [Signal; 3] = [Signal::SIGTERM, Signal::SIGINT, Signal::SIGQUIT];

impl SignalPipe {
    /// Route `signals` to a new pipe (replacing any earlier pipe).
    pub fn install(signals: &[Signal]) -> io::Result<SignalPipe> {
        let (read, write) = nix::unistd::pipe2(OFlag::O_NONBLOCK | OFlag::O_CLOEXEC)?;
        PIPE_WRITE.store(write.as_raw_fd(), Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        for &signal in signals {
            // SAFETY: the handler only calls async-signal-safe write(2).
            unsafe { sigaction(signal, &action) }?;
        }
        Ok(SignalPipe {
            read,
            _write: write,
        })
    }

    pub fn read_fd(&self) -> RawFd {
        self.read.as_raw_fd()
    }

    /// The signals received since the last call, in order.
    pub fn drain(&self) -> Vec<i32> {
        let mut out = Vec::new();
        let mut buf = [0u8; 64];
        loop {
            match nix::unistd::read(&self.read, &mut buf) {
                Ok(0) => break,
                Ok(n) => out.extend(buf[..n].iter().map(|&b| i32::from(b))),
                Err(nix::errno::Errno::EINTR) => continue,
                Err(_) => break,
            }
        }
        out
    }
}

/// Back to the default action, in a freshly forked child before it installs
/// its own (async-signal-safe: only sigaction).
pub fn reset_to_default(signals: &[Signal]) {
    PIPE_WRITE.store(-1, Ordering::SeqCst);
    let action = SigAction::new(SigHandler::SigDfl, SaFlags::empty(), SigSet::empty());
    for &signal in signals {
        // SAFETY: restoring the default disposition is always sound.
        let _ = unsafe { sigaction(signal, &action) };
    }
}
