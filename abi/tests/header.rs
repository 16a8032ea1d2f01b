//! The checked-in `include/m0serve.h` must be exactly what cbindgen makes of
//! `abi/src/lib.rs`. Set `M0_UPDATE_HEADER=1` to rewrite it.

use std::path::Path;

/// The "Changelog" section of the crate docs, as lines of a C comment
/// (without the Markdown backticks). The section ends at the next heading
/// or with the docs, and its last paragraph (where the section says it is
/// copied here) is left out.
fn changelog_comment(lib_rs: &str) -> String {
    let docs: Vec<&str> = lib_rs
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .collect();
    let start = docs
        .iter()
        .position(|l| *l == "# Changelog")
        .expect("the crate docs have a # Changelog section")
        + 1;
    let section: Vec<&str> = docs[start..]
        .iter()
        .copied()
        .take_while(|l| !l.starts_with('#'))
        .collect();
    let last_gap = section
        .iter()
        .rposition(|l| l.is_empty())
        .unwrap_or(section.len());
    section[..last_gap]
        .iter()
        .map(|l| format!(" * {}", l.replace('`', "")).trim_end().to_string())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn checked_in_header_matches_the_abi_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../include/m0serve.h");
    let lib_rs = std::fs::read_to_string(crate_dir.join("src/lib.rs")).expect("read src/lib.rs");
    let mut config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("abi/cbindgen.toml parses");
    let preamble = config.header.take().unwrap_or_default();
    let preamble = preamble
        .trim_end()
        .strip_suffix("*/")
        .expect("cbindgen.toml's header is one C comment");
    config.header = Some(format!(
        "{preamble}*\n * ABI changelog\n{}\n */",
        changelog_comment(&lib_rs)
    ));
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");

    if std::env::var_os("M0_UPDATE_HEADER").is_some() {
        std::fs::write(&header_path, &generated).expect("write include/m0serve.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&header_path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/m0serve.h is stale: it differs from what abi/src/lib.rs generates.\n\
         Refresh it with: M0_UPDATE_HEADER=1 cargo test -p m0serve-abi --test header"
    );
}
