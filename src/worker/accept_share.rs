//! Accept sharing: every connection lands on the least-loaded worker.
//!
//! All workers wait on one listener, and whichever wakes first accepts the
//! whole burst (31 of 32 connections on one worker, measured). So the
//! worker that accepts a connection passes it to the least-loaded sibling
//! whose load is strictly below its own, over that sibling's SOCK_SEQPACKET
//! channel with SCM_RIGHTS. Load = open connections + connections handed
//! over and not yet received, read from the shared page.
//!
//! A sibling's count is only as new as its news: a worker learns that a
//! client closed when its loop next runs. Right after a burst of clients
//! closed, the acceptor (which has just seen its own closes) is the one
//! running, and a sibling still waiting for a CPU still counts its own:
//! trusted as it stood, that split the next burst 24/8, then 28/4. So each
//! count is published with its moment (`active_at_ns`: the return of the
//! wait whose events it holds; what reached the sockets after that the
//! worker has not seen, however recently it published), and the acceptor
//! takes off the share estimated gone since: the share of its own
//! connections that left after that moment (`history.rs`). Clients that
//! come and go together are judged alike; a sibling whose clients stayed
//! while ours left looks lighter than it is only until it runs (a
//! connection handed to it wakes it) and publishes afresh. Connections that
//! reached a sibling after its moment (`active_fresh`) are not estimated
//! gone when it published after our last departure: they may be a new
//! burst's, kept by a sibling accepting beside us.
//!
//! Nothing is ever dropped: the target's `pending` is raised before the send
//! and undone on any failure (channel full, sibling gone), and then the
//! acceptor keeps the connection itself.

mod history;

use std::cell::{Cell, RefCell};
use std::io::{IoSlice, IoSliceMut};
use std::net::SocketAddr;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nix::sys::socket::{ControlMessage, ControlMessageOwned, MsgFlags, recvmsg, sendmsg};

use crate::shared_page::{LEAVING, SharedPage, WorkerLine};

/// A sibling inside one loop pass for longer than this is skipped.
const BUSY_NS: u64 = 10_000_000;
/// A sibling's pool load older than this is not counted: its controller
/// stopped measuring (nothing in its pool), so it wants no handler CPU.
const POOL_FRESH_NS: u64 = 1_000_000_000;

/// What the pools of the other workers published, summed over those that
/// measured lately (see `shared_page::WorkerLine`).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct SiblingPools {
    pub workers: usize,
    /// CPUs they used, and CPUs their handler threads wanted.
    pub cpu: f64,
    pub demand: f64,
    pub threads: usize,
}

/// Marks a worker's loop as making progress while its leading thread makes
/// the calls a pass queued (`loop_calls`): between passes, `state` would
/// otherwise keep the pass's start, and a worker that had answered every
/// request of a burst but not yet begun its next pass looked stuck to its
/// siblings (busy for more than `BUSY_NS`), which then kept the whole next
/// burst (32/0 over two WSGI workers).
#[derive(Clone)]
pub struct ProgressMark {
    page: Arc<SharedPage>,
    index: usize,
}

/// Whether a slot's line is still this process's (`AcceptShare::owns_line`).
fn is_mine(line: &WorkerLine) -> bool {
    line.pid.load(Ordering::Relaxed) == u64::from(std::process::id())
}

impl ProgressMark {
    /// A call ended: the loop is not stuck. Only a pass under way is moved
    /// on; a loop that has since parked (0) or left stays as it is.
    pub fn note(&self) {
        let line = self.page.line(self.index);
        if !is_mine(line) {
            return;
        }
        let state = line.state.load(Ordering::Relaxed);
        if state != 0 && state != LEAVING {
            let now = crate::plugin::host::monotonic_ns();
            let _ = line
                .state
                .compare_exchange(state, now, Ordering::Relaxed, Ordering::Relaxed);
        }
    }
}

pub struct AcceptShare {
    page: Arc<SharedPage>,
    index: usize,
    /// This worker's own channel (receive side).
    recv: OwnedFd,
    /// Every worker's channel (send side), by index.
    sends: Vec<OwnedFd>,
    /// Off (`--no-accept-share`, `M0_ACCEPT_SHARE=0`): the channels are
    /// kept but nothing is passed.
    enabled: bool,
    /// This worker's own counts. The page's line is the slot's, and after
    /// a reload it carries the replaced worker's counts too.
    accepted: Cell<u64>,
    passed: Cell<u64>,
    received: Cell<u64>,
    /// The pending count seen at the last check with an empty channel.
    stale_pending: Cell<u64>,
    /// This worker's own count over time (`history.rs`).
    history: RefCell<history::History>,
    /// When the loop's last wait returned: its count holds the events the
    /// kernel had delivered by then, and none after.
    seen_at_ns: Cell<u64>,
    /// Connections that came since then (accepted or received in this pass).
    fresh: Cell<u64>,
    /// Monotonic ns at which a connection last left.
    departed_ns: Cell<u64>,
}

impl AcceptShare {
    pub fn new(
        page: SharedPage,
        index: usize,
        recv: OwnedFd,
        sends: Vec<OwnedFd>,
        enabled: bool,
    ) -> AcceptShare {
        page.line(index)
            .pid
            .store(u64::from(std::process::id()), Ordering::SeqCst);
        page.line(index).state.store(0, Ordering::SeqCst);
        let enabled = enabled && page.workers() > 1;
        AcceptShare {
            page: Arc::new(page),
            index,
            recv,
            sends,
            enabled,
            accepted: Cell::new(0),
            passed: Cell::new(0),
            received: Cell::new(0),
            stale_pending: Cell::new(0),
            history: RefCell::new(history::History::new()),
            seen_at_ns: Cell::new(0),
            fresh: Cell::new(0),
            departed_ns: Cell::new(0),
        }
    }

    /// Whether the slot's line is still this worker's: during a reload the
    /// replacement takes it over (it writes its pid once its init is done)
    /// while this one drains, and must not be marked leaving by it.
    fn owns_line(&self) -> bool {
        is_mine(self.me())
    }

    /// For the loop's calls between passes; none while nothing is passed.
    pub fn progress_mark(&self) -> Option<ProgressMark> {
        self.enabled.then(|| ProgressMark {
            page: Arc::clone(&self.page),
            index: self.index,
        })
    }

    pub fn channel_fd(&self) -> RawFd {
        self.recv.as_raw_fd()
    }

    fn me(&self) -> &WorkerLine {
        self.page.line(self.index)
    }

    pub fn own_pending(&self) -> u64 {
        self.me().pending.load(Ordering::SeqCst)
    }

    pub fn note_accepted(&self) {
        self.accepted.set(self.accepted.get() + 1);
        self.me().accepted.fetch_add(1, Ordering::Relaxed);
    }

    /// The loop starts a pass (`now_ns`, right after its wait returned) or
    /// is about to wait (0).
    pub fn mark_pass(&self, now_ns: u64) {
        if now_ns != 0 {
            self.seen_at_ns.set(now_ns);
            self.fresh.set(0);
        }
        if self.me().state.load(Ordering::Relaxed) != LEAVING && self.owns_line() {
            self.me().state.store(now_ns, Ordering::Relaxed);
        }
    }

    /// Publish this worker's count as it stands (before a wait, or after a
    /// change), as of the last wait's return.
    pub fn publish_active(&self, active: usize) {
        if self.owns_line() {
            let me = self.me();
            me.active.store(active as u64, Ordering::SeqCst);
            me.active_at_ns
                .store(self.seen_at_ns.get(), Ordering::SeqCst);
            me.active_fresh.store(self.fresh.get(), Ordering::SeqCst);
            me.published_ns
                .store(crate::plugin::host::monotonic_ns(), Ordering::SeqCst);
        }
    }

    /// The count changed to `active`; `departed` when a connection left (a
    /// close, or its client hung up). Remembered, then published.
    pub fn note_change(&self, active: usize, departed: bool) {
        if departed {
            self.departed_ns.set(crate::plugin::host::monotonic_ns());
        } else {
            self.fresh.set(self.fresh.get() + 1);
        }
        // Only an acceptor that may pass reads its history.
        if self.enabled {
            self.history
                .borrow_mut()
                .record(self.seen_at_ns.get(), active as u64, departed);
        }
        self.publish_active(active);
    }

    pub fn leave(&self) {
        if self.owns_line() {
            self.me().state.store(LEAVING, Ordering::SeqCst);
        }
    }

    /// Heals a pending count left high by a sibling that raised it and
    /// died before it sent (or whose send failed after this worker's last
    /// receive): with the channel empty, a count that stays the same from
    /// one check to the next (the loop checks every 250 ms; a hand-over
    /// takes microseconds) is set back to zero. Call right after the
    /// channel was found empty.
    pub fn heal_pending(&self) {
        if !self.owns_line() {
            return;
        }
        let pending = &self.me().pending;
        let now = pending.load(Ordering::SeqCst);
        if now == 0 {
            self.stale_pending.set(0);
            return;
        }
        if now != self.stale_pending.get() {
            self.stale_pending.set(now);
            return;
        }
        if pending
            .compare_exchange(now, 0, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            crate::log::debug(format_args!(
                "accept share: {now} hand-over(s) counted as pending never arrived; count reset"
            ));
        }
        self.stale_pending.set(0);
    }

    /// The sibling to hand a new connection to, if one is strictly less
    /// loaded than `own_load` (`sibling_load`). Ties rotate.
    pub fn pick(&self, own_load: u64, now_ns: u64, allow_busy: bool) -> Option<usize> {
        if !self.enabled {
            return None;
        }
        let n = self.page.workers();
        let start = self.page.next_rotation() as usize;
        let mut best: Option<(u64, usize)> = None;
        for k in 0..n {
            let j = (start + k) % n;
            if j == self.index {
                continue;
            }
            let line = self.page.line(j);
            if line.pid.load(Ordering::Relaxed) == 0 {
                continue; // never started
            }
            let state = line.state.load(Ordering::SeqCst);
            if state == LEAVING
                || (!allow_busy && state != 0 && now_ns.saturating_sub(state) > BUSY_NS)
            {
                continue;
            }
            let load = self.sibling_load(line);
            if load < own_load && best.is_none_or(|(b, _)| load < b) {
                best = Some((load, j));
            }
        }
        best.map(|(_, j)| j)
    }

    /// A sibling's load: its count less those estimated gone unseen, plus
    /// the connections handed to it and not yet received.
    fn sibling_load(&self, line: &WorkerLine) -> u64 {
        let at = line.active_at_ns.load(Ordering::SeqCst);
        let count = line.active.load(Ordering::SeqCst);
        // Those that came after its moment may be a new burst's: not
        // estimated gone, unless it has published nothing since one of ours
        // left (then they came before that, and may have left as ours did).
        let fresh = if line.published_ns.load(Ordering::SeqCst) > self.departed_ns.get() {
            line.active_fresh.load(Ordering::SeqCst).min(count)
        } else {
            0
        };
        let gone = history::unseen(count - fresh, self.history.borrow().since(at));
        count - gone + line.pending.load(Ordering::SeqCst)
    }

    /// Pass `fd` (with its peer) to worker `target`. True when it went; on
    /// false the caller still owns the connection.
    pub fn pass(&self, target: usize, fd: RawFd, peer: SocketAddr) -> bool {
        let line = self.page.line(target);
        line.pending.fetch_add(1, Ordering::SeqCst);
        if line.state.load(Ordering::SeqCst) == LEAVING {
            line.pending.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        let payload = format!("{} {}", peer.ip(), peer.port());
        let fds = [fd];
        let sent = sendmsg::<()>(
            self.sends[target].as_raw_fd(),
            &[IoSlice::new(payload.as_bytes())],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_NOSIGNAL,
            None,
        );
        if sent.is_err() {
            line.pending.fetch_sub(1, Ordering::SeqCst);
            return false;
        }
        self.passed.set(self.passed.get() + 1);
        self.me().passed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// Receive one handed-over connection; `Ok(None)` when the channel is
    /// empty.
    pub fn receive(&self) -> std::io::Result<Option<(OwnedFd, Option<SocketAddr>)>> {
        let mut buf = [0u8; 128];
        let mut space = nix::cmsg_space!([RawFd; 2]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = match recvmsg::<()>(
            self.recv.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_DONTWAIT | MsgFlags::MSG_CMSG_CLOEXEC,
        ) {
            Ok(m) => m,
            Err(nix::errno::Errno::EAGAIN) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        let len = msg.bytes;
        let truncated = msg.flags.contains(MsgFlags::MSG_CTRUNC);
        let mut fds = Vec::new();
        if let Ok(cmsgs) = msg.cmsgs() {
            for cmsg in cmsgs {
                if let ControlMessageOwned::ScmRights(received) = cmsg {
                    fds.extend(received);
                }
            }
        }
        // Retired on receipt, whatever arrived: a datagram without a
        // descriptor must not leave the count one high forever.
        let pending = &self.me().pending;
        let _ = pending.fetch_update(Ordering::SeqCst, Ordering::SeqCst, |p| {
            Some(p.saturating_sub(1))
        });
        // SAFETY: SCM_RIGHTS gave us new descriptors we now own.
        let mut owned: Vec<OwnedFd> = fds
            .into_iter()
            .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
            .collect();
        if truncated || owned.len() != 1 {
            crate::log::warn(format_args!(
                "accept share: a hand-over arrived damaged; dropped it"
            ));
            return Ok(Some((
                owned
                    .pop()
                    .ok_or_else(|| std::io::Error::other("no descriptor"))?,
                None,
            )));
        }
        let peer = std::str::from_utf8(&buf[..len]).ok().and_then(|text| {
            let (ip, port) = text.split_once(' ')?;
            Some(SocketAddr::new(ip.parse().ok()?, port.parse().ok()?))
        });
        self.received.set(self.received.get() + 1);
        self.me().received.fetch_add(1, Ordering::Relaxed);
        Ok(owned.pop().map(|fd| (fd, peer)))
    }

    /// This worker's pool load, for its siblings' controllers.
    pub fn publish_pool(&self, cpu: f64, demand: f64, threads: usize, now_ns: u64) {
        let me = self.me();
        let milli = |x: f64| (x.max(0.0) * 1000.0).round() as u64;
        me.cpu_milli.store(milli(cpu), Ordering::Relaxed);
        me.demand_milli.store(milli(demand), Ordering::Relaxed);
        me.pool_threads.store(threads as u64, Ordering::Relaxed);
        me.pool_at_ns.store(now_ns.max(1), Ordering::Release);
    }

    /// The other workers' pool loads, published within `POOL_FRESH_NS`
    /// by workers not leaving. Every worker inherits the supervisor's CPU
    /// affinity, so they all share the CPUs this one may use.
    pub fn sibling_pools(&self, now_ns: u64) -> SiblingPools {
        let mut sum = SiblingPools::default();
        for j in (0..self.page.workers()).filter(|&j| j != self.index) {
            let line = self.page.line(j);
            let at = line.pool_at_ns.load(Ordering::Acquire);
            if at == 0
                || now_ns.saturating_sub(at) > POOL_FRESH_NS
                || line.pid.load(Ordering::Relaxed) == 0
                || line.state.load(Ordering::Relaxed) == LEAVING
            {
                continue;
            }
            sum.workers += 1;
            sum.cpu += line.cpu_milli.load(Ordering::Relaxed) as f64 / 1000.0;
            sum.demand += line.demand_milli.load(Ordering::Relaxed) as f64 / 1000.0;
            sum.threads += line.pool_threads.load(Ordering::Relaxed) as usize;
        }
        sum
    }

    /// Accepted, passed, received: for the log at shutdown.
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.accepted.get(), self.passed.get(), self.received.get())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use nix::sys::socket::{AddressFamily, SockFlag, SockType, socketpair};

    fn share(page: SharedPage, index: usize) -> AcceptShare {
        let pair = || {
            socketpair(
                AddressFamily::Unix,
                SockType::SeqPacket,
                None,
                SockFlag::SOCK_NONBLOCK,
            )
            .unwrap()
        };
        let (recv, _) = pair();
        let sends = (0..page.workers()).map(|_| pair().1).collect();
        AcceptShare::new(page, index, recv, sends, true)
    }

    #[test]
    fn a_pending_count_that_never_arrives_is_reset_at_the_second_look() {
        let s = share(SharedPage::create(2).unwrap(), 0);
        let pending = &s.me().pending;
        pending.store(1, Ordering::SeqCst);
        s.heal_pending();
        assert_eq!(pending.load(Ordering::SeqCst), 1, "one look is not enough");
        s.heal_pending();
        assert_eq!(pending.load(Ordering::SeqCst), 0);
        // A count that moves between looks is a hand-over under way.
        pending.store(1, Ordering::SeqCst);
        s.heal_pending();
        pending.store(2, Ordering::SeqCst);
        s.heal_pending();
        assert_eq!(pending.load(Ordering::SeqCst), 2);
    }

    #[test]
    fn a_replaced_worker_leaves_its_slot_to_the_replacement() {
        let page = SharedPage::create(2).unwrap();
        let old = share(page, 1);
        old.publish_active(3);
        // The replacement writes its pid into the slot.
        old.me()
            .pid
            .store(u64::from(std::process::id()) + 1, Ordering::SeqCst);
        old.me().active.store(0, Ordering::SeqCst);
        old.leave();
        old.publish_active(5);
        old.mark_pass(42);
        assert_eq!(
            old.me().state.load(Ordering::SeqCst),
            0,
            "not marked leaving"
        );
        assert_eq!(old.me().active.load(Ordering::SeqCst), 0);
        // Its own counts stay its own.
        old.note_accepted();
        assert_eq!(old.counts(), (1, 0, 0));
    }
}
