//! #52's routes over real sockets: TEI's `/rerank`, `/predict`,
//! `/embed_sparse` and `/similarity`, Cohere's `/v1/rerank` and
//! `/v2/rerank`, and `POST /` per model kind, against the cross-encoder
//! and SPLADE fixtures' reference.json (tests/data/tasks, made by
//! sentence-transformers' CrossEncoder and SparseEncoder in float32;
//! scores from their logits with the sigmoid or softmax computed here),
//! and the 424 every kind answers on the routes of the others.

use std::path::PathBuf;

use serde_json::{Value, json};

use crate::support::OutputBounded;
use crate::support::embed::{
    batch_counts, cosine, minilm, post, reference, serve_dir, stop_and_read_batching, vectors,
};
use crate::support::{Client, Server, repo_root};

fn task(name: &str) -> PathBuf {
    repo_root().join("tests/data/tasks").join(name)
}

fn fixture(name: &str) -> Value {
    let path = task(name).join("reference.json");
    serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap_or_else(|| panic!("not a list: {v}"))
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

pub(crate) fn sigmoid(x: f64) -> f64 {
    1.0 / (1.0 + (-x).exp())
}

fn softmax(logits: &[f64]) -> Vec<f64> {
    let max = logits.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = logits.iter().map(|l| (l - max).exp()).collect();
    let sum: f64 = e.iter().sum();
    e.iter().map(|x| x / sum).collect()
}

/// The reference's pairs grouped by query, in first-seen order: each
/// query, its texts and their logits (one label).
pub(crate) fn queries(r: &Value) -> Vec<(String, Vec<String>, Vec<f64>)> {
    let mut out: Vec<(String, Vec<String>, Vec<f64>)> = Vec::new();
    for (pair, logits) in r["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .zip(r["logits"].as_array().unwrap())
    {
        let (q, t) = (pair[0].as_str().unwrap(), pair[1].as_str().unwrap());
        let l = floats(logits)[0];
        match out.iter_mut().find(|(have, _, _)| have == q) {
            Some((_, texts, ls)) => {
                texts.push(t.to_string());
                ls.push(l);
            }
            None => out.push((q.to_string(), vec![t.to_string()], vec![l])),
        }
    }
    out
}

/// The reference's query of the most texts.
fn longest(r: &Value) -> (String, Vec<String>, Vec<f64>) {
    queries(r)
        .into_iter()
        .max_by_key(|(_, texts, _)| texts.len())
        .unwrap()
}

/// Asserts a TEI 424 naming what the route needs and what the model is.
fn wrong_model(c: &mut Client, path: &str, body: &Value, needs: &str, kind: &str) {
    let (status, v, r) = post(c, path, body);
    assert_eq!(status, 424, "{path}: {v}");
    if path.ends_with("/rerank") && path.starts_with("/v") {
        // Cohere's shape: the message alone.
        assert_eq!(v.as_object().map(|o| o.len()), Some(1), "{path}: {v}");
        assert!(
            v["message"].as_str().unwrap().contains(needs),
            "{path}: {v}"
        );
    } else if path == "/v1/embeddings" {
        // OpenAI's.
        assert_eq!(v["error"]["code"], "wrong_model_type", "{path}: {v}");
        let e = v["error"]["message"].as_str().unwrap();
        assert!(e.contains(needs), "{path}: {e}");
    } else {
        assert_eq!(v["error_type"], "Backend", "{path}: {v}");
        let e = v["error"].as_str().unwrap();
        assert!(
            e.contains(&format!("model is not {needs} model")),
            "{path}: {e}"
        );
        assert!(e.contains(&format!("{kind} model")), "{path}: {e}");
    }
    assert!(r.header("x-total-time").is_none(), "{path}");
}

/// Every (query, texts) of a reranker fixture through `/rerank`: the
/// sigmoid of each logit within 1e-4, highest first; raw scores are the
/// logits; `return_text` echoes the texts.
fn check_rerank(c: &mut Client, r: &Value, path: &str) {
    for (q, texts, logits) in queries(r) {
        let (status, v, resp) = post(
            c,
            path,
            &json!({"query": q, "texts": texts, "return_text": true, "truncate": true}),
        );
        assert_eq!(status, 200, "{path} {q}: {v}");
        assert!(resp.header("x-compute-tokens").is_some());
        let ranks = v.as_array().unwrap();
        assert_eq!(ranks.len(), texts.len());
        let scores: Vec<f64> = ranks.iter().map(|x| x["score"].as_f64().unwrap()).collect();
        assert!(
            scores.windows(2).all(|w| w[0] >= w[1]),
            "{path}: not sorted: {v}"
        );
        for x in ranks {
            let i = x["index"].as_u64().unwrap() as usize;
            let want = sigmoid(logits[i]);
            let got = x["score"].as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-4,
                "{path} {q} text {i}: {got} vs {want}"
            );
            assert_eq!(x["text"], texts[i].as_str());
        }
        let (_, raw, _) = post(
            c,
            path,
            &json!({"query": q, "texts": texts, "raw_scores": true, "truncate": true}),
        );
        for x in raw.as_array().unwrap() {
            let i = x["index"].as_u64().unwrap() as usize;
            assert!(
                (x["score"].as_f64().unwrap() - logits[i]).abs() < 1e-4,
                "{raw}"
            );
            assert!(x.get("text").is_none());
        }
    }
}

#[test]
fn an_embedder_computes_similarity_and_answers_the_other_kinds_routes_424() {
    let r = reference();
    let s = serve_dir(&minilm(), &[], &[]);
    let mut c = Client::connect(s.addr);
    // The source against every other short sentence: the cosines of the
    // reference embeddings.
    let pick: Vec<usize> = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty() && r.tokens[i] < r.max_len)
        .collect();
    let (src, rest) = (pick[0], &pick[1..]);
    let sentences: Vec<&str> = rest.iter().map(|&i| r.sentences[i].as_str()).collect();
    let body = json!({"inputs": {"source_sentence": r.sentences[src], "sentences": sentences}});
    let (status, v, resp) = post(&mut c, "/similarity", &body);
    assert_eq!(status, 200, "{v}");
    let got = floats(&v);
    assert_eq!(got.len(), rest.len());
    for (g, &i) in got.iter().zip(rest) {
        let want = cosine(&r.embeddings[src], &r.embeddings[i]);
        assert!((g - want).abs() < 1e-4, "sentence {i}: {g} vs {want}");
    }
    let tokens: usize = pick.iter().map(|&i| r.tokens[i]).sum();
    assert_eq!(
        resp.header("x-compute-tokens"),
        Some(tokens.to_string().as_str())
    );
    // Mistakes are TEI's: an empty list 400, a wrong shape 422.
    let (status, v, _) = post(
        &mut c,
        "/similarity",
        &json!({"inputs": {"source_sentence": "a", "sentences": []}}),
    );
    assert_eq!((status, &v["error_type"]), (400, &json!("Empty")), "{v}");
    let (status, _, _) = post(&mut c, "/similarity", &json!({"inputs": "a"}));
    assert_eq!(status, 422);
    // The other kinds' routes: 424 before the body is read, whatever it is.
    let pairs = json!({"query": "q", "texts": ["a"], "documents": ["a"], "inputs": "a"});
    for (path, needs) in [
        ("/rerank", "a re-ranker"),
        ("/predict", "a classifier"),
        ("/embed_sparse", "a sparse (SPLADE)"),
        ("/v1/rerank", "a re-ranker"),
        ("/v2/rerank", "a re-ranker"),
    ] {
        wrong_model(&mut c, path, &pairs, needs, "embedding");
    }
    let info = c.get("/info");
    let info: Value = serde_json::from_slice(&info.body).unwrap();
    assert_eq!(info["task"], "embedding");
    assert_eq!(info["model_type"]["embedding"]["pooling"], "mean");
    let doc: Value = serde_json::from_slice(&c.get("/openapi.json").body).unwrap();
    assert!(doc["paths"]["/similarity"].is_object());
    assert!(
        doc["paths"].get("/rerank").is_none(),
        "an embedder lists no /rerank"
    );
    // The worker lived through all of it.
    let (status, v, _) = post(&mut c, "/embed", &json!({"inputs": "still here"}));
    assert_eq!((status, vectors(&v).len()), (200, 1));
}

#[test]
fn rerankers_score_each_pair_as_the_cross_encoder_does() {
    for name in [
        "bert_reranker",
        "xlm_roberta_reranker",
        "modernbert_reranker",
        "mpnet_reranker",
    ] {
        let r = fixture(name);
        let s = serve_dir(&task(name), &[], &[]);
        let mut c = Client::connect(s.addr);
        check_rerank(&mut c, &r, "/rerank");
        // `POST /` is a reranker's /rerank, as in TEI.
        check_rerank(&mut c, &r, "/");
        // /predict takes a reranker too: its one label, through a sigmoid.
        let singles = strings(&r["singles"]);
        let (status, v, _) = post(
            &mut c,
            "/predict",
            &json!({"inputs": singles[0], "truncate": true}),
        );
        assert_eq!(status, 200, "{name}: {v}");
        let want = sigmoid(floats(&r["single_logits"][0])[0]);
        assert_eq!(v[0]["label"], r["labels"][0], "{name}: {v}");
        assert!(
            (v[0]["score"].as_f64().unwrap() - want).abs() < 1e-4,
            "{name}: {v}"
        );
        let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
        assert_eq!(info["task"], "reranker");
        assert_eq!(
            info["model_type"]["reranker"]["id2label"]["0"],
            r["labels"][0]
        );
        wrong_model(
            &mut c,
            "/embed",
            &json!({"inputs": "a"}),
            "an embedding",
            "reranker",
        );
        wrong_model(
            &mut c,
            "/v1/embeddings",
            &json!({"input": "a"}),
            "an embedding",
            "reranker",
        );
        wrong_model(
            &mut c,
            "/similarity",
            &json!({}),
            "an embedding",
            "reranker",
        );
        wrong_model(
            &mut c,
            "/embed_sparse",
            &json!({"inputs": "a"}),
            "a sparse (SPLADE)",
            "reranker",
        );
    }
}

#[test]
fn classifiers_give_every_label_as_the_cross_encoder_does() {
    for name in ["bert_classifier", "distilbert_classifier"] {
        let r = fixture(name);
        let labels = strings(&r["labels"]);
        let s = serve_dir(&task(name), &[], &[]);
        let mut c = Client::connect(s.addr);
        // Each single text alone, as `inputs: str`, on /predict and on /.
        let singles = strings(&r["singles"]);
        for path in ["/predict", "/"] {
            for (i, text) in singles.iter().enumerate() {
                let body = json!({"inputs": text, "truncate": true});
                let (status, v, _) = post(&mut c, path, &body);
                assert_eq!(status, 200, "{name} {path} {text:?}: {v}");
                check_labels(&v, &floats(&r["single_logits"][i]), &labels, false);
            }
        }
        // Every pair in one batch, raw and not.
        let pairs = r["pairs"].clone();
        for raw in [false, true] {
            let (status, v, _) = post(
                &mut c,
                "/predict",
                &json!({"inputs": pairs, "raw_scores": raw, "truncate": true}),
            );
            assert_eq!(status, 200, "{name}: {v}");
            let got = v.as_array().unwrap();
            assert_eq!(got.len(), pairs.as_array().unwrap().len());
            for (g, logits) in got.iter().zip(r["logits"].as_array().unwrap()) {
                check_labels(g, &floats(logits), &labels, raw);
            }
        }
        // A pair alone is `[a, b]`.
        let (_, v, _) = post(
            &mut c,
            "/predict",
            &json!({"inputs": pairs[0], "truncate": true}),
        );
        check_labels(&v, &floats(&r["logits"][0]), &labels, false);
        let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
        assert_eq!(info["task"], "classifier");
        assert_eq!(info["model_type"]["classifier"]["label2id"][&labels[1]], 1);
        wrong_model(
            &mut c,
            "/rerank",
            &json!({"query": "q", "texts": ["a"]}),
            "a re-ranker",
            "classifier",
        );
        wrong_model(
            &mut c,
            "/v2/rerank",
            &json!({}),
            "a re-ranker",
            "classifier",
        );
        wrong_model(
            &mut c,
            "/embed",
            &json!({"inputs": "a"}),
            "an embedding",
            "classifier",
        );
    }
}

/// One input's `[{score, label}]`: every label, highest first, each the
/// softmax of the logits (or the logit itself, `raw`) within 1e-4.
fn check_labels(v: &Value, logits: &[f64], labels: &[String], raw: bool) {
    let want = if raw {
        logits.to_vec()
    } else {
        softmax(logits)
    };
    let got = v.as_array().unwrap_or_else(|| panic!("{v}"));
    assert_eq!(got.len(), labels.len(), "{v}");
    let scores: Vec<f64> = got.iter().map(|p| p["score"].as_f64().unwrap()).collect();
    assert!(scores.windows(2).all(|w| w[0] >= w[1]), "not sorted: {v}");
    for p in got {
        let k = labels
            .iter()
            .position(|l| p["label"] == l.as_str())
            .unwrap();
        let s = p["score"].as_f64().unwrap();
        assert!(
            (s - want[k]).abs() < 1e-4,
            "{}: {s} vs {}",
            labels[k],
            want[k]
        );
    }
}

/// Cohere's routes take Cohere's 1000 documents (LangChain's reranker
/// sends every document retrieved), TEI's `/rerank` TEI's 32; each limit's
/// refusal names its own setting.
#[test]
fn cohere_rerank_takes_more_documents_than_teis_rerank_and_names_its_limit() {
    let r = fixture("bert_reranker");
    let (q, texts, logits) = longest(&r);
    // 40 documents, the fixture's texts over and over: each copy scores as
    // its original.
    let docs: Vec<&String> = texts.iter().cycle().take(40).collect();
    let s = serve_dir(&task("bert_reranker"), &[], &[]);
    let mut c = Client::connect(s.addr);
    let body = json!({"query": q, "documents": docs, "truncate": true});
    let (status, v, _) = post(&mut c, "/v2/rerank", &body);
    assert_eq!(status, 200, "{v}");
    let results = v["results"].as_array().unwrap();
    assert_eq!(results.len(), 40, "{v}");
    for got in results {
        let i = got["index"].as_u64().unwrap() as usize;
        let want = sigmoid(logits[i % texts.len()]);
        assert!(
            (got["relevance_score"].as_f64().unwrap() - want).abs() < 1e-4,
            "{got}"
        );
    }
    let (status, v, _) = post(&mut c, "/rerank", &json!({"query": q, "texts": docs}));
    assert_eq!(status, 413, "TEI's 32: {v}");
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("M0_EMBED_MAX_CLIENT_BATCH_SIZE"),
        "{v}"
    );
    drop(c);
    drop(s);
    let s = serve_dir(
        &task("bert_reranker"),
        &[],
        &[("M0_EMBED_MAX_COHERE_DOCUMENTS", "39")],
    );
    let mut c = Client::connect(s.addr);
    let (status, v, _) = post(&mut c, "/v1/rerank", &body);
    assert_eq!(status, 400, "{v}");
    let message = v["message"].as_str().unwrap();
    assert!(
        message.contains("M0_EMBED_MAX_COHERE_DOCUMENTS") && message.contains("39"),
        "{v}"
    );
}

#[test]
fn cohere_rerank_answers_in_cohere_shape_cut_to_top_n() {
    let r = fixture("bert_reranker");
    let s = serve_dir(&task("bert_reranker"), &[], &[]);
    let mut c = Client::connect(s.addr);
    let (q, texts, logits) = longest(&r);
    assert!(texts.len() >= 2, "the fixture has a query of several texts");
    let mut want: Vec<(usize, f64)> = logits.iter().map(|&l| sigmoid(l)).enumerate().collect();
    want.sort_by(|a, b| b.1.total_cmp(&a.1));
    // v1 takes documents as objects too; v2 as LangChain sends them.
    let objects: Vec<Value> = texts.iter().map(|t| json!({"text": t})).collect();
    for (path, docs, version) in [
        ("/v1/rerank", json!(objects), "1"),
        ("/v2/rerank", json!(texts), "2"),
    ] {
        let body = json!({"model": "rerank-v3.5", "query": q, "documents": docs, "top_n": 1});
        let (status, v, _) = post(&mut c, path, &body);
        assert_eq!(status, 200, "{path}: {v}");
        assert!(v["id"].as_str().is_some_and(|id| id.len() == 36), "{v}");
        assert_eq!(v["meta"]["api_version"]["version"], version);
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 1, "top_n: {v}");
        for (got, &(i, score)) in results.iter().zip(&want) {
            assert_eq!(got["index"], i, "{path}: {v}");
            assert!((got["relevance_score"].as_f64().unwrap() - score).abs() < 1e-4);
            assert!(got.get("document").is_none(), "not asked for: {v}");
        }
        let body = json!({"query": q, "documents": docs, "return_documents": true});
        let (_, v, _) = post(&mut c, path, &body);
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), texts.len());
        let i = results[0]["index"].as_u64().unwrap() as usize;
        assert_eq!(results[0]["document"]["text"], texts[i].as_str());
        // Mistakes: 400 with Cohere's `{"message"}`.
        for bad in [
            json!({"query": q, "documents": []}),
            json!({"query": q, "documents": docs, "top_n": 0}),
            json!({"documents": docs}),
        ] {
            let (status, v, _) = post(&mut c, path, &bad);
            assert_eq!(status, 400, "{path} {bad}: {v}");
            assert_eq!(
                v.as_object().unwrap().keys().collect::<Vec<_>>(),
                ["message"]
            );
        }
    }
}

#[test]
fn embed_sparse_gives_the_sparse_encoders_entries() {
    let r = fixture("splade");
    let s = serve_dir(&task("splade"), &[], &[]);
    let mut c = Client::connect(s.addr);
    let sentences = strings(&r["sentences"]);
    let want = r["vectors"].as_array().unwrap();
    for path in ["/embed_sparse", "/"] {
        for (text, vector) in sentences.iter().zip(want) {
            if text.is_empty() {
                // TEI refuses an empty input on its embedding routes.
                let (status, _, _) = post(&mut c, path, &json!({"inputs": text}));
                assert_eq!(status, 400);
                continue;
            }
            let body = json!({"inputs": [text], "truncate": true});
            let (status, v, _) = post(&mut c, path, &body);
            assert_eq!(status, 200, "{path} {text:?}: {v}");
            let got = v[0].as_array().unwrap();
            let want = vector.as_array().unwrap();
            let indices = |xs: &[Value], k: &str| -> Vec<u64> {
                xs.iter()
                    .map(|e| {
                        if k == "i" {
                            e["index"].as_u64().unwrap()
                        } else {
                            e[0].as_u64().unwrap()
                        }
                    })
                    .collect()
            };
            assert_eq!(indices(got, "i"), indices(want, "w"), "{text:?}");
            for (g, w) in got.iter().zip(want) {
                let (g, w) = (g["value"].as_f64().unwrap(), w[1].as_f64().unwrap());
                assert!((g - w).abs() < 1e-4, "{text:?}: {g} vs {w}");
            }
        }
    }
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["task"], "sparse");
    assert_eq!(info["model_type"]["embedding"]["pooling"], "splade");
    wrong_model(
        &mut c,
        "/embed",
        &json!({"inputs": "a"}),
        "an embedding",
        "sparse",
    );
    wrong_model(&mut c, "/rerank", &json!({}), "a re-ranker", "sparse");
}

/// A rerank of 96 texts from one client and small ones from three
/// others, at once: the core batches the requests and the plugin puts
/// every pair of a batch in the same passes, so the worker's closing line
/// counts fewer calls than requests (a call held several clients'
/// pairs); every score is still the reference's. In fork and spawn mode.
#[test]
fn a_rerank_of_many_texts_shares_its_passes_with_other_clients_pairs() {
    let r = fixture("bert_reranker");
    let (q, texts, logits) = longest(&r);
    let many: Vec<usize> = (0..96).map(|k| k % texts.len()).collect();
    for flags in [&[][..], &["--workers", "1", "--spawn-workers"][..]] {
        let env = [("M0_EMBED_MAX_CLIENT_BATCH_SIZE", "96")];
        let s: Server = serve_dir(&task("bert_reranker"), flags, &env);
        std::thread::scope(|scope| {
            for client in 0..4usize {
                let (q, texts, logits, many, s) = (&q, &texts, &logits, &many, &s);
                scope.spawn(move || {
                    let mut c = Client::connect(s.addr);
                    for _ in 0..5 {
                        let pick: Vec<usize> = match client {
                            0 => many.clone(),
                            k => vec![k % texts.len(), (k + 1) % texts.len()],
                        };
                        let sent: Vec<&str> = pick.iter().map(|&i| texts[i].as_str()).collect();
                        let (status, v, _) = post(
                            &mut c,
                            "/rerank",
                            &json!({"query": q, "texts": sent, "truncate": true}),
                        );
                        assert_eq!(status, 200, "{flags:?}: {v}");
                        for x in v.as_array().unwrap() {
                            let i = pick[x["index"].as_u64().unwrap() as usize];
                            let want = sigmoid(logits[i]);
                            assert!((x["score"].as_f64().unwrap() - want).abs() < 1e-4);
                        }
                    }
                });
            }
        });
        let (line, log) = stop_and_read_batching(s);
        let line = line.unwrap_or_else(|| panic!("{flags:?}: no batching line:\n{log}"));
        let (calls, requests) = batch_counts(&line).unwrap();
        assert_eq!(requests, 20, "{line}");
        assert!(
            calls < requests,
            "{flags:?}: no call held two clients' pairs: {line}"
        );
    }
}

/// tests/embed/task_clients.py in the embedding venv, against `s`: what
/// the client parsed, as JSON.
fn client(s: &Server, args: &[&str]) -> Value {
    let venv = crate::support::venv::embed_venv();
    let out = std::process::Command::new(crate::support::venv::venv_python(&venv))
        .arg(repo_root().join("tests/embed/task_clients.py"))
        .arg(args[0])
        .arg(format!("http://{}", s.addr))
        .args(&args[1..])
        .output_bounded()
        .expect("run tests/embed/task_clients.py");
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        s.log()
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// huggingface_hub's `InferenceClient(base_url=...).sentence_similarity`
/// posts TEI's similarity body to the base URL: an embedder's `POST /`
/// answers it, with the reference's cosines.
#[test]
fn huggingface_hubs_sentence_similarity_works_unchanged() {
    let r = reference();
    let s = serve_dir(&minilm(), &[], &[]);
    let pick: Vec<usize> = (0..r.sentences.len())
        .filter(|&i| !r.sentences[i].is_empty() && r.tokens[i] < r.max_len)
        .take(6)
        .collect();
    let mut args = vec!["similarity"];
    args.extend(pick.iter().map(|&i| r.sentences[i].as_str()));
    let v = client(&s, &args);
    let got = floats(&v["cosines"]);
    assert_eq!(got.len(), pick.len() - 1, "{v}");
    for (g, &i) in got.iter().zip(&pick[1..]) {
        let want = cosine(&r.embeddings[pick[0]], &r.embeddings[i]);
        assert!((g - want).abs() < 1e-4, "sentence {i}: {g} vs {want}");
    }
}

/// The `cohere` package's `Client.rerank` and `ClientV2.rerank` against a
/// reranker (top_n, return_documents, the 400 it raises for no documents)
/// and huggingface_hub's `text_classification` against a classifier, each
/// matching the reference.
#[test]
fn the_cohere_and_huggingface_hub_clients_work_unchanged() {
    let r = fixture("bert_reranker");
    let (q, texts, logits) = longest(&r);
    let s = serve_dir(&task("bert_reranker"), &[], &[]);
    let mut args = vec!["cohere", q.as_str()];
    args.extend(texts.iter().map(String::as_str));
    let v = client(&s, &args);
    let mut want: Vec<(usize, f64)> = logits.iter().map(|&l| sigmoid(l)).enumerate().collect();
    want.sort_by(|a, b| b.1.total_cmp(&a.1));
    for (version, n, docs) in [("v1", 1, true), ("v2", texts.len(), false)] {
        let got = v[version]["results"].as_array().unwrap();
        assert_eq!(got.len(), n, "{version}: {v}");
        assert_eq!(v[version]["version"], &version[1..], "{v}");
        for (g, &(i, score)) in got.iter().zip(&want) {
            assert_eq!(g[0], i, "{version}: {v}");
            assert!(
                (g[1].as_f64().unwrap() - score).abs() < 1e-4,
                "{version}: {v}"
            );
            assert_eq!(g[2].as_str(), docs.then_some(texts[i].as_str()), "{v}");
        }
    }
    assert_eq!(v["empty"]["status"], 400, "{v}");
    assert!(v["empty"]["body"]["message"].is_string(), "{v}");
    drop(s);
    let r = fixture("bert_classifier");
    let labels = strings(&r["labels"]);
    let s = serve_dir(&task("bert_classifier"), &[], &[]);
    let text = strings(&r["singles"])[0].clone();
    let v = client(&s, &["classify", &text]);
    let want = softmax(&floats(&r["single_logits"][0]));
    let got = v["labels"].as_array().unwrap();
    assert_eq!(got.len(), labels.len(), "{v}");
    for g in got {
        let k = labels.iter().position(|l| g[0] == l.as_str()).unwrap();
        assert!((g[1].as_f64().unwrap() - want[k]).abs() < 1e-4, "{v}");
    }
}
