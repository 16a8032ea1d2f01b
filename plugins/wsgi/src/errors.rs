//! `wsgi.errors`: a text stream that writes whole lines to the server log.
//!
//! One instance per handler thread, so partial lines of two threads never
//! mix; what is left of a line is flushed when the request ends.

use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyString};

use crate::host;

#[pyclass(module = "m0serve", name = "Errors")]
pub struct WsgiErrors {
    pending: String,
}

impl WsgiErrors {
    pub fn new() -> Self {
        WsgiErrors {
            pending: String::new(),
        }
    }

    fn emit_lines(&mut self) {
        let Some(last_nl) = self.pending.rfind('\n') else {
            return;
        };
        let host = host::get();
        for line in self.pending[..last_nl].split('\n') {
            host.error(line.strip_suffix('\r').unwrap_or(line));
        }
        self.pending.drain(..=last_nl);
    }

    /// Logs what is left of a line.
    pub fn flush_pending(&mut self) {
        if !self.pending.is_empty() {
            let line = std::mem::take(&mut self.pending);
            host::get().error(&line);
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
        let n = self.push(data)?;
        self.emit_lines();
        Ok(n)
    }

    fn writelines(&mut self, lines: &Bound<'_, PyAny>) -> PyResult<()> {
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
