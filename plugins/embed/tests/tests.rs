//! The embed plugin's integration tests, in one test binary with a module
//! per area (as the server's own `tests/tests.rs`); `common/` holds what
//! they share.

mod common;

mod all_mpnet;
mod bad_folders;
mod bf16;
mod cache;
mod families;
mod minilm;
mod tasks;
mod tiny_bert;
