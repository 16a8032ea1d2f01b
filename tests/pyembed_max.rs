//! The pyembed plugin with the MAX backend (`backends/max_minilm.py`,
//! Modular's MAX graph API) over real sockets, as `tests/pyembed.rs` runs the
//! numpy one: under two workers, forked and spawned, the reference sentences
//! concurrently, batched by the core and not (cosine >= 0.9999 against
//! sentence-transformers); a SIGHUP that replaces the workers with no failed
//! request, and the new workers as right; a SIGTERM that drains and exits 0;
//! `--doctor`'s report of the backend.
//!
//! The venv (target/max-venv, about 0.9 GB) is built by the tests, and the
//! compile cache is target/max-cache, which outlives the run: the first run
//! on a machine compiles the graph (minutes, in `backends/check.py`, which
//! also checks the outputs), every later load, each worker's included, reads
//! the cache (seconds).

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use serde_json::json;

use crate::support;
use crate::support::embed;
use crate::support::embed::{burst, check_replies, fire, reference};
use crate::support::venv;
use crate::support::{Server, command, plugin, repo_root};

/// How long the first compile may take (4-5 minutes on a busy 2-core box).
const COMPILE_TIMEOUT: Duration = Duration::from_secs(15 * 60);

/// What the backend logs when it starts to load (cold or cached) and when a
/// load found its graph in the cache.
const COMPILING: &str = "max_minilm: compiling";
const CACHED: &str = "(from the cache)";

struct Max {
    venv: PathBuf,
    cache: PathBuf,
}

/// The MAX venv and a warm compile cache, once per test binary: runs
/// `backends/check.py max_minilm` with the venv's python and the tests'
/// cache (the reference's 26 sentences one by one and in batches, cosine
/// >= 0.9999), so that no server start compiles.
fn max() -> &'static Max {
    static MAX: OnceLock<Max> = OnceLock::new();
    MAX.get_or_init(|| {
        let venv = venv::max_venv();
        let cache = venv::max_cache();
        let cold = !has_cache_entries(&cache);
        let log_path = support::scratch_dir("pyembed_max").join("check.log");
        let log = std::fs::File::create(&log_path).expect("create check.log");
        let t0 = Instant::now();
        let mut child = Command::new(venv::venv_python(&venv))
            .arg(repo_root().join("backends/check.py"))
            .arg("max_minilm")
            .env("M0_PYEMBED_CACHE", &cache)
            .env_remove("M0_EMBED_MODEL_DIR")
            .env_remove("MODULAR_MAX_CACHE_DIR")
            .current_dir(repo_root())
            .stdin(Stdio::null())
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .expect("run backends/check.py");
        let status = loop {
            if let Some(status) = child.try_wait().expect("wait for check.py") {
                break Some(status);
            }
            if t0.elapsed() > COMPILE_TIMEOUT {
                let _ = child.kill();
                let _ = child.wait();
                break None;
            }
            std::thread::sleep(Duration::from_millis(100));
        };
        let out = std::fs::read_to_string(&log_path).unwrap_or_default();
        eprintln!(
            "check.py max_minilm ({} cache): {:.1} s\n{out}",
            if cold { "cold" } else { "warm" },
            t0.elapsed().as_secs_f64()
        );
        let status = status
            .unwrap_or_else(|| panic!("check.py max_minilm ran past {COMPILE_TIMEOUT:?}:\n{out}"));
        assert!(status.success() && out.contains("\nOK"), "{status}:\n{out}");
        // The backend says that it compiles, cold or not; a cold cache gets
        // new entries, a warm one is read.
        assert!(out.contains(COMPILING), "{out}");
        if cold {
            assert!(out.contains("new cache entries"), "{out}");
        }
        assert!(has_cache_entries(&cache), "nothing cached in {cache:?}");
        Max { venv, cache }
    })
}

/// Whether MAX has written anything to `cache` (besides the backend's lock).
fn has_cache_entries(cache: &std::path::Path) -> bool {
    std::fs::read_dir(cache)
        .map(|d| d.flatten().any(|e| e.file_name() != "m0serve-compile.lock"))
        .unwrap_or(false)
}

/// `m0serve --plugin pyembed --app-dir backends --venv MAX_VENV max_minilm
/// EXTRA...` with the tests' compile cache, the GIL declared released and
/// the compute threads the backend's.
fn pyembed_max(extra: &[&str]) -> Command {
    let m = max();
    let p = plugin("pyembed");
    let backends = repo_root().join("backends");
    let mut args = vec![
        "--plugin",
        p.to_str().unwrap(),
        "--app-dir",
        backends.to_str().unwrap(),
        "--venv",
        m.venv.to_str().unwrap(),
        "max_minilm",
    ];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    cmd.env_remove("M0_EMBED_MODEL_DIR")
        .env_remove("MODULAR_MAX_CACHE_DIR")
        .env("M0_PYEMBED_CACHE", &m.cache)
        .env("M0_PYEMBED_GIL", "released")
        .env(
            "M0_EMBED_THREADS",
            support::affinity_cpus().len().to_string(),
        );
    cmd
}

/// A server with the MAX backend whose `workers` workers have loaded the
/// graph from the cache, without a warning from the plugin.
fn serve_max(flags: &[&str], workers: usize) -> Server {
    let s = Server::start_cmd(pyembed_max(flags));
    let loaded = s.wait_for_log_count(CACHED, workers, Duration::from_secs(120));
    assert_eq!(
        loaded,
        workers,
        "not every worker read the cache:\n{}",
        s.log()
    );
    assert!(s.log_count(COMPILING) >= workers, "{}", s.log());
    let spawned = flags.contains(&"--spawn-workers");
    assert!(
        s.log()
            .contains(if spawned { "spawn mode" } else { "fork mode" }),
        "{}",
        s.log()
    );
    // The declared GIL and threads agree with the backend's.
    assert_eq!(
        s.log_count("pyembed: backend `max_minilm`"),
        0,
        "{}",
        s.log()
    );
    s
}

/// Every scenario on one server of two workers in `mode`, then the burst
/// again with `--no-batch`: the burst (cosine >= 0.9999), a SIGHUP under
/// load with no failed request, the burst on the new workers, a SIGTERM
/// that answers the requests in flight and exits 0.
fn scenarios(mode: &[&str]) {
    let _serial = support::one_at_a_time();
    let r = reference();
    let probes = burst(&r);
    let flags = [&["--workers", "2"][..], mode].concat();

    let mut s = serve_max(&flags, 2);
    let t0 = Instant::now();
    check_replies(&format!("{flags:?}"), &r, &probes, &fire(&s, &probes));
    eprintln!("{flags:?}: burst in {:.2} s", t0.elapsed().as_secs_f64());

    let body = json!({"inputs": "a sentence to embed"}).to_string();
    let request = format!(
        "POST /embed HTTP/1.1\r\nHost: t\r\nContent-Type: application/json\r\n\
         Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    // A new worker imports MAX and loads the graph from the cache (seconds,
    // one worker at a time) before the old one goes.
    support::sighup_under_load(&s, request.as_bytes(), b"]]", Duration::from_secs(120));
    assert_eq!(
        s.wait_for_log_count(CACHED, 4, Duration::from_secs(60)),
        4,
        "{}",
        s.log()
    );
    check_replies(
        &format!("{flags:?} after SIGHUP"),
        &r,
        &probes,
        &fire(&s, &probes),
    );

    // Every sentence in each request: a forward pass of some length.
    let inputs: Vec<&str> = r
        .sentences
        .iter()
        .filter(|t| !t.is_empty())
        .map(String::as_str)
        .collect();
    embed::sigterm_answers_what_is_in_flight(&mut s, &r, &inputs);
    let log = s.log();
    assert_eq!(s.log_count("replacing it"), 0, "{log}");
    let line = log.lines().find(|l| l.contains("batching:"));
    eprintln!("{flags:?}: {line:?}");
    assert!(
        line.is_some_and(|l| !l.contains("off")),
        "no batching line:\n{log}"
    );

    let flags = [&flags[..], &["--no-batch"]].concat();
    let s = serve_max(&flags, 2);
    check_replies(&format!("{flags:?}"), &r, &probes, &fire(&s, &probes));
    let (line, log) = embed::stop_and_read_batching(s);
    eprintln!("{flags:?}: {line:?}");
    assert!(
        line.as_deref().is_none_or(|l| l.contains("off")),
        "--no-batch still batched: {line:?}\n{log}"
    );
    assert_eq!(log.matches("replacing it").count(), 0, "{log}");
}

#[test]
fn the_max_backend_in_forked_workers_matches_the_reference_through_sighup_and_sigterm() {
    scenarios(&[]);
}

#[test]
fn the_max_backend_in_spawned_workers_matches_the_reference_through_sighup_and_sigterm() {
    scenarios(&["--spawn-workers"]);
}

#[test]
fn doctor_reports_the_max_backend_in_fork_and_spawn_mode() {
    let _serial = support::one_at_a_time();
    for mode in [&[][..], &["--spawn-workers"]] {
        let mut cmd = pyembed_max(mode);
        let (code, j) = support::doctor_json(&cmd.arg("--doctor").output().expect("run --doctor"));
        assert_eq!(code, Some(0), "{mode:?}: {j:#}");
        embed::check_pyembed_doctor(&j, "max_minilm", "max", "max-venv", true);
        let facts = &j["plugin"]["facts"];
        assert_eq!(
            facts["embed.threads"],
            support::affinity_cpus().len().to_string(),
            "{j:#}"
        );
        // MAX is in sys.modules after the import, so the fact names it.
        let unsafe_modules = facts["python.fork_unsafe_modules"]
            .as_str()
            .unwrap_or_default();
        assert!(unsafe_modules.split(',').any(|m| m == "max"), "{j:#}");
        // No warning in either mode: the worker starts Python, and imports
        // MAX, only after fork(), from a supervisor that never loads it,
        // and nothing forks after that (D7), which the forked-workers test
        // above shows (two workers, a SIGHUP, a drain).
        let warned = support::doctor_warnings(&j);
        assert!(!warned.iter().any(|w| w == "fork-unsafe-runtime"), "{j:#}");
    }
}
