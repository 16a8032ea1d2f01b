//! `--cpu-affinity N`: each worker is pinned to N CPUs of the server's own
//! mask, in turn, in fork and spawn mode and across a respawn; the pools
//! plan for the worker's own CPUs; a request for more CPUs than there are
//! is refused with 78, naming the flag and its variable.

use std::io::Write;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, command, plugin};

/// The CPUs a process may run on, from its `Cpus_allowed_list` (`0-1,4`).
fn allowed(pid: i32) -> Vec<usize> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_else(|e| panic!("read /proc/{pid}/status: {e}"));
    let list = status
        .lines()
        .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
        .expect("a Cpus_allowed_list line")
        .trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// A hello_c command on exactly two CPUs, or `None` where this process may
/// use fewer (said on stderr).
fn on_two_cpus(extra: &[&str]) -> Option<Command> {
    let p = plugin("hello_c");
    let mut args = vec!["--plugin", p.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    if let Err(cpus) = support::pin_to_cpus(&mut cmd, 2) {
        let _ = writeln!(
            std::io::stderr(),
            "cpu_affinity: skipped, this process may use {cpus} CPU and the test needs 2"
        );
        return None;
    }
    Some(cmd)
}

fn wait_for_worker(s: &Server, index: usize, not: i32) -> i32 {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Some(&pid) = s.worker_pids().get(index)
            && pid != not
            && pid > 0
            && s.log().contains(&format!("pid={pid} on CPU(s) "))
        {
            return pid;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    panic!("no worker {index} other than {not} started:\n{}", s.log());
}

#[test]
fn each_worker_is_pinned_to_its_turn_of_the_cpus_and_a_respawn_to_the_same() {
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let mut extra = vec!["--workers", "3", "--cpu-affinity", "1"];
        extra.extend_from_slice(mode);
        let Some(cmd) = on_two_cpus(&extra) else {
            return;
        };
        let s = Server::start_cmd(cmd);
        let mask = allowed(s.pid());
        assert_eq!(mask.len(), 2, "the supervisor stays on both CPUs");
        let pids: Vec<i32> = (0..3).map(|i| wait_for_worker(&s, i, 0)).collect();
        // In turn, wrapping: 0 on the first, 1 on the second, 2 on the first.
        for (i, &pid) in pids.iter().enumerate() {
            assert_eq!(
                allowed(pid),
                vec![mask[i % 2]],
                "worker {i} ({mode:?})\n{}",
                s.log()
            );
            assert!(
                s.log()
                    .contains(&format!("pid={pid} on CPU(s) {} serving", mask[i % 2])),
                "worker {i}'s start line names its CPU\n{}",
                s.log()
            );
        }
        // The pools plan for one CPU each, not for the server's two (and
        // for the two workers that take turns on the first).
        assert!(
            s.log().contains("2 workers share 1 usable CPU(s)"),
            "the pool plans for the worker's own CPU\n{}",
            s.log()
        );
        // A respawned worker takes its slot's CPU again.
        // SAFETY: killing a worker process of the server this test started.
        unsafe { libc::kill(pids[1], libc::SIGKILL) };
        let again = wait_for_worker(&s, 1, pids[1]);
        assert_eq!(allowed(again), vec![mask[1]], "the respawned worker 1");
        let r = support::get(s.addr, "/");
        assert_eq!(r.status, 200);
    }
}

#[test]
fn more_cpus_per_worker_than_the_server_has_is_refused_with_78_naming_the_flag() {
    let Some(mut cmd) = on_two_cpus(&["--workers", "2", "--cpu-affinity", "3"]) else {
        return;
    };
    let out = cmd.output_bounded().expect("run m0serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("--cpu-affinity 3") && err.contains("M0_CPU_AFFINITY"),
        "{err}"
    );
    assert!(err.contains("pass --cpu-affinity 2 or less"), "{err}");

    // The doctor says the same, and where each worker would run.
    let Some(mut cmd) = on_two_cpus(&["--workers", "2", "--cpu-affinity", "3", "--doctor"]) else {
        return;
    };
    assert_eq!(cmd.output_bounded().unwrap().status.code(), Some(78));
    let Some(mut cmd) = on_two_cpus(&["--workers", "3", "--cpu-affinity", "1", "--doctor"]) else {
        return;
    };
    let out = cmd.output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(0));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).expect("the doctor's JSON");
    let topo = &doc["topology"];
    assert_eq!(topo["cpu_affinity"], 1);
    let cpus: Vec<&str> = topo["worker_cpus"]
        .as_array()
        .expect("worker_cpus")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert_eq!(cpus.len(), 3);
    assert_eq!(cpus[0], cpus[2], "worker 2 wraps around to worker 0's CPU");
    assert_ne!(cpus[0], cpus[1]);
    assert_eq!(topo["handler_threads"]["workers_sharing_cpus"], 2);
}
