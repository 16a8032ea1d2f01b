//! The checked-in `include/m0embed_backend.h` must be exactly what cbindgen
//! makes of `backend-abi/src/lib.rs`. Set `M0_UPDATE_HEADER=1` to rewrite it.

use std::path::Path;

#[test]
fn checked_in_header_matches_the_abi_source() {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let header_path = crate_dir.join("../include/m0embed_backend.h");
    let config = cbindgen::Config::from_file(crate_dir.join("cbindgen.toml"))
        .expect("backend-abi/cbindgen.toml parses");
    let bindings = cbindgen::Builder::new()
        .with_config(config)
        .with_src(crate_dir.join("src/lib.rs"))
        .generate()
        .expect("cbindgen generates the header");
    let mut generated = Vec::new();
    bindings.write(&mut generated);
    let generated = String::from_utf8(generated).expect("header is UTF-8");

    if std::env::var_os("M0_UPDATE_HEADER").is_some() {
        std::fs::write(&header_path, &generated).expect("write include/m0embed_backend.h");
        return;
    }
    let checked_in = std::fs::read_to_string(&header_path).unwrap_or_default();
    assert!(
        checked_in == generated,
        "include/m0embed_backend.h is stale: it differs from what backend-abi/src/lib.rs \
         generates.\nRefresh it with: M0_UPDATE_HEADER=1 cargo test -p m0embed-backend-abi --test header"
    );
}
