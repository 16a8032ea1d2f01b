//! The stand-in reranker of #52 on all-MiniLM-L6-v2's real tokenizer,
//! encoder and pooler with a seeded classifier (tests/data/minilm_reranker),
//! over real sockets: `/rerank` against the logits sentence-transformers'
//! CrossEncoder gave in float32 (tests/data/minilm_reranker_reference.json),
//! one client at a time and several at once. The tiny fixtures of
//! embed_tasks.rs check every family's head; this one checks the real
//! vocabulary, 512 positions and a pair cut longest first.

use std::path::Path;
use std::process::Command;

use serde_json::{Value, json};

use crate::embed_tasks::{queries, sigmoid};
use crate::support::OutputBounded;
use crate::support::embed::{batch_counts, post, serve_dir, stop_and_read_batching};
use crate::support::test_dir::TestDir;
use crate::support::venv::{embed_venv, minilm_dir, venv_python};
use crate::support::{Client, Server, repo_root};

pub(crate) fn reference() -> Value {
    let path = repo_root().join("tests/data/minilm_reranker_reference.json");
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// The reranker's folder assembled into `dir` by the checked-in script
/// (standard library only, so the test venv's python runs it: no torch)
/// from the MiniLM package the embedding tests already install.
pub(crate) fn assemble(dir: &Path) {
    let venv = embed_venv();
    let out = Command::new(venv_python(&venv))
        .arg(repo_root().join("tests/data/make_minilm_reranker.py"))
        .arg("assemble")
        .arg(dir)
        .arg("--model")
        .arg(minilm_dir(&venv))
        .output_bounded()
        .expect("run tests/data/make_minilm_reranker.py");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// One `/rerank` of `texts` against `q`: every score (the sigmoid, or the
/// logit itself with `raw`) within 1e-4 of the reference, highest first,
/// and the texts in the reference's order wherever two logits are further
/// apart than the tolerance (closer ones may swap and both be right).
fn check(c: &mut Client, q: &str, texts: &[String], logits: &[f64], raw: bool) {
    let body = json!({"query": q, "texts": texts, "truncate": true, "raw_scores": raw});
    let (status, v, _) = post(c, "/rerank", &body);
    assert_eq!(status, 200, "{q}: {v}");
    let ranks = v.as_array().unwrap();
    assert_eq!(ranks.len(), texts.len(), "{v}");
    let order: Vec<usize> = ranks
        .iter()
        .map(|x| x["index"].as_u64().unwrap() as usize)
        .collect();
    for (x, &i) in ranks.iter().zip(&order) {
        let want = if raw { logits[i] } else { sigmoid(logits[i]) };
        let got = x["score"].as_f64().unwrap();
        assert!((got - want).abs() < 1e-4, "{q} text {i}: {got} vs {want}");
    }
    for (k, &a) in order.iter().enumerate() {
        for &b in &order[k + 1..] {
            assert!(
                logits[a] >= logits[b] - 2e-4,
                "{q}: text {a} ranked above {b}: {v}"
            );
        }
    }
}

#[test]
fn the_minilm_reranker_scores_pairs_as_the_cross_encoder_does() {
    let r = reference();
    assert_eq!(r["max_length"], 512);
    let dir = TestDir::new("embed_reranker_minilm");
    assemble(&dir);
    let s: Server = serve_dir(&dir, &[], &[]);
    let mut c = Client::connect(s.addr);
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["task"], "reranker", "{info}");
    assert_eq!(info["max_input_length"], 512, "{info}");
    for (q, texts, logits) in queries(&r) {
        check(&mut c, &q, &texts, &logits, false);
        check(&mut c, &q, &texts, &logits, true);
    }
    // The pair past 512 tokens is cut longest first to the reference's
    // ids: the server counts exactly the reference's tokens.
    let longest = r["tokens"]
        .as_array()
        .unwrap()
        .iter()
        .position(|t| t.as_array().unwrap().len() == 512)
        .unwrap();
    let pair = &r["pairs"][longest];
    let body = json!({"query": pair[0], "texts": [pair[1]], "truncate": true});
    let (status, v, resp) = post(&mut c, "/rerank", &body);
    assert_eq!(status, 200, "{v}");
    assert_eq!(resp.header("x-compute-tokens"), Some("512"));
    let want = sigmoid(r["logits"][longest][0].as_f64().unwrap());
    assert!((v[0]["score"].as_f64().unwrap() - want).abs() < 1e-4, "{v}");
}

/// Every query of the reference from its own client, four at once and
/// five times each: the batches mix pairs of different queries (the
/// worker's closing line counts fewer calls than requests) and every
/// score and order is still the reference's.
#[test]
fn the_minilm_reranker_is_the_same_in_concurrent_mixed_batches() {
    let r = reference();
    let groups = queries(&r);
    assert!(groups.len() >= 4, "the reference has four queries or more");
    let dir = TestDir::new("embed_reranker_minilm_mixed");
    assemble(&dir);
    let s: Server = serve_dir(&dir, &["--workers", "1"], &[]);
    std::thread::scope(|scope| {
        for (q, texts, logits) in &groups[..4] {
            let s = &s;
            scope.spawn(move || {
                let mut c = Client::connect(s.addr);
                for round in 0..5 {
                    check(&mut c, q, texts, logits, round % 2 == 1);
                }
            });
        }
    });
    let (line, log) = stop_and_read_batching(s);
    let line = line.unwrap_or_else(|| panic!("no batching line:\n{log}"));
    let (calls, requests) = batch_counts(&line).unwrap();
    assert_eq!(requests, 20, "{line}");
    assert!(calls < requests, "no call held two clients' pairs: {line}");
}
