//! The interpreter pyo3 was configured with, for `interp::choose_python`.
//!
//! The libpython RUNPATH is not set here: link arguments of a library
//! crate's build script apply to its own targets only, so each plugin
//! (cdylib) that uses this crate sets it in its own build.rs.

fn main() {
    let config = pyo3_build_config::get();
    // The default `program_name` when no virtual environment is given, so
    // `sys.executable` and `sys.prefix` are those of the Python we link.
    let executable = config.executable().unwrap_or_default();
    println!("cargo:rustc-env=M0_PYHOST_BUILD_PYTHON={executable}");
    println!("cargo:rerun-if-env-changed=PYO3_PYTHON");
    println!("cargo:rerun-if-env-changed=PYO3_CONFIG_FILE");
}
