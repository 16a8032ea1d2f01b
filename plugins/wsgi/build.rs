//! Link libpython with a RUNPATH to the pinned interpreter's lib dir.
//!
//! A cdylib gets no rpath by default, and a distribution may ship its own
//! `libpython3.X.so.1.0` under the same soname: without the RUNPATH the plugin
//! would silently run that other Python (see shared notes,
//! python-embedding.md). A link argument must come from the cdylib's own
//! build script; the rest of the embedding is m0-pyhost's.

fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
