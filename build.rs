//! Builds the C example plugin beside the binary, so `--plugin hello_c`
//! works straight after `cargo build` / `cargo run`. The flags are the ones
//! the header promises to be clean under.

use std::path::PathBuf;
use std::process::Command;

fn main() {
    println!("cargo:rerun-if-changed=plugins/hello_c/hello.c");
    println!("cargo:rerun-if-changed=include/m0serve.h");
    println!("cargo:rerun-if-env-changed=CC");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    // OUT_DIR is target/<profile>/build/m0serve-<hash>/out: the binary's
    // directory is three levels up.
    let Some(bin_dir) = out_dir.ancestors().nth(3) else {
        return;
    };
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args([
            "-std=c11",
            "-O2",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fPIC",
            "-shared",
            "-fvisibility=hidden",
        ])
        .args(["-Iinclude", "plugins/hello_c/hello.c", "-o"])
        .arg(bin_dir.join("libhello_c.so"))
        .status();
    match status {
        Ok(s) if s.success() => {}
        Ok(s) => panic!("compiling plugins/hello_c/hello.c with {cc} failed ({s})"),
        Err(e) => panic!(
            "cannot run the C compiler {cc:?} to build the hello_c plugin: {e}; install gcc or set CC"
        ),
    }
}
