//! The controller against a closed-loop queueing model with seeded noise:
//! its decisions, tested without clocks.

use super::*;
use crate::worker::accept_share::SiblingPools;

/// A closed loop of `conns` clients against a pool that completes
/// `capacity(threads)` requests per second, with seeded noise: enough of
/// a queueing system to check where the controller settles.
struct Model {
    conns: usize,
    capacity: fn(usize) -> f64,
    lock_share: fn(usize) -> f64,
    /// CPUs busy at n threads.
    cpu_busy: fn(usize) -> f64,
    live: usize,
    counters: Counters,
    carry: f64,
    seed: u64,
    /// Completions per second of loop calls (all `conns` clients served by
    /// the thread leading the loop); `None`: the worker makes none.
    loop_capacity: Option<f64>,
    suspended: bool,
    /// Slow changes of the machine's speed (other tenants), by time since
    /// the start: a factor on every rate.
    weather: fn(Duration) -> f64,
    elapsed: Duration,
}

impl Tunable for Model {
    fn completed(&self) -> u64 {
        self.counters.completed
    }
    fn counters(&self) -> Counters {
        self.counters
    }
    fn served(&self) -> u64 {
        self.counters.completed + self.counters.loop_calls
    }
    fn load(&self) -> (usize, usize) {
        if self.making_loop_calls() {
            return (0, 0);
        }
        let busy = self.live.min(self.conns);
        (self.conns - busy, busy)
    }
    fn in_flight(&self) -> usize {
        self.conns
    }
    fn size(&self) -> (usize, usize) {
        (self.live, self.live)
    }
    fn resize(&mut self, threads: usize) {
        self.live = threads;
    }
    fn suspend_loop_calls(&mut self, suspended: bool, _now: Instant) {
        self.suspended = suspended;
    }
}

impl Model {
    fn noise(&mut self) -> f64 {
        // xorshift64: +-10% per 10 ms tick, about +-1.3% per window.
        self.seed ^= self.seed << 13;
        self.seed ^= self.seed >> 7;
        self.seed ^= self.seed << 17;
        (self.seed % 2001) as f64 / 10_000.0 - 0.1
    }

    fn making_loop_calls(&self) -> bool {
        self.loop_capacity.is_some() && !self.suspended
    }

    fn advance(&mut self, dt: Duration) {
        if let (Some(capacity), true) = (self.loop_capacity, self.making_loop_calls()) {
            // One thread calls, reads and writes: no pool time, one CPU.
            let due = capacity * (1.0 + self.noise()) * dt.as_secs_f64() + self.carry;
            self.carry = due - due.floor();
            self.counters.loop_calls += due.floor() as u64;
            self.counters.cpu_ns += (dt.as_secs_f64() * 1e9) as u64;
            return;
        }
        self.elapsed += dt;
        let rate = (self.capacity)(self.live) * (1.0 + self.noise()) * (self.weather)(self.elapsed);
        let due = rate * dt.as_secs_f64() + self.carry;
        let done = due.floor();
        self.carry = due - done;
        // Little's law: every client is in the pool, so a request spends
        // conns / rate there, of which busy / rate being served.
        let in_pool = self.conns as f64 / rate;
        let service = self.live.min(self.conns) as f64 / rate;
        let c = &mut self.counters;
        c.completed += done as u64;
        c.service_ns += (done * service * 1e9) as u64;
        c.queue_wait_ns += (done * (in_pool - service) * 1e9) as u64;
        c.lock_wait_ns += (done * service * (self.lock_share)(self.live) * 1e9) as u64;
        c.cpu_ns += ((self.cpu_busy)(self.live) * dt.as_secs_f64() * 1e9) as u64;
    }
}

/// Runs the model for `seconds` and returns the pool size at every tick
/// of the last `last` seconds, sorted.
/// How a view behaves on `cpus` CPUs at n threads.
struct View {
    cpus: usize,
    capacity: fn(usize) -> f64,
    lock_share: fn(usize) -> f64,
    cpu_busy: fn(usize) -> f64,
}

fn settle(conns: usize, initial: usize, view: View, seconds: u64, last: u64) -> Vec<usize> {
    settle_in(conns, initial, view, seconds, last, |_| 1.0)
}

/// `settle` on a machine whose speed changes with `weather`.
fn settle_in(
    conns: usize,
    initial: usize,
    view: View,
    seconds: u64,
    last: u64,
    weather: fn(Duration) -> f64,
) -> Vec<usize> {
    let plan = PoolPlan {
        initial,
        min: 1,
        max: 64,
        adaptive: true,
        cpus: view.cpus,
        workers: 1,
        reason: String::new(),
    };
    let mut controller = Controller::new(plan, false);
    let mut model = Model {
        conns,
        capacity: view.capacity,
        lock_share: view.lock_share,
        cpu_busy: view.cpu_busy,
        live: initial,
        counters: Counters::default(),
        carry: 0.0,
        seed: 0x9e37_79b9_7f4a_7c15,
        loop_capacity: None,
        suspended: false,
        weather,
        elapsed: Duration::ZERO,
    };
    let start = Instant::now();
    let ticks = seconds * 1000 / TICK.as_millis() as u64;
    let keep_from = ticks - last * 1000 / TICK.as_millis() as u64;
    let mut sizes = Vec::new();
    for i in 1..=ticks {
        model.advance(TICK);
        controller.tick(&mut model, start + TICK * i as u32);
        if i >= keep_from {
            sizes.push(model.live);
        }
    }
    sizes.sort_unstable();
    sizes
}

fn median(sizes: &[usize]) -> usize {
    sizes[sizes.len() / 2]
}

fn share_at(sizes: &[usize], size: usize) -> f64 {
    sizes.iter().filter(|&&s| s == size).count() as f64 / sizes.len() as f64
}

#[test]
fn a_lock_holding_view_on_one_cpu_settles_on_one_thread() {
    // Every thread past the first only waits for the lock and costs a
    // little in switches (eight threads were
    // measured to cost 31%).
    let view = View {
        cpus: 1,
        capacity: |n| 2200.0 * (1.0 - 0.03 * (n - 1) as f64),
        lock_share: |n| 0.9 * (n - 1) as f64 / n as f64,
        cpu_busy: |_| 1.0,
    };
    let sizes = settle(8, 2, view, 40, 20);
    assert_eq!(median(&sizes), 1, "{sizes:?}");
    assert!(share_at(&sizes, 1) > 0.8, "{sizes:?}");
}

/// 1 ms of Python per request with the GIL held, one worker on two CPUs:
/// it uses one of them whatever its threads, so the CPUs never look
/// saturated, and a second thread only queues for the lock (measured:
/// fixed 2 served 0.80-0.95x of fixed 1).
fn gil_holding_on_two_cpus() -> View {
    View {
        cpus: 2,
        capacity: |n| 1250.0 * (1.0 - 0.1 * (n - 1).min(2) as f64),
        lock_share: |n| 0.9 * (n - 1) as f64 / n as f64,
        cpu_busy: |_| 1.05,
    }
}

#[test]
fn a_lock_holding_view_on_two_cpus_steps_down_to_one_thread() {
    let sizes = settle(8, 2, gil_holding_on_two_cpus(), 40, 20);
    assert_eq!(median(&sizes), 1, "{sizes:?}");
    assert!(share_at(&sizes, 1) > 0.8, "{sizes:?}");
}

#[test]
fn a_lock_holding_view_stays_on_one_thread_when_the_machine_slows_down_at_times() {
    // The same view on a shared machine whose speed drops by 15% for
    // 0.7 s in every 2.3 s (other tenants: the same configuration served
    // 2,100-2,700 req/s in neighbouring 5 s runs). A step down whose
    // window met a slowdown lost, and the pool went back to two threads
    // and served there until the next trial.
    let weather = |t: Duration| {
        if (200..900).contains(&(t.as_millis() % 2300)) {
            0.85
        } else {
            1.0
        }
    };
    let sizes = settle_in(8, 2, gil_holding_on_two_cpus(), 60, 40, weather);
    assert!(
        share_at(&sizes, 1) > 0.9,
        "{:.2} {sizes:?}",
        share_at(&sizes, 1)
    );
}

#[test]
fn when_sizes_tie_on_throughput_the_pool_takes_the_fewest_threads() {
    // A view that releases its lock but has one CPU to compute on.
    let view = View {
        cpus: 1,
        capacity: |_| 3150.0,
        lock_share: |_| 0.0,
        cpu_busy: |_| 1.0,
    };
    let sizes = settle(64, 2, view, 40, 20);
    assert!(share_at(&sizes, 1) > 0.8, "{sizes:?}");
}

#[test]
fn views_that_block_get_a_thread_per_waiting_client() {
    // 5 ms of sleep per request: throughput scales with threads up to
    // the number of clients.
    let sleeping = |capacity: fn(usize) -> f64| View {
        cpus: 2,
        capacity,
        lock_share: |_| 0.0,
        cpu_busy: |n| 0.01 * n as f64,
    };
    let sizes = settle(64, 2, sleeping(|n| 200.0 * n.min(64) as f64), 40, 10);
    assert!(median(&sizes) >= 56, "{sizes:?}");
    let sizes = settle(8, 2, sleeping(|n| 200.0 * n.min(8) as f64), 40, 10);
    // Never a trial below the 8 the clients need, once there: each one
    // would make requests wait a whole call.
    assert!(sizes.iter().all(|&n| n >= 8), "{sizes:?}");
    assert!(median(&sizes) <= 12, "{sizes:?}");
}

#[test]
fn a_fast_view_settles_and_then_rarely_leaves_its_best_size() {
    // A WSGI hello: a second thread overlaps one's socket writes with
    // the other's Python; a third only queues for the GIL.
    let capacity = |n: usize| match n {
        1 => 140_000.0,
        2 => 172_000.0,
        _ => 172_000.0 * (1.0 - 0.02 * (n - 2) as f64),
    };
    let view = View {
        cpus: 1,
        capacity,
        lock_share: |n| 0.5 * (n - 1) as f64 / n as f64,
        cpu_busy: |_| 1.0,
    };
    let sizes = settle(64, 2, view, 90, 60);
    // Trials at other sizes are short and, once settled, rare.
    assert!(share_at(&sizes, 2) > 0.99, "{sizes:?}");
}

#[test]
fn compute_bound_views_settle_near_the_cpus() {
    // Four CPUs; every thread past four only adds switching.
    let view = View {
        cpus: 4,
        capacity: |n| 1000.0 * n.min(4) as f64 * (1.0 - 0.01 * n.saturating_sub(4) as f64),
        lock_share: |_| 0.0,
        cpu_busy: |n| n.min(4) as f64,
    };
    let sizes = settle(64, 2, view, 40, 20);
    let m = median(&sizes);
    assert!((4..=6).contains(&m), "{sizes:?}");
}

/// A worker with `cpus` usable CPUs making loop calls at `loop_capacity`
/// requests per second, its pool serving `capacity(threads)` once they
/// are suspended: where the controller's mode settles, tick by tick.
struct Modes {
    controller: Controller,
    model: Model,
    start: Instant,
    ticks: u32,
}

impl Modes {
    fn new(conns: usize, loop_capacity: f64, view: View) -> Modes {
        Modes::seeded(conns, loop_capacity, view, 0x9e37_79b9_7f4a_7c15)
    }

    /// `new` with the model's noise from `seed`.
    fn seeded(conns: usize, loop_capacity: f64, view: View, seed: u64) -> Modes {
        let plan = PoolPlan {
            initial: 2,
            min: 1,
            max: 64,
            adaptive: true,
            cpus: view.cpus,
            workers: 1,
            reason: String::new(),
        };
        Modes {
            controller: Controller::new(plan, true),
            model: Model {
                conns,
                capacity: view.capacity,
                lock_share: view.lock_share,
                cpu_busy: view.cpu_busy,
                live: 2,
                counters: Counters::default(),
                carry: 0.0,
                seed,
                loop_capacity: Some(loop_capacity),
                suspended: false,
                weather: |_| 1.0,
                elapsed: Duration::ZERO,
            },
            start: Instant::now(),
            ticks: 0,
        }
    }

    /// Run for `seconds`; the share of ticks with loop calls suspended,
    /// and the pool sizes seen while they were.
    fn run(&mut self, seconds: u32) -> (f64, Vec<usize>) {
        let ticks = seconds * 1000 / TICK.as_millis() as u32;
        let mut suspended = 0;
        let mut sizes = Vec::new();
        for _ in 0..ticks {
            self.ticks += 1;
            self.model.advance(TICK);
            let now = self.start + TICK * self.ticks;
            self.controller.tick(&mut self.model, now);
            assert_eq!(self.model.suspended, self.controller.loop_calls_suspended());
            if self.model.suspended {
                suspended += 1;
                sizes.push(self.model.live);
            }
        }
        (suspended as f64 / ticks as f64, sizes)
    }
}

/// A GIL-holding hello: loop calls serve 70k/s on one thread; the pool
/// (the loop hands each call to a handler thread on the other CPU) serves
/// about half of that, as measured on 2 CPUs, and a third thread only
/// queues for the GIL.
fn hello_on_two_cpus() -> View {
    View {
        cpus: 2,
        capacity: |n| match n {
            1 => 32_000.0,
            _ => 38_000.0 * (1.0 - 0.02 * (n - 2) as f64),
        },
        lock_share: |n| 0.5 * (n - 1) as f64 / n as f64,
        cpu_busy: |n| n.min(2) as f64,
    }
}

/// About 1 ms of hashing with the GIL released: loop calls compute on one
/// CPU, each pool thread on a CPU of its own, up to the two there are.
fn hashing_on_two_cpus() -> View {
    View {
        cpus: 2,
        capacity: |n| 980.0 * n.min(2) as f64 * (1.0 - 0.01 * n.saturating_sub(2) as f64),
        lock_share: |_| 0.0,
        cpu_busy: |n| n.min(2) as f64,
    }
}

#[test]
fn a_gil_holding_hello_on_two_cpus_keeps_its_loop_calls() {
    let mut m = Modes::new(8, 70_000.0, hello_on_two_cpus());
    let (early, _) = m.run(30);
    // The pool was tried (a probe window is 50 ms at this rate), and lost.
    assert!(early > 0.0, "the pool was never tried");
    assert!(early < 0.02, "{early}");
    // Once settled, probes are rare: well under 1% of the time.
    let (settled, _) = m.run(60);
    assert!(settled < 0.005, "{settled}");
    assert_eq!(m.controller.mode.changes, 0, "{}", m.controller.call_path());
}

#[test]
fn a_view_computing_without_the_gil_on_two_cpus_gets_the_pool_with_a_thread_per_cpu() {
    let mut m = Modes::new(8, 1000.0, hashing_on_two_cpus());
    m.run(10);
    let (share, sizes) = m.run(60);
    // Loop calls are tried again now and then, and lose.
    assert!(share > 0.98, "{share}");
    let two = sizes.iter().filter(|&&n| n == 2).count() as f64 / sizes.len() as f64;
    assert!(two > 0.9, "{sizes:?}");
    assert!(
        m.controller.call_path().contains("suspended"),
        "{}",
        m.controller.call_path()
    );
}

#[test]
fn when_the_pool_barely_beats_loop_calls_loop_calls_stay() {
    // The pool serves 2% more: within the noise of a window, and not worth
    // the threads.
    let view = || View {
        cpus: 2,
        capacity: |n| if n >= 2 { 10_200.0 } else { 9_000.0 },
        lock_share: |_| 0.0,
        cpu_busy: |n| n.min(2) as f64,
    };
    // Over twenty runs of the model's noise: a 2% gain is within the
    // noise of a window, so now and then the pool wins two windows in a
    // row and loop calls win back at their next trial; one seed alone
    // tells nothing of how often.
    let (mut shares, mut stayed) = (Vec::new(), 0);
    for seed in 1..=20u64 {
        let mut m = Modes::seeded(
            8,
            10_000.0,
            view(),
            seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1,
        );
        m.run(10);
        // About three trial windows of the pool (200 ms each at this
        // rate) in the minute, backing off: 1% of the time.
        let (share, _) = m.run(60);
        shares.push(share);
        stayed += usize::from(m.controller.mode.changes == 0);
    }
    let mean = shares.iter().sum::<f64>() / shares.len() as f64;
    assert!(mean <= 0.025, "{mean}: {shares:?}");
    assert!(
        stayed >= 14,
        "{stayed} of 20 runs never left loop calls: {shares:?}"
    );
}

#[test]
fn one_client_at_a_time_brings_loop_calls_back_and_load_sends_them_away_again() {
    let mut m = Modes::new(8, 1000.0, hashing_on_two_cpus());
    m.run(10);
    assert!(m.controller.loop_calls_suspended());
    // One call at a time: no thread to run beside it.
    m.model.conns = 1;
    m.run(1);
    assert!(
        !m.controller.loop_calls_suspended(),
        "{}",
        m.controller.call_path()
    );
    let (share, _) = m.run(10);
    assert_eq!(share, 0.0);
    // Concurrent again: the pool wins its next probe.
    m.model.conns = 8;
    let (share, _) = m.run(60);
    assert!(share > 0.9, "{share}");
}

#[test]
fn without_measuring_loop_calls_the_controller_never_suspends_them() {
    // A worker with one CPU of its own (`loop_calls::decide`): loop calls
    // stay on whatever the pool would do.
    let mut m = Modes::new(8, 1000.0, hashing_on_two_cpus());
    m.controller = Controller::new(m.controller.plan.clone(), false);
    let (share, _) = m.run(30);
    assert_eq!(share, 0.0);
}

#[test]
fn a_fast_view_settled_on_its_best_size_does_not_repeat_a_losing_probe_while_the_load_holds() {
    // The fast view of `a_fast_view_settles_and_then_rarely_leaves_its_best_size`:
    // each trial away from 2 threads loses, and nothing changes.
    let capacity = |n: usize| match n {
        1 => 140_000.0,
        2 => 172_000.0,
        _ => 172_000.0 * (1.0 - 0.02 * (n - 2) as f64),
    };
    let view = View {
        cpus: 1,
        capacity,
        lock_share: |n| 0.5 * (n - 1) as f64 / n as f64,
        cpu_busy: |_| 1.0,
    };
    let plan = PoolPlan {
        initial: 2,
        min: 1,
        max: 64,
        adaptive: true,
        cpus: 1,
        workers: 1,
        reason: String::new(),
    };
    let mut controller = Controller::new(plan, false);
    let mut model = Model {
        conns: 64,
        capacity: view.capacity,
        lock_share: view.lock_share,
        cpu_busy: view.cpu_busy,
        live: 2,
        counters: Counters::default(),
        carry: 0.0,
        seed: 0x9e37_79b9_7f4a_7c15,
        loop_capacity: None,
        suspended: false,
        weather: |_| 1.0,
        elapsed: Duration::ZERO,
    };
    let start = Instant::now();
    let mut trials = 0;
    let mut last = 2;
    for i in 1..=(120_000 / TICK.as_millis() as u32) {
        model.advance(TICK);
        controller.tick(&mut model, start + TICK * i);
        // Trials begun after the first 30 s (each lost once by then).
        if model.live != last && last == 2 && i > 30_000 / TICK.as_millis() as u32 {
            trials += 1;
        }
        last = model.live;
    }
    // Backing off alone (to one per 30 s) would have tried about three
    // times in these 90 s.
    assert!(
        trials <= 1,
        "{trials} trials: {}",
        controller.pool_summary()
    );
    assert!(controller.not_repeated > 0, "{}", controller.pool_summary());
}

/// Workers on one box of `cpus` CPUs, each a closed loop of `conns`
/// clients on a view that computes `cpu_s` and then blocks `block_s` per
/// request, with the GIL released: the kernel shares the CPUs among the
/// runnable threads of every worker, and each thread past the CPUs costs
/// a little in switching. What a worker's controller reads from its
/// threads' clocks and from its siblings' lines comes from this.
/// The shared page as the simulated workers see it: each one's last
/// (CPUs used, CPUs wanted, threads).
type Page = std::rc::Rc<std::cell::RefCell<Vec<Option<(f64, f64, usize)>>>>;

struct SharedBox {
    cpus: f64,
    cpu_s: f64,
    block_s: f64,
    workers: Vec<Sim>,
    controllers: Vec<Controller>,
    start: Instant,
    ticks: u32,
}

struct Sim {
    index: usize,
    conns: usize,
    live: usize,
    counters: Counters,
    clock: Clock,
    carry: f64,
    page: Page,
}

impl Tunable for Sim {
    fn completed(&self) -> u64 {
        self.counters.completed
    }
    fn counters(&self) -> Counters {
        Counters {
            clock: Some(self.clock),
            ..self.counters
        }
    }
    fn load(&self) -> (usize, usize) {
        let busy = self.live.min(self.conns);
        (self.conns - busy, busy)
    }
    fn size(&self) -> (usize, usize) {
        (self.live, self.live)
    }
    fn resize(&mut self, threads: usize) {
        self.live = threads;
    }
    fn suspend_loop_calls(&mut self, _: bool, _: Instant) {}
    fn thread_clock(&self) -> Option<Clock> {
        Some(self.clock)
    }
    fn siblings(&self) -> Option<SiblingPools> {
        let page = self.page.borrow();
        let mut sum = SiblingPools::default();
        for (j, line) in page.iter().enumerate() {
            if let (true, Some((cpu, demand, threads))) = (j != self.index, line) {
                sum.workers += 1;
                sum.cpu += cpu;
                sum.demand += demand;
                sum.threads += threads;
            }
        }
        Some(sum)
    }
    fn publish(&self, cpu: f64, demand: f64, threads: usize) {
        self.page.borrow_mut()[self.index] = Some((cpu, demand, threads));
    }
}

impl SharedBox {
    fn new(
        workers: usize,
        cpus: usize,
        conns: usize,
        initial: usize,
        cpu_ms: f64,
        block_ms: f64,
    ) -> SharedBox {
        let page = std::rc::Rc::new(std::cell::RefCell::new(vec![None; workers]));
        let plan = PoolPlan {
            initial,
            min: 1,
            max: 64,
            adaptive: true,
            cpus,
            workers,
            reason: String::new(),
        };
        SharedBox {
            cpus: cpus as f64,
            cpu_s: cpu_ms / 1e3,
            block_s: block_ms / 1e3,
            workers: (0..workers)
                .map(|index| Sim {
                    index,
                    conns,
                    live: initial,
                    counters: Counters::default(),
                    clock: Clock::default(),
                    carry: 0.0,
                    page: page.clone(),
                })
                .collect(),
            controllers: (0..workers)
                .map(|_| Controller::new(plan.clone(), false))
                .collect(),
            start: Instant::now(),
            ticks: 0,
        }
    }

    fn advance(&mut self, dt: Duration) {
        let dt = dt.as_secs_f64();
        let (c, s) = (self.cpu_s, self.block_s);
        // Busy threads want a CPU c / (c + s) of the time; past the CPUs
        // each gets a share `f` of one, and every runnable thread past the
        // CPUs costs 3% in switching.
        let busy: Vec<f64> = self
            .workers
            .iter()
            .map(|w| w.live.min(w.conns) as f64)
            .collect();
        let wanted: f64 = busy.iter().map(|b| b * c / (c + s)).sum();
        let f = (self.cpus / wanted.max(1e-9)).min(1.0);
        let penalty = 1.0 / (1.0 + 0.03 * (wanted - self.cpus).max(0.0));
        for (w, b) in self.workers.iter_mut().zip(busy) {
            let per_request = c / f + s;
            let due = b / per_request * penalty * dt + w.carry;
            w.carry = due - due.floor();
            let k = &mut w.counters;
            k.completed += due.floor() as u64;
            k.service_ns += (b * dt * 1e9) as u64;
            k.queue_wait_ns += ((w.conns as f64 - b) * dt * 1e9) as u64;
            let ran = b * c / per_request * dt;
            let waited = b * (c / f - c) / per_request * dt;
            w.clock.ran += (ran * 1e9) as u64;
            w.clock.waited += (waited * 1e9) as u64;
            k.cpu_ns += ((ran + 0.02 * dt) * 1e9) as u64;
        }
    }

    /// Run for `seconds`; every worker's pool size at every tick. A worker
    /// without clients is not ticked, as the event loop ticks the
    /// controller only while calls are in flight.
    fn run(&mut self, seconds: u32) -> Vec<Vec<usize>> {
        let mut sizes = vec![Vec::new(); self.workers.len()];
        for _ in 0..seconds * 1000 / TICK.as_millis() as u32 {
            self.ticks += 1;
            self.advance(TICK);
            let now = self.start + TICK * self.ticks;
            for (i, (w, c)) in self
                .workers
                .iter_mut()
                .zip(&mut self.controllers)
                .enumerate()
            {
                if w.conns > 0 {
                    c.tick(w, now);
                }
                sizes[i].push(w.live);
            }
        }
        sizes
    }
}

#[test]
fn two_workers_on_two_cpus_share_them_for_a_cpu_bound_view() {
    // 1 ms of hashing per request, the GIL released; 8 clients each; the
    // pools start at 4 threads each, eight for two CPUs.
    let mut b = SharedBox::new(2, 2, 8, 4, 1.0, 0.0);
    b.run(20);
    let sizes = b.run(20);
    for (i, s) in sizes.iter().enumerate() {
        assert!(
            s.iter().all(|&n| n <= 2),
            "worker {i}: {s:?} {}",
            b.controllers[i].pool_summary()
        );
    }
    let end: usize = b.workers.iter().map(|w| w.live).sum();
    assert!(
        end <= 3,
        "{end} threads in all: {}",
        b.controllers[0].pool_summary()
    );
}

#[test]
fn workers_started_together_try_no_thread_past_their_share() {
    // Two workers from one thread each, a CPU-bound view: the first to
    // close a window finds no sibling on the page yet. Taking its share to
    // be both CPUs, it tried a second thread, and under the kernel's
    // per-thread fairness the trial "raised throughput" by taking the
    // sibling's CPU time.
    let mut b = SharedBox::new(2, 2, 8, 1, 1.0, 0.0);
    let sizes = b.run(10);
    for (i, s) in sizes.iter().enumerate() {
        let summary = b.controllers[i].pool_summary();
        assert!(s.iter().all(|&n| n == 1), "worker {i}: {s:?} {summary}");
    }
    let waited: u64 = b.controllers.iter().map(|c| c.waited_for_siblings).sum();
    assert_eq!(waited, 1, "{}", b.controllers[0].pool_summary());
}

#[test]
fn a_worker_whose_siblings_publish_nothing_takes_the_cpus_after_a_window() {
    // Two workers planned, one of them idle (it never measures, so never
    // publishes): the busy one waits one window, then finds room for a
    // thread per CPU.
    let mut b = SharedBox::new(1, 2, 8, 1, 1.0, 0.0);
    let plan = PoolPlan {
        workers: 2,
        ..b.controllers[0].plan.clone()
    };
    b.controllers[0] = Controller::new(plan, false);
    b.run(20);
    let sizes = b.run(10);
    assert!(
        median(&sizes[0]) == 2,
        "{:?} {}",
        sizes[0],
        b.controllers[0].pool_summary()
    );
    assert_eq!(b.controllers[0].waited_for_siblings, 1);
}

#[test]
fn a_worker_whose_first_clients_come_late_tries_no_thread_past_its_share() {
    // Two workers on two CPUs, 8 clients each; worker 0 computes on one
    // thread from the start (a GIL-holding view keeps it there), worker 1
    // has no client for 5 s. Its first window closed across the idle
    // seconds measured their rate and no thread clocks (none were read
    // before its first tick): room for a second thread, tried at once and
    // judged against that rate.
    let mut b = SharedBox::new(2, 2, 8, 1, 1.0, 0.0);
    let one = PoolPlan {
        max: 1,
        ..b.controllers[0].plan.clone()
    };
    b.controllers[0] = Controller::new(one, false);
    b.workers[1].conns = 0;
    b.run(5);
    b.workers[1].conns = 8;
    let sizes = b.run(10);
    let summary = b.controllers[1].pool_summary();
    assert!(sizes[1].iter().all(|&n| n == 1), "{:?} {summary}", sizes[1]);
}

#[test]
fn one_worker_alone_on_two_cpus_keeps_a_thread_per_cpu_for_a_cpu_bound_view() {
    let mut b = SharedBox::new(1, 2, 8, 4, 1.0, 0.0);
    b.run(20);
    let sizes = b.run(20);
    assert!(
        median(&sizes[0]) == 2,
        "{:?} {}",
        sizes[0],
        b.controllers[0].pool_summary()
    );
}

#[test]
fn two_workers_on_two_cpus_still_grow_for_a_view_that_sleeps() {
    // 50 ms of sleep per request, 16 clients each.
    let mut b = SharedBox::new(2, 2, 16, 1, 0.05, 50.0);
    b.run(40);
    let sizes = b.run(10);
    for (i, s) in sizes.iter().enumerate() {
        assert!(
            median(s) >= 12,
            "worker {i}: {s:?} {}",
            b.controllers[i].pool_summary()
        );
    }
}

#[test]
fn a_view_that_sleeps_keeps_spare_threads_beyond_its_clients_and_holds_them() {
    // 5 ms of sleep per request, one worker on two CPUs: once settled,
    // every tick has a free thread for the next request (a thread or more
    // past the clients), and idle retirement does not take it back.
    for (conns, most) in [(8, 11), (32, 40)] {
        let mut b = SharedBox::new(1, 2, conns, 2, 0.05, 5.0);
        b.run(20);
        let sizes = b.run(30);
        let summary = b.controllers[0].pool_summary();
        assert!(
            sizes[0].iter().all(|&n| n > conns && n <= most),
            "{conns} clients: {:?} {summary}",
            sizes[0]
        );
        assert!(summary.contains("kept free"), "{summary}");
    }
    // A view that computes keeps none: one thread per CPU.
    let mut b = SharedBox::new(1, 2, 8, 4, 1.0, 0.0);
    b.run(20);
    let sizes = b.run(10);
    assert!(sizes[0].iter().all(|&n| n <= 2), "{:?}", sizes[0]);
}

#[test]
fn a_stall_of_threads_that_wait_for_a_cpu_adds_no_thread() {
    // 100 ms of CPU per request on one CPU, two threads: nothing completes
    // for longer than a stall, but both threads are runnable all along.
    let mut b = SharedBox::new(1, 1, 8, 2, 100.0, 0.0);
    let sizes = b.run(20);
    assert!(sizes[0].iter().all(|&n| n <= 2), "{:?}", sizes[0]);
    assert!(
        b.controllers[0].stalls_runnable > 0,
        "{}",
        b.controllers[0].pool_summary()
    );
    // A view that blocks as long still gets threads at once.
    let mut b = SharedBox::new(1, 1, 8, 2, 0.01, 100.0);
    let sizes = b.run(20);
    assert!(median(&sizes[0]) >= 6, "{:?}", sizes[0]);
}
