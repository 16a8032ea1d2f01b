//! `wsgi.input`: the request body as a file-like object.
//!
//! The host has buffered the whole body before `handle`, so reads are memory
//! copies and never block: they run with the GIL held. `read()` without a
//! size fills a `bytes` object straight from the host's buffer (one copy).

use m0serve_plugin::RawBody;
use pyo3::exceptions::PyOSError;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyList};

/// Bytes pulled from the host at a time by `readline`.
const LINE_CHUNK: usize = 8192;

#[pyclass(module = "m0serve", name = "Input", freelist = 64)]
pub struct WsgiInput {
    /// The body of the `handle` call in progress; invalidated before it
    /// returns.
    body: RawBody,
    /// Body bytes not yet pulled from the host.
    remaining: u64,
    /// Bytes pulled from the host but not yet returned (by `readline`).
    buf: Vec<u8>,
    pos: usize,
}

impl WsgiInput {
    pub fn new(body: RawBody, content_length: u64) -> Self {
        WsgiInput {
            body,
            remaining: content_length,
            buf: Vec::new(),
            pos: 0,
        }
    }

    /// Called when `handle` returns: later reads see the end of the body.
    pub fn invalidate(&mut self) {
        self.body.invalidate();
        self.remaining = 0;
        self.buf = Vec::new();
        self.pos = 0;
    }

    fn buffered(&self) -> &[u8] {
        &self.buf[self.pos..]
    }

    /// Fills `out` from the host; returns the bytes written (short only at
    /// the real end of the body).
    fn pull_into(&mut self, out: &mut [u8]) -> PyResult<usize> {
        if !self.body.is_valid() {
            return Ok(0);
        }
        let mut done = 0;
        while done < out.len() {
            let n = self
                .body
                .read(&mut out[done..])
                .map_err(|e| PyOSError::new_err(format!("reading the request body failed: {e}")))?;
            if n == 0 {
                self.remaining = 0;
                break;
            }
            done += n;
            self.remaining = self.remaining.saturating_sub(n as u64);
        }
        Ok(done)
    }

    /// Pulls up to `want` more bytes from the host into `buf`.
    fn fill(&mut self, want: usize) -> PyResult<usize> {
        if self.pos > 0 && self.pos == self.buf.len() {
            self.buf.clear();
            self.pos = 0;
        }
        let want = want.min(self.remaining.min(usize::MAX as u64) as usize);
        if want == 0 {
            return Ok(0);
        }
        let start = self.buf.len();
        self.buf.resize(start + want, 0);
        let got = {
            let mut tmp = std::mem::take(&mut self.buf);
            let r = self.pull_into(&mut tmp[start..]);
            self.buf = tmp;
            r?
        };
        self.buf.truncate(start + got);
        Ok(got)
    }

    fn available(&self) -> u64 {
        self.buffered().len() as u64 + self.remaining
    }

    /// Reads `size` bytes (all when negative).
    fn read_bytes<'py>(&mut self, py: Python<'py>, size: i64) -> PyResult<Bound<'py, PyBytes>> {
        let avail = self.available();
        let n = if size < 0 {
            avail
        } else {
            (size as u64).min(avail)
        } as usize;
        if n == 0 {
            return Ok(PyBytes::new(py, b""));
        }
        let mut short = None;
        let bytes = PyBytes::new_with(py, n, |out| {
            let take = self.buffered().len().min(n);
            out[..take].copy_from_slice(&self.buf[self.pos..self.pos + take]);
            self.pos += take;
            let got = if take < n {
                take + self.pull_into(&mut out[take..])?
            } else {
                take
            };
            if got < n {
                short = Some(got);
            }
            Ok(())
        })?;
        match short {
            // The host delivered less than it announced: return what came.
            Some(got) => Ok(PyBytes::new(py, &bytes.as_bytes()[..got])),
            None => Ok(bytes),
        }
    }

    /// Reads one line, at most `limit` bytes (no limit when negative).
    fn read_line<'py>(&mut self, py: Python<'py>, limit: i64) -> PyResult<Bound<'py, PyBytes>> {
        let limit = if limit < 0 {
            usize::MAX
        } else {
            limit as usize
        };
        let mut scanned = 0;
        loop {
            let avail = self.buffered();
            let window = &avail[..avail.len().min(limit)];
            if let Some(i) = window[scanned..].iter().position(|&b| b == b'\n') {
                let end = scanned + i + 1;
                let line = PyBytes::new(py, &avail[..end]);
                self.pos += end;
                return Ok(line);
            }
            if window.len() >= limit || self.remaining == 0 {
                let line = PyBytes::new(py, window);
                self.pos += window.len();
                return Ok(line);
            }
            scanned = window.len();
            self.fill(LINE_CHUNK)?;
        }
    }
}

/// Accepts None or an int for the size arguments.
fn size_arg(size: Option<&Bound<'_, PyAny>>) -> PyResult<i64> {
    match size {
        None => Ok(-1),
        Some(s) if s.is_none() => Ok(-1),
        Some(s) => s.extract::<i64>(),
    }
}

#[pymethods]
impl WsgiInput {
    #[pyo3(signature = (size = None))]
    fn read<'py>(
        &mut self,
        py: Python<'py>,
        size: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let size = size_arg(size)?;
        self.read_bytes(py, size)
    }

    #[pyo3(signature = (size = None))]
    fn readline<'py>(
        &mut self,
        py: Python<'py>,
        size: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let size = size_arg(size)?;
        self.read_line(py, size)
    }

    #[pyo3(signature = (hint = None))]
    fn readlines<'py>(
        &mut self,
        py: Python<'py>,
        hint: Option<&Bound<'py, PyAny>>,
    ) -> PyResult<Bound<'py, PyList>> {
        let hint = size_arg(hint)?;
        let lines = PyList::empty(py);
        let mut total = 0i64;
        loop {
            let line = self.read_line(py, -1)?;
            let len = line.as_bytes().len() as i64;
            if len == 0 {
                break;
            }
            lines.append(line)?;
            total += len;
            if hint > 0 && total >= hint {
                break;
            }
        }
        Ok(lines)
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&mut self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyBytes>>> {
        let line = self.read_line(py, -1)?;
        Ok((!line.as_bytes().is_empty()).then_some(line))
    }

    fn readable(&self) -> bool {
        true
    }

    fn close(&self) {}

    #[getter]
    fn closed(&self) -> bool {
        false
    }
}
