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

use crate::process::{EXIT_REFUSED, EXIT_STARTUP};

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
        exit_code: EXIT_STARTUP,
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

/// Unsent bytes a connection may hold in the kernel before a write to it
/// is refused (`TCP_NOTSENT_LOWAT`, inherited by every accepted socket).
/// Without it the kernel's send buffer grows to megabytes for a client
/// that stops reading: 16 clients pipelining requests and reading nothing
/// had the worker answer 395,000 of them, 5 MB each, before their sockets
/// refused more, every few seconds as they reconnected, while the clients
/// that read waited behind them. Bytes the peer's window admits are sent
/// as before: only the queue behind a closed window is bounded, and a
/// reader that keeps up sees no difference.
pub const UNSENT_LIMIT: u32 = 16 * 1024;

/// Bound what the kernel queues for a peer that does not read
/// (`UNSENT_LIMIT`); on the listener, so accepted sockets inherit it with
/// no system call of their own.
pub fn limit_unsent(fd: &OwnedFd) -> std::io::Result<()> {
    let value = UNSENT_LIMIT as libc::c_int;
    set_option(fd, libc::IPPROTO_TCP, libc::TCP_NOTSENT_LOWAT, &value)
}

/// `setsockopt` with a plain value the kernel copies: the options nix has
/// no wrapper for.
fn set_option<T: Copy>(fd: &OwnedFd, level: i32, name: i32, value: &T) -> std::io::Result<()> {
    // SAFETY: `value` is a valid, initialised T that lives across the call,
    // and the length passed is its size; the kernel only reads it.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            level,
            name,
            (value as *const T).cast(),
            std::mem::size_of::<T>() as libc::socklen_t,
        )
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(std::io::Error::last_os_error())
    }
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

/// The first descriptor systemd passes (`SD_LISTEN_FDS_START`).
const LISTEN_FDS_START: i32 = 3;

/// The listening socket systemd handed over (socket activation:
/// `LISTEN_PID` is this process and `LISTEN_FDS` counts descriptors from
/// 3), or `None` when there is none. Adopting it instead of binding means
/// a restart of the service refuses no connection: systemd keeps the
/// socket, and what arrives meanwhile waits in its backlog for the next
/// process. The variables are removed so that no worker or plugin reads
/// them again. Call it while the process has one thread.
pub fn inherited() -> Result<Option<OwnedFd>, BindError> {
    let refuse = |message: String, fix: &str| BindError {
        exit_code: EXIT_REFUSED,
        message,
        fix: fix.to_string(),
    };
    let pid = std::env::var("LISTEN_PID").ok();
    let fds = std::env::var("LISTEN_FDS").ok();
    let for_us = pid.as_deref().and_then(|p| p.parse::<u32>().ok()) == Some(std::process::id());
    if !for_us {
        return Ok(None);
    }
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        // SAFETY: called at startup, before any thread is started, so no
        // other thread reads the environment meanwhile.
        unsafe { std::env::remove_var(var) };
    }
    let count = fds
        .as_deref()
        .and_then(|n| n.parse::<i32>().ok())
        .unwrap_or(0);
    if count != 1 {
        return Err(refuse(
            format!(
                "socket activation passed {count} descriptors (LISTEN_FDS); m0serve serves one"
            ),
            "give the socket unit exactly one ListenStream=",
        ));
    }
    // SAFETY: F_GETFD on a raw number reads its flags and changes nothing;
    // owning a descriptor that is not open would abort at its close.
    if unsafe { libc::fcntl(LISTEN_FDS_START, libc::F_GETFD) } < 0 {
        return Err(refuse(
            "socket activation (LISTEN_FDS=1) but descriptor 3 is not open".into(),
            "start m0serve from its socket unit, or unset LISTEN_PID and LISTEN_FDS",
        ));
    }
    // SAFETY: systemd's protocol hands this process descriptor 3, open
    // (checked above); we take ownership of it once, here.
    let fd = unsafe { <OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(LISTEN_FDS_START) };
    let listening = socket::getsockopt(&fd, sockopt::AcceptConn).unwrap_or(false);
    let stream = socket::getsockopt(&fd, sockopt::SockType).ok() == Some(SockType::Stream);
    let inet = local_addr(&fd).is_some();
    if !(listening && stream && inet) {
        return Err(refuse(
            "socket activation passed descriptor 3, which is not a listening TCP socket".into(),
            "use ListenStream= with an address and port in the socket unit",
        ));
    }
    // Ours alone: the supervisor hands workers their own copies.
    nix::fcntl::fcntl(
        &fd,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    )
    .map_err(|e| {
        refuse(
            format!("socket activation: descriptor 3: {e}"),
            "check the socket unit",
        )
    })?;
    Ok(Some(fd))
}

/// Make the listening socket complete no new handshake (a classic BPF
/// filter that drops every packet reaching it): a stop then drains a
/// backlog that cannot grow, and a client connecting meanwhile is refused
/// once the listener closes, before it could send a request. The filter is
/// the socket's, so every process sharing it sees it.
pub fn refuse_new_connections(fd: &OwnedFd) -> std::io::Result<()> {
    // BPF_RET | BPF_K with k = 0: keep no byte of any packet.
    let mut drop_all = [libc::sock_filter {
        code: 0x06,
        jt: 0,
        jf: 0,
        k: 0,
    }];
    let program = libc::sock_fprog {
        len: 1,
        filter: drop_all.as_mut_ptr(),
    };
    // The program points at `drop_all`, which lives across the call; the
    // kernel copies both.
    set_option(fd, libc::SOL_SOCKET, libc::SO_ATTACH_FILTER, &program)
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
    fn accepted_sockets_inherit_the_unsent_limit_from_the_listener() {
        let listener = bind("127.0.0.1:0".parse().unwrap(), 16).ok().unwrap();
        limit_unsent(&listener).unwrap();
        let addr = local_addr(&listener).unwrap();
        let _client = std::net::TcpStream::connect(addr).unwrap();
        let accepted = socket::accept(&listener).unwrap();
        let mut value: libc::c_int = 0;
        let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
        // SAFETY: value and len are valid for the kernel to write an int.
        let rc = unsafe {
            libc::getsockopt(
                accepted.as_raw_fd(),
                libc::IPPROTO_TCP,
                libc::TCP_NOTSENT_LOWAT,
                (&mut value as *mut libc::c_int).cast(),
                &mut len,
            )
        };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
        assert_eq!(value as u32, UNSENT_LIMIT);
    }

    #[test]
    fn second_bind_on_a_port_is_refused_with_the_flag_named() {
        let first = bind("127.0.0.1:0".parse().unwrap(), 16).ok().unwrap();
        let addr = local_addr(&first).unwrap();
        let err = bind(addr, 16).err().unwrap();
        assert_eq!(err.exit_code, EXIT_STARTUP);
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
