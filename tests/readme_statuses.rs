//! The README's table of the embedding routes' error statuses, read from
//! README.md and checked row by row against a live embed server: each row's
//! request sent to `POST /embed` (TEI) and `POST /v1/embeddings` (OpenAI),
//! each answer's status the one the table gives. A row this test has no
//! request for, or a request whose row is missing, fails it too.

use serde_json::{Value, json};

use crate::support::venv;
use crate::support::{Client, Server, command, plugin, repo_root};

/// The table's header line in README.md.
const HEADER: &str = "| the request | TEI: `POST /embed` | OpenAI: `POST /v1/embeddings` |";

/// The server's limits, set low so that each request stays small.
const MAX_INPUTS: usize = 4;
const PAYLOAD_LIMIT: usize = 65536;

/// One row of the table: its label, and its two statuses.
#[derive(Debug)]
struct Row {
    label: String,
    tei: u16,
    openai: u16,
}

/// The rows of the table under [`HEADER`].
fn readme_rows() -> Vec<Row> {
    let readme = std::fs::read_to_string(repo_root().join("README.md")).unwrap();
    let mut lines = readme.lines().skip_while(|l| l.trim() != HEADER);
    assert!(
        lines.next().is_some(),
        "README.md has no line {HEADER:?}: the status table this test checks"
    );
    lines
        .skip(1) // |---|---|---|
        .take_while(|l| l.starts_with('|'))
        .map(|l| {
            let cells: Vec<&str> = l.trim_matches('|').split('|').map(str::trim).collect();
            assert_eq!(cells.len(), 3, "README row {l:?}: three cells");
            let status = |c: &str| {
                c.parse::<u16>()
                    .unwrap_or_else(|_| panic!("README row {l:?}: {c:?} is not a status"))
            };
            Row {
                label: cells[0].to_string(),
                tei: status(cells[1]),
                openai: status(cells[2]),
            }
        })
        .collect()
}

/// The request each row describes, by the start of its label: the body for
/// `/embed`, the body for `/v1/embeddings` (raw bytes: not all are JSON).
fn requests() -> Vec<(&'static str, Vec<u8>, Vec<u8>)> {
    let both = |tei: Value, openai: Value| (tei.to_string(), openai.to_string());
    let model = "m";
    let too_many: Vec<&str> = vec!["a"; MAX_INPUTS + 1];
    let long = "word ".repeat(300);
    let huge = "a".repeat(PAYLOAD_LIMIT + 1);
    let cases = [
        (
            "a body that is not JSON",
            (r#"{"inputs": "#.to_string(), r#"{"input": "#.to_string()),
        ),
        (
            "no input",
            both(json!({"inputs": []}), json!({"input": [], "model": model})),
        ),
        (
            "a wrong type",
            both(json!({"inputs": 5}), json!({"input": 5, "model": model})),
        ),
        (
            "more inputs than the route takes",
            both(
                json!({"inputs": too_many}),
                json!({"input": too_many, "model": model}),
            ),
        ),
        (
            "an input over the model's 256 tokens",
            both(
                json!({"inputs": long}),
                json!({"input": long, "model": model}),
            ),
        ),
        (
            "`dimensions` outside 1..384",
            both(
                json!({"inputs": "a", "dimensions": 385}),
                json!({"input": "a", "model": model, "dimensions": 385}),
            ),
        ),
        (
            "token ids",
            both(
                json!({"inputs": [[101, 7592, 102]]}),
                json!({"input": [[101, 7592, 102]], "model": model}),
            ),
        ),
        (
            "a body over the payload limit",
            both(
                json!({"inputs": huge}),
                json!({"input": huge, "model": model}),
            ),
        ),
    ];
    cases
        .into_iter()
        .map(|(label, (tei, openai))| (label, tei.into_bytes(), openai.into_bytes()))
        .collect()
}

fn status(c: &mut Client, path: &str, body: &[u8]) -> (u16, String) {
    let r = c.request("POST", path, &[("Content-Type", "application/json")], body);
    (r.status, String::from_utf8_lossy(&r.body).into_owned())
}

#[test]
fn the_readmes_error_statuses_are_the_servers() {
    let rows = readme_rows();
    let requests = requests();
    for row in &rows {
        let matching = requests
            .iter()
            .filter(|(start, _, _)| row.label.starts_with(start))
            .count();
        assert_eq!(
            matching, 1,
            "README row {:?} has {matching} requests in tests/readme_statuses.rs: give it one",
            row.label
        );
    }
    let minilm = venv::minilm_dir(&venv::embed_venv());
    let p = plugin("embed");
    let mut cmd = command(&["--plugin", p.to_str().unwrap(), minilm.to_str().unwrap()]);
    cmd.env("M0_EMBED_MAX_CLIENT_BATCH_SIZE", MAX_INPUTS.to_string())
        .env("M0_EMBED_MAX_OPENAI_INPUTS", MAX_INPUTS.to_string())
        .env("M0_EMBED_PAYLOAD_LIMIT", PAYLOAD_LIMIT.to_string())
        .env_remove("M0_EMBED_AUTO_TRUNCATE")
        .env_remove("M0_EMBED_ACCEPT_TOKEN_IDS");
    let s = Server::start_cmd(cmd);
    let mut wrong = Vec::new();
    for (start, tei, openai) in &requests {
        let row = rows
            .iter()
            .find(|r| r.label.starts_with(start))
            .unwrap_or_else(|| panic!("README's status table has no row {start:?}..."));
        for (path, body, want) in [
            ("/embed", tei, row.tei),
            ("/v1/embeddings", openai, row.openai),
        ] {
            // A new connection each: the server may close one after an error.
            let mut c = Client::connect(s.addr);
            let (got, answer) = status(&mut c, path, body);
            if got != want {
                let answer: String = answer.chars().take(300).collect();
                wrong.push(format!(
                    "{:?} on {path}: the README says {want}, the server answers {got}: {answer}",
                    row.label
                ));
            }
        }
    }
    assert!(wrong.is_empty(), "{}", wrong.join("\n"));
    // The successful request beside them: the server answers, and all of
    // the above were its refusals.
    let mut c = Client::connect(s.addr);
    let (got, answer) = status(&mut c, "/embed", br#"{"inputs": "a"}"#);
    assert_eq!(got, 200, "{answer}");
}
