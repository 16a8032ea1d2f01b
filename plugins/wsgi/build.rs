//! Link libpython with a RUNPATH to the pinned interpreter's lib dir.
//!
//! A cdylib gets no rpath by default, and a distribution may ship its own
//! `libpython3.X.so.1.0` under the same soname: without the RUNPATH the plugin
//! would silently run that other Python (see shared notes,
//! python-embedding.md).

fn main() {
    pyo3_build_config::add_libpython_rpath_link_args();
    let config = pyo3_build_config::get();
    // The interpreter pyo3 was configured with: the default `program_name`
    // when no virtual environment is given, so `sys.executable` and
    // `sys.prefix` are those of the Python we link.
    let executable = config.executable().unwrap_or_default();
    println!("cargo:rustc-env=M0_WSGI_BUILD_PYTHON={executable}");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=PYO3_CONFIG_FILE");
}
