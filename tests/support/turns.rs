//! Taking turns on the box. The integration tests are one binary whose
//! tests run side by side, two at a time; a test that measures (a ratio
//! of two modes, what a controller decides with CPUs to spare, counts that
//! contention changes) needs the box as it had it when each file was a
//! binary of its own and ran alone. [`serial`] gives it that: it waits for
//! its turn among the tests that measure, then until no other test has a
//! server running, and while it holds its guard a server another test
//! starts waits for it to finish.
//!
//! Servers are counted by the test that started them, known by the name
//! of its thread (the test harness names each test's thread after the
//! test). A server started from a thread of the test's own (unnamed) is
//! not counted and never waits; nor does one of a test that already has a
//! server running, which would otherwise wait for a measuring test that
//! waits for it.

use std::collections::BTreeMap;
use std::sync::{Condvar, Mutex, MutexGuard};

struct Occupancy {
    /// The measuring test that holds the box, or waits for it.
    owner: Option<String>,
    /// Servers running, by the test that started them.
    servers: BTreeMap<String, usize>,
}

static BOX: Mutex<Occupancy> = Mutex::new(Occupancy {
    owner: None,
    servers: BTreeMap::new(),
});
static CHANGED: Condvar = Condvar::new();

fn state() -> MutexGuard<'static, Occupancy> {
    BOX.lock().unwrap_or_else(|e| e.into_inner())
}

/// The running test's name, from its thread's; `None` on a thread of the
/// test's own and on the main thread (a harness run with one thread).
fn test_name() -> Option<String> {
    let name = std::thread::current().name()?.to_string();
    (name != "main").then_some(name)
}

/// The box to this test alone until dropped (see the module docs).
pub struct Alone {
    name: Option<String>,
    _turn: MutexGuard<'static, ()>,
}

/// Tests that measure, or share a CPU, take turns, and each has the box to
/// itself: hold the guard for the whole test. A test that failed holding
/// it does not stop the others.
pub fn serial() -> Alone {
    static TURN: Mutex<()> = Mutex::new(());
    let turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let name = test_name();
    if let Some(name) = &name {
        let mut s = state();
        s.owner = Some(name.clone());
        while s.servers.iter().any(|(test, &n)| test != name && n > 0) {
            s = CHANGED.wait(s).unwrap_or_else(|e| e.into_inner());
        }
    }
    Alone { name, _turn: turn }
}

impl Drop for Alone {
    fn drop(&mut self) {
        if self.name.is_some() {
            state().owner = None;
            CHANGED.notify_all();
        }
    }
}

/// A running server's place in the count; taken before it starts.
pub struct Ticket(Option<String>);

/// Waits while another test holds the box, unless this test already runs
/// a server; then counts one more server for this test.
pub fn ticket() -> Ticket {
    let Some(name) = test_name() else {
        return Ticket(None);
    };
    let mut s = state();
    loop {
        let mine = s.servers.get(&name).copied().unwrap_or(0);
        let other_owner = s.owner.as_ref().is_some_and(|o| *o != name);
        if !other_owner || mine > 0 {
            break;
        }
        s = CHANGED.wait(s).unwrap_or_else(|e| e.into_inner());
    }
    *s.servers.entry(name.clone()).or_insert(0) += 1;
    Ticket(Some(name))
}

impl Drop for Ticket {
    fn drop(&mut self) {
        if let Some(name) = &self.0 {
            let mut s = state();
            if let Some(n) = s.servers.get_mut(name) {
                *n -= 1;
                if *n == 0 {
                    s.servers.remove(name);
                }
            }
            drop(s);
            CHANGED.notify_all();
        }
    }
}

/// Tests that only use a lot of CPU or time (an interpreter's imports, a
/// model compiled, a README run end to end), and measure nothing, take
/// turns among themselves but share the box with the others: a measuring
/// test still waits for their servers, and they for it.
pub fn one_at_a_time() -> MutexGuard<'static, ()> {
    static TURN: Mutex<()> = Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}
