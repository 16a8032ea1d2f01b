//! Every integration test of the server, in one test binary (ripgrep's
//! way): each file of this folder is a module named for the area it
//! proves, and `support/` holds the helpers they share. One binary links
//! once and compiles `support/` once, where a binary per file linked forty
//! times; its tests also run side by side across areas, where binaries ran
//! one after another and each waited on its slowest test.
//!
//! Run one area with `cargo test --test integration AREA::` (for example
//! `accept_share::`), one test by its full name.

mod support;

mod accept_share;
mod access_log;
mod api_keys;
mod batching;
mod call_path;
mod cli_habits;
mod cors;
mod cpu_affinity;
mod doctor;
mod doctor_terminal;
mod embed_admission;
mod embed_api;
mod embed_dtype;
mod embed_families;
mod embed_lone_pass;
mod embed_memory;
mod embed_models;
mod embed_native_backend;
mod embed_reranker;
mod embed_tasks;
mod embed_tei_surface;
mod exhaustion;
mod forwarded;
mod fuzz_http;
mod health;
mod help;
mod http_core;
mod idle_connections;
mod inline_calls;
mod install;
mod kubernetes;
mod layering;
mod loop_calls;
mod metrics;
mod models;
mod nginx;
mod openapi;
mod plugin_abi;
mod plugin_fixes;
mod pool;
mod pool_shared;
mod pyembed;
mod pyembed_max;
mod readme;
mod readme_statuses;
mod sd_notify;
mod sdk;
mod server_log;
mod slow_clients;
mod socket_activation;
mod suite_scripts;
mod workers;
mod wsgi_conformance;
mod wsgi_frameworks;
mod wsgi_leak;
