//! Several models behind one port (#53): one server of two embedders
//! (all-MiniLM-L6-v2 under two names) and the stand-in reranker of
//! tests/data/minilm_reranker, 2 workers, forked and spawned. Each model
//! answers with its own reference through the client that picks it: the
//! `openai` package's `model=`, huggingface_hub's `InferenceClient` whose
//! base URL is `/models/{name}`, the `cohere` package's `model=`, all at
//! once; `client.models.list()` lists the three; an unknown model and one
//! of the wrong kind are answered in each API's own shape; a folder that
//! fails to load and a name given twice refuse the start with 78; each
//! model has its own admission budget; TEI's `te_*` series are on the
//! `--metrics` page per model.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use serde_json::{Value, json};

use crate::embed_reranker::{assemble, reference as rerank_reference};
use crate::embed_tasks::{queries, sigmoid};
use crate::support::OutputBounded;
use crate::support::embed::{cosine, minilm, post, reference};
use crate::support::test_dir::TestDir;
use crate::support::venv::{embed_venv, venv_python};
use crate::support::{Client, Server, command, doctor_json, plugin, repo_root};

/// The names the server serves, in the order given.
const NAMES: [&str; 3] = ["mini", "mini2", "rr"];

/// The three models' ARGs: MiniLM as `mini` and `mini2`, the reranker
/// (assembled into `rr`) as `rr`.
fn model_args(rr: &Path) -> Vec<String> {
    let m = minilm();
    vec![
        format!("mini={}", m.display()),
        format!("mini2={}", m.display()),
        format!("rr={}", rr.display()),
    ]
}

fn embed_command(models: &[String], extra: &[&str]) -> Command {
    embed_command_with(&[], models, extra)
}

/// `m0serve FLAGS --plugin embed MODELS... EXTRA`.
fn embed_command_with(flags: &[&str], models: &[String], extra: &[&str]) -> Command {
    let p = plugin("embed");
    let mut args = flags.to_vec();
    args.extend(["--plugin", p.to_str().unwrap()]);
    args.extend(models.iter().map(String::as_str));
    args.extend_from_slice(extra);
    command(&args)
}

fn serve(rr: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let mut cmd = embed_command(&model_args(rr), extra);
    cmd.envs(env.iter().copied());
    Server::start_cmd(cmd)
}

/// tests/embed/models_clients.py in the embedding venv against `s`: what
/// the client parsed.
fn client(s: &Server, what: &str, args: &[&str]) -> Value {
    let out = Command::new(venv_python(&embed_venv()))
        .arg(repo_root().join("tests/embed/models_clients.py"))
        .arg(what)
        .arg(format!("http://{}", s.addr))
        .args(args)
        .output_bounded()
        .expect("run tests/embed/models_clients.py");
    assert!(
        out.status.success(),
        "{what}: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

/// Every vector of `v["vectors"]` at cosine >= 0.9999 to the reference's
/// embedding of its sentence.
fn check_vectors(v: &Value, want: &[&Vec<f64>], what: &str) {
    let got = v["vectors"].as_array().unwrap();
    assert_eq!(got.len(), want.len(), "{what}: {v}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let c = cosine(&floats(g), w);
        assert!(c >= 0.9999, "{what} sentence {i}: cosine {c}");
    }
}

#[test]
fn each_model_answers_with_its_own_reference_through_its_client_all_at_once() {
    let r = reference();
    let rr_ref = rerank_reference();
    let groups = queries(&rr_ref);
    let rr = TestDir::new("embed_models_rr");
    assemble(&rr);
    let pick: Vec<usize> = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty() && r.tokens[i] < r.max_len)
        .take(8)
        .collect();
    let texts: Vec<&str> = pick.iter().map(|&i| r.sentences[i].as_str()).collect();
    let want: Vec<&Vec<f64>> = pick.iter().map(|&i| &r.embeddings[i]).collect();
    for mode in [&[][..], &["--spawn-workers"][..]] {
        let mut extra = vec!["--workers", "2"];
        extra.extend_from_slice(mode);
        let s = serve(&rr, &extra, &[]);
        std::thread::scope(|scope| {
            let s = &s;
            for name in ["mini", "mini2"] {
                let (texts, want) = (&texts, &want);
                scope.spawn(move || {
                    let mut args = vec![name];
                    args.extend(texts);
                    let v = client(s, "openai", &args);
                    // The reply names the model the request named.
                    assert_eq!(v["model"], name, "{mode:?} {v}");
                    check_vectors(&v, want, &format!("{mode:?} openai {name}"));
                    let v = client(s, "hf", &args);
                    check_vectors(&v, want, &format!("{mode:?} hf {name}"));
                });
            }
            for (q, docs, logits) in &groups[..2] {
                scope.spawn(move || {
                    let mut args = vec!["rr", q.as_str()];
                    args.extend(docs.iter().map(String::as_str));
                    let v = client(s, "cohere", &args);
                    let got = v["results"].as_array().unwrap();
                    assert_eq!(got.len(), docs.len(), "{v}");
                    for g in got {
                        let i = g[0].as_u64().unwrap() as usize;
                        let want = sigmoid(logits[i]);
                        let score = g[1].as_f64().unwrap();
                        assert!(
                            (score - want).abs() < 1e-4,
                            "{mode:?} {q} {i}: {score} vs {want}"
                        );
                    }
                });
            }
        });
        let v = client(&s, "list", &[]);
        assert_eq!(v["ids"], json!(NAMES), "{v}");
        // /info: the first model's TEI fields, and every model.
        let mut c = Client::connect(s.addr);
        let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
        assert_eq!(info["served_model_name"], "mini", "{info}");
        let models = info["models"].as_array().unwrap();
        let kinds: Vec<(&str, &str)> = models
            .iter()
            .map(|m| (m["name"].as_str().unwrap(), m["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(
            kinds,
            [
                ("mini", "embedding"),
                ("mini2", "embedding"),
                ("rr", "reranker")
            ]
        );
        assert_eq!(models[2]["max_input_length"], 512, "{info}");
        let info: Value = serde_json::from_slice(&c.get("/models/rr/info").body).unwrap();
        assert_eq!(info["task"], "reranker", "{info}");
        // The document lists every kind's routes; each model's, its own.
        let paths = |path: &str, c: &mut Client| -> Vec<String> {
            let d: Value = serde_json::from_slice(&c.get(path).body).unwrap();
            d["paths"].as_object().unwrap().keys().cloned().collect()
        };
        let all = paths("/openapi.json", &mut c);
        assert!(
            all.contains(&"/embed".into()) && all.contains(&"/rerank".into()),
            "{all:?}"
        );
        let rr_paths = paths("/models/rr/openapi.json", &mut c);
        assert!(rr_paths.contains(&"/rerank".into()), "{rr_paths:?}");
        assert!(!rr_paths.contains(&"/embed".into()), "{rr_paths:?}");
        // TEI's routes without a prefix go to the first model of their
        // kind: /rerank to rr, /embed to mini.
        let (q, docs, logits) = &groups[0];
        let (status, v, _) = post(&mut c, "/rerank", &json!({"query": q, "texts": docs}));
        assert_eq!(status, 200, "{v}");
        for x in v.as_array().unwrap() {
            let i = x["index"].as_u64().unwrap() as usize;
            assert!((x["score"].as_f64().unwrap() - sigmoid(logits[i])).abs() < 1e-4);
        }
        let (status, v, _) = post(&mut c, "/embed", &json!({"inputs": texts[0]}));
        assert_eq!(status, 200, "{v}");
        assert!(cosine(&floats(&v[0]), want[0]) >= 0.9999);
    }
}

#[test]
fn an_unknown_model_or_one_of_the_wrong_kind_is_answered_in_each_apis_shape() {
    let rr = TestDir::new("embed_models_wrong");
    assemble(&rr);
    let s = serve(&rr, &["--workers", "1"], &[]);
    let v = client(&s, "unknown", &["mini", "rr"]);
    // OpenAI's envelope, 404 model_not_found, listing the served names.
    let e = &v["openai_unknown"];
    assert_eq!(e["status"], 404, "{v}");
    assert_eq!(e["type"], "NotFoundError", "{v}");
    let err = &e["body"];
    assert_eq!(err["type"], "invalid_request_error", "{v}");
    assert_eq!(err["param"], "model", "{v}");
    assert_eq!(err["code"], "model_not_found", "{v}");
    let message = err["message"].as_str().unwrap();
    for name in NAMES {
        assert!(message.contains(name), "{message}");
    }
    // A reranker named on /v1/embeddings: 400, naming it and its kind.
    let e = &v["openai_wrong_kind"];
    assert_eq!(e["status"], 400, "{v}");
    let message = e["body"]["message"].as_str().unwrap();
    assert!(message.contains("`rr` is a reranker model"), "{message}");
    // Cohere's `{"message"}`: 404, and 400 for an embedder.
    let e = &v["cohere_unknown"];
    assert_eq!(e["status"], 404, "{v}");
    let message = e["body"]["message"].as_str().unwrap();
    assert!(
        message.contains("rerank-x") && message.contains("mini2"),
        "{message}"
    );
    let e = &v["cohere_wrong_kind"];
    assert_eq!(e["status"], 400, "{v}");
    let message = e["body"]["message"].as_str().unwrap();
    assert!(
        message.contains("`mini` is an embedding model"),
        "{message}"
    );
    // TEI's: an unknown /models/{name}/ is a 404 of TEI's JSON, a route
    // its model cannot answer TEI's 424.
    let mut c = Client::connect(s.addr);
    let (status, v, _) = post(&mut c, "/models/nope/embed", &json!({"inputs": "a"}));
    assert_eq!(status, 404, "{v}");
    assert_eq!(v["error_type"], "Validation", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("mini, mini2, rr"),
        "{v}"
    );
    let (status, v, _) = post(
        &mut c,
        "/models/mini/rerank",
        &json!({"query": "q", "texts": ["a"]}),
    );
    assert_eq!(status, 424, "{v}");
    assert_eq!(v["error_type"], "Backend", "{v}");
    // It names the model and where the route is answered.
    let message = v["error"].as_str().unwrap();
    assert!(
        message.contains("`mini` is an embedding model"),
        "{message}"
    );
    assert!(message.contains("/models/rr/..."), "{message}");
    let (status, v, _) = post(&mut c, "/models/rr/embed", &json!({"inputs": "a"}));
    assert_eq!(status, 424, "{v}");
    // The worker is still there.
    let (status, _, _) = post(&mut c, "/models/mini2/embed", &json!({"inputs": "a"}));
    assert_eq!(status, 200);
}

/// The command's exit status and what it wrote.
fn run_to_exit(models: &[String], env: &[(&str, &str)], doctor: bool) -> (Option<i32>, String) {
    let flags: &[&str] = if doctor { &["--doctor"] } else { &[] };
    let mut cmd = embed_command_with(flags, models, &[]);
    cmd.envs(env.iter().copied());
    // A refused start exits at once; 120 s is a hang, not a slow box.
    let out = crate::support::output_within(&mut cmd, Duration::from_secs(120));
    let mut text = String::from_utf8_lossy(&out.stderr).into_owned();
    text.push_str(&String::from_utf8_lossy(&out.stdout));
    (out.status.code(), text)
}

#[test]
fn a_folder_that_fails_to_load_or_a_name_given_twice_refuses_the_start_with_78() {
    let m = minilm();
    let missing = TestDir::new("embed_models_missing");
    let nowhere: PathBuf = missing.join("no_such_model");
    for doctor in [false, true] {
        // The second model's folder does not load: no half-served start.
        let models = [
            format!("mini={}", m.display()),
            format!("broken={}", nowhere.display()),
        ];
        let (code, log) = run_to_exit(&models, &[], doctor);
        assert_eq!(code, Some(78), "doctor {doctor}: {log}");
        assert!(log.contains(nowhere.to_str().unwrap()), "{log}");
        // One name twice.
        let models = [format!("a={}", m.display()), format!("a={}", m.display())];
        let (code, log) = run_to_exit(&models, &[], doctor);
        assert_eq!(code, Some(78), "doctor {doctor}: {log}");
        assert!(log.contains("two models are served as `a`"), "{log}");
        assert!(log.contains("NAME=DIR"), "{log}");
    }
    // Two folders of one base name are one name too, until named.
    let models = [m.display().to_string(), m.display().to_string()];
    let (code, log) = run_to_exit(&models, &[], false);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("two models are served as `model`"), "{log}");
    // More models than one server serves, refused before any loads.
    let models: Vec<String> = (0..17).map(|i| format!("m{i}={}", m.display())).collect();
    let (code, log) = run_to_exit(&models, &[], false);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("17 models given"), "{log}");
    // The one-model setting with several models.
    let models = [format!("a={}", m.display()), format!("b={}", m.display())];
    let (code, log) = run_to_exit(&models, &[("M0_EMBED_SERVED_MODEL_NAME", "x")], false);
    assert_eq!(code, Some(78), "{log}");
    assert!(log.contains("M0_EMBED_SERVED_MODEL_NAME"), "{log}");
    assert!(log.contains("NAME=DIR"), "{log}");
}

#[test]
fn the_doctor_lists_every_model_with_its_facts() {
    let rr = TestDir::new("embed_models_doctor");
    assemble(&rr);
    let out = embed_command_with(&["--doctor"], &model_args(&rr), &[])
        .output_bounded()
        .unwrap();
    let (code, v) = doctor_json(&out);
    assert_eq!(code, Some(0), "{v}");
    let facts = &v["plugin"]["facts"];
    assert_eq!(facts["embed.models"], "mini,mini2,rr", "{v}");
    // Today's facts describe the first model; each has its own.
    assert_eq!(facts["embed.served_model_name"], "mini", "{v}");
    assert_eq!(facts["embed.model.2.served_model_name"], "rr", "{v}");
    assert_eq!(facts["embed.model.2.task"], "reranker", "{v}");
    assert_eq!(facts["embed.model.1.task"], "embedding", "{v}");
    assert_eq!(facts["embed.model.2.weights_shared"], "true", "{v}");
    let mapped: u64 = facts["embed.model.2.weights_mapped_bytes"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(mapped > 1_000_000, "{v}");
}

/// POSTs `body` as JSON: the status and the parsed reply; no reply (the
/// connection closed, or 30 s of silence) fails the test with how long it
/// waited and the server's log, which names a worker's death.
fn post_or_log(s: &Server, c: &mut Client, path: &str, body: &Value) -> (u16, Value) {
    let started = std::time::Instant::now();
    let reply = c.try_request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let Some(r) = reply else {
        panic!(
            "no answer to POST {path} after {:?}; the server's log:\n{}",
            started.elapsed(),
            s.log()
        );
    };
    (
        r.status,
        serde_json::from_slice(&r.body).unwrap_or(Value::Null),
    )
}

/// Each model its own budget: while one 256-input request holds the
/// embedder's inputs far over `M0_EMBED_MAX_CONCURRENT_INPUTS`, a one-input
/// `/embed` to it is refused 429, and the reranker still admits a rerank
/// between two such refusals (a worker-wide budget would refuse it too).
#[test]
fn each_model_has_its_own_admission_budget() {
    let rr = TestDir::new("embed_models_admission");
    assemble(&rr);
    let m = minilm();
    let models = [
        format!("mini={}", m.display()),
        format!("rr={}", rr.display()),
    ];
    let mut cmd = embed_command(&models, &["--workers", "1"]);
    cmd.env("M0_EMBED_MAX_CONCURRENT_INPUTS", "64");
    let s = Server::start_cmd(cmd);
    let r = reference();
    let long = r.sentences[r.first_sentence()].repeat(4);
    // Over the embedder's budget of 64 on its own, and long enough (about
    // a second of both CPUs) that the rerank and the probes beside it end
    // first; 2048 inputs took over the client's 30 s on a busy box.
    let inputs: Vec<&str> = (0..256).map(|_| long.as_str()).collect();
    let big_done = std::sync::atomic::AtomicBool::new(false);
    let (probe_before, rerank, probe_after) = std::thread::scope(|scope| {
        let big = scope.spawn(|| {
            let mut c = Client::connect(s.addr);
            let body = json!({"model": "mini", "input": inputs, "encoding_format": "float"});
            // Refused while a probe is in flight: again, until admitted.
            let mut answer = post_or_log(&s, &mut c, "/v1/embeddings", &body);
            for _ in 0..1000 {
                if answer.0 != 429 {
                    break;
                }
                answer = post_or_log(&s, &mut c, "/v1/embeddings", &body);
            }
            big_done.store(true, std::sync::atomic::Ordering::SeqCst);
            assert_eq!(answer.0, 200, "{}", answer.1);
        });
        let mut c = Client::connect(s.addr);
        let probe = |c: &mut Client| post_or_log(&s, c, "/embed", &json!({"inputs": "a"})).0;
        // Until the big request is admitted (its 256 inputs in flight).
        let mut before = probe(&mut c);
        while before != 429 && !big_done.load(std::sync::atomic::Ordering::SeqCst) {
            before = probe(&mut c);
        }
        let (q, docs, _) = &queries(&rerank_reference())[0];
        let (rerank, v) = post_or_log(&s, &mut c, "/rerank", &json!({"query": q, "texts": docs}));
        assert!(rerank == 200 || rerank == 429, "{v}");
        let after = probe(&mut c);
        big.join().unwrap();
        (before, rerank, after)
    });
    assert_eq!(
        probe_before, 429,
        "the big request was never seen in flight"
    );
    assert_eq!(
        probe_after, 429,
        "the big request ended before the rerank was admitted"
    );
    assert_eq!(
        rerank, 200,
        "the reranker was refused while only the embedder was full"
    );
}

/// The `--metrics` page's lines of `series` whose labels hold `model`.
fn series(text: &str, series: &str, labels: &[&str]) -> f64 {
    let prefix = format!("{series}{{");
    text.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter(|l| labels.iter().all(|want| l.contains(want)))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
        .sum()
}

/// TEI's `te_*` series, per model: requests, successes, failures by
/// reason, the durations and sizes as histograms, summed over 2 workers.
#[test]
fn teis_series_are_on_the_metrics_page_per_model() {
    let rr = TestDir::new("embed_models_metrics");
    assemble(&rr);
    let logs = TestDir::new("embed_models_access_log");
    let access = logs.join("access.jsonl");
    let mut s = serve(
        &rr,
        &[
            "--workers",
            "2",
            "--metrics",
            "127.0.0.1:0",
            "--access-log",
            access.to_str().unwrap(),
            "--access-log-format",
            "json",
        ],
        &[],
    );
    let r = reference();
    let ids: Vec<usize> = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty() && r.tokens[i] < r.max_len)
        .take(6)
        .collect();
    let mut c = Client::connect(s.addr);
    let mut mini_tokens = 0;
    for pair in ids.chunks(2) {
        let inputs: Vec<&str> = pair.iter().map(|&i| r.sentences[i].as_str()).collect();
        let (status, v, resp) = post(&mut c, "/models/mini/embed", &json!({"inputs": inputs}));
        assert_eq!(status, 200, "{v}");
        mini_tokens += resp
            .header("x-compute-tokens")
            .unwrap()
            .parse::<usize>()
            .unwrap();
    }
    let (status, _, _) = post(&mut c, "/models/mini/embed", &json!({"inputs": []}));
    assert_eq!(status, 400);
    let (q, docs, _) = &queries(&rerank_reference())[0];
    for _ in 0..2 {
        let body = json!({"query": q, "texts": &docs[..4], "truncate": true});
        let (status, v, _) = post(&mut c, "/rerank", &body);
        assert_eq!(status, 200, "{v}");
    }
    let text = crate::support::get(s.metrics_addr(), "/metrics").text();
    let mini = "model=\"mini\"";
    let rr = "model=\"rr\"";
    assert_eq!(series(&text, "te_request_count", &[mini]), 4.0, "{text}");
    assert_eq!(series(&text, "te_request_success", &[mini]), 3.0, "{text}");
    assert_eq!(
        series(&text, "te_request_failure", &[mini, "err=\"validation\""]),
        1.0,
        "{text}"
    );
    assert_eq!(series(&text, "te_request_count", &[rr]), 2.0, "{text}");
    assert_eq!(series(&text, "te_request_success", &[rr]), 2.0, "{text}");
    assert_eq!(series(&text, "te_request_failure", &[rr]), 0.0, "{text}");
    assert_eq!(
        series(&text, "te_request_duration_count", &[mini]),
        3.0,
        "{text}"
    );
    assert_eq!(
        series(&text, "te_request_inference_duration_count", &[rr]),
        2.0,
        "{text}"
    );
    // Inputs and tokens: every pass of every request counted.
    assert_eq!(
        series(&text, "te_request_input_length_count", &[mini]),
        6.0,
        "{text}"
    );
    assert_eq!(
        series(&text, "te_batch_next_size_sum", &[mini]),
        6.0,
        "{text}"
    );
    assert_eq!(
        series(&text, "te_batch_next_size_sum", &[rr]),
        8.0,
        "{text}"
    );
    assert_eq!(
        series(&text, "te_batch_next_tokens_sum", &[mini]),
        mini_tokens as f64,
        "{text}"
    );
    assert!(
        text.contains("# TYPE te_request_duration histogram"),
        "{text}"
    );
    assert!(text.contains("# TYPE te_request_count counter"), "{text}");
    // The host's own series name the model too.
    assert!(
        text.lines()
            .any(|l| l.starts_with("m0serve_") && l.contains(rr)),
        "{text}"
    );
    // And the access log's JSON lines.
    s.stop_and_log();
    let lines: Vec<Value> = std::fs::read_to_string(&access)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let mut seen: Vec<(&str, Option<&str>)> = lines
        .iter()
        .map(|l| (l["target"].as_str().unwrap(), l["model"].as_str()))
        .collect();
    seen.sort();
    seen.dedup();
    assert_eq!(
        seen,
        [
            ("/models/mini/embed", Some("mini")),
            ("/rerank", Some("rr"))
        ],
        "{lines:?}"
    );
}
