//! Differential fuzzing of the request parser and the chunked decoder
//! against h11 (a strict HTTP/1.1 parser, PyPI, pinned in
//! tests/requirements-fuzz.txt): requests made from a grammar of real and
//! hostile parts, and mutations of them, with a fixed seed. Properties:
//! the parser never panics; a request it accepts, h11 accepts too, with the
//! same method, target, version and body framing, and the same body bytes
//! once decoded. What h11 accepts and we refuse is counted, not failed (we
//! may be stricter). `bench/run fuzz` runs the same harness for longer.
//!
//! `M0_FUZZ_CASES` and `M0_FUZZ_SEED` change the run (the bench sets them).

use std::io::Write;
use std::process::{Command, Stdio};

use m0serve::http::chunked::ChunkedDecoder;
use m0serve::http::head::{self, BodyFraming, Limits, RequestHead};

use crate::support::venv;

/// xorshift64*: enough to spread the choices, the same on every machine.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, from: &[T]) -> T {
        from[self.below(from.len())]
    }
    /// One of the first `common` items mostly, any of them sometimes.
    fn pick_mostly<T: Copy>(&mut self, from: &[T], common: usize, percent: u64) -> T {
        let n = if self.chance(percent) {
            common
        } else {
            from.len()
        };
        self.pick(&from[..n])
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.next() % 100 < percent
    }
}

const METHODS: &[&str] = &[
    "GET", "POST", "HEAD", "PUT", "OPTIONS", "DELETE", "PATCH", "CONNECT", "M-SEARCH", "get",
    "G\"T", "", "GET/",
];
const TARGETS: &[&str] = &[
    "/",
    "/a/b?c=d&e",
    "/%41%zz",
    "*",
    "http://h.example/p?q",
    "https://h:8443",
    "h:443",
    "/a b",
    "/\"{}|\\^`",
    "//x",
    "/?",
    "",
    "/caf\u{e9}",
    "/a#frag",
    "/\x7f",
];
const VERSIONS: &[&str] = &[
    "HTTP/1.1",
    "HTTP/1.0",
    "HTTP/2.0",
    "http/1.1",
    "HTTP/1.10",
    "HTTP/1",
    "HTTP/1.1 ",
    "HTTP/0.9",
];
const EOLS: &[&str] = &["\r\n", "\r\n", "\r\n", "\n", "\r", "\r\r\n"];
const NAMES: &[&str] = &[
    "Host",
    "Host",
    "Content-Length",
    "Transfer-Encoding",
    "Connection",
    "Expect",
    "X-A",
    "x-b",
    "Content-Type",
    "X A",
    "X:A",
    "",
    "X-\u{e9}",
    "Host ",
    " Host",
    "X\tA",
    "Content-Length ",
];
const VALUES: &[&str] = &[
    "h",
    "h.example:80",
    "0",
    "5",
    "13",
    "-1",
    "+5",
    "5, 5",
    "5,6",
    " 7 ",
    "99999999999999999999",
    "chunked",
    "Chunked",
    "gzip, chunked",
    "chunked, gzip",
    "identity, chunked",
    "chunked, chunked",
    "close",
    "keep-alive",
    "100-continue",
    "",
    "a\u{e9}b",
    "a\tb",
    "a\x00b",
    "a\rb",
    "x y",
    "[::1]:8080",
    "a b",
];

/// A chunked body: well formed or not.
fn chunked_body(rng: &mut Rng) -> String {
    let mut body = String::new();
    for _ in 0..rng.below(4) {
        let n = rng.below(12);
        let size = match rng.below(10) {
            0 => format!("{n:X}"),
            1 => format!("{n:x};ext=1"),
            2 => format!("0{n:x}"),
            3 => format!(" {n:x}"),
            4 => "zz".to_string(),
            5 => format!("{n:x} "),
            _ => format!("{n:x}"),
        };
        body.push_str(&size);
        body.push_str(rng.pick(EOLS));
        body.push_str(&"x".repeat(if rng.chance(90) { n } else { n + 1 }));
        body.push_str(rng.pick(EOLS));
    }
    if rng.chance(90) {
        body.push('0');
        if rng.chance(20) {
            body.push_str(";last");
        }
        body.push_str("\r\n");
        if rng.chance(20) {
            body.push_str("Trailer-A: 1\r\n");
        }
        if rng.chance(90) {
            body.push_str("\r\n");
        }
    }
    body
}

/// A request from the grammar; mostly valid, each part sometimes not.
fn structured(rng: &mut Rng) -> Vec<u8> {
    let sep = |rng: &mut Rng| {
        if rng.chance(95) {
            " "
        } else {
            rng.pick(&["  ", "\t", ""])
        }
    };
    let mut out = String::new();
    if rng.chance(3) {
        out.push_str("\r\n");
    }
    out.push_str(rng.pick_mostly(METHODS, 2, 80));
    out.push_str(sep(rng));
    out.push_str(rng.pick_mostly(TARGETS, 2, 80));
    out.push_str(sep(rng));
    out.push_str(rng.pick_mostly(VERSIONS, 2, 85));
    let eol = if rng.chance(90) {
        "\r\n"
    } else {
        rng.pick(EOLS)
    };
    out.push_str(eol);
    let mut framing = 0;
    if rng.chance(90) {
        out.push_str("Host: h");
        out.push_str(eol);
    }
    for _ in 0..rng.below(5) {
        let (name, value) = if rng.chance(85) {
            rng.pick(COMMON)
        } else {
            (rng.pick(NAMES), rng.pick(VALUES))
        };
        if name.starts_with("Transfer") && value.ends_with("chunked") {
            framing = 2;
        }
        out.push_str(name);
        out.push_str(if rng.chance(95) {
            ": "
        } else {
            rng.pick(&[":", " : ", ":\t"])
        });
        out.push_str(value);
        if rng.chance(5) {
            out.push_str(eol);
            out.push_str(" folded");
        }
        out.push_str(eol);
    }
    out.push_str(eol);
    if framing == 2 || rng.chance(10) {
        out.push_str(&chunked_body(rng));
    } else if rng.chance(40) {
        out.push_str(&"b".repeat(rng.below(16)));
    }
    out.into_bytes()
}

/// Fields a real client sends, for most of the headers.
const COMMON: &[(&str, &str)] = &[
    ("X-A", "1"),
    ("x-b", "a b"),
    ("Content-Type", "text/plain; charset=utf-8"),
    ("Connection", "close"),
    ("Connection", "keep-alive"),
    ("Content-Length", "5"),
    ("Content-Length", "0"),
    ("Transfer-Encoding", "chunked"),
    ("Accept", "*/*"),
    ("User-Agent", "curl/8.0"),
];

const BYTES: &[u8] = b" \t\r\n:,;0aZ\x00\x7f\x80\xff/?%\"";

/// A structured request with a few bytes flipped, inserted or removed.
fn mutated(rng: &mut Rng) -> Vec<u8> {
    let mut v = structured(rng);
    for _ in 0..1 + rng.below(3) {
        if v.is_empty() {
            break;
        }
        let at = rng.below(v.len());
        match rng.below(5) {
            0 => v[at] = rng.pick(BYTES),
            4 => v.truncate(at),
            1 => v.insert(at, rng.pick(BYTES)),
            2 => {
                v.remove(at);
            }
            _ => {
                let end = (at + 1 + rng.below(8)).min(v.len());
                let piece = v[at..end].to_vec();
                v.splice(at..at, piece);
            }
        }
    }
    v
}

/// How we frame a request: the same shape as the reference's verdicts.
#[derive(Debug, PartialEq)]
enum Ours {
    Need,
    Error(u16),
    Ok {
        method: String,
        target: String,
        version: String,
        framing: &'static str,
        /// The decoded body when all of it is there; Err when refused.
        body: Option<Result<Vec<u8>, u16>>,
    },
}

fn ours(buf: &[u8]) -> Ours {
    let limits = Limits::default();
    let mut h = RequestHead::default();
    match head::parse(buf, &limits, &mut h) {
        Err(e) => return Ours::Error(e.status),
        Ok(false) => return Ours::Need,
        Ok(true) => {}
    }
    let rest = &buf[h.head_len..];
    let (framing, body) = match h.body.0 {
        BodyFraming::None => ("none", Some(Ok(Vec::new()))),
        BodyFraming::Length(n) => (
            "length",
            (rest.len() as u64 >= n).then(|| Ok(rest[..n as usize].to_vec())),
        ),
        BodyFraming::Chunked => {
            let mut d = ChunkedDecoder::new(limits.max_body);
            let mut out = Vec::new();
            let body = match d.decode(rest, &mut out) {
                Err(e) => Some(Err(e.status)),
                Ok(_) if d.is_done() => Some(Ok(out)),
                Ok(_) => None,
            };
            ("chunked", body)
        }
    };
    Ours::Ok {
        method: String::from_utf8_lossy(h.method.get(buf)).into_owned(),
        target: String::from_utf8_lossy(h.target.get(buf)).into_owned(),
        version: format!("1.{}", h.http_minor),
        framing,
        body,
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len() / 2)
        .map(|i| u8::from_str_radix(&s[2 * i..2 * i + 2], 16).unwrap())
        .collect()
}

/// The reference's verdict on each case, in order.
fn h11_verdicts(cases: &[Vec<u8>]) -> Vec<serde_json::Value> {
    let venv = venv::make_venv("fuzz-venv", "tests/requirements-fuzz.txt", &[]);
    let mut child = Command::new(venv::venv_python(&venv))
        .arg(venv::repo().join("tests/fuzz/h11_frame.py"))
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run tests/fuzz/h11_frame.py");
    let mut input = String::new();
    for c in cases {
        // RFC 9112 section 2.2: a server should ignore empty lines before
        // the request line, and ours does; h11 refuses them. Both get the
        // request that follows.
        let start = c
            .iter()
            .position(|&b| b != b'\r' && b != b'\n')
            .unwrap_or(c.len());
        let lone_cr = c[..start]
            .windows(2)
            .any(|w| w[0] == b'\r' && w[1] != b'\n')
            || c[..start].ends_with(b"\r");
        let c = if lone_cr { &c[..] } else { &c[start..] };
        input.push_str(&format!("{{\"head\": \"{}\", \"body\": \"\"}}\n", hex(c)));
    }
    let mut stdin = child.stdin.take().unwrap();
    let writer = std::thread::spawn(move || stdin.write_all(input.as_bytes()));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "h11_frame.py failed");
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

/// What a run found.
#[derive(Default, Debug)]
pub struct Tally {
    cases: usize,
    /// Both frame the request the same way.
    agreed: usize,
    /// Both refuse it.
    both_refuse: usize,
    /// We refuse (or wait) where h11 frames a request: allowed.
    stricter: usize,
    /// Both wait for more bytes.
    both_need: usize,
    findings: Vec<String>,
}

fn compare(case: &[u8], ours: &Ours, theirs: &serde_json::Value, t: &mut Tally) {
    t.cases += 1;
    let show = || String::from_utf8_lossy(case).escape_debug().to_string();
    let verdict = theirs["v"].as_str().unwrap_or("");
    match (ours, verdict) {
        (Ours::Need, "need") => t.both_need += 1,
        (Ours::Error(_), "error") => t.both_refuse += 1,
        (Ours::Need | Ours::Error(_), "ok") => t.stricter += 1,
        (Ours::Error(_), "need") | (Ours::Need, "error") => t.stricter += 1,
        (Ours::Ok { .. }, "error") => t
            .findings
            .push(format!("we accept, h11 refuses: {}", show())),
        (Ours::Ok { .. }, "need") => t
            .findings
            .push(format!("we frame, h11 waits for more: {}", show())),
        (
            Ours::Ok {
                method,
                target,
                version,
                framing,
                body,
            },
            "ok",
        ) => {
            let same_head = theirs["method"] == method.as_str()
                && theirs["target"] == target.as_str()
                && theirs["version"] == version.as_str()
                && theirs["framing"] == *framing;
            if !same_head {
                t.findings.push(format!(
                    "framed differently: ours {method} {target} {version} {framing}, h11 {theirs}: {}",
                    show()
                ));
                return;
            }
            let h11_body = theirs["body"].as_str().map(unhex);
            let h11_refused = theirs["body_error"] == true;
            match (body, h11_body, h11_refused) {
                (Some(Ok(b)), Some(hb), _) if *b != hb => t.findings.push(format!(
                    "bodies differ: ours {:?}, h11 {:?}: {}",
                    String::from_utf8_lossy(b),
                    String::from_utf8_lossy(&hb),
                    show()
                )),
                (Some(Ok(_)), None, true) => t
                    .findings
                    .push(format!("we decode a body h11 refuses: {}", show())),
                _ => t.agreed += 1,
            }
        }
        (o, v) => t
            .findings
            .push(format!("unexpected pair {o:?} / {v}: {}", show())),
    }
}

pub fn run(seed: u64, n: usize) -> Tally {
    let mut rng = Rng(seed | 1);
    let cases: Vec<Vec<u8>> = (0..n)
        .map(|i| {
            if i % 2 == 0 {
                structured(&mut rng)
            } else {
                mutated(&mut rng)
            }
        })
        .collect();
    // Never panics: a panic here fails the test with the case in hand.
    let ours: Vec<Ours> = cases.iter().map(|c| ours(c)).collect();
    let theirs = h11_verdicts(&cases);
    assert_eq!(theirs.len(), cases.len());
    let mut t = Tally::default();
    for ((c, o), v) in cases.iter().zip(&ours).zip(&theirs) {
        compare(c, o, v, &mut t);
    }
    t
}

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn the_parser_frames_every_request_it_accepts_as_h11_does() {
    let seed = env_or("M0_FUZZ_SEED", 0x6d30_5eed);
    let n = env_or("M0_FUZZ_CASES", 4000) as usize;
    let t = run(seed, n);
    // The summary line `bench/run fuzz` reads.
    eprintln!(
        "fuzz: seed {seed:#x}: {} cases, {} framed alike, {} refused by both, {} refused by us only, {} incomplete for both, {} finding(s)",
        t.cases,
        t.agreed,
        t.both_refuse,
        t.stricter,
        t.both_need,
        t.findings.len()
    );
    // The grammar must reach accepted requests and refusals alike, or the
    // comparison proves little.
    assert!(
        t.agreed > n / 8 && t.both_refuse > n / 20,
        "{} framed alike, {} refused by both",
        t.agreed,
        t.both_refuse
    );
    assert!(
        t.findings.is_empty(),
        "{} finding(s), first ones:\n{}",
        t.findings.len(),
        t.findings
            .iter()
            .take(15)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n")
    );
}
