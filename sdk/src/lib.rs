//! Write an m0serve plugin in safe Rust: a plugin is an impl of [`Plugin`]
//! and one [`export!`] line.
//!
//! The crate wraps the C ABI of `m0serve-abi` (and nothing of the server):
//! it exports `m0_plugin_describe` and `m0_plugin_init`, turns the host's
//! pointers into borrowed views ([`Request`], its [`Body`] as a reader),
//! gives a response in typed states ([`Response`] → [`BodyWriter`] →
//! [`Sent`]), and catches every panic at the boundary: a panic before the
//! response began becomes a 500, after it a cut-off response, and a log
//! line names the hook, the request and the panic's message.
//!
//! A complete plugin:
//!
//! ```
//! use std::io::Read;
//! use m0serve_plugin::{Description, Error, Host, InitArgs, InitError, Plugin};
//! use m0serve_plugin::{Request, Response, Sent};
//!
//! struct Greeter {
//!     greeting: String,
//! }
//!
//! impl Plugin for Greeter {
//!     // Reentrant, no process-wide lock, never blocks: the host may call it
//!     // from its event loop.
//!     const DESCRIPTION: Description = Description::new(c"greeter", c"1.0.0").inline();
//!
//!     fn init(host: &'static Host, args: &InitArgs) -> Result<Self, InitError> {
//!         if args.arg.contains('\n') {
//!             return Err(InitError::refused("greeter: ARG must be one line"));
//!         }
//!         host.info(&format!("greeter: worker {} ready", args.worker_index));
//!         let greeting = if args.arg.is_empty() { "hello".into() } else { args.arg.clone() };
//!         Ok(Greeter { greeting })
//!     }
//!
//!     fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error> {
//!         match (req.method(), req.path()) {
//!             (b"GET", b"/") => resp.text(200, &format!("{}, world\n", self.greeting)),
//!             (b"POST", b"/count") => {
//!                 let mut body = Vec::new();
//!                 req.body().read_to_end(&mut body).map_err(|_| Error::BAD_REQUEST)?;
//!                 resp.text(200, &format!("{} bytes\n", body.len()))
//!             }
//!             _ => Err(Error::NOT_FOUND),
//!         }
//!     }
//! }
//!
//! m0serve_plugin::export!(Greeter);
//! ```
//!
//! Build it as a `cdylib` and run `m0serve --plugin target/release/libgreeter.so`.
//!
//! Only `handle` and `init` are required; [`Plugin`] documents the optional
//! hooks. What the host guarantees about threads, sizes and versions is in
//! the `m0serve-abi` crate.

mod batch;
mod describe;
mod entry;
mod error;
mod host;
mod init;
mod models;
mod request;
mod response;

pub use batch::Batch;
pub use describe::{CallModel, Description, ProcessLock, Start};
pub use error::{Error, InitError};
pub use host::{Host, Level, host};
pub use init::InitArgs;
pub use models::{Metric, ModelId};
pub use request::{Addr, Body, RawBody, Request};
pub use response::{BodyWriter, Header, Length, RawResponse, Response, Sent};

/// A plugin. The host makes one per worker process with [`Plugin::init`],
/// after `fork()` (or fork+exec), and calls it from its handler threads as
/// the [`Description`] allows; it is never dropped (the process exits).
pub trait Plugin: Sized + Send + Sync + 'static {
    /// What the plugin is and how it may be called.
    const DESCRIPTION: Description;

    /// The description the host reads, once per process: `DESCRIPTION`
    /// unless a plugin chooses at run time (its compute threads from a
    /// variable, say). It must have no side effects: `m0serve --doctor`
    /// calls it in a throwaway process.
    fn describe() -> Description {
        Self::DESCRIPTION
    }

    /// Starts the plugin in this worker. [`InitError::refused`] makes the
    /// worker exit 78 (a configuration error, not respawned);
    /// [`InitError::failed`] exits 1.
    fn init(host: &'static Host, args: &InitArgs) -> Result<Self, InitError>;

    /// Answers one request through `resp`. An `Err` before the response
    /// began becomes its status (see [`Error`]); after, the response is cut
    /// off and the connection closed.
    fn handle(&self, req: &Request<'_>, resp: Response<'_>) -> Result<Sent, Error>;

    /// With [`Description::batch`]: answers several requests, each through
    /// its own response. By default each goes to `handle` in turn and the
    /// first error is returned (the host answers those left unanswered).
    fn handle_batch(&self, batch: Batch<'_>) -> Result<(), Error> {
        let mut first = Ok(());
        for (req, resp) in batch {
            if let Err(e) = self.handle(&req, resp) {
                first = first.and(Err(e));
            }
        }
        first
    }

    /// With [`Description::admits`]: whether `req` may wait for
    /// [`handle`](Plugin::handle) or [`handle_batch`](Plugin::handle_batch).
    /// Called on the host's event-loop thread once the whole body is in
    /// (`req.body()` reads it; the handler reads it again from the start),
    /// beside the plugin's other calls: it must not block. `in_flight` is
    /// the cost of the requests this worker admitted and has not finished.
    /// [`Admit::Cost`] queues the request, holding that cost until its
    /// response is done (the host keeps the sum, so nothing here must be
    /// released); [`Admit::Answered`] refuses it with the answer sent
    /// through `resp`. By default every request is admitted at no cost.
    fn admit(&self, req: &Request<'_>, resp: Response<'_>, in_flight: u64) -> Admit {
        let _ = (req, resp, in_flight);
        Admit::Cost(0)
    }

    /// On each handler thread before its first call; an error stops the
    /// worker. `index` is [`Request::thread_index`] of the thread's calls.
    fn thread_start(&self, index: u32) -> Result<(), Error> {
        let _ = index;
        Ok(())
    }

    /// On each handler thread before it exits.
    fn thread_stop(&self, index: u32) {
        let _ = index;
    }

    /// Once, when the worker drains, after its last call.
    fn shutdown(&self) {}
}

/// What [`Plugin::admit`] decides about a request.
pub enum Admit {
    /// Queue it; it costs this much (in the plugin's own unit, such as
    /// inputs) until its response is done.
    Cost(u64),
    /// It was answered here (refused: a 429 with `Retry-After`); an `Err`
    /// before the response began becomes its status.
    Answered(Result<Sent, Error>),
}

/// Exports `m0_plugin_describe` and `m0_plugin_init` for a type that
/// implements [`Plugin`]. Use it once per library.
#[macro_export]
macro_rules! export {
    ($plugin:ty) => {
        const _: () = {
            static INFO: $crate::__private::Info = $crate::__private::Info::new();
            static CALLS: $crate::__private::M0PluginCalls = $crate::__private::calls::<$plugin>();

            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub extern "C" fn m0_plugin_describe() -> *const $crate::__private::M0PluginInfo {
                INFO.get::<$plugin>()
            }

            /// # Safety
            /// Called by the host as `M0InitFn` documents.
            #[allow(unsafe_code)]
            #[unsafe(no_mangle)]
            pub unsafe extern "C" fn m0_plugin_init(
                host: *const $crate::__private::M0Host,
                args: *const $crate::__private::M0InitArgs,
                calls: *mut *const $crate::__private::M0PluginCalls,
                state: *mut *mut ::core::ffi::c_void,
                error: *mut $crate::__private::M0Error,
            ) -> i32 {
                // SAFETY: the host's pointers, as the ABI defines them.
                unsafe {
                    $crate::__private::init::<$plugin>(host, args, &CALLS, calls, state, error)
                }
            }
        };
    };
}

/// For `export!` only.
#[doc(hidden)]
pub mod __private {
    pub use crate::entry::{Info, calls, init};
    pub use m0serve_abi::{M0Error, M0Host, M0InitArgs, M0PluginCalls, M0PluginInfo};
}
