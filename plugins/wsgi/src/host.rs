//! The host's functions, as the SDK copied them at init.

pub use m0serve_plugin::Host;

/// The host table. Only called from init and the calls after it, by which
/// time the SDK has installed it.
pub fn get() -> &'static Host {
    m0serve_plugin::host().expect("the SDK installs the host table before init runs")
}
