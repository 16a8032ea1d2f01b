//! `M0_EMBED_DTYPE` over a real server (issue #54): what the CPU resolves
//! `auto` to, told by `--doctor` (`embed.dtype`, `embed.kernels`); a forced
//! bfloat16 served where the CPU has bf16 (`/info` says so, the reference
//! sentences at cosine >= 0.9999 over HTTP) and refused with 78 naming the
//! missing CPU features where it has none; float32 served and reported; a
//! value that is none of the three refused with 78 naming the variable and
//! the values; a forced bfloat16 with a native backend refused, as that
//! backend computes in f32.

use std::path::Path;
use std::time::Duration;

use serde_json::Value;

use crate::support::embed::{check_alone_and_mixed, embed_doctor, minilm, reference, serve_dir};
use crate::support::{Client, command, plugin};

/// `m0serve --plugin embed MINILM` with `env`, expected to exit: its code
/// and what it wrote.
fn run_to_exit(dir: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let p = plugin("embed");
    let mut cmd = command(&["--plugin", p.to_str().unwrap(), dir.to_str().unwrap()]);
    cmd.envs(env.iter().copied());
    // A refused start exits at once; 120 s is a hang, not a slow box.
    let out = crate::support::output_within(&mut cmd, Duration::from_secs(120));
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    (out.status.code(), text)
}

/// Whether this CPU computes in bf16, as the doctor says `auto` resolves.
fn cpu_has_bf16() -> bool {
    let (code, v) = embed_doctor(&minilm(), &[("M0_EMBED_DTYPE", "auto")]);
    assert_eq!(code, Some(0), "{v}");
    match v["plugin"]["facts"]["embed.dtype"].as_str() {
        Some("bfloat16") => true,
        Some("float32") => false,
        other => panic!("embed.dtype {other:?}: {v}"),
    }
}

fn info(addr: std::net::SocketAddr) -> Value {
    serde_json::from_slice(&Client::connect(addr).get("/info").body).unwrap()
}

#[test]
fn the_doctor_names_the_dtype_and_kernels_auto_chose() {
    // Said outright: the tests' servers are float32 unless told.
    let (code, v) = embed_doctor(&minilm(), &[("M0_EMBED_DTYPE", "auto")]);
    assert_eq!(code, Some(0), "{v}");
    let facts = &v["plugin"]["facts"];
    let kernels = facts["embed.kernels"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    match facts["embed.dtype"].as_str() {
        Some("bfloat16") => assert!(
            ["amx-bf16", "avx512-bf16"].contains(&kernels.as_str()),
            "{v}"
        ),
        Some("float32") => {
            assert!(kernels.contains("f32"), "{v}");
            eprintln!("auto's bfloat16: skipped: this CPU lacks avx512_bf16 and amx_bf16");
        }
        other => panic!("embed.dtype {other:?}: {v}"),
    }
    let (_, v) = embed_doctor(&minilm(), &[("M0_EMBED_DTYPE", "float32")]);
    assert_eq!(v["plugin"]["facts"]["embed.dtype"], "float32", "{v}");
    assert!(
        v["plugin"]["facts"]["embed.kernels"]
            .as_str()
            .unwrap()
            .contains("f32"),
        "{v}"
    );
}

#[test]
fn a_forced_bfloat16_is_served_on_a_bf16_cpu_and_refused_with_78_elsewhere() {
    let env = [("M0_EMBED_DTYPE", "bfloat16")];
    if cpu_has_bf16() {
        let s = serve_dir(&minilm(), &["--workers", "2"], &env);
        assert_eq!(info(s.addr)["model_dtype"], "bfloat16");
        check_alone_and_mixed(&s, &reference());
        return;
    }
    eprintln!("serving bfloat16: skipped: this CPU lacks avx512_bf16 and amx_bf16");
    let (code, log) = run_to_exit(&minilm(), &env);
    assert_eq!(code, Some(78), "{log}");
    for part in [
        "M0_EMBED_DTYPE=bfloat16",
        "avx512_bf16",
        "amx_bf16",
        "float32",
    ] {
        assert!(log.contains(part), "{part} in {log}");
    }
    let (code, v) = embed_doctor(&minilm(), &env);
    assert_eq!(code, Some(78), "{v}");
    assert!(v.to_string().contains("amx_bf16"), "{v}");
}

#[test]
fn float32_is_served_and_reported_as_float32() {
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_DTYPE", "float32")]);
    assert_eq!(info(s.addr)["model_dtype"], "float32");
    check_alone_and_mixed(&s, &reference());
}

#[test]
fn a_dtype_that_is_none_of_the_three_is_refused_with_78_naming_the_values() {
    for bad in ["fp16", "bf16", "Float32"] {
        let (code, log) = run_to_exit(&minilm(), &[("M0_EMBED_DTYPE", bad)]);
        assert_eq!(code, Some(78), "{bad}: {log}");
        assert!(
            log.contains("M0_EMBED_DTYPE") && log.contains("auto, float32 or bfloat16"),
            "{bad}: {log}"
        );
    }
}

/// A native backend computes in f32 whatever the plugin asks: a forced
/// bfloat16 is refused before the library is opened (the path need not
/// exist), and auto is no refusal (the library's own error then).
#[test]
fn a_forced_bfloat16_with_a_native_backend_is_refused_with_78() {
    let lib = "/nonexistent/libbackend.so";
    let (code, log) = run_to_exit(
        &minilm(),
        &[("M0_EMBED_BACKEND", lib), ("M0_EMBED_DTYPE", "bfloat16")],
    );
    assert_eq!(code, Some(78), "{log}");
    assert!(
        log.contains("M0_EMBED_DTYPE=bfloat16") && log.contains("computes in float32"),
        "{log}"
    );
    let (code, log) = run_to_exit(
        &minilm(),
        &[("M0_EMBED_BACKEND", lib), ("M0_EMBED_DTYPE", "auto")],
    );
    assert_eq!(code, Some(78), "{log}");
    assert!(!log.contains("M0_EMBED_DTYPE"), "{log}");
}
