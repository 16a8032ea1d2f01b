//! The two error types a plugin returns: `Error` from a call, `InitError`
//! from init.

use core::fmt;

use m0serve_abi as abi;

/// Why a call did not answer: one of the ABI's return codes. Returned from
/// [`Plugin::handle`](crate::Plugin::handle) before the response has started,
/// the host answers with its status (`NOT_FOUND` is a 404); after it has
/// started, the response is cut off and the connection closed. The host's
/// own functions report their failures with the same type.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Error(i32);

impl Error {
    /// 500: the plugin failed.
    pub const INTERNAL: Error = Error(abi::M0_ERR_INTERNAL);
    /// 400: the request is invalid for this handler.
    pub const BAD_REQUEST: Error = Error(abi::M0_ERR_BAD_REQUEST);
    /// 404: nothing is served here.
    pub const NOT_FOUND: Error = Error(abi::M0_ERR_NOT_FOUND);
    /// 503: overloaded or not ready.
    pub const UNAVAILABLE: Error = Error(abi::M0_ERR_UNAVAILABLE);
    /// 504: a backend the plugin waited on timed out.
    pub const TIMEOUT: Error = Error(abi::M0_ERR_TIMEOUT);
    /// 413: the body is too large for this handler.
    pub const TOO_LARGE: Error = Error(abi::M0_ERR_TOO_LARGE);
    /// 422: understood but cannot be processed.
    pub const UNPROCESSABLE: Error = Error(abi::M0_ERR_UNPROCESSABLE);
    /// Not a failure: from a call made on the event loop
    /// ([`Request::on_loop`](crate::Request::on_loop)), "this one may block,
    /// call me again on a handler thread". Anywhere else the host answers 500.
    pub const DEFER: Error = Error(abi::M0_DEFER);
    /// From the host: the client went away.
    pub const DISCONNECTED: Error = Error(abi::M0_ERR_DISCONNECTED);
    /// From the host: a call out of order.
    pub const STATE: Error = Error(abi::M0_ERR_STATE);
    /// From the host: an invalid argument (a header with CR, LF or NUL, a
    /// header the host owns, a status out of range).
    pub const INVALID: Error = Error(abi::M0_ERR_INVALID);
    /// From the host: a write did not complete within the write timeout.
    pub const WRITE_TIMEOUT: Error = Error(abi::M0_ERR_WRITE_TIMEOUT);

    /// The ABI return code.
    pub const fn code(self) -> i32 {
        self.0
    }

    /// The error for a negative return code (or `M0_DEFER`); `None` for
    /// `M0_OK`.
    pub const fn from_code(code: i32) -> Option<Error> {
        if code == abi::M0_OK {
            None
        } else {
            Some(Error(code))
        }
    }

    /// `Ok(())` for `M0_OK`, else the error.
    pub(crate) fn check(code: i32) -> Result<(), Error> {
        match Error::from_code(code) {
            None => Ok(()),
            Some(e) => Err(e),
        }
    }

    fn name(self) -> &'static str {
        match self.0 {
            abi::M0_ERR_INTERNAL => "internal error",
            abi::M0_ERR_BAD_REQUEST => "bad request",
            abi::M0_ERR_NOT_FOUND => "not found",
            abi::M0_ERR_UNAVAILABLE => "unavailable",
            abi::M0_ERR_TIMEOUT => "timeout",
            abi::M0_ERR_TOO_LARGE => "too large",
            abi::M0_ERR_UNPROCESSABLE => "unprocessable",
            abi::M0_DEFER => "deferred to a handler thread",
            abi::M0_ERR_DISCONNECTED => "the client disconnected",
            abi::M0_ERR_STATE => "called out of order",
            abi::M0_ERR_INVALID => "invalid argument",
            abi::M0_ERR_WRITE_TIMEOUT => "write timed out",
            _ => "unknown error",
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Error({}: {})", self.0, self.name())
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} (m0serve code {})", self.name(), self.0)
    }
}

impl std::error::Error for Error {}

impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        let kind = match e {
            Error::DISCONNECTED => std::io::ErrorKind::ConnectionAborted,
            Error::WRITE_TIMEOUT | Error::TIMEOUT => std::io::ErrorKind::TimedOut,
            Error::INVALID => std::io::ErrorKind::InvalidInput,
            _ => std::io::ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// Why init did not start the plugin. The message is the host's to print:
/// name the problem and the fix, and the flag or variable that set it.
/// Write the fix last, after `; ` ("greeter: ARG has two lines; pass one
/// line"): the host reports the part after the last `; ` (or `; fix: `) as
/// the fix, `--doctor`'s `fix` field, and the rest as the problem.
#[derive(Debug)]
pub struct InitError {
    pub(crate) code: i32,
    pub(crate) message: String,
}

impl InitError {
    /// The configuration is wrong: the worker exits 78 and is not respawned
    /// (a bad ARG, a missing file), since a retry would fail the same way.
    pub fn refused(message: impl Into<String>) -> InitError {
        InitError {
            code: abi::M0_INIT_REFUSED,
            message: message.into(),
        }
    }

    /// The plugin could not start: the worker exits 1.
    pub fn failed(message: impl Into<String>) -> InitError {
        InitError {
            code: abi::M0_INIT_FAILED,
            message: message.into(),
        }
    }

    /// Whether this is a refusal (exit 78) rather than a failure.
    pub fn is_refusal(&self) -> bool {
        self.code == abi::M0_INIT_REFUSED
    }

    pub fn message(&self) -> &str {
        &self.message
    }

    /// The same kind of error with its message rewritten (a prefix added).
    pub fn map_message(self, f: impl FnOnce(&str) -> String) -> InitError {
        InitError {
            code: self.code,
            message: f(&self.message),
        }
    }
}

impl fmt::Display for InitError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for InitError {}
