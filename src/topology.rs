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

/// The CPUs of this process's affinity mask, in ascending order.
pub fn affinity_list() -> Vec<usize> {
    match nix::sched::sched_getaffinity(nix::unistd::Pid::from_raw(0)) {
        Ok(set) => (0..nix::sched::CpuSet::count())
            .filter(|&i| set.is_set(i).unwrap_or(false))
            .collect(),
        Err(_) => (0..online_sysconf()).collect(),
    }
}

/// `--cpu-affinity N`: the CPUs worker `index` is pinned to, N of `mask`
/// taken in turn from where the previous worker's ended, wrapping around.
/// Empty when N is 0 or the mask is.
pub fn worker_cpus(mask: &[usize], index: u32, per_worker: u32) -> Vec<usize> {
    if per_worker == 0 || mask.is_empty() {
        return Vec::new();
    }
    let n = (per_worker as usize).min(mask.len());
    let start = index as usize * n;
    (0..n).map(|k| mask[(start + k) % mask.len()]).collect()
}

/// With every worker pinned so, how many workers run on each CPU (at
/// most): what the pools size for instead of the worker count.
pub fn workers_per_cpu(mask_len: usize, workers: u32, per_worker: u32) -> usize {
    let n = (per_worker as usize).min(mask_len.max(1));
    (workers as usize * n).div_ceil(mask_len.max(1)).max(1)
}

/// Pin this process (every thread it starts from now on) to `cpus`.
pub fn pin(cpus: &[usize]) -> nix::Result<()> {
    let mut set = nix::sched::CpuSet::new();
    for &c in cpus {
        set.set(c)?;
    }
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set)
}

/// A CPU list as `taskset -c` writes it: `0-3,6`.
pub fn fmt_cpus(cpus: &[usize]) -> String {
    let mut sorted = cpus.to_vec();
    sorted.sort_unstable();
    let mut out = Vec::new();
    let mut i = 0;
    while i < sorted.len() {
        let mut j = i;
        while j + 1 < sorted.len() && sorted[j + 1] == sorted[j] + 1 {
            j += 1;
        }
        out.push(if j > i {
            format!("{}-{}", sorted[i], sorted[j])
        } else {
            sorted[i].to_string()
        });
        i = j + 1;
    }
    out.join(",")
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_take_their_cpus_in_turn_and_wrap() {
        let mask = [0, 1, 2, 3];
        assert_eq!(worker_cpus(&mask, 0, 1), vec![0]);
        assert_eq!(worker_cpus(&mask, 1, 1), vec![1]);
        assert_eq!(worker_cpus(&mask, 4, 1), vec![0]);
        assert_eq!(worker_cpus(&mask, 1, 2), vec![2, 3]);
        assert_eq!(worker_cpus(&mask, 2, 3), vec![2, 3, 0]);
        assert_eq!(worker_cpus(&[5, 7], 1, 4), vec![5, 7]);
        assert!(worker_cpus(&mask, 0, 0).is_empty());
        assert_eq!(workers_per_cpu(2, 2, 1), 1);
        assert_eq!(workers_per_cpu(2, 3, 1), 2);
        assert_eq!(workers_per_cpu(4, 2, 4), 2);
        assert_eq!(fmt_cpus(&[3, 0, 1, 2, 6]), "0-3,6");
        assert_eq!(fmt_cpus(&[1]), "1");
    }
}
