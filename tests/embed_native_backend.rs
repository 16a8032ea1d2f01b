//! Native forward-pass backends (`include/m0embed_backend.h`) behind the
//! embed plugin, over real sockets, each library built here with `cc`: the
//! C static-embedding backend of `backends/c/` serving the StaticEmbedding
//! fixture of tests/data/static under two workers, forked and spawned,
//! batched (cosine >= 0.9999 against sentence-transformers' vectors); the
//! identity fixture of `tests/c/embed_backend.c`, whose rows echo the ids
//! it was given, packed and padded and cut to the call limits; a backend
//! that fails to load (78, its message), one that fails a forward pass
//! (424 / 500 for that batch, the worker serves the next), one of another
//! ABI major, with a short table or a NULL function (78 before any call);
//! the library opened in the workers, never the supervisor; `--doctor`'s
//! facts.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support;
use crate::support::embed::{
    burst, check_alone_and_mixed, check_replies, cosine, embed_doctor, fire, openai_vectors, post,
    reference_at, serve_dir, stop_and_read_batching, vectors,
};
use crate::support::{Client, Server, cc, command, plugin, repo_root, scratch_dir};

fn static_dir() -> PathBuf {
    repo_root().join("tests/data/static/model")
}

fn static_reference() -> support::embed::Reference {
    reference_at(&repo_root().join("tests/data/static/reference.json"))
}

/// The token ids sentence-transformers packed for each reference sentence.
fn reference_ids() -> Vec<Vec<u32>> {
    let v: Value = serde_json::from_str(
        &std::fs::read_to_string(repo_root().join("tests/data/static/reference.json")).unwrap(),
    )
    .unwrap();
    serde_json::from_value(v["ids"].clone()).unwrap()
}

/// `backends/c/static_embedding.c`, built.
fn static_backend() -> PathBuf {
    let out = scratch_dir("embed_backends").join("libstatic_embedding.so");
    let src = repo_root().join("backends/c/static_embedding.c");
    cc(&["-O2", "-shared", src.to_str().unwrap()], &out);
    out
}

/// `tests/c/embed_backend.c` built with `defines`, as `libNAME.so`.
fn fixture(name: &str, defines: &[&str]) -> PathBuf {
    let out = scratch_dir("embed_backends").join(format!("lib{name}.so"));
    let src = repo_root().join("tests/c/embed_backend.c");
    let mut args = vec!["-shared", src.to_str().unwrap()];
    args.extend_from_slice(defines);
    cc(&args, &out);
    out
}

fn serve(backend: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut env = env.to_vec();
    env.push(("M0_EMBED_BACKEND", backend.to_str().unwrap()));
    serve_dir(&static_dir(), extra, &env)
}

/// A server of the static model over `backend` that must not start: its
/// exit code and log.
fn refused(backend: &Path, env: &[(&str, &str)]) -> (Option<i32>, String) {
    let p = plugin("embed");
    let dir = static_dir();
    let mut cmd = command(&[
        "--plugin",
        p.to_str().unwrap(),
        dir.to_str().unwrap(),
        "--workers",
        "2",
    ]);
    cmd.env("M0_EMBED_BACKEND", backend)
        .envs(env.iter().copied());
    match Server::try_start(cmd) {
        Ok(s) => panic!("the server started:\n{}", s.log()),
        Err((log, status)) => (status.and_then(|s| s.code()), log),
    }
}

#[test]
fn the_static_backend_matches_sentence_transformers_batched_in_fork_and_spawn_workers() {
    let _serial = support::one_at_a_time();
    let lib = static_backend();
    let r = static_reference();
    let probes = burst(&r);
    for mode in [
        &["--workers", "2"][..],
        &["--workers", "2", "--spawn-workers"],
    ] {
        let s = serve(&lib, mode, &[]);
        let spawned = mode.contains(&"--spawn-workers");
        let log = s.log();
        assert!(
            log.contains(if spawned { "spawn mode" } else { "fork mode" }),
            "{log}"
        );
        assert_eq!(log.matches("static_embedding.c 1.0").count(), 2, "{log}");
        let got = fire(&s, &probes);
        check_replies(&format!("{mode:?}"), &r, &probes, &got);
        check_alone_and_mixed(&s, &r);
        let mut c = Client::connect(s.addr);
        // StaticEmbedding tokenizes without special tokens.
        let k = 4;
        let (status, v, _) = post(&mut c, "/tokenize", &json!({"inputs": r.sentences[k]}));
        assert_eq!(status, 200, "{v}");
        let ids: Vec<u64> = v[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        let want: Vec<u64> = reference_ids()[k].iter().map(|&i| u64::from(i)).collect();
        assert_eq!(ids, want);
        // A blank text pools no token: zeros, as encode() gives it.
        for normalize in [true, false] {
            let (status, v, _) = post(
                &mut c,
                "/embed",
                &json!({"inputs": "   ", "normalize": normalize}),
            );
            assert_eq!(status, 200, "{v}");
            assert!(vectors(&v)[0].iter().all(|&x| x == 0.0), "{v}");
        }
        // OpenAI's route, several inputs in one request.
        let (status, v, _) = post(
            &mut c,
            "/v1/embeddings",
            &json!({"input": [r.sentences[3], r.sentences[25]]}),
        );
        assert_eq!(status, 200, "{v}");
        for (row, i) in openai_vectors(&v).iter().zip([3, 25]) {
            let cos = cosine(row, &r.embeddings[i]);
            assert!(cos >= 0.9999, "sentence {i}: cosine {cos}");
        }
        assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
        let (line, log) = stop_and_read_batching(s);
        assert!(line.is_some(), "no batching line:\n{log}");
    }
}

/// The identity fixture's rows are [token count, ids...]: what the plugin
/// handed the backend, packed or padded, across calls cut at
/// M0_EMBED_MAX_BATCH_REQUESTS inputs, in the request's order.
#[test]
fn the_backend_gets_each_inputs_ids_packed_or_padded_in_order_across_calls() {
    let _serial = support::one_at_a_time();
    let r = static_reference();
    let ids = reference_ids();
    let picks = [4, 1, 23, 2, 9, 3, 12];
    let inputs: Vec<&str> = picks.iter().map(|&i| r.sentences[i].as_str()).collect();
    for (name, defines) in [("identity", &[][..]), ("identity_padded", &["-DPADDED"])] {
        let lib = fixture(name, defines);
        let s = serve(&lib, &[], &[("M0_EMBED_MAX_BATCH_REQUESTS", "3")]);
        let inputs_kind = if defines.is_empty() {
            "packed"
        } else {
            "padded"
        };
        assert!(
            s.log().contains(&format!("{inputs_kind} inputs")),
            "{}",
            s.log()
        );
        let mut c = Client::connect(s.addr);
        let (status, v, _) = post(
            &mut c,
            "/embed",
            &json!({"inputs": inputs, "normalize": false}),
        );
        assert_eq!(status, 200, "{v}");
        let rows = vectors(&v);
        assert_eq!(rows.len(), picks.len());
        for (row, &i) in rows.iter().zip(&picks) {
            let want = &ids[i];
            assert_eq!(row[0] as usize, want.len(), "{name}: sentence {i}");
            let echoed: Vec<u32> = row[1..=want.len().min(63)]
                .iter()
                .map(|&x| x as u32)
                .collect();
            assert_eq!(echoed, want[..want.len().min(63)], "{name}: sentence {i}");
            assert!(row[want.len().min(63) + 1..].iter().all(|&x| x == 0.0));
        }
    }
}

#[test]
fn a_backend_that_fails_to_load_is_refused_with_78_and_its_message() {
    let _serial = support::one_at_a_time();
    let lib = fixture("load_fails", &["-DLOAD_FAILS"]);
    let (code, log) = refused(&lib, &[]);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("FIXTURE-LOAD-MARKER"), "{log}");
    assert!(log.contains(lib.to_str().unwrap()), "{log}");
    assert!(!log.contains("worker 0 pid="), "{log}");
    // No such library: named, with the variable.
    let missing = scratch_dir("embed_backends").join("libno_such_backend.so");
    let (code, log) = refused(&missing, &[]);
    assert_eq!(code, Some(78), "{log}");
    assert!(
        log.contains("libno_such_backend.so") && log.contains("M0_EMBED_BACKEND"),
        "{log}"
    );
    // The static model without a backend: the native encoder says which.
    let p = plugin("embed");
    let dir = static_dir();
    let mut cmd = command(&["--plugin", p.to_str().unwrap(), dir.to_str().unwrap()]);
    cmd.env_remove("M0_EMBED_BACKEND");
    let (code, log) = match Server::try_start(cmd) {
        Ok(s) => panic!("the server started:\n{}", s.log()),
        Err((log, status)) => (status.and_then(|s| s.code()), log),
    };
    assert_eq!(code, Some(78), "{log}");
    assert!(
        log.contains("StaticEmbedding") && log.contains("M0_EMBED_BACKEND="),
        "{log}"
    );
}

#[test]
fn another_abi_major_or_a_short_table_is_refused_before_any_call() {
    let _serial = support::one_at_a_time();
    let marker = scratch_dir("embed_backends").join(format!("called.{}", std::process::id()));
    let _ = std::fs::remove_file(&marker);
    let env = [("M0_TEST_BACKEND_MARKER", marker.to_str().unwrap())];
    let lib = fixture("abi_major_2", &["-DABI_MAJOR=2"]);
    let (code, log) = refused(&lib, &env);
    assert_eq!(code, Some(78), "{log}");
    for needle in [
        lib.to_str().unwrap(),
        "ABI 2.0",
        "speaks 1.0",
        "include/m0embed_backend.h",
    ] {
        assert!(log.contains(needle), "{needle:?} not in:\n{log}");
    }
    assert!(
        !marker.exists(),
        "the plugin called a backend of another major: {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let lib = fixture("short_table", &["-DTABLE_SIZE=16"]);
    let (code, log) = refused(&lib, &[]);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("table of 16 bytes"), "{log}");
    let lib = fixture("no_forward", &["-DNO_FORWARD"]);
    let (code, log) = refused(&lib, &[]);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("has no forward in its table"), "{log}");
}

/// The library is opened in the workers (and the plugin's throwaway
/// start before binding), never in the supervisor, forked or spawned.
#[test]
fn the_library_is_opened_in_the_workers_never_in_the_supervisor() {
    let _serial = support::one_at_a_time();
    let lib = fixture("mark_open", &["-DMARK_OPEN"]);
    for mode in [
        &["--workers", "2"][..],
        &["--workers", "2", "--spawn-workers"],
    ] {
        let opened = scratch_dir("embed_backends").join(format!(
            "opened.{}.{}",
            std::process::id(),
            mode.len()
        ));
        let _ = std::fs::remove_file(&opened);
        let s = serve(
            &lib,
            mode,
            &[("M0_TEST_BACKEND_OPENED", opened.to_str().unwrap())],
        );
        let pids: Vec<i32> = std::fs::read_to_string(&opened)
            .unwrap_or_default()
            .lines()
            .map(|l| l.parse().unwrap())
            .collect();
        let workers = s.worker_pids();
        assert_eq!(workers.len(), 2, "{}", s.log());
        for w in &workers {
            assert!(
                pids.contains(w),
                "{mode:?}: worker {w} did not open it: {pids:?}"
            );
        }
        assert!(
            !pids.contains(&s.pid()),
            "{mode:?}: the supervisor {} opened the library: {pids:?}",
            s.pid()
        );
    }
}

#[test]
fn a_failed_forward_pass_answers_its_batch_and_the_worker_serves_the_next() {
    let _serial = support::one_at_a_time();
    let lib = fixture("forward_fails", &["-DFORWARD_FAILS_AT=40"]);
    let r = static_reference();
    let ids = reference_ids();
    let s = serve(&lib, &["--workers", "1"], &[]);
    let pids = s.worker_pids();
    let mut c = Client::connect(s.addr);
    let fine = |c: &mut Client| {
        let (status, v, _) = post(
            c,
            "/embed",
            &json!({"inputs": r.sentences[3], "normalize": false}),
        );
        assert_eq!(status, 200, "{v}");
        assert_eq!(vectors(&v)[0][0] as usize, ids[3].len(), "{v}");
    };
    fine(&mut c);
    // Sentence 23 has 96 tokens: the backend fails that batch.
    let (status, v, _) = post(&mut c, "/embed", &json!({"inputs": r.sentences[23]}));
    assert_eq!(status, 424, "{v}");
    assert_eq!(v["error_type"], "Backend", "{v}");
    let msg = v["error"].as_str().unwrap_or_default();
    assert!(
        msg.contains("FIXTURE-FORWARD-MARKER") && msg.contains("embed_backend.c"),
        "{v}"
    );
    fine(&mut c);
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": [r.sentences[3], r.sentences[23]]}),
    );
    assert_eq!(status, 500, "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("FIXTURE-FORWARD-MARKER")),
        "{v}"
    );
    fine(&mut c);
    assert_eq!(s.worker_pids(), pids);
    assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
}

#[test]
fn doctor_reports_the_backend_and_its_declaration() {
    let _serial = support::one_at_a_time();
    let lib = static_backend();
    let (code, j) = embed_doctor(
        &static_dir(),
        &[("M0_EMBED_BACKEND", lib.to_str().unwrap())],
    );
    assert_eq!(code, Some(0), "{j:#}");
    let facts = &j["plugin"]["facts"];
    for (key, want) in [
        ("embed.backend", lib.to_str().unwrap()),
        ("embed.backend_name", "static_embedding.c 1.0"),
        ("embed.backend_abi", "1.0"),
        ("embed.backend_dim", "64"),
        ("embed.backend_inputs", "packed"),
        ("embed.backend_lock", "none"),
        ("embed.backend_threads", "1"),
        ("embed.architecture", "static"),
        ("embed.dim", "64"),
        ("embed.pooling", "mean"),
    ] {
        assert_eq!(facts[key], want, "{key}: {j:#}");
    }
}
