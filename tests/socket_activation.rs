//! Socket activation (systemd's `LISTEN_FDS` protocol): the server adopts
//! the listening socket it is handed instead of binding, so a restart
//! refuses no connection. Once with this test in systemd's place (it holds
//! the socket across two servers), once with systemd's own
//! `systemd-socket-activate`.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::Duration;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, binary, plugin};

/// The server, started as systemd starts a socket-activated service: the
/// listener at descriptor 3, `LISTEN_FDS=1`, `LISTEN_PID` its own pid (the
/// shell's `$$`, which `exec` keeps). The shell moves the listener to 3:
/// the child of `Command` must not touch descriptors it does not own.
fn activated(listener: RawFd, extra: &str) -> Server {
    let hello = plugin("hello_c");
    let to_3 = if listener == 3 {
        String::new()
    } else {
        format!("exec 3<&{listener} {listener}<&-; ")
    };
    let script = format!(
        "{to_3}LISTEN_PID=$$ LISTEN_FDS=1 exec {} --plugin {} --workers 2 {extra}",
        binary().display(),
        hello.display()
    );
    let mut cmd = Command::new("sh");
    cmd.args(["-c", &script])
        .env("M0_LOG_LEVEL", "debug")
        .env_remove("M0_WORKERS");
    // SAFETY: one fcntl on the listener's descriptor, async-signal-safe
    // between fork and exec: the shell inherits it.
    unsafe {
        cmd.pre_exec(move || {
            if libc::fcntl(listener, libc::F_SETFD, 0) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Server::start_cmd(cmd)
}

fn get(addr: SocketAddr) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    s.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

#[test]
fn an_adopted_listener_survives_a_restart_and_refuses_no_connection() {
    let _serial = support::one_at_a_time();
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap();
    for mode in ["", "--spawn-workers"] {
        let mut first = activated(listener.as_raw_fd(), mode);
        assert_eq!(
            first.addr, addr,
            "the server serves the socket it was handed"
        );
        assert!(first.log().contains("socket activation"), "{}", first.log());
        assert!(get(addr).ends_with("hello, world\n"));
        first.signal(libc::SIGTERM);
        let status = first.wait_exit(Duration::from_secs(30));
        assert_eq!(status.and_then(|s| s.code()), Some(0), "{}", first.log());
        // Between the two servers: the socket is still listening (this
        // test holds it, as systemd does), so the connection waits.
        let waiting = std::thread::spawn(move || get(addr));
        std::thread::sleep(Duration::from_millis(300));
        let second = activated(listener.as_raw_fd(), mode);
        let answer = waiting.join().unwrap();
        assert!(
            answer.starts_with("HTTP/1.1 200") && answer.ends_with("hello, world\n"),
            "{mode}: the connection made during the restart got {answer:?}\n{}",
            second.log()
        );
    }
}

#[test]
fn a_socket_unit_that_passes_anything_but_one_listener_is_refused_with_78() {
    let hello = plugin("hello_c");
    let cases = [
        ("LISTEN_FDS=2", "", "ListenStream"),
        ("LISTEN_FDS=1", "exec 3<&-; ", "not open"),
        (
            "LISTEN_FDS=1",
            "exec 3</dev/null; ",
            "not a listening TCP socket",
        ),
    ];
    for (fds, prelude, says) in cases {
        let script = format!(
            "{prelude}LISTEN_PID=$$ {fds} exec {} --plugin {}",
            binary().display(),
            hello.display()
        );
        let out = Command::new("sh")
            .args(["-c", &script])
            .output_bounded()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{fds} {prelude}: {err}");
        assert!(err.contains(says), "{fds} {prelude}: {err}");
    }
}

/// systemd's own activator: it listens, and on the first connection starts
/// the server with the socket.
#[test]
fn systemd_socket_activate_starts_the_server_with_its_socket() {
    let _serial = support::one_at_a_time();
    let activate = support::tools::system_tool("systemd-socket-activate");
    // The activator cannot be told port 0 and say which it got: a free
    // port is found, and another one tried if some other test took it
    // before the activator bound it.
    let hello = plugin("hello_c");
    let (addr, mut activator) = (0..5)
        .find_map(|_| {
            let addr = TcpListener::bind("127.0.0.1:0")
                .unwrap()
                .local_addr()
                .unwrap();
            let mut child = Command::new(&activate)
                .arg("-l")
                .arg(addr.to_string())
                .arg(binary())
                .args(["--plugin", hello.to_str().unwrap(), "--workers", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .process_group(0)
                .spawn()
                .unwrap();
            for _ in 0..100 {
                if let Some(status) = child.try_wait().unwrap() {
                    let mut err = String::new();
                    let _ = child.stderr.take().unwrap().read_to_string(&mut err);
                    assert!(
                        err.contains("in use"),
                        "the activator exited {status}: {err}"
                    );
                    return None;
                }
                if TcpStream::connect(addr).is_ok() {
                    return Some((addr, child));
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            panic!("the activator never listened on {addr}");
        })
        .expect("five free ports were each taken before the activator bound them");
    let answer = get(addr);
    // SAFETY: the activator execs the server in its own process group.
    unsafe { libc::kill(-(activator.id() as i32), libc::SIGTERM) };
    let status = activator.wait().unwrap();
    let mut err = String::new();
    let _ = activator.stderr.take().unwrap().read_to_string(&mut err);
    assert!(answer.ends_with("hello, world\n"), "{answer:?}\n{err}");
    assert!(err.contains("socket activation"), "{err}");
    assert_eq!(status.code(), Some(0), "{err}");
}
