//! The models a plugin serves behind one port (ABI 1.6): their names, as
//! `M0Host.model_register` gave them ids, and each model's admitted cost
//! in flight.
//!
//! A model id is an index below `M0_MODELS_MAX`; a job carries it as a
//! `u32` (`NO_MODEL` when the plugin named none), so the hot path never
//! touches a name. Names are set once, at init, and read without a lock
//! afterwards (the metrics page copies them when the worker starts
//! publishing, the access log when it writes a line).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use m0serve_abi as abi;

/// A job's model when the plugin named none.
pub const NO_MODEL: u32 = u32::MAX;

const MAX: usize = abi::M0_MODELS_MAX;

/// What counts a job in per model: one class per model id, and the last
/// for jobs with no model.
pub const CLASSES: usize = MAX + 1;

/// The class of a job of `model`.
pub fn class(model: u32) -> usize {
    (model as usize).min(CLASSES - 1)
}

static NAMES: [OnceLock<Box<str>>; MAX] = [const { OnceLock::new() }; MAX];
/// Held while a name is looked up and set, so one name gets one id.
static REGISTERING: Mutex<()> = Mutex::new(());
/// The cost admitted per model and not yet complete (`model_in_flight`).
static IN_FLIGHT: [AtomicU64; MAX] = [const { AtomicU64::new(0) }; MAX];

/// 1 to `M0_MODEL_NAME_MAX` bytes of visible ASCII without `"` or `\`: it
/// then goes into a metric label and a JSON string as it is.
pub fn is_model_name(name: &[u8]) -> bool {
    (1..=abi::M0_MODEL_NAME_MAX).contains(&name.len())
        && name
            .iter()
            .all(|&b| b.is_ascii_graphic() && b != b'"' && b != b'\\')
}

/// The id of `name`, registering it if it is new; `None` for a malformed
/// name or when `M0_MODELS_MAX` are registered already.
pub fn register(name: &[u8]) -> Option<u32> {
    if !is_model_name(name) {
        return None;
    }
    let _held = REGISTERING.lock().unwrap_or_else(|e| e.into_inner());
    for (id, slot) in NAMES.iter().enumerate() {
        match slot.get() {
            Some(known) if known.as_bytes() == name => return Some(id as u32),
            Some(_) => continue,
            None => {
                // Checked above: visible ASCII is UTF-8.
                let text = String::from_utf8_lossy(name).into_owned().into_boxed_str();
                let _ = slot.set(text);
                return Some(id as u32);
            }
        }
    }
    None
}

/// The name of model `id`, when it is registered.
pub fn name(id: u32) -> Option<&'static str> {
    NAMES.get(id as usize)?.get().map(|n| &**n)
}

/// Whether `id` is a registered model.
pub fn is_registered(id: u32) -> bool {
    name(id).is_some()
}

/// The models registered so far, by id.
pub fn names() -> Vec<&'static str> {
    NAMES
        .iter()
        .map_while(|slot| slot.get().map(|n| &**n))
        .collect()
}

/// How many models are registered.
pub fn count() -> usize {
    NAMES.iter().take_while(|slot| slot.get().is_some()).count()
}

/// Admitted cost of model `id` not yet complete; 0 for an unknown id.
pub fn in_flight(id: u32) -> u64 {
    IN_FLIGHT
        .get(id as usize)
        .map_or(0, |n| n.load(Ordering::Relaxed))
}

/// A request of model `id` was admitted with `cost` (the event loop).
pub fn hold(id: u32, cost: u64) {
    if let Some(n) = IN_FLIGHT.get(id as usize) {
        n.fetch_add(cost, Ordering::Relaxed);
    }
}

/// That request's response is complete: its cost is released (the event
/// loop, exactly once per `hold`).
pub fn release(id: u32, cost: u64) {
    if let Some(n) = IN_FLIGHT.get(id as usize) {
        // Only the loop writes: a load and a store cannot race with another
        // release, and a saturating one never wraps on a bug elsewhere.
        let before = n.load(Ordering::Relaxed);
        debug_assert!(before >= cost, "released more than was admitted");
        n.store(before.saturating_sub(cost), Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_name_is_checked_and_keeps_its_id() {
        assert!(!is_model_name(b""));
        assert!(!is_model_name(b"a b"));
        assert!(!is_model_name(b"a\"b"));
        assert!(!is_model_name(b"a\\b"));
        assert!(!is_model_name(&[b'a'; abi::M0_MODEL_NAME_MAX + 1]));
        assert!(is_model_name(b"bge-small/v1.5"));
        let a = register(b"unit-a").unwrap();
        let b = register(b"unit-b").unwrap();
        assert_ne!(a, b);
        assert_eq!(register(b"unit-a"), Some(a));
        assert_eq!(name(b), Some("unit-b"));
        assert_eq!(register(b"no spaces"), None);
        hold(a, 5);
        hold(b, 2);
        release(a, 3);
        assert_eq!((in_flight(a), in_flight(b)), (2, 2));
        assert_eq!(in_flight(NO_MODEL), 0);
    }
}
