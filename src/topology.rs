//! How many CPUs this process can really use: the online count, narrowed by
//! the affinity mask and a cgroup CPU quota (containers).

/// CPUs online.
pub fn online_cpus() -> usize {
    std::thread::available_parallelism()
        .map(|n| n.get())
        .unwrap_or(1)
        .max(online_sysconf())
}

fn online_sysconf() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    if n > 0 { n as usize } else { 1 }
}

/// CPUs in this process's affinity mask.
pub fn affinity_cpus() -> usize {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .count()
            .max(1),
        Err(_) => online_sysconf(),
    }
}

/// A cgroup v2 `cpu.max` quota, rounded up to whole CPUs.
pub fn cgroup_quota_cpus() -> Option<usize> {
    let text = std::fs::read_to_string("/sys/fs/cgroup/cpu.max").ok()?;
    let mut parts = text.split_whitespace();
    let quota = parts.next()?;
    let period: f64 = parts.next()?.parse().ok()?;
    if quota == "max" || period <= 0.0 {
        return None;
    }
    let quota: f64 = quota.parse().ok()?;
    Some(((quota / period).ceil() as usize).max(1))
}

/// The CPUs worth planning for: the smallest of online, affinity and quota.
pub fn usable_cpus() -> usize {
    let mut n = online_sysconf().min(affinity_cpus());
    if let Some(q) = cgroup_quota_cpus() {
        n = n.min(q);
    }
    n.max(1)
}
