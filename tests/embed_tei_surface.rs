//! TEI 1.9's request surface on the embed plugin, over real sockets: the
//! timing headers on every embedding reply (batched by the core or not),
//! `dimensions` on both routes, the served model name, prompts from the
//! model folder and the default-prompt settings, `truncation_direction`,
//! `/tokenize` and `/decode` against the `tokenizers` package, and
//! `/embed_all` against `/embed`.

use std::process::Command;

use serde_json::{Value, json};

use crate::support::OutputBounded;
use crate::support::embed::{embed_doctor, post, reference, vectors};
use crate::support::embed::{minilm, serve_dir};
use crate::support::test_dir::{TestDir, link_tree};
use crate::support::venv;
use crate::support::{Client, command, plugin};

/// The MiniLM folder with a `config_sentence_transformers.json` holding
/// two prompts, in a folder of this test (the weights linked, the small
/// files copied).
fn with_prompts() -> TestDir {
    let dir = TestDir::new("embed_prompts");
    link_tree(&minilm(), &dir);
    let file = dir.join("config_sentence_transformers.json");
    // A copy, never a link: removed first all the same, so that the write
    // cannot reach the venv's file.
    let _ = std::fs::remove_file(&file);
    std::fs::write(
        file,
        json!({"prompts": {"query": "query: ", "passage": "passage: "}}).to_string(),
    )
    .unwrap();
    dir
}

fn norm(v: &[f64]) -> f64 {
    v.iter().map(|x| x * x).sum::<f64>().sqrt()
}

fn max_diff(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f64::max)
}

fn embed_one(c: &mut Client, body: Value) -> Vec<f64> {
    let (status, v, _) = post(c, "/embed", &body);
    assert_eq!(status, 200, "{body}: {v}");
    vectors(&v).remove(0)
}

const TIMING: [&str; 8] = [
    "x-compute-type",
    "x-compute-time",
    "x-compute-characters",
    "x-compute-tokens",
    "x-total-time",
    "x-tokenization-time",
    "x-queue-time",
    "x-inference-time",
];

#[test]
fn timing_headers_come_with_every_embedding_reply_batched_or_not() {
    let text = "héllo wörld, twice"; // 18 characters, 22 bytes
    for flags in [&["--no-batch"][..], &[][..]] {
        let s = serve_dir(&minilm(), flags, &[]);
        let mut c = Client::connect(s.addr);
        let (_, toks, _) = post(&mut c, "/tokenize", &json!({"inputs": text}));
        let tokens = toks[0].as_array().unwrap().len();
        for (path, body) in [
            ("/embed", json!({"inputs": [text, text]})),
            ("/", json!({"inputs": [text, text]})),
            ("/v1/embeddings", json!({"input": [text, text]})),
            ("/embed_all", json!({"inputs": [text, text]})),
        ] {
            let (status, v, r) = post(&mut c, path, &body);
            assert_eq!(status, 200, "{flags:?} {path}: {v}");
            for h in TIMING {
                let value = r
                    .header(h)
                    .unwrap_or_else(|| panic!("{flags:?} {path}: no {h}"));
                if h != "x-compute-type" {
                    value
                        .parse::<u64>()
                        .unwrap_or_else(|e| panic!("{path} {h}: {value:?}: {e}"));
                }
            }
            assert_eq!(r.header("x-compute-type"), Some("cpu"));
            assert_eq!(r.header("x-compute-characters"), Some("36"), "{path}");
            assert_eq!(
                r.header("x-compute-tokens"),
                Some((2 * tokens).to_string().as_str()),
                "{path}"
            );
            let ms = |h| r.header(h).unwrap().parse::<u64>().unwrap();
            assert_eq!(ms("x-compute-time"), ms("x-total-time"));
            // Whole milliseconds rounded down: the parts fit in the total.
            assert!(
                ms("x-queue-time") + ms("x-tokenization-time") + ms("x-inference-time")
                    <= ms("x-total-time"),
                "{path}: {:?}",
                TIMING.map(|h| r.header(h))
            );
            if path == "/v1/embeddings" {
                assert_eq!(v["usage"]["prompt_tokens"], 2 * tokens);
            }
        }
        // Errors and the other routes carry none.
        let (status, _, r) = post(&mut c, "/embed", &json!({"inputs": []}));
        assert_eq!(status, 400);
        assert!(r.header("x-total-time").is_none());
    }
}

#[test]
fn dimensions_keep_the_first_n_then_normalize_and_the_served_name_answers() {
    let s = serve_dir(&minilm(), &[], &[]);
    let mut c = Client::connect(s.addr);
    let text = "The quick brown fox jumps over the lazy dog.";
    let full = embed_one(&mut c, json!({"inputs": text, "normalize": false}));
    let first: Vec<f64> = full[..128].to_vec();
    let n = norm(&first);
    let want: Vec<f64> = first.iter().map(|x| x / n).collect();
    let got = embed_one(&mut c, json!({"inputs": text, "dimensions": 128}));
    assert_eq!(got.len(), 128);
    assert!((norm(&got) - 1.0).abs() < 1e-5);
    assert!(max_diff(&got, &want) < 1e-5, "{}", max_diff(&got, &want));
    // Not normalized: just the first 128.
    let cut = embed_one(
        &mut c,
        json!({"inputs": text, "dimensions": 128, "normalize": false}),
    );
    assert!(max_diff(&cut, &first) < 1e-6);
    // OpenAI's route: the same vector.
    let (status, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": text, "dimensions": 128, "model": "text-embedding-3-small"}),
    );
    assert_eq!(status, 200, "{v}");
    let oai: Vec<f64> = v["data"][0]["embedding"]
        .as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect();
    assert!(max_diff(&oai, &want) < 1e-5);
    // Any model name is taken; the reply names the served model (the
    // folder's name by default), as /info does.
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    let folder = std::fs::canonicalize(minilm())
        .unwrap()
        .file_name()
        .unwrap()
        .to_string_lossy()
        .into_owned();
    assert_eq!(v["model"], folder.as_str(), "{v}");
    assert_eq!(info["served_model_name"], folder.as_str(), "{info}");
    for (d, status) in [(json!(0), 422), (json!(385), 422), (json!(1.5), 422)] {
        let (got, e, _) = post(&mut c, "/embed", &json!({"inputs": text, "dimensions": d}));
        assert_eq!(got, status, "{d}: {e}");
        assert!(
            e["error"].as_str().unwrap().contains("from 1 to 384"),
            "{e}"
        );
        let (got, e, _) = post(
            &mut c,
            "/v1/embeddings",
            &json!({"input": text, "dimensions": d}),
        );
        assert_eq!(got, 400, "{d}: {e}");
        assert_eq!(e["error"]["param"], "dimensions");
    }
    drop(c);
    drop(s);
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_SERVED_MODEL_NAME", "mini")]);
    let mut c = Client::connect(s.addr);
    let (_, v, _) = post(
        &mut c,
        "/v1/embeddings",
        &json!({"input": "x", "model": "text-embedding-ada-002"}),
    );
    assert_eq!(v["model"], "mini", "{v}");
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["served_model_name"], "mini", "{info}");
}

#[test]
fn prompts_come_from_the_model_folder_and_the_default_prompt_settings() {
    let dir = with_prompts();
    let s = serve_dir(&dir, &[], &[]);
    let mut c = Client::connect(s.addr);
    let text = "what is the capital of France?";
    let prompted = embed_one(&mut c, json!({"inputs": format!("query: {text}")}));
    let named = embed_one(&mut c, json!({"inputs": text, "prompt_name": "query"}));
    let plain = embed_one(&mut c, json!({"inputs": text}));
    assert!(max_diff(&named, &prompted) < 1e-6);
    assert!(max_diff(&plain, &prompted) > 1e-3);
    let (status, v, _) = post(
        &mut c,
        "/embed",
        &json!({"inputs": text, "prompt_name": "document"}),
    );
    assert_eq!(status, 422, "{v}");
    let msg = v["error"].as_str().unwrap();
    assert!(
        msg.contains("\"document\"") && msg.contains("\"passage\"") && msg.contains("\"query\""),
        "{msg}"
    );
    let info: Value = serde_json::from_slice(&c.get("/info").body).unwrap();
    assert_eq!(info["prompts"], json!(["passage", "query"]), "{info}");
    drop(c);
    drop(s);
    // The default prompt, by name or as text, for inputs that name none.
    for env in [
        ("M0_EMBED_DEFAULT_PROMPT_NAME", "query"),
        ("M0_EMBED_DEFAULT_PROMPT", "query: "),
    ] {
        let s = serve_dir(&dir, &[], &[env]);
        let mut c = Client::connect(s.addr);
        let got = embed_one(&mut c, json!({"inputs": text}));
        assert!(max_diff(&got, &prompted) < 1e-6, "{env:?}");
        let (_, v, _) = post(&mut c, "/v1/embeddings", &json!({"input": text}));
        assert!(v["usage"]["prompt_tokens"].as_u64().unwrap() > 0, "{v}");
        let passage = embed_one(&mut c, json!({"inputs": text, "prompt_name": "passage"}));
        assert!(max_diff(&passage, &prompted) > 1e-3, "{env:?}");
    }
    // The doctor states the prompts and the settings.
    let (_, d) = embed_doctor(
        &dir,
        &[
            ("M0_EMBED_DEFAULT_PROMPT_NAME", "query"),
            ("M0_EMBED_SERVED_MODEL_NAME", "mini"),
        ],
    );
    let facts = &d["plugin"]["facts"];
    assert_eq!(facts["embed.prompts"], "passage,query", "{d}");
    assert_eq!(facts["embed.default_prompt_name"], "query", "{d}");
    assert_eq!(facts["embed.served_model_name"], "mini", "{d}");
    assert_eq!(facts["embed.max_client_batch_size"], "32", "{d}");
    assert!(facts["embed.payload_limit"].is_string(), "{d}");
    // Both at once, or a name the model lacks: refused at startup (78).
    for env in [
        &[
            ("M0_EMBED_DEFAULT_PROMPT_NAME", "query"),
            ("M0_EMBED_DEFAULT_PROMPT", "q: "),
        ][..],
        &[("M0_EMBED_DEFAULT_PROMPT_NAME", "nope")][..],
    ] {
        let p = plugin("embed");
        let mut cmd = command(&["--plugin", p.to_str().unwrap(), dir.to_str().unwrap()]);
        for (k, v) in env {
            cmd.env(k, v);
        }
        let out = cmd.output_bounded().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "{env:?}: {err}");
        assert!(err.contains("M0_EMBED_DEFAULT_PROMPT"), "{err}");
    }
}

#[test]
fn truncation_direction_left_keeps_the_end_and_the_special_tokens() {
    let r = reference();
    let long = r
        .tokens
        .iter()
        .position(|&n| n == r.max_len)
        .expect("a sentence cut at the limit");
    let text = &r.sentences[long];
    let s = serve_dir(&minilm(), &[], &[("M0_EMBED_ACCEPT_TOKEN_IDS", "1")]);
    let mut c = Client::connect(s.addr);
    let (_, toks, _) = post(&mut c, "/tokenize", &json!({"inputs": text}));
    let ids: Vec<u64> = toks[0]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["id"].as_u64().unwrap())
        .collect();
    assert!(ids.len() > r.max_len, "{}", ids.len());
    let (cls, sep) = (ids[0], ids[ids.len() - 1]);
    let keep = r.max_len - 2;
    let mut left = vec![cls];
    left.extend_from_slice(&ids[ids.len() - 1 - keep..ids.len() - 1]);
    left.push(sep);
    let mut right = ids[..r.max_len - 1].to_vec();
    right.push(sep);
    let by_ids = |c: &mut Client, ids: &[u64]| embed_one(c, json!({"inputs": [ids]}));
    let want_left = by_ids(&mut c, &left);
    let want_right = by_ids(&mut c, &right);
    let got_left = embed_one(
        &mut c,
        json!({"inputs": text, "truncate": true, "truncation_direction": "Left"}),
    );
    let got_right = embed_one(
        &mut c,
        json!({"inputs": text, "truncate": true, "truncation_direction": "Right"}),
    );
    assert!(max_diff(&got_left, &want_left) < 1e-6);
    assert!(max_diff(&got_right, &want_right) < 1e-6);
    assert!(max_diff(&got_left, &got_right) > 1e-3);
    // Ids cut from the left keep [CLS] and [SEP] as text does.
    let got_ids_left = embed_one(
        &mut c,
        json!({"inputs": [ids], "truncate": true, "truncation_direction": "Left"}),
    );
    assert!(max_diff(&got_ids_left, &want_left) < 1e-6);
    // embed_all: the kept tokens, max_len of them.
    let (status, v, _) = post(
        &mut c,
        "/embed_all",
        &json!({"inputs": text, "truncate": true, "truncation_direction": "Left"}),
    );
    assert_eq!(status, 200);
    assert_eq!(v[0].as_array().unwrap().len(), r.max_len);
}

#[test]
fn tokenize_and_decode_match_the_tokenizers_package() {
    let texts = [
        "Hello, world!",
        "naïve café 🦀 日本語",
        "  spaces   and\ttabs ",
    ];
    let s = serve_dir(&minilm(), &[], &[]);
    let mut c = Client::connect(s.addr);
    let (status, v, r) = post(&mut c, "/tokenize", &json!({"inputs": texts}));
    assert_eq!(status, 200, "{v}");
    assert!(r.header("x-total-time").is_none());
    let venv = venv::embed_venv();
    let script = r#"
import json, sys
from tokenizers import Tokenizer
t = Tokenizer.from_file(sys.argv[1])
t.no_padding()
t.no_truncation()
texts = json.loads(sys.argv[2])
out = []
for s in texts:
    e = t.encode(s)
    # The package's offsets count chars; TEI answers bytes of the UTF-8 input.
    def byte(i):
        return len(s[:i].encode())
    spans = [[byte(a), byte(b)] for a, b in e.offsets]
    out.append({"ids": e.ids, "special": e.special_tokens_mask, "spans": spans,
                "plain": t.encode(s, add_special_tokens=False).ids,
                "decoded": t.decode(e.ids), "decoded_all": t.decode(e.ids, skip_special_tokens=False)})
print(json.dumps(out))
"#;
    let out = Command::new(venv::venv_python(&venv))
        .args(["-c", script])
        .arg(minilm().join("tokenizer.json"))
        .arg(json!(texts).to_string())
        .output_bounded()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want: Value = serde_json::from_slice(&out.stdout).unwrap();
    for (i, text) in texts.iter().enumerate() {
        let tokens = v[i].as_array().unwrap();
        let ids: Vec<u64> = tokens.iter().map(|t| t["id"].as_u64().unwrap()).collect();
        let want_ids: Vec<u64> = want[i]["ids"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_u64().unwrap())
            .collect();
        assert_eq!(ids, want_ids, "{text}");
        let specials = want[i]["special"].as_array().unwrap();
        let spans = want[i]["spans"].as_array().unwrap();
        for ((t, special), span) in tokens.iter().zip(specials).zip(spans) {
            let sp = special.as_u64() == Some(1);
            assert_eq!(t["special"], sp, "{t}");
            if sp {
                assert!(t["start"].is_null() && t["stop"].is_null(), "{t}");
            } else {
                // The package's offsets, in bytes of the input, and the
                // input's text between them: never empty for a WordPiece
                // token of these texts.
                let (a, b) = (span[0].as_u64().unwrap(), span[1].as_u64().unwrap());
                assert!(a < b, "{text}: the package gives {span} for {t}");
                assert_eq!(
                    (t["start"].as_u64(), t["stop"].as_u64()),
                    (Some(a), Some(b)),
                    "{text}: {t}"
                );
                let covered = &text[a as usize..b as usize];
                assert_eq!(t["text"], covered, "{text}: {t}");
            }
        }
        // Without special tokens.
        let (_, plain, _) = post(
            &mut c,
            "/tokenize",
            &json!({"inputs": text, "add_special_tokens": false}),
        );
        let plain: Vec<u64> = plain[0]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["id"].as_u64().unwrap())
            .collect();
        assert_eq!(json!(plain), want[i]["plain"], "{text}");
        // Decoding round-trips as the package decodes.
        let (status, d, _) = post(&mut c, "/decode", &json!({"ids": ids}));
        assert_eq!(status, 200, "{d}");
        assert_eq!(d[0], want[i]["decoded"], "{text}");
        let (_, d, _) = post(
            &mut c,
            "/decode",
            &json!({"ids": [ids], "skip_special_tokens": false}),
        );
        assert_eq!(d[0], want[i]["decoded_all"], "{text}");
    }
    let (status, e, _) = post(&mut c, "/decode", &json!({"ids": [1, 999999]}));
    assert_eq!(status, 422, "{e}");
    assert!(e["error"].as_str().unwrap().contains("999999"), "{e}");
}

#[test]
fn embed_all_mean_pooled_is_embed_without_normalizing() {
    let s = serve_dir(&minilm(), &[], &[]);
    let mut c = Client::connect(s.addr);
    let texts = ["A man is eating food.", "Ein Mann isst."];
    let (status, v, _) = post(&mut c, "/embed_all", &json!({"inputs": texts}));
    assert_eq!(status, 200, "{v}");
    let (_, pooled, _) = post(
        &mut c,
        "/embed",
        &json!({"inputs": texts, "normalize": false}),
    );
    let pooled = vectors(&pooled);
    let (_, toks, _) = post(&mut c, "/tokenize", &json!({"inputs": texts}));
    for (i, rows) in v.as_array().unwrap().iter().enumerate() {
        let rows = vectors(rows);
        assert_eq!(rows.len(), toks[i].as_array().unwrap().len());
        assert!(rows.iter().all(|r| r.len() == 384));
        let mean: Vec<f64> = (0..384)
            .map(|k| rows.iter().map(|r| r[k]).sum::<f64>() / rows.len() as f64)
            .collect();
        assert!(
            max_diff(&mean, &pooled[i]) < 1e-4,
            "{}",
            max_diff(&mean, &pooled[i])
        );
    }
}
