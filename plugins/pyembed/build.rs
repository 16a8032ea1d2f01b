//! Link libpython with a RUNPATH to the pinned interpreter's lib dir, as the
//! WSGI plugin does, for the same reason: a distribution's own
//! `libpython3.X.so.1.0` under the same soname would otherwise be loaded. A
//! link argument must come from the cdylib's own build script.

fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
}
