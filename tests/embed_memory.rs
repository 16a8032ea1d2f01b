//! One copy of the weights however many workers: the embed plugin maps its
//! packed weights cache read-only and shared, so after two workers have
//! served the reference sentences (one at a time, then concurrently) the
//! sum of their proportional set sizes (`Pss` of
//! /proc/PID/smaps_rollup) stays within 1.4x of one worker's under the
//! same load (two private copies of MiniLM's 90 MB would be about 1.9x);
//! `--doctor` says how many bytes are mapped, from where, and that they
//! are shared.

use std::path::{Path, PathBuf};

use serde_json::{Value, json};

use crate::support::OutputBounded;
use crate::support::embed::minilm;
use crate::support::embed::{cosine, post, reference, vectors};
use crate::support::test_dir::TestDir;
use crate::support::{Client, Server, command, plugin};

fn serve(workers: &str, cache: &Path) -> Server {
    serve_models(workers, cache, &[minilm().display().to_string()])
}

/// The embed plugin serving one model per ARG of `models`.
fn serve_models(workers: &str, cache: &Path, models: &[String]) -> Server {
    let p = plugin("embed");
    let mut args = vec!["--plugin", p.to_str().unwrap()];
    args.extend(models.iter().map(String::as_str));
    args.extend(["--workers", workers]);
    let mut cmd = command(&args);
    cmd.env("M0_EMBED_CACHE_DIR", cache);
    Server::start_cmd(cmd)
}

/// `Pss` of /proc/PID/smaps_rollup, in kB.
fn pss_kb(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no Pss in smaps_rollup of {pid}:\n{text}"))
}

/// `Rss` of /proc/PID/smaps_rollup, in kB.
fn rss_kb(pid: i32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap();
    text.lines()
        .find_map(|l| l.strip_prefix("Rss:"))
        .and_then(|v| v.trim().strip_suffix("kB"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap()
}

/// Every reference sentence (the empty one aside, which is refused) one
/// request at a time, then all of them from 8 connections at once, each a
/// batch in its own order; every vector checked against the reference.
fn serve_the_reference(s: &Server) {
    let r = reference();
    let ids: Vec<usize> = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty())
        .collect();
    let check = |c: &mut Client, pick: &[usize]| {
        let inputs: Vec<&str> = pick.iter().map(|&i| r.sentences[i].as_str()).collect();
        let (status, v, _) = post(c, "/embed", &json!({"inputs": inputs, "truncate": true}));
        assert_eq!(status, 200, "{v}");
        for (g, &i) in vectors(&v).iter().zip(pick) {
            let cos = cosine(g, &r.embeddings[i]);
            assert!(cos >= 0.9999, "sentence {i}: cosine {cos}");
        }
    };
    let mut c = Client::connect(s.addr);
    for &i in &ids {
        check(&mut c, &[i]);
    }
    std::thread::scope(|scope| {
        for t in 0..8usize {
            let (ids, check) = (&ids, &check);
            scope.spawn(move || {
                for round in 0..3usize {
                    let mut c = Client::connect(s.addr);
                    let mut pick: Vec<usize> = ids.to_vec();
                    pick.rotate_left((t * 5 + round) % ids.len());
                    check(&mut c, &pick);
                }
            });
        }
    });
}

/// The reranker's reference pairs, each query's from its own connection
/// and all at once, every score checked: its weights paged in by every
/// worker that answers.
fn rerank_the_reference(s: &Server) {
    let r = crate::embed_reranker::reference();
    let groups = crate::embed_tasks::queries(&r);
    std::thread::scope(|scope| {
        for (q, texts, logits) in &groups {
            scope.spawn(move || {
                let mut c = Client::connect(s.addr);
                for _ in 0..3 {
                    let body = json!({"query": q, "texts": texts, "truncate": true});
                    let (status, v, _) = post(&mut c, "/models/rr/rerank", &body);
                    assert_eq!(status, 200, "{v}");
                    for x in v.as_array().unwrap() {
                        let i = x["index"].as_u64().unwrap() as usize;
                        let want = crate::embed_tasks::sigmoid(logits[i]);
                        assert!((x["score"].as_f64().unwrap() - want).abs() < 1e-4, "{v}");
                    }
                }
            });
        }
    });
}

/// The workers' (Pss, Rss) in kB after serving the reference.
fn measure(workers: usize, cache: &Path) -> Vec<(u64, u64)> {
    let s = serve(&workers.to_string(), cache);
    measured(&s, workers)
}

/// The workers' (Pss, Rss) in kB of `s` after serving the references.
fn measured(s: &Server, workers: usize) -> Vec<(u64, u64)> {
    serve_the_reference(s);
    let pids = s.worker_pids();
    assert_eq!(pids.len(), workers, "{}", s.log());
    assert!(
        s.wait_for_log("mapped shared from", std::time::Duration::from_secs(5)),
        "{}",
        s.log()
    );
    pids.iter().map(|&p| (pss_kb(p), rss_kb(p))).collect()
}

#[test]
fn two_workers_share_one_copy_of_the_weights() {
    let cache = TestDir::new("embed_memory_cache");
    // Two workers first, into an empty cache folder: one of them writes
    // the cache, so any memory that costs counts against sharing.
    let two = measure(2, &cache);
    let one = measure(1, &cache);
    let sum: u64 = two.iter().map(|w| w.0).sum();
    eprintln!(
        "embed memory: one worker Pss {} kB (Rss {} kB); two workers Pss {} + {} = {sum} kB \
         (Rss {} and {} kB); ratio {:.2}",
        one[0].0,
        one[0].1,
        two[0].0,
        two[1].0,
        two[0].1,
        two[1].1,
        sum as f64 / one[0].0 as f64
    );
    assert!(
        sum * 10 <= one[0].0 * 14,
        "two workers' Pss {two:?} sum to {sum} kB, over 1.4x one worker's {} kB",
        one[0].0
    );
}

/// Two models (MiniLM and the stand-in reranker), each its own cache
/// file: two workers serving both stay within 1.4x of one worker serving
/// both, as with one model.
#[test]
fn two_workers_of_two_models_share_one_copy_of_each() {
    let cache = TestDir::new("embed_memory_two_models");
    let rr = TestDir::new("embed_memory_rr");
    crate::embed_reranker::assemble(&rr);
    let models = [
        format!("mini={}", minilm().display()),
        format!("rr={}", rr.display()),
    ];
    let measure = |workers: usize| {
        let s = serve_models(&workers.to_string(), &cache, &models);
        rerank_the_reference(&s);
        let m = measured(&s, workers);
        assert_eq!(
            s.log_count("mapped shared from"),
            2 * workers,
            "{}",
            s.log()
        );
        m
    };
    let two = measure(2);
    let one = measure(1);
    let sum: u64 = two.iter().map(|w| w.0).sum();
    eprintln!(
        "embed memory, two models: one worker Pss {} kB; two workers {} + {} = {sum} kB; \
         ratio {:.2}",
        one[0].0,
        two[0].0,
        two[1].0,
        sum as f64 / one[0].0 as f64
    );
    assert!(
        sum * 10 <= one[0].0 * 14,
        "two workers' Pss {two:?} sum to {sum} kB, over 1.4x one worker's {} kB",
        one[0].0
    );
}

#[test]
fn the_doctor_reports_the_weights_mapped_shared_and_from_where() {
    let cache = TestDir::new("embed_memory_doctor");
    let p = plugin("embed");
    let dir = minilm();
    let out = command(&[
        "--doctor",
        "--plugin",
        p.to_str().unwrap(),
        dir.to_str().unwrap(),
    ])
    .env("M0_EMBED_CACHE_DIR", cache.path())
    .output_bounded()
    .unwrap();
    let report = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{report}");
    let v: Value =
        serde_json::from_str(report.lines().find(|l| l.starts_with('{')).unwrap()).unwrap();
    let facts = &v["plugin"]["facts"];
    assert_eq!(facts["embed.weights_shared"], "true", "{v}");
    let mapped: u64 = facts["embed.weights_mapped_bytes"]
        .as_str()
        .unwrap()
        .parse()
        .unwrap();
    assert!(mapped > 80_000_000, "{v}");
    assert_eq!(
        facts["embed.weight_bytes"],
        facts["embed.weights_mapped_bytes"]
    );
    let file = PathBuf::from(facts["embed.weights_file"].as_str().unwrap());
    assert_eq!(file.parent(), Some(cache.path()), "{v}");
    assert!(std::fs::metadata(&file).unwrap().len() >= mapped, "{v}");
}

#[test]
fn a_long_batch_leaves_no_buffers_behind() {
    let cache = TestDir::new("embed_memory_cache_long");
    let s = serve("1", &cache);
    serve_the_reference(&s);
    let pid = s.worker_pids()[0];
    let before = pss_kb(pid);
    // 16 inputs cut to the whole 256-token window: passes of 4096 tokens,
    // whose buffers (the feed-forward's alone 4096 x 1536 floats, 25 MB)
    // are many times what the reference needs.
    let long = "memory of a long batch ".repeat(200);
    let inputs: Vec<&str> = (0..16).map(|_| long.as_str()).collect();
    let mut c = Client::connect(s.addr);
    for _ in 0..2 {
        let (status, v, _) = post(
            &mut c,
            "/embed",
            &json!({"inputs": inputs, "truncate": true}),
        );
        assert_eq!(status, 200, "{v}");
    }
    serve_the_reference(&s);
    let after = pss_kb(pid);
    eprintln!("embed memory: one worker Pss {before} kB, after two 4096-token passes {after} kB");
    assert!(
        after * 10 <= before * 11,
        "Pss grew from {before} to {after} kB after a long batch"
    );
}
