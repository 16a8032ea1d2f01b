//! Plugins: finding them, opening them, checking their ABI, and the host
//! function table they call back into.

pub mod call;
pub mod catalog;
pub mod descriptor;
pub mod exchange;
pub mod host;
pub mod init_args;
pub mod loader;
pub mod models;
pub mod plugin_metrics;
pub mod probe;
pub mod refusal;

pub use descriptor::Descriptor;
pub use loader::{Plugin, PluginError, resolve};
