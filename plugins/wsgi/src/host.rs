//! The host's functions, as the SDK copied them at init.

pub use m0_pyhost::host as get;
pub use m0serve_plugin::Host;
