//! `wsgi.file_wrapper`: turns a file-like object into an iterable of blocks.

use pyo3::exceptions::PyTypeError;
use pyo3::prelude::*;
use pyo3::types::PyBytes;

/// Default block size, as wsgiref's.
const DEFAULT_BLKSIZE: usize = 8192;

#[pyclass(module = "m0serve", name = "FileWrapper")]
pub struct FileWrapper {
    filelike: Py<PyAny>,
    blksize: usize,
}

#[pymethods]
impl FileWrapper {
    #[new]
    #[pyo3(signature = (filelike, blksize = DEFAULT_BLKSIZE))]
    fn new(filelike: Bound<'_, PyAny>, blksize: usize) -> PyResult<Self> {
        if !filelike.hasattr("read")? {
            return Err(PyTypeError::new_err(
                "wsgi.file_wrapper needs an object with a read() method",
            ));
        }
        Ok(FileWrapper {
            filelike: filelike.unbind(),
            blksize: blksize.max(1),
        })
    }

    fn __iter__(slf: PyRef<'_, Self>) -> PyRef<'_, Self> {
        slf
    }

    fn __next__<'py>(&self, py: Python<'py>) -> PyResult<Option<Bound<'py, PyAny>>> {
        let data = self
            .filelike
            .bind(py)
            .call_method1("read", (self.blksize,))?;
        let empty = match data.cast::<PyBytes>() {
            Ok(b) => b.as_bytes().is_empty(),
            Err(_) => data.len()? == 0,
        };
        Ok((!empty).then_some(data))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let f = self.filelike.bind(py);
        if f.hasattr("close")? {
            f.call_method0("close")?;
        }
        Ok(())
    }
}
