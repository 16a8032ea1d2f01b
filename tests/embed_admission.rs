//! Overload is an answer, not a hang: the embed plugin counts each
//! request's inputs on the host's event loop (ABI 1.5 `admit`) and
//! refuses, at once, one that would take its worker over
//! `M0_EMBED_MAX_CONCURRENT_INPUTS`, with 429, `Retry-After` and the
//! route's own error shape. A flood of 32-input requests gets only 200s
//! and 429s, the 200s match sentence-transformers, and afterwards the
//! worker admits a request of exactly the limit (nothing leaked) and
//! reports no cost in flight when it drains.

use std::sync::Barrier;
use std::time::Duration;

use serde_json::{Value, json};

use crate::support::embed;
use crate::support::embed::{cosine, embed_doctor, post, reference, vectors};
use crate::support::venv;
use crate::support::{Client, Server, command, plugin};

const LIMIT: usize = 64;

fn serve(limit: usize) -> Server {
    let p = plugin("embed");
    let dir = venv::minilm_dir(&venv::embed_venv());
    let mut cmd = command(&[
        "--plugin",
        p.to_str().unwrap(),
        dir.to_str().unwrap(),
        "--workers",
        "1",
    ]);
    cmd.env("M0_EMBED_MAX_CONCURRENT_INPUTS", limit.to_string());
    Server::start_cmd(cmd)
}

/// The rows of a 200 on either route.
fn rows(path: &str, v: &Value) -> Vec<Vec<f64>> {
    if path.contains("embeddings") {
        embed::openai_vectors(v)
    } else {
        vectors(v)
    }
}

fn body(path: &str, texts: &[&str]) -> Value {
    if path.contains("embeddings") {
        json!({"input": texts, "encoding_format": "float"})
    } else {
        json!({"inputs": texts, "truncate": true})
    }
}

#[test]
fn a_flood_of_batches_gets_200_or_429_at_once_and_the_count_returns_to_zero() {
    let r = reference();
    let ids: Vec<usize> = (0..r.sentences.len())
        // OpenAI's route cannot truncate: inputs within the model's window.
        .filter(|&i| {
            !r.sentences[i].is_empty() && r.tokens[i] < r.max_len && r.sentences[i].len() < 400
        })
        .collect();
    // 32 inputs a request, cycling through the reference sentences.
    let pick: Vec<usize> = (0..32).map(|k| ids[k % ids.len()]).collect();
    let texts: Vec<&str> = pick.iter().map(|&i| r.sentences[i].as_str()).collect();
    let mut s = serve(LIMIT);

    let mut c = Client::connect(s.addr);
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["max_concurrent_inputs"], LIMIT, "{info}");

    const CONNS: usize = 16;
    const ROUNDS: usize = 3;
    let paths = ["/embed", "/", "/v1/embeddings"];
    let start = Barrier::new(CONNS);
    let results: Vec<(&str, u16, Value, Option<String>)> = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..CONNS)
            .map(|t| {
                let (start, texts, paths) = (&start, &texts, &paths);
                scope.spawn(move || {
                    let mut c = Client::connect(s.addr);
                    start.wait();
                    (0..ROUNDS)
                        .map(|round| {
                            let path = paths[(t + round) % paths.len()];
                            let (status, v, resp) = post(&mut c, path, &body(path, texts));
                            let retry = resp.header("Retry-After").map(str::to_string);
                            (path, status, v, retry)
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap())
            .collect()
    });
    let (mut ok, mut refused) = (0, 0);
    for (path, status, v, retry) in &results {
        match status {
            200 => {
                ok += 1;
                let got = rows(path, v);
                assert_eq!(got.len(), pick.len(), "{path}");
                for (g, &i) in got.iter().zip(&pick) {
                    let cos = cosine(g, &r.embeddings[i]);
                    assert!(cos >= 0.9999, "{path}: sentence {i}: cosine {cos}");
                }
            }
            429 => {
                refused += 1;
                assert_eq!(retry.as_deref(), Some("1"), "{path}: {v}");
                if path.contains("embeddings") {
                    assert_eq!(v["error"]["type"], "rate_limit_error", "{v}");
                    assert_eq!(v["error"]["code"], "overloaded", "{v}");
                    assert!(v["error"]["message"].is_string(), "{v}");
                } else {
                    assert_eq!(v["error_type"], "Overloaded", "{v}");
                    let msg = v["error"].as_str().unwrap_or_default();
                    assert!(msg.contains("M0_EMBED_MAX_CONCURRENT_INPUTS"), "{v}");
                }
            }
            other => panic!("{path}: {other} (only 200 and 429 may answer a flood): {v}"),
        }
    }
    eprintln!("flood: {ok} x 200, {refused} x 429 of {}", results.len());
    assert!(ok >= 1 && refused >= 1, "{ok} x 200, {refused} x 429");

    // Refused bodies and failures give back what they were admitted at.
    let mut c = Client::connect(s.addr);
    let (status, _, _) = post(&mut c, "/embed", &json!({"inputs": vec!["x"; 33]}));
    assert_eq!(status, 413);
    let r400 = c.request(
        "POST",
        "/embed",
        &[("Content-Type", "application/json")],
        b"{",
    );
    assert_eq!(r400.status, 400);
    // Clients that leave before their answer give theirs back too.
    for _ in 0..3 {
        let mut gone = Client::connect(s.addr);
        gone.send(
            format!(
                "POST /embed HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{}",
                body("/embed", &texts).to_string().len(),
                body("/embed", &texts)
            )
            .as_bytes(),
        );
    }
    // Exactly the limit, with nothing in flight: admitted, unless a count
    // leaked (any left over would make it a 429). Those that left may
    // still be computing: wait for them with quiet 1-input requests.
    let full: Vec<&str> = (0..LIMIT).map(|k| texts[k % texts.len()]).collect();
    let mut answered = None;
    for _ in 0..100 {
        // TEI's routes take 32 inputs a request; OpenAI's 2048.
        let path = "/v1/embeddings";
        let (status, v, _) = post(&mut c, path, &body(path, &full));
        if status == 200 {
            answered = Some(v);
            break;
        }
        assert_eq!(status, 429, "{v}");
        std::thread::sleep(Duration::from_millis(100));
    }
    let v = answered.expect("a request of exactly the limit was never admitted: a count leaked");
    assert_eq!(rows("/v1/embeddings", &v).len(), LIMIT);

    s.signal(libc::SIGTERM);
    assert!(s.wait_exit(Duration::from_secs(30)).is_some());
    let log = s.log();
    let line = log
        .lines()
        .find(|l| l.contains("admission: "))
        .unwrap_or_else(|| panic!("no admission line:\n{log}"));
    assert!(line.ends_with("at the end 0"), "{line}");
}

#[test]
fn the_doctor_reports_the_limit_and_that_the_plugin_admits() {
    let dir = venv::minilm_dir(&venv::embed_venv());
    let (_, v) = embed_doctor(&dir, &[("M0_EMBED_MAX_CONCURRENT_INPUTS", "77")]);
    let text = v.to_string();
    assert_eq!(v["plugin"]["declares_admit"], true, "{text}");
    assert_eq!(
        v["plugin"]["facts"]["embed.max_concurrent_inputs"], "77",
        "{text}"
    );
}
