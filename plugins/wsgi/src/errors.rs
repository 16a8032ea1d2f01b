//! `wsgi.errors`: a text stream that writes whole lines to the server log.
//!
//! One instance per handler thread, so partial lines of two threads never
//! mix; what is left of a line is flushed when the request ends.
//!
//! What an app writes itself is logged as an error (PEP 3333 makes this the
//! error stream). What a `logging` handler writes here (Flask's default
//! handler does, for `app.logger`) keeps its record's level: a warning goes
//! out as a warning, and `--log-level` filters it as one. Telling the two
//! apart costs a look at the caller's frames, on this stream's writes only.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::host;
use m0serve_plugin::Level;

#[pyclass(module = "m0serve", name = "Errors")]
pub struct WsgiErrors {
    pending: String,
    /// The level of the lines in `pending`.
    level: Level,
}

impl WsgiErrors {
    pub fn new() -> Self {
        WsgiErrors {
            pending: String::new(),
            level: Level::Error,
        }
    }

    fn emit_lines(&mut self) {
        let Some(last_nl) = self.pending.rfind('\n') else {
            return;
        };
        let host = host::get();
        for line in self.pending[..last_nl].split('\n') {
            host.log(self.level, line.strip_suffix('\r').unwrap_or(line));
        }
        self.pending.drain(..=last_nl);
    }

    /// Logs what is left of a line.
    pub fn flush_pending(&mut self) {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            host::get().log(self.level, &line);
        }
    }

    /// Text of another level ends the partial line before it.
    fn set_level(&mut self, level: Level) {
        if level != self.level {
            self.flush_pending();
            self.level = level;
        }
    }

    fn push(&mut self, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        if let Ok(s) = data.cast::<PyString>() {
            let s = s.to_cow()?;
            self.pending.push_str(&s);
            Ok(s.chars().count())
        } else if let Ok(b) = data.cast::<PyBytes>() {
            let b = b.as_bytes();
            self.pending.push_str(&String::from_utf8_lossy(b));
            Ok(b.len())
        } else {
            Err(pyo3::exceptions::PyTypeError::new_err(format!(
                "wsgi.errors.write() argument must be str, not {}",
                data.get_type().name()?
            )))
        }
    }
}

impl Default for WsgiErrors {
    fn default() -> Self {
        Self::new()
    }
}

#[pymethods]
impl WsgiErrors {
    fn write(&mut self, data: &Bound<'_, PyAny>) -> PyResult<usize> {
        self.set_level(caller_level(data.py()));
        let n = self.push(data)?;
        self.emit_lines();
        Ok(n)
    }

    fn writelines(&mut self, lines: &Bound<'_, PyAny>) -> PyResult<()> {
        self.set_level(caller_level(lines.py()));
        for line in lines.try_iter()? {
            self.push(&line?)?;
        }
        self.emit_lines();
        Ok(())
    }

    fn flush(&mut self) {
        self.flush_pending();
    }

    fn writable(&self) -> bool {
        true
    }

    fn isatty(&self) -> bool {
        false
    }
}

/// The level of the text being written: the record's, when a `logging`
/// handler's `emit` is the caller, or the caller of a wrapper such as
/// wsgiref.validate's (`EMIT_DEPTH` frames up; a native method has no frame
/// of its own, so frame 0 is the Python code that called it); otherwise an
/// error.
fn caller_level(py: Python<'_>) -> Level {
    /// The caller, and two wrappers around the stream.
    const EMIT_DEPTH: usize = 3;
    let record_level = || -> PyResult<Option<i64>> {
        let mut frame = py.import("sys")?.getattr("_getframe")?.call1((0,))?;
        for _ in 0..EMIT_DEPTH {
            if frame.is_none() {
                break;
            }
            if frame
                .getattr("f_code")?
                .getattr("co_name")?
                .extract::<String>()?
                == "emit"
            {
                let record = frame.getattr("f_locals")?.get_item("record").ok();
                return Ok(record.and_then(|r| r.getattr("levelno").ok()?.extract::<i64>().ok()));
            }
            frame = frame.getattr("f_back")?;
        }
        Ok(None)
    };
    // The `logging` module's numbers: DEBUG 10, INFO 20, WARNING 30, ERROR 40.
    match record_level().ok().flatten() {
        Some(n) if n < 20 => Level::Debug,
        Some(n) if n < 30 => Level::Info,
        Some(n) if n < 40 => Level::Warn,
        _ => Level::Error,
    }
}
