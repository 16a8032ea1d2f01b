//! `deploy/install` puts the binary, the plugins, the header and the
//! completions under a prefix, and the installed binary serves a plugin by
//! its short name from there, with no M0_PLUGIN_PATH.

use std::path::Path;
use std::process::Command;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, binary, plugin, repo_root, scratch_dir};

fn install(args: &[&str]) -> std::process::Output {
    Command::new(repo_root().join("deploy/install"))
        .args(args)
        .env_remove("M0_PLUGIN_PATH")
        .output_bounded()
        .expect("run deploy/install")
}

#[test]
fn an_installed_copy_finds_its_plugins_and_serves() {
    // The plugins this build has beside the binary, built if need be.
    plugin("hello_c");
    plugin("hello_rs");
    let build = binary().parent().unwrap().to_path_buf();
    let prefix = scratch_dir("install-prefix");
    let _ = std::fs::remove_dir_all(&prefix);
    let out = install(&[
        "--prefix",
        prefix.to_str().unwrap(),
        "--from",
        build.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    for file in [
        "bin/m0serve",
        "lib/m0serve/libhello_c.so",
        "lib/m0serve/libhello_rs.so",
        "include/m0serve.h",
        "share/bash-completion/completions/m0serve",
        "share/zsh/site-functions/_m0serve",
        "share/fish/vendor_completions.d/m0serve.fish",
    ] {
        assert!(prefix.join(file).is_file(), "{file} not installed");
    }
    assert!(
        !prefix.join("bin/libhello_c.so").exists(),
        "a plugin beside the installed binary would hide the lookup this test is for"
    );
    assert_eq!(
        std::fs::read(prefix.join("include/m0serve.h")).unwrap(),
        std::fs::read(repo_root().join("include/m0serve.h")).unwrap()
    );

    let installed = prefix.join("bin/m0serve");
    let served = |name: &str| {
        let mut cmd = Command::new(&installed);
        cmd.args(["--host", "127.0.0.1", "--port", "0", "--plugin", name])
            .env_remove("M0_PLUGIN_PATH")
            .env_remove("M0_PLUGIN")
            .env_remove("M0_WORKERS");
        let s = Server::start_cmd(cmd);
        assert_eq!(support::get(s.addr, "/").text(), "hello, world\n", "{name}");
    };
    served("hello_c");
    served("hello_rs");

    // --doctor names the file it found there.
    let out = Command::new(&installed)
        .args(["--doctor", "--port", "0", "--plugin", "hello_c"])
        .env_remove("M0_PLUGIN_PATH")
        .output_bounded()
        .unwrap();
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let file = j["plugin"]["file"].as_str().expect("plugin.file");
    let lib = std::fs::canonicalize(prefix.join("lib/m0serve")).unwrap();
    assert_eq!(
        std::fs::canonicalize(file).unwrap(),
        lib.join("libhello_c.so"),
        "{j:#}"
    );
}

#[test]
fn install_without_a_build_or_with_a_bad_flag_says_what_to_do() {
    let empty = scratch_dir("install-empty-build");
    let prefix = scratch_dir("install-unused-prefix");
    let out = install(&[
        "--prefix",
        prefix.to_str().unwrap(),
        "--from",
        empty.to_str().unwrap(),
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("cargo build --release"), "{err}");
    assert!(!Path::new(&prefix.join("bin/m0serve")).exists());
    let out = install(&["--prefx", "/tmp/x"]);
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--prefx"));
}
