//! m0serve: an HTTP/1.1 application server whose handlers are C-ABI plugins.
//!
//! Where things live: `app` (startup order), `checks` (what is refused and
//! why), `supervisor` (worker processes), `worker::event_loop` (the accept
//! and request path), `worker::pool` (handler threads), `plugin` (loading
//! and the host table), `http` (framing).
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod app;
pub mod checks;
pub mod config;
pub mod doctor;
pub mod http;
pub mod json;
pub mod listener;
pub mod log;
pub mod plugin;
pub mod process;
pub mod shared_page;
pub mod signals;
pub mod supervisor;
pub mod topology;
pub mod worker;
