//! What the server does when the box runs out of something: here, file
//! descriptors (a low `ulimit -n`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::process::CommandExt;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::{Server, command, plugin};

/// CPU time (user + system) the process `pid` has used, in clock ticks.
fn cpu_ticks(pid: i32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    // The command name may hold spaces: fields count from after its ')'.
    let rest = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// With 64 descriptors a worker can hold a few dozen connections; 100 are
/// opened (the rest wait in the kernel's backlog). Accept fails with
/// EMFILE: one log line, no spinning (CPU time, not wall time, is
/// compared), and once connections close the waiting ones are accepted
/// and answered.
#[test]
fn out_of_descriptors_the_loop_neither_spins_nor_stops_accepting() {
    let hello = plugin("hello_c");
    let mut cmd = command(&["--plugin", hello.to_str().unwrap(), "--workers", "1"]);
    // SAFETY: one async-signal-safe system call between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let s = Server::start_cmd(cmd);
    let worker = s.worker_pids()[0];
    let conns: Vec<TcpStream> = (0..100)
        .map(|_| TcpStream::connect(s.addr).expect("the backlog takes it"))
        .collect();
    assert!(
        s.wait_for_log(
            "accept failed: Too many open files",
            Duration::from_secs(20)
        ),
        "{}",
        s.log()
    );
    // Two seconds at EMFILE with connections waiting: a loop that retried
    // at once would use all of a CPU.
    let (ticks0, t0) = (cpu_ticks(worker), Instant::now());
    std::thread::sleep(Duration::from_secs(2));
    let used = (cpu_ticks(worker) - ticks0) as f64;
    // SAFETY: sysconf has no preconditions.
    let per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    let share = used / per_sec / t0.elapsed().as_secs_f64();
    assert!(
        share < 0.5,
        "the worker used {:.0}% of a CPU while accept failed",
        share * 100.0
    );
    assert_eq!(s.log_count("accept failed"), 1, "{}", s.log());

    // The last connection is still in the backlog: it sends a request,
    // and half the others leave.
    let mut conns = conns;
    let mut last = conns.pop().unwrap();
    last.write_all(b"GET / HTTP/1.1\r\nHost: t\r\nConnection: close\r\n\r\n")
        .unwrap();
    conns.truncate(49);
    last.set_read_timeout(Some(Duration::from_secs(30)))
        .unwrap();
    let mut out = Vec::new();
    let _ = last.read_to_end(&mut out);
    let text = String::from_utf8_lossy(&out);
    assert!(
        text.starts_with("HTTP/1.1 200") && text.ends_with("hello, world\n"),
        "{text:?}\n{}",
        s.log()
    );
    assert!(
        s.wait_for_log("accepting connections again", Duration::from_secs(10)),
        "{}",
        s.log()
    );
    drop(conns);
    assert_eq!(support::get(s.addr, "/").status, 200);
}
