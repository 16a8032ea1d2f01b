//! systemd's readiness protocol (`sd_notify`, for `Type=notify` units):
//! when `NOTIFY_SOCKET` names a unix datagram socket, the supervisor sends
//! it newline-separated `KEY=VALUE` states: `READY=1` once every worker
//! serves, `RELOADING=1` and `READY=1` again around a SIGHUP reload,
//! `STOPPING=1` when a stop begins.
//!
//! The variable is taken out of the environment at startup, before the
//! plugin's probe child or any worker exists: only the supervisor speaks
//! for the service, so a plugin (or a Python library inside one) cannot
//! tell systemd the server is ready on its behalf.
//!
//! Each message goes out on a socket of its own, opened and closed in the
//! call as systemd's own `sd_notify` does, so no notification descriptor
//! is left open for a forked worker to inherit.

use std::ffi::OsString;
use std::os::linux::net::SocketAddrExt;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::time::Duration;

/// The variable systemd sets for a `Type=notify` service.
pub const ENV_NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// How long one message may wait for room in systemd's queue: systemd
/// reads its socket at once, and the single-threaded supervisor must not
/// hang on a listener that has gone away.
const SEND_TIMEOUT: Duration = Duration::from_secs(2);

/// Where the notifications go.
pub struct Notifier {
    addr: SocketAddr,
    /// `NOTIFY_SOCKET` as it was given, for messages and the doctor.
    shown: String,
}

/// `NOTIFY_SOCKET` as found at startup.
pub enum Found {
    /// Not set (not started by systemd as `Type=notify`).
    Unset,
    /// A socket to notify.
    Socket(Notifier),
    /// Set, but not to an address this server can send to.
    Unusable {
        shown: String,
        /// What is wrong with the value.
        problem: String,
        /// What to change, naming the variable.
        fix: String,
    },
}

impl Found {
    /// The problem and its fix as one line, for the log.
    pub fn unusable_message(&self) -> Option<String> {
        match self {
            Found::Unusable { problem, fix, .. } => Some(format!("{problem}; {fix}")),
            _ => None,
        }
    }

    /// The value of `NOTIFY_SOCKET`, when it was set.
    pub fn shown(&self) -> Option<&str> {
        match self {
            Found::Unset => None,
            Found::Socket(n) => Some(&n.shown),
            Found::Unusable { shown, .. } => Some(shown),
        }
    }
}

/// Read `NOTIFY_SOCKET` and remove it from the environment. Call it while
/// the process has one thread.
pub fn take_from_env() -> Found {
    let Some(value) = std::env::var_os(ENV_NOTIFY_SOCKET) else {
        return Found::Unset;
    };
    // SAFETY: called at startup, before any thread is started, so no other
    // thread reads the environment meanwhile.
    unsafe { std::env::remove_var(ENV_NOTIFY_SOCKET) };
    parse(value)
}

fn parse(value: OsString) -> Found {
    let shown = value.to_string_lossy().into_owned();
    let bytes = value.as_bytes();
    let addr = match bytes.first() {
        Some(b'/') => SocketAddr::from_pathname(&value),
        // systemd's notation for Linux's abstract namespace: a leading NUL
        // byte in place of the '@'.
        Some(b'@') => SocketAddr::from_abstract_name(&bytes[1..]),
        _ => {
            return Found::Unusable {
                problem: format!(
                    "{ENV_NOTIFY_SOCKET}={shown:?} is neither a socket path (/...) nor an abstract socket name (@...), so systemd is not told when the server is ready"
                ),
                fix: format!(
                    "unset {ENV_NOTIFY_SOCKET}, or use Type=exec in the unit if this systemd notifies over another transport"
                ),
                shown,
            };
        }
    };
    match addr {
        Ok(addr) => Found::Socket(Notifier { addr, shown }),
        Err(e) => Found::Unusable {
            problem: format!(
                "{ENV_NOTIFY_SOCKET}={shown:?} is not a usable socket address ({e}), so systemd is not told when the server is ready"
            ),
            fix: format!("point {ENV_NOTIFY_SOCKET} at a shorter path, or unset it"),
            shown,
        },
    }
}

impl Notifier {
    /// Send one message of `KEY=VALUE` lines.
    pub fn send(&self, state: &str) -> std::io::Result<()> {
        let socket = UnixDatagram::unbound()?;
        socket.set_write_timeout(Some(SEND_TIMEOUT))?;
        socket.send_to_addr(state.as_bytes(), &self.addr)?;
        Ok(())
    }

    /// The address, as `NOTIFY_SOCKET` gave it.
    pub fn shown(&self) -> &str {
        &self.shown
    }
}

/// `CLOCK_MONOTONIC` in microseconds, which systemd asks to accompany
/// `RELOADING=1` (`MONOTONIC_USEC=`) so it can tell a reload's `READY=1`
/// from an earlier one.
pub fn monotonic_usec() -> u64 {
    nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .map(|t| t.tv_sec() as u64 * 1_000_000 + t.tv_nsec() as u64 / 1_000)
        .unwrap_or(0)
}

/// Lines of a `STATUS=` text: systemd shows it in `systemctl status`; a
/// newline would start another key.
pub fn status_line(text: &str) -> String {
    text.replace(['\n', '\r'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_and_abstract_names_are_taken_and_anything_else_is_refused_by_name() {
        let Found::Socket(n) = parse("/run/systemd/notify".into()) else {
            panic!("a path is an address")
        };
        assert_eq!(
            n.addr.as_pathname(),
            Some(std::path::Path::new("/run/systemd/notify"))
        );
        let Found::Socket(n) = parse("@m0/notify".into()) else {
            panic!("an abstract name is an address")
        };
        assert_eq!(n.addr.as_abstract_name(), Some(&b"m0/notify"[..]));
        for bad in ["relative/notify", "vsock:2:1234", ""] {
            match parse(bad.into()) {
                found @ Found::Unusable { .. } => {
                    assert_eq!(found.shown(), Some(bad));
                    let message = found.unusable_message().unwrap();
                    assert!(message.contains(ENV_NOTIFY_SOCKET), "{message}");
                    assert!(message.contains("; unset"), "{message}");
                }
                _ => panic!("{bad:?} was taken"),
            }
        }
        let long = format!("/{}", "x".repeat(200));
        assert!(matches!(parse(long.into()), Found::Unusable { .. }));
    }

    #[test]
    fn a_message_reaches_the_socket_whole() {
        let dir = std::env::temp_dir().join(format!("m0-notify-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("notify");
        let _ = std::fs::remove_file(&path);
        let listener = UnixDatagram::bind(&path).unwrap();
        let Found::Socket(n) = parse(path.clone().into_os_string()) else {
            panic!("a path is an address")
        };
        n.send("READY=1\nSTATUS=serving").unwrap();
        let mut buf = [0u8; 256];
        let got = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..got], b"READY=1\nSTATUS=serving");
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn status_text_stays_on_one_line() {
        assert_eq!(status_line("a\nb\r\nc"), "a b  c");
    }
}
