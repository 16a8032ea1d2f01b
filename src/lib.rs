//! m0serve: an HTTP/1.1 application server whose handlers are C-ABI plugins.
//!
//! Where things live: `app` (startup order), `checks` (what is refused and
//! why), `supervisor` (worker processes), `worker::event_loop` (the accept
//! and request path), `worker::event_loop::loop_calls` (the loop's thread
//! calling the plugin), `worker::pool` (handler threads, their sizing, the
//! adaptive controller), `plugin` (loading, the host table, the call
//! itself), `http` (framing).
//!
//! Inside a module folder the files form no cycle either, a submodule's use
//! of its own parent aside, and neither do its parts, a child module taken
//! with everything under it (`tests/layering.rs` checks both).
//!
//! # Layers
//!
//! Lowest first. A module uses only modules of the layers before its own,
//! so no two modules depend on each other; `tests/layering.rs` reads this
//! list and fails on a use that breaks it, or on a module left out of it.
//!
//! 1. `auth`, `http`, `json`, `memfd_map`, `sd_notify`, `signals`,
//!    `topology`: each stands on its own and uses no other module of the
//!    crate.
//! 2. `log`, `metrics_page`, `shared_page`: the server's own lines,
//!    dated by `http`'s calendar; pages of atomics the processes share,
//!    each a `memfd_map`.
//! 3. `process`: the exit codes, and the exec contract of a spawned
//!    worker, both sides (the pages it is handed, the signals reset
//!    before exec).
//! 4. `listener`: the listening socket, bound or adopted, each failure
//!    with its exit code.
//! 5. `config`: the command line and environment, resolved once (its
//!    request limits are `http`'s, its host parsing `listener`'s).
//! 6. `plugin`: finding, probing and opening plugins, their init arguments,
//!    the host table, the one place a plugin's `handle` is called
//!    (`plugin::call`) and the response it writes (`plugin::exchange`).
//! 7. `worker`: a worker process, from opening the plugin to its exit.
//! 8. `checks`, `supervisor`: what is refused before binding, and why; the
//!    worker processes.
//! 9. `doctor`: the checks and the plan as `--doctor` reports them.
//! 10. `app`: the startup order, which may use any of the above.
#![deny(clippy::undocumented_unsafe_blocks)]

pub mod app;
pub mod auth;
pub mod checks;
pub mod config;
pub mod doctor;
pub mod http;
pub mod json;
pub mod listener;
pub mod log;
pub mod memfd_map;
pub mod metrics_page;
pub mod plugin;
pub mod process;
pub mod sd_notify;
pub mod shared_page;
pub mod signals;
pub mod supervisor;
pub mod topology;
pub mod worker;
