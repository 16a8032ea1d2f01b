//! The worker's event loop: one thread, one `mio::Poll`, edge-triggered.
//!
//! Each pass: wait; handle the events of connections already held; take
//! completions from the pool and resume those connections; then admit a
//! bounded batch of new connections (so a flood of connects cannot starve
//! requests in progress); then sweep timeouts. Every read drains the socket
//! until it would block (or a short read shows it is dry), because an edge
//! is announced only once.
//!
//! A request meets the front desk first (`event_loop/front_desk.rs`): the
//! health path, a CORS preflight, a request without a valid API key and a
//! scrape are answered there, by the loop; any other goes on to the plugin.
//!
//! A plugin that declares `M0_CAP_INLINE` (its handler never blocks) is
//! called on this thread, with no hand-off; a request it would block on
//! comes back as `M0_DEFER` and goes to the pool like any other (see
//! `event_loop/inline.rs`).
//!
//! Any other reentrant plugin is called by whichever thread leads the loop,
//! between passes, while no call is in flight on a handler thread (on a
//! worker with CPUs to spare, while the adaptive controller finds that
//! serves more than the pool alone): one thread then reads, calls and
//! writes, as bjoern does, with no hand-off between threads. A call that
//! runs long has a handler thread take the loop over (see
//! `event_loop/loop_calls/`; the methods at the end of this file are the
//! loop's side of it).

use std::io;
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, RawFd};
use std::sync::Arc;
use std::time::{Duration, Instant};

use mio::net::TcpListener;
use mio::unix::SourceFd;
use mio::{Events, Interest, Poll, Token};
use slab::Slab;

use super::accept_share::AcceptShare;
use super::access_log::{AccessLog, Entry};
use super::connection::{Conn, Phase, Ready, Step};
use super::metrics::WorkerMetrics;
use super::pool::Pool;
use super::pool::adaptive::{self, Controller};
use crate::config::Config;
use crate::http::head::{Limits, RequestHead};
use crate::http::{HttpError, response};
use crate::plugin::call::{Completion, Job, Peer};
use crate::plugin::exchange::Outcome;
use crate::signals::SignalPipe;

mod accept_pause;
mod admission;
mod answer;
mod front_desk;
mod inline;
mod scrape;
mod sweep;

pub mod loop_calls;
mod tunable;

use front_desk::{Desk, FrontDesk, Pass};
use inline::{InlineCalls, SpinGate};
use loop_calls::{LoopCaller, LoopCalls};

pub const LISTENER: Token = Token(usize::MAX - 1);
pub const WAKER: Token = Token(usize::MAX - 2);
pub const SIGNALS: Token = Token(usize::MAX - 3);
pub const CHANNEL: Token = Token(usize::MAX - 4);
pub const METRICS: Token = Token(usize::MAX - 5);

/// Set once this worker has logged a 413 for `--max-body`.
static MAX_BODY_LOGGED: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// New connections admitted per pass.
const ACCEPT_BATCH: usize = 64;
/// At the start of a drain, the backlog is taken in up to this many
/// batches (a listener's backlog is `--backlog`, 1024 by default).
const DRAIN_ACCEPT_ROUNDS: usize = 16;
/// How long a closing connection waits for the client to go away.
const LINGER: Duration = Duration::from_secs(2);
/// Requests one connection may have answered inline before the loop turns
/// to the others: a client that keeps its pipe full of pipelined requests
/// (megabytes sit in the socket buffers) would otherwise hold the loop
/// until it stops sending, and every other connection would wait. Sixteen
/// rather than more: a turn of 64 streamed answers held the others for
/// several milliseconds, a p99 four times that of the same load alone.
const DRIVE_BUDGET: u32 = 16;
/// How long a draining worker waits for the first request of a connection
/// it accepted just before the drain (at most `--header-timeout`).
const FIRST_REQUEST_GRACE: Duration = Duration::from_secs(2);
/// How long a draining worker keeps an idle keep-alive connection open for
/// a request its client may already have sent (at most `--idle-timeout`).
const NEXT_REQUEST_GRACE: Duration = Duration::from_millis(500);

pub struct Timeouts {
    pub header: Option<Duration>,
    pub body: Option<Duration>,
    /// `--body-min-rate` in bytes a second (0: off).
    pub body_min_rate: u64,
    pub idle: Option<Duration>,
}

impl Timeouts {
    /// When a body waiting for more bytes times out: `--body-timeout` after
    /// its last progress, or sooner when it has averaged less than
    /// `--body-min-rate` since it began (the allowance: `--body-timeout`
    /// plus a second per `--body-min-rate` bytes received).
    fn body_deadline(
        &self,
        now: Instant,
        began: (Instant, u64),
        read_total: u64,
    ) -> Option<Instant> {
        let stall = now + self.body?;
        if self.body_min_rate == 0 {
            return Some(stall);
        }
        let received = read_total.saturating_sub(began.1);
        let allowance =
            self.body? + Duration::from_secs_f64(received as f64 / self.body_min_rate as f64);
        Some(stall.min(began.0 + allowance))
    }
}

pub struct EventLoop {
    poll: Poll,
    listener: Option<TcpListener>,
    conns: Slab<Conn>,
    /// Connections in `conns` whose client has hung up (`Conn::hung_up`).
    hung_up: usize,
    pool: Pool,
    controller: Controller,
    share: Option<AcceptShare>,
    channel_owed: bool,
    limits: Limits,
    timeouts: Timeouts,
    max_keepalive_requests: u32,
    graceful: Duration,
    signals: SignalPipe,
    head_scratch: RequestHead,
    spare_bufs: Vec<Vec<u8>>,
    in_flight: usize,
    accept_owed: bool,
    accept_pause: accept_pause::AcceptPause,
    drain_deadline: Option<Instant>,
    /// Connections that spent their `DRIVE_BUDGET` with requests still
    /// buffered or unread: driven again after this turn's events, with no
    /// event to announce them (the socket's edge has passed).
    resume: Vec<usize>,
    /// When connections past their deadline are looked for.
    sweep: sweep::SweepClock,
    inline: Option<InlineCalls>,
    /// The plugin admits each request before it is queued
    /// (`event_loop/admission.rs`).
    admission: Option<admission::Admitting>,
    loop_calls: Option<LoopCalls>,
    events: Option<Events>,
    completions: Vec<Completion>,
    access_log: Option<AccessLog>,
    /// The checks before any plugin, with their settings (health path,
    /// API keys, CORS, trusted proxies): `event_loop/front_desk.rs`.
    desk: FrontDesk,
    /// `--metrics`: this worker's counting, and the listener scrapes come to.
    metrics: Option<WorkerMetrics>,
    metrics_listener: Option<TcpListener>,
    /// How long to keep polling without blocking after the last event, and
    /// when the last event came (see `spin_instead_of_blocking`).
    idle_spin: Duration,
    last_event: Instant,
    spin_gate: SpinGate,
    /// Read once after each wait: the time deadlines are reckoned from
    /// (they are checked a few milliseconds apart at the most often, see
    /// `event_loop/sweep.rs`; a clock read per request cost 3% of
    /// the WSGI hello's CPU).
    now: Instant,
    pub accepted: u64,
}

/// Why the loop ended.
pub enum Exit {
    Drained,
    /// The drain deadline passed with this many requests still in flight.
    DeadlinePassed(usize),
    /// A second stop signal, or a fatal error in a handler thread.
    Immediate,
}

impl EventLoop {
    pub fn new(
        poll: Poll,
        listener: TcpListener,
        pool: Pool,
        controller: Controller,
        share: Option<AcceptShare>,
        cfg: &Config,
        signals: SignalPipe,
    ) -> io::Result<EventLoop> {
        if let Some(share) = &share {
            poll.registry().register(
                &mut SourceFd(&share.channel_fd()),
                CHANNEL,
                Interest::READABLE,
            )?;
        }
        let mut listener = listener;
        poll.registry()
            .register(&mut listener, LISTENER, Interest::READABLE)?;
        poll.registry().register(
            &mut SourceFd(&signals.read_fd()),
            SIGNALS,
            Interest::READABLE,
        )?;
        let cli = &cfg.cli;
        Ok(EventLoop {
            poll,
            listener: Some(listener),
            conns: Slab::with_capacity(1024),
            hung_up: 0,
            pool,
            controller,
            share,
            channel_owed: false,
            limits: cfg.limits,
            timeouts: Timeouts {
                header: Config::timeout(cli.header_timeout),
                body: Config::timeout(cli.body_timeout),
                body_min_rate: cli.body_min_rate,
                idle: Config::timeout(cli.idle_timeout),
            },
            max_keepalive_requests: cli.max_keepalive_requests,
            graceful: cli.graceful_timeout,
            signals,
            head_scratch: RequestHead::default(),
            spare_bufs: Vec::new(),
            in_flight: 0,
            accept_owed: false,
            accept_pause: Default::default(),
            drain_deadline: None,
            resume: Vec::new(),
            sweep: sweep::SweepClock::new(Instant::now()),
            inline: None,
            admission: None,
            loop_calls: None,
            events: Some(Events::with_capacity(1024)),
            completions: Vec::with_capacity(64),
            access_log: None,
            desk: FrontDesk::new(cfg),
            metrics: None,
            metrics_listener: None,
            idle_spin: Duration::from_micros(u64::from(cli.idle_spin_us)),
            last_event: Instant::now(),
            spin_gate: SpinGate::new(cli.idle_spin_max_wait),
            now: Instant::now(),
            accepted: 0,
        })
    }

    pub fn into_pool(self) -> Pool {
        if let Some(inline) = &self.inline {
            self.pool.release_loop_thread(inline.bufs.index);
        }
        self.pool
    }

    /// Accepted, passed on, received from siblings.
    pub fn share_counts(&self) -> Option<(u64, u64, u64)> {
        self.share.as_ref().map(AcceptShare::counts)
    }

    pub fn run(&mut self) -> io::Result<Exit> {
        loop {
            if let Some(exit) = self.pass()? {
                return Ok(exit);
            }
        }
    }

    /// One pass of the loop; `Some` when the loop has ended.
    pub fn pass(&mut self) -> io::Result<Option<Exit>> {
        let mut events = self
            .events
            .take()
            .unwrap_or_else(|| Events::with_capacity(1024));
        let mut completions = std::mem::take(&mut self.completions);
        let result = self.pass_with(&mut events, &mut completions);
        if let (Ok(Some(_)), Some(log)) = (&result, &mut self.access_log) {
            // The loop has ended: what the log holds goes out before exit.
            log.flush();
        }
        self.events = Some(events);
        self.completions = completions;
        result
    }

    fn pass_with(
        &mut self,
        events: &mut Events,
        completions: &mut Vec<Completion>,
    ) -> io::Result<Option<Exit>> {
        if super::pool::fatal_stop_requested() {
            return Ok(Some(Exit::Immediate));
        }
        if let Some(deadline) = self.drain_deadline {
            let handed_over = self.share.as_ref().map_or(0, AcceptShare::own_pending);
            if self.conns.is_empty() && self.in_flight == 0 && handed_over == 0 {
                return Ok(Some(Exit::Drained));
            }
            if Instant::now() >= deadline {
                return Ok(Some(Exit::DeadlinePassed(self.in_flight)));
            }
        }
        let mut timeout = self.poll_timeout();
        if self.spin_instead_of_blocking() {
            timeout = Some(Duration::ZERO);
        }
        let may_block = timeout != Some(Duration::ZERO);
        let parked = may_block && self.pool.park_loop();
        let timeout = if may_block && !parked {
            Some(Duration::ZERO)
        } else {
            timeout
        };
        self.publish_share_load();
        if let Some(share) = &self.share {
            share.mark_pass(0);
        }
        let polled = self.poll.poll(events, timeout);
        self.pool.unpark_loop();
        if let Some(share) = &self.share {
            share.mark_pass(crate::plugin::host::monotonic_ns());
        }
        self.now = Instant::now();
        match polled {
            Ok(()) if !events.is_empty() => self.last_event = self.now,
            Ok(()) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => return Ok(None),
            Err(e) => return Err(e),
        }
        let mut listener_ready = false;
        let mut channel_ready = false;
        let mut scrapers_ready = false;
        for event in events.iter() {
            match event.token() {
                LISTENER => listener_ready = true,
                CHANNEL => channel_ready = true,
                METRICS => scrapers_ready = true,
                WAKER => {}
                SIGNALS => {
                    if self.on_signals() {
                        return Ok(Some(Exit::Immediate));
                    }
                }
                Token(key) => self.on_socket_event(key, event.is_read_closed()),
            }
        }
        // Those cut short last turn, after this turn's events: each waited
        // one round of the others.
        let resume = std::mem::take(&mut self.resume);
        for &key in &resume {
            if self.conns.get(key).is_some_and(|c| c.may_drive()) {
                self.drive(key);
            }
        }
        self.resume_spare(resume);
        self.pool.drain_completions(completions);
        for done in completions.drain(..) {
            self.on_completion(done);
        }
        // New connections after the events of those already held.
        if channel_ready || self.channel_owed {
            self.receive_batch();
        }
        if listener_ready || self.accept_owed || self.accept_pause.due(self.now) {
            self.accept_batch();
        }
        if scrapers_ready {
            self.accept_scrapers();
        }
        let now = self.now;
        // While only loop calls are in flight the pool has nothing to size,
        // unless the controller measures loop calls against it or publishes
        // the worker's load for siblings on the same CPUs.
        if self.pool_in_flight() > 0
            || (self.in_flight > 0
                && (self.controller.measures_loop_calls() || self.controller.shares_cpus()))
        {
            let mut worker = tunable::Worker {
                pool: &mut self.pool,
                loop_calls: self.loop_calls.as_mut(),
                in_flight: self.in_flight,
                share: self.share.as_ref(),
            };
            self.controller.tick(&mut worker, now);
        }
        if now >= self.sweep.next(self.conns.len()) {
            self.sweep_timeouts();
        }
        self.expire_one();
        if let Some(log) = &mut self.access_log {
            log.tick(now);
        }
        self.publish_metrics(now);
        Ok(None)
    }

    /// Keep the resume list's allocation for the next turn (unless a
    /// resumed connection already started a new list).
    fn resume_spare(&mut self, mut spare: Vec<usize>) {
        if self.resume.is_empty() {
            spare.clear();
            self.resume = spare;
        }
    }

    fn poll_timeout(&self) -> Option<Duration> {
        if self.accept_owed || self.channel_owed || !self.resume.is_empty() || self.sweep.has_due()
        {
            return Some(Duration::ZERO);
        }
        let mut timeout = None;
        if !self.conns.is_empty() {
            let next = self.sweep.next(self.conns.len());
            timeout = Some(next.saturating_duration_since(Instant::now()));
        }
        if self.in_flight > 0 {
            timeout = Some(timeout.map_or(adaptive::TICK, |t: Duration| t.min(adaptive::TICK)));
        }
        if let Some(deadline) = self.drain_deadline {
            let left = deadline
                .saturating_duration_since(Instant::now())
                .min(sweep::HOUSEKEEPING);
            timeout = Some(timeout.map_or(left, |t: Duration| t.min(left)));
        }
        if let Some(due) = self.metrics.as_ref().map(WorkerMetrics::next_publish) {
            let left = due.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t: Duration| t.min(left)));
        }
        if let Some(due) = self.access_log.as_ref().and_then(AccessLog::deadline) {
            let left = due.saturating_duration_since(Instant::now());
            timeout = Some(timeout.map_or(left, |t: Duration| t.min(left)));
        }
        if let Some(left) = self.accept_pause.wake_in(Instant::now()) {
            timeout = Some(timeout.map_or(left, |t: Duration| t.min(left)));
        }
        timeout
    }

    /// Returns true when the loop must stop at once.
    fn on_signals(&mut self) -> bool {
        let mut stop_now = false;
        for signo in self.signals.drain() {
            // Ctrl-C sends SIGINT to the whole process group; the
            // supervisor turns it into the SIGTERM that starts this drain.
            // Acting on it here too made that SIGTERM a second signal,
            // which stops at once and cuts the requests in flight.
            if signo == libc::SIGTERM || signo == libc::SIGQUIT {
                if self.drain_deadline.is_some() {
                    stop_now = true;
                } else {
                    self.start_drain();
                }
            }
            // SIGHUP and SIGINT belong to the supervisor: a worker ignores
            // them.
        }
        stop_now
    }

    /// Stop accepting, close idle connections, let requests in flight finish.
    pub fn start_drain(&mut self) {
        if self.drain_deadline.is_some() {
            return;
        }
        crate::plugin::exchange::set_draining();
        if let Some(share) = &self.share {
            share.leave();
        }
        self.drain_deadline = Some(Instant::now() + self.graceful);
        // Connections the kernel completed before the stop are the clients'
        // as much as accepted ones (connect() returned, the request is
        // often on the wire): take them in before letting the listener go,
        // or closing it resets them. They get the early grace below.
        for _ in 0..DRAIN_ACCEPT_ROUNDS {
            self.accept_batch();
            if !self.accept_owed {
                break;
            }
        }
        if let Some(mut listener) = self.listener.take() {
            let _ = self.poll.registry().deregister(&mut listener);
        }
        self.close_metrics_listener();
        self.accept_owed = false;
        // No idle connection is closed at once: its client may have sent
        // its next request already (a busy keep-alive client always has one
        // on the wire), and closing under it fails a request that a client
        // such as wrk, or any non-idempotent one, does not retry. So each
        // keeps a short grace to send one more head, answered with
        // `Connection: close`, and is closed quietly if none comes. One
        // accepted but not yet heard from (its request is usually on the
        // wire) gets the longer first-request grace.
        let now = Instant::now();
        let first = self
            .timeouts
            .header
            .map_or(FIRST_REQUEST_GRACE, |t| t.min(FIRST_REQUEST_GRACE));
        let next = self
            .timeouts
            .idle
            .map_or(NEXT_REQUEST_GRACE, |t| t.min(NEXT_REQUEST_GRACE));
        for (key, conn) in self.conns.iter() {
            if !conn.is_idle() {
                continue;
            }
            let by = now + if conn.served > 0 { next } else { first };
            let deadline = self.sweep.get(key).map_or(by, |d| d.min(by));
            self.sweep.set(key, Some(deadline));
        }
        crate::log::debug(format_args!(
            "draining: {} connection(s) open, {} request(s) in flight",
            self.conns.len(),
            self.in_flight
        ));
    }

    fn accept_batch(&mut self) {
        self.accept_owed = false;
        for _ in 0..ACCEPT_BATCH {
            let Some(listener) = self.listener.as_ref() else {
                return;
            };
            match listener.accept() {
                Ok((stream, addr)) => {
                    self.accept_pause.resumed();
                    if let Some(share) = &self.share {
                        share.note_accepted();
                        let own_load = self.share_load() as u64 + share.own_pending();
                        let now = crate::plugin::host::monotonic_ns();
                        if let Some(target) = share.pick(own_load, now, false)
                            && share.pass(target, stream.as_raw_fd(), addr)
                        {
                            // The sibling holds it now; our descriptor closes.
                            continue;
                        }
                    }
                    self.admit(stream, addr)
                }
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::ConnectionAborted => continue,
                Err(e) => {
                    // EMFILE and friends: not owed (retrying at once would
                    // spin); retried on a timer or when a descriptor frees.
                    self.accept_pause.failed(&e, self.now);
                    return;
                }
            }
        }
        self.accept_owed = true;
    }

    /// Connections handed over by siblings: admitted like accepted ones, or
    /// passed on when this worker is leaving.
    fn receive_batch(&mut self) {
        self.channel_owed = false;
        for _ in 0..ACCEPT_BATCH {
            let Some(share) = self.share.as_ref() else {
                return;
            };
            let (fd, peer) = match share.receive() {
                Ok(Some(got)) => got,
                Ok(None) => return,
                Err(e) => {
                    crate::log::warn(format_args!("accept share: receive failed: {e}"));
                    return;
                }
            };
            let std_stream = std::net::TcpStream::from(fd);
            let Some(peer) = peer.or_else(|| std_stream.peer_addr().ok()) else {
                continue;
            };
            if self.drain_deadline.is_some()
                && let Some(target) = share.pick(u64::MAX, 0, true)
                && share.pass(target, std_stream.as_raw_fd(), peer)
            {
                continue;
            }
            if std_stream.set_nonblocking(true).is_err() {
                continue;
            }
            self.admit(mio::net::TcpStream::from_std(std_stream), peer);
        }
        self.channel_owed = true;
    }

    fn admit(&mut self, stream: mio::net::TcpStream, addr: SocketAddr) {
        self.admit_as(stream, addr, None, false);
    }

    /// A connection accepted while the plugin's init ran, with the bytes
    /// already read from it (`loading.rs`).
    pub fn admit_held(&mut self, stream: std::net::TcpStream, addr: SocketAddr, bytes: Vec<u8>) {
        if stream.set_nonblocking(true).is_ok() {
            let stream = mio::net::TcpStream::from_std(stream);
            self.admit_as(stream, addr, Some(bytes), false);
        }
    }

    /// Admit a connection; `scraper` for one from the metrics listener.
    fn admit_as(
        &mut self,
        mut stream: mio::net::TcpStream,
        addr: SocketAddr,
        read: Option<Vec<u8>>,
        scraper: bool,
    ) {
        let _ = stream.set_nodelay(true);
        let entry = self.conns.vacant_entry();
        let key = entry.key();
        if let Err(e) = self
            .poll
            .registry()
            .register(&mut stream, Token(key), Interest::READABLE)
        {
            crate::log::warn(format_args!("cannot register a connection: {e}"));
            return;
        }
        self.accepted += 1;
        let peer = Arc::new(Peer {
            addr: addr.ip().to_canonical(),
            ip: addr.ip().to_canonical().to_string(),
            port: addr.port(),
        });
        let buf = read.unwrap_or_else(|| self.spare_bufs.pop().unwrap_or_default());
        let mut conn = Conn::new(stream, peer, buf);
        conn.scraper = scraper;
        self.sweep
            .set(key, self.timeouts.header.map(|t| self.now + t));
        entry.insert(conn);
        self.note_share_change(false);
        self.drive(key);
    }

    /// The connections that count for accept sharing: the open ones, less
    /// those whose client has hung up. A connection stays open while its
    /// request computes even when the client is gone (it is read again only
    /// after the answer), and counting those made a worker busy with the
    /// last batch of one load look full to the next: every connection of a
    /// new burst of clients went to its sibling, and stayed there.
    fn share_load(&self) -> usize {
        self.conns.len() - self.hung_up
    }

    fn publish_share_load(&self) {
        if let Some(share) = &self.share {
            share.publish_active(self.share_load());
        }
    }

    /// The share load changed: a connection came, or left (`departed`).
    fn note_share_change(&self, departed: bool) {
        if let Some(share) = &self.share {
            share.note_change(self.share_load(), departed);
        }
    }

    /// The socket said the client's end is closed: count it out of the load.
    fn note_hung_up(&mut self, key: usize) {
        if let Some(conn) = self.conns.get_mut(key)
            && !conn.hung_up
        {
            conn.hung_up = true;
            self.hung_up += 1;
            self.note_share_change(true);
        }
    }

    fn on_socket_event(&mut self, key: usize, read_closed: bool) {
        if read_closed {
            self.note_hung_up(key);
        }
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.may_read = true;
        match conn.phase {
            Phase::Dispatched => {}
            Phase::Flushing { .. } => self.flush(key),
            Phase::Linger => {
                if conn.discard_input() {
                    self.close(key);
                }
            }
            _ => {
                if conn.interim_pending() && !self.flush_interim(key) {
                    return;
                }
                self.drive(key)
            }
        }
    }

    /// Send more of a `100 Continue` the socket did not take at once.
    /// False when the connection was closed.
    fn flush_interim(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        let fd = conn.stream.as_raw_fd();
        match crate::plugin::exchange::flush_spilled(fd, &conn.out, &mut conn.out_pos) {
            Ok(false) => true,
            Ok(true) => {
                self.out_gone(key);
                true
            }
            Err(_) => {
                self.close(key);
                false
            }
        }
    }

    /// Before a request goes to the plugin, whose response goes straight
    /// to the socket: a `100 Continue` still waiting for the socket is
    /// dropped if none of it went out (a server may omit it; the client
    /// has sent the body anyway), and the connection is closed if part of
    /// it did (the response cannot follow half an interim one). False when
    /// closed.
    fn settle_interim(&mut self, key: usize) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        if !conn.interim_pending() {
            return true;
        }
        if conn.out_pos > 0 {
            self.close(key);
            return false;
        }
        self.out_gone(key);
        true
    }

    /// The connection's `out` was sent (or dropped): empty it, keep no
    /// large buffer, and listen for reads only again.
    pub(super) fn out_gone(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        conn.out.clear();
        conn.out_pos = 0;
        if conn.out.capacity() > 64 * 1024 {
            conn.out = Vec::new();
        }
        let _ = self
            .poll
            .registry()
            .reregister(&mut conn.stream, Token(key), Interest::READABLE);
    }

    /// Parse and dispatch whatever the connection has, answering pipelined
    /// requests in turn while inline calls complete them on the spot.
    fn drive(&mut self, key: usize) {
        let mut answered = 0;
        loop {
            let Some(conn) = self.conns.get_mut(key) else {
                return;
            };
            if answered == DRIVE_BUDGET {
                if !self.resume.contains(&key) {
                    self.resume.push(key);
                }
                return;
            }
            let had_bytes = !conn.rbuf.is_empty();
            match conn.advance(&self.limits, &mut self.head_scratch) {
                Step::Wait => {
                    // The first byte of a head starts the header timeout; a
                    // body gets the body timeout from its last progress.
                    let now = self.now;
                    match conn.phase {
                        Phase::Body { .. } => {
                            let began = *conn.body_began.get_or_insert((now, conn.read_total));
                            self.sweep.set(
                                key,
                                self.timeouts.body_deadline(now, began, conn.read_total),
                            );
                        }
                        Phase::Head if !had_bytes && !conn.rbuf.is_empty() => {
                            self.sweep.set(key, self.timeouts.header.map(|t| now + t));
                        }
                        _ => {}
                    }
                    // A `100 Continue` waits for the socket: hear when it is
                    // writable (a rare state: the client reads nothing).
                    if conn.interim_pending()
                        && self
                            .poll
                            .registry()
                            .reregister(
                                &mut conn.stream,
                                Token(key),
                                Interest::READABLE | Interest::WRITABLE,
                            )
                            .is_err()
                    {
                        self.close(key);
                    }
                    return;
                }
                Step::Dispatch(ready) => {
                    conn.body_began = None;
                    if !self.dispatch(key, ready) {
                        return;
                    }
                    answered += 1;
                }
                Step::Refuse(err) => return self.refuse(key, err),
                Step::Close => return self.close(key),
            }
        }
    }

    /// A parsed request: past the front desk and the plugin's admission
    /// to whoever calls the plugin (this thread inline, a loop call, or the
    /// pool). True when it was answered on this thread and the connection
    /// can take the next one at once.
    fn dispatch(&mut self, key: usize, mut ready: Ready) -> bool {
        if !self.settle_interim(key) {
            self.head_scratch_return(ready.head);
            return false;
        }
        let Some(conn) = self.conns.get(key) else {
            self.head_scratch_return(ready.head);
            return false;
        };
        let pass = match self.desk.check(
            &mut ready,
            &conn.rbuf,
            conn.peer.addr,
            conn.scraper,
            &self.metrics,
        ) {
            Desk::Pass(pass) => pass,
            Desk::Answered(answer) => return self.answer_from_desk(key, ready, answer),
            Desk::Scrape => return self.answer_scrape(key, ready),
        };
        let Some(job) = self.take_job(key, ready, pass) else {
            return false;
        };
        let job = match self.admit_request(key, job) {
            Ok(job) => job,
            Err(ready) => return ready,
        };
        let job = match self.try_inline(key, job) {
            Ok(job) => job,
            Err(ready) => return ready,
        };
        if let Some(conn) = self.conns.get_mut(key) {
            conn.phase = Phase::Dispatched;
        }
        if self.may_call_on_loop() {
            self.in_flight += 1;
            self.queue_loop_call(job);
        } else {
            self.submit_to_pool(key, job);
        }
        false
    }

    /// The job of a request that passed the front desk, with what the desk
    /// gave it; None when the connection is gone. The request's bytes go
    /// with the job, pipelined bytes after it stay; the connection has no
    /// deadline while the job is out.
    fn take_job(&mut self, key: usize, ready: Ready, pass: Pass) -> Option<Job> {
        let conn = self.conns.get_mut(key)?;
        let Ready {
            head,
            body,
            consumed,
        } = ready;
        let cap = self.max_keepalive_requests;
        let keep_alive =
            head.keep_alive && self.drain_deadline.is_none() && (cap == 0 || conn.served + 1 < cap);
        let mut rest = self.spare_bufs.pop().unwrap_or_default();
        rest.clear();
        rest.extend_from_slice(&conn.rbuf[consumed..]);
        let mut buf = std::mem::replace(&mut conn.rbuf, rest);
        buf.truncate(consumed);
        let Pass {
            cors,
            client,
            https,
        } = pass;
        let job = Job {
            token: key,
            fd: conn.stream.as_raw_fd(),
            buf,
            head,
            body,
            keep_alive,
            peer: client.unwrap_or_else(|| Arc::clone(&conn.peer)),
            https,
            cors,
            queued_at: self.now,
            cost: 0,
            model: crate::plugin::models::NO_MODEL,
        };
        self.sweep.set(key, None);
        Some(job)
    }

    /// Queue the job for a handler thread; a full queue is answered 503
    /// here.
    fn submit_to_pool(&mut self, key: usize, mut job: Job) {
        // Queue wait counts from here: inline and loop calls need no clock.
        job.queued_at = Instant::now();
        match self.pool.try_submit(job) {
            Ok(()) => self.in_flight += 1,
            Err(job) => {
                self.release_cost(&job);
                let http_minor = job.head.http_minor;
                self.recycle(job.buf, job.head);
                self.reply_and_linger(
                    key,
                    http_minor,
                    503,
                    "server busy: the request queue is full",
                    &[(b"Retry-After", b"1")],
                );
            }
        }
    }

    pub(super) fn on_completion(&mut self, done: Completion) {
        self.in_flight -= 1;
        let Completion { job, outcome } = done;
        self.release_cost(&job);
        let key = job.token;
        self.log_access(&job, &outcome);
        self.recycle(job.buf, job.head);
        if self.after_response(key, outcome.keep_alive) {
            self.drive(key);
        }
    }

    /// A response is complete on the wire. True when the connection waits
    /// for (or already holds) its next request.
    fn after_response(&mut self, key: usize, keep_alive: bool) -> bool {
        let Some(conn) = self.conns.get_mut(key) else {
            return false;
        };
        conn.served += 1;
        if !keep_alive {
            self.linger_or_close(key);
            return false;
        }
        conn.phase = Phase::Head;
        if self.drain_deadline.is_some() && conn.rbuf.is_empty() {
            self.close(key);
            return false;
        }
        // Pipelined bytes already here are a head in progress.
        let timeout = if conn.rbuf.is_empty() {
            self.timeouts.idle
        } else {
            self.timeouts.header
        };
        self.sweep.set(key, timeout.map(|t| self.now + t));
        true
    }

    pub fn set_access_log(&mut self, log: AccessLog) {
        self.access_log = Some(log);
    }

    /// The access log's line for a response the plugin gave.
    pub(super) fn log_access(&mut self, job: &Job, outcome: &Outcome) {
        if self.access_log.is_none() && self.metrics.is_none() {
            return;
        }
        let header = |name: &[u8]| {
            job.head
                .field(&job.buf, name)
                .map_or(&b""[..], |v| v.get(&job.buf))
        };
        let now = Instant::now();
        answer::note(
            &mut self.access_log,
            &self.metrics,
            &Entry {
                client: &job.peer.ip,
                method: job.head.method.get(&job.buf),
                target: job.head.target.get(&job.buf),
                http_minor: job.head.http_minor,
                status: outcome.status,
                body_bytes: outcome.body_bytes,
                duration: now.saturating_duration_since(job.queued_at),
                batch: outcome.batch,
                model: job.model,
                referer: header(b"referer"),
                user_agent: header(b"user-agent"),
            },
            now,
        );
    }

    /// The access log's line for a response the server gave itself (a
    /// refusal: the request may not have parsed, so no method or target).
    fn log_refusal(&mut self, key: usize, http_minor: u8, status: u16, body_bytes: usize) {
        let Some(conn) = self.conns.get(key) else {
            return;
        };
        answer::note(
            &mut self.access_log,
            &self.metrics,
            &Entry {
                client: &conn.peer.ip,
                method: b"-",
                target: b"-",
                http_minor,
                status,
                body_bytes: body_bytes as u64,
                duration: Duration::ZERO,
                batch: 0,
                model: crate::plugin::models::NO_MODEL,
                referer: b"",
                user_agent: b"",
            },
            self.now,
        );
    }

    fn recycle(&mut self, mut buf: Vec<u8>, head: RequestHead) {
        if self.spare_bufs.len() < 256 && buf.capacity() <= 64 * 1024 {
            buf.clear();
            self.spare_bufs.push(buf);
        }
        self.head_scratch_return(head);
    }

    fn head_scratch_return(&mut self, head: RequestHead) {
        // Keep the larger header vector for the next parse.
        if head.headers.capacity() > self.head_scratch.headers.capacity() {
            self.head_scratch.headers = head.headers;
        }
    }

    fn refuse(&mut self, key: usize, err: HttpError) {
        let http_minor = 1;
        if err.status == 413 {
            // The one refusal an application's user meets in normal use
            // (an upload): name the limit and how to raise it, and say so
            // once in the log, where whoever runs the server looks.
            let max = self.limits.max_body;
            let text = format!(
                "request body too large: this server takes at most {max} bytes \
                 (--max-body / M0_MAX_BODY)"
            );
            if !MAX_BODY_LOGGED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                crate::log::warn(format_args!(
                    "a request body over --max-body ({max} bytes) was refused with 413; \
                     raise it with --max-body or M0_MAX_BODY (said once per worker)"
                ));
            }
            return self.reply_and_linger(key, http_minor, 413, &text, &[]);
        }
        self.reply_and_linger(key, http_minor, err.status, err.detail, &[]);
    }

    /// Answer from the loop itself, then close after the client goes away.
    fn reply_and_linger(
        &mut self,
        key: usize,
        http_minor: u8,
        status: u16,
        text: &str,
        extra: &[(&[u8], &[u8])],
    ) {
        // The body `simple` writes: the text and a newline.
        self.log_refusal(key, http_minor, status, text.len() + 1);
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        // Never waits for the socket: what it does not take is flushed as
        // the client reads, like an inline response, and the linger
        // follows (a `100 Continue` still waiting goes first).
        response::simple(&mut conn.out, http_minor, status, text, false, extra);
        let fd: RawFd = conn.stream.as_raw_fd();
        match crate::plugin::exchange::flush_spilled(fd, &conn.out, &mut conn.out_pos) {
            Ok(true) => {
                conn.out.clear();
                conn.out_pos = 0;
                self.linger_or_close(key);
            }
            Ok(false) => {
                let deadline = Some(self.now + LINGER);
                self.flush_when_writable(key, false, deadline);
            }
            Err(_) => self.close(key),
        }
    }

    /// Close our side; if the client may still be sending, read and
    /// discard for a while so our last response is not destroyed by a reset.
    fn linger_or_close(&mut self, key: usize) {
        let Some(conn) = self.conns.get_mut(key) else {
            return;
        };
        if conn.read_closed {
            self.close(key);
            return;
        }
        let _ = conn.stream.shutdown(std::net::Shutdown::Write);
        conn.phase = Phase::Linger;
        self.sweep.set(key, Some(Instant::now() + LINGER));
        if conn.discard_input() {
            self.close(key);
        }
    }

    fn close(&mut self, key: usize) {
        if let Some(mut conn) = self.conns.try_remove(key) {
            self.sweep.set(key, None);
            let _ = self.poll.registry().deregister(&mut conn.stream);
            // One whose client hung up left the count then.
            if conn.hung_up {
                self.hung_up -= 1;
            } else {
                self.note_share_change(true);
            }
            self.accept_pause.descriptor_freed(self.now);
            if self.spare_bufs.len() < 256 && conn.rbuf.capacity() <= 64 * 1024 {
                conn.rbuf.clear();
                self.spare_bufs.push(conn.rbuf);
            }
        }
    }

    fn sweep_timeouts(&mut self) {
        let now = Instant::now();
        let housekeeping = self.sweep.housekeeping_due(now);
        if housekeeping && self.share.is_some() {
            // Empty the channel first: only then can a pending count be
            // judged stale.
            self.receive_batch();
            if let (Some(share), false) = (&self.share, self.channel_owed) {
                share.heal_pending();
            }
        }
        self.sweep.sweep(now);
    }

    /// Handle connections a sweep found past their deadline, one a pass
    /// (see `event_loop/sweep.rs`).
    fn expire_one(&mut self) {
        if let Some(key) = self.sweep.next_due()
            && let Some(conn) = self.conns.get(key)
        {
            match conn.phase {
                Phase::Head if conn.rbuf.is_empty() && conn.served > 0 => self.close(key),
                Phase::Head => self.refuse(
                    key,
                    HttpError::new(408, "request head not received in time"),
                ),
                Phase::Body { .. } => self.refuse(
                    key,
                    HttpError::new(
                        408,
                        "request body not received in time (--body-timeout, --body-min-rate)",
                    ),
                ),
                Phase::Linger | Phase::Flushing { .. } => self.close(key),
                Phase::Dispatched => {}
            }
        }
    }
}

/// The loop's side of loop calls (see `event_loop/loop_calls/`).
impl EventLoop {
    /// Let the thread leading the loop call the plugin.
    pub fn enable_loop_calls(&mut self) {
        self.loop_calls = Some(LoopCalls::default());
    }

    pub fn loop_calls_enabled(&self) -> bool {
        self.loop_calls.is_some()
    }

    /// The call path the worker ended on, for its closing line.
    pub fn call_path(&self) -> String {
        match &self.loop_calls {
            Some(_) if self.controller.measures_loop_calls() => self.controller.call_path(),
            Some(_) => "call path: loop calls on, as decided at the start".into(),
            None => "call path: the pool, as decided at the start".into(),
        }
    }

    /// What the pool concluded and why, for the closing line.
    pub fn pool_summary(&self) -> String {
        self.controller.pool_summary()
    }

    pub fn loop_caller(&self) -> LoopCaller {
        LoopCaller::new(
            self.pool.loop_side(),
            self.share.as_ref().and_then(AcceptShare::progress_mark),
        )
    }

    /// See `Pool::adopt_thread`.
    pub fn adopt_thread(&mut self, thread: std::thread::JoinHandle<()>) {
        self.pool.adopt_thread(thread);
    }

    /// Whether the request being dispatched may be a loop call.
    fn may_call_on_loop(&mut self) -> bool {
        let (in_flight, now) = (self.in_flight, self.now);
        self.loop_calls
            .as_mut()
            .is_some_and(|calls| calls.may_call(in_flight, now))
    }

    /// Calls in flight on handler threads.
    fn pool_in_flight(&self) -> usize {
        match &self.loop_calls {
            Some(calls) => calls.in_the_pool(self.in_flight),
            None => self.in_flight,
        }
    }

    fn queue_loop_call(&mut self, job: Job) {
        if let Some(calls) = &mut self.loop_calls {
            calls.queue(job);
        }
    }

    /// The loop calls this pass queued, for the leading thread to make.
    pub fn take_loop_calls(&mut self, into: &mut Vec<Job>) {
        let Some(calls) = &mut self.loop_calls else {
            return;
        };
        if calls.take(self.in_flight, self.now, into) {
            // Held for loop calls to resume, but the pool did not finish
            // in time: they are pool calls after all (admitted already, so
            // past the queue's bound).
            self.pool
                .loop_side()
                .give_back(into.drain(..), &mut Vec::new());
        }
    }

    /// The leading thread made every call it took, with no hand-off.
    pub fn finish_loop_calls(&mut self, done: &mut Vec<Completion>) {
        if done.is_empty() {
            return;
        }
        if let Some(calls) = &mut self.loop_calls {
            calls.finishing(done.len());
        }
        for completion in done.drain(..) {
            if let Some(calls) = &mut self.loop_calls {
                calls.finished_one();
            }
            self.on_completion(completion);
        }
    }

    /// A handler thread took the loop over from a long call: send calls to
    /// the pool for a while.
    pub fn handed_over(&mut self, why: &str) {
        if let Some(calls) = &mut self.loop_calls {
            calls.handed_over(why, Instant::now());
        }
        self.pool.keep_one_handler();
    }
}
