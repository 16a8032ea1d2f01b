//! Binding the one listening socket all workers share.
//!
//! No SO_REUSEPORT: a second server on the same port must be refused, not
//! silently handed half the connections. SO_REUSEADDR only lets a restart
//! bind while old connections sit in TIME_WAIT.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

use nix::sys::socket::{
    self, AddressFamily, Backlog, SockFlag, SockType, SockaddrStorage, sockopt,
};

/// Parse `--host`: an IP address, `localhost`, or `[v6]`. No DNS.
pub fn parse_host(host: &str) -> Result<IpAddr, String> {
    let trimmed = host.trim_start_matches('[').trim_end_matches(']');
    if trimmed.eq_ignore_ascii_case("localhost") {
        return Ok(IpAddr::from([127, 0, 0, 1]));
    }
    trimmed.parse().map_err(|_| {
        format!(
            "--host {host:?} is not an IP address; use e.g. 127.0.0.1, 0.0.0.0, ::1 or localhost"
        )
    })
}

/// An address as `--host` and `--port` would name it: `127.0.0.1:8000`,
/// `[::1]:8000`.
pub fn fmt_addr(addr: SocketAddr) -> String {
    match addr {
        SocketAddr::V6(v6) => format!("[{}]:{}", v6.ip(), v6.port()),
        v4 => v4.to_string(),
    }
}

/// Why the listener could not be bound, and what to change: the port check
/// reports the two apart, and the server prints them as one line.
#[derive(Debug)]
pub struct BindError {
    pub exit_code: i32,
    /// The problem: "port 8000 on 127.0.0.1 is in use by another process".
    pub message: String,
    /// What to change, naming the flag: "stop it or pick another port with
    /// --port".
    pub fix: String,
}

impl std::fmt::Display for BindError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}; {}", self.message, self.fix)
    }
}

/// The fix for failures that name no better one.
const FIX_OTHER: &str = "stop the other process or pick another port with --port";

/// Bind and listen. Errors name the problem and the flag that fixes it.
pub fn bind(addr: SocketAddr, backlog: u32) -> Result<OwnedFd, BindError> {
    let family = if addr.is_ipv4() {
        AddressFamily::Inet
    } else {
        AddressFamily::Inet6
    };
    let fail_with = |message: String, fix: &str| BindError {
        exit_code: 1,
        message,
        fix: fix.to_string(),
    };
    let fail = |message: String| fail_with(message, FIX_OTHER);
    let fd = socket::socket(family, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)
        .map_err(|e| fail(format!("cannot create a socket: {e}")))?;
    socket::setsockopt(&fd, sockopt::ReuseAddr, &true)
        .map_err(|e| fail(format!("SO_REUSEADDR: {e}")))?;
    socket::bind(fd.as_raw_fd(), &SockaddrStorage::from(addr)).map_err(|e| match e {
        nix::errno::Errno::EADDRINUSE => fail_with(
            format!(
                "port {} on {} is in use by another process",
                addr.port(),
                addr.ip()
            ),
            "stop it or pick another port with --port",
        ),
        nix::errno::Errno::EACCES => fail_with(
            format!("not allowed to listen on port {}", addr.port()),
            "ports below 1024 need privileges, pick another with --port",
        ),
        nix::errno::Errno::EADDRNOTAVAIL => fail_with(
            format!("address {} is not on this machine", addr.ip()),
            "pick another with --host",
        ),
        other => fail(format!("cannot listen on {addr}: {other}")),
    })?;
    let backlog = Backlog::new(backlog.min(i32::MAX as u32) as i32).unwrap_or(Backlog::MAXCONN);
    socket::listen(&fd, backlog).map_err(|e| fail(format!("cannot listen on {addr}: {e}")))?;
    Ok(fd)
}

/// The address a listener is bound to (the real port after `--port 0`).
pub fn local_addr(fd: &OwnedFd) -> Option<SocketAddr> {
    let ss: SockaddrStorage = socket::getsockname(fd.as_raw_fd()).ok()?;
    if let Some(v4) = ss.as_sockaddr_in() {
        return Some(SocketAddr::from((v4.ip(), v4.port())));
    }
    ss.as_sockaddr_in6()
        .map(|v6| SocketAddr::from((v6.ip(), v6.port())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hosts() {
        assert_eq!(parse_host("localhost").unwrap().to_string(), "127.0.0.1");
        assert_eq!(parse_host("[::1]").unwrap().to_string(), "::1");
        assert!(parse_host("example.com").is_err());
    }

    #[test]
    fn second_bind_on_a_port_is_refused_with_the_flag_named() {
        let first = bind("127.0.0.1:0".parse().unwrap(), 16).ok().unwrap();
        let addr = local_addr(&first).unwrap();
        let err = bind(addr, 16).err().unwrap();
        assert_eq!(err.exit_code, 1);
        assert!(err.message.contains("in use"), "{err}");
        assert!(err.fix.contains("--port"), "{err}");
        assert!(
            !err.message.contains("--port"),
            "the fix is said once: {err}"
        );
        assert_eq!(
            err.to_string(),
            format!(
                "port {} on 127.0.0.1 is in use by another process; {}",
                addr.port(),
                err.fix
            )
        );
    }
}
