//! The access log (`--access-log PATH|-`): one line per response, in JSON
//! lines or Apache's combined format.
//!
//! Lines are formatted into this worker's buffer on the event loop, which
//! sees every completion; no lock and no system call per request. The
//! buffer is written when it holds `FLUSH_BYTES`, when its oldest line is
//! `FLUSH_AFTER` old, and when the worker stops (so a SIGTERM loses
//! nothing). Each write holds whole lines and at most `PIPE_BUF` bytes, so
//! the workers' lines never interleave, on a pipe as in a file opened with
//! `O_APPEND`.
//!
//! Every field is escaped: what a client puts in a target or a header
//! cannot start a line of its own or break the JSON.

use std::fs::File;
use std::io::Write;
use std::time::{Duration, Instant};

use crate::config::AccessLogFormat;
use crate::log::line::{hex_escape, json_str, rfc3339, wall_clock};

const FLUSH_BYTES: usize = 32 * 1024;
pub const FLUSH_AFTER: Duration = Duration::from_millis(100);
/// Writes up to this size are atomic on a pipe (POSIX `PIPE_BUF` on Linux).
const PIPE_BUF: usize = 4096;

/// One response, as the log line describes it.
pub struct Entry<'a> {
    pub client: &'a str,
    pub method: &'a [u8],
    pub target: &'a [u8],
    pub http_minor: u8,
    pub status: u16,
    pub body_bytes: u64,
    pub duration: Duration,
    /// Requests in the plugin call that answered this one; 0 when the
    /// plugin was called for this request alone.
    pub batch: u16,
    /// The request's model (ABI 1.6, `models::NO_MODEL` when it has none):
    /// the JSON line names it.
    pub model: u32,
    pub referer: &'a [u8],
    pub user_agent: &'a [u8],
}

pub struct AccessLog {
    out: File,
    format: AccessLogFormat,
    worker: u32,
    buf: Vec<u8>,
    /// When the oldest unwritten line was added.
    since: Option<Instant>,
    write_failed: bool,
}

impl AccessLog {
    /// Opens `path` for appending (`-`: this process's standard output).
    pub fn open(path: &str, format: AccessLogFormat, worker: u32) -> std::io::Result<AccessLog> {
        let out = if path == "-" {
            // SAFETY: fd 1 stays open for the life of the process; the
            // duplicate is this log's own and closes with it.
            let fd = nix::unistd::dup(unsafe { std::os::fd::BorrowedFd::borrow_raw(1) })?;
            File::from(fd)
        } else {
            open_append(path)?
        };
        Ok(AccessLog {
            out,
            format,
            worker,
            buf: Vec::with_capacity(FLUSH_BYTES + 1024),
            since: None,
            write_failed: false,
        })
    }

    pub fn record(&mut self, e: &Entry<'_>, now: Instant) {
        match self.format {
            AccessLogFormat::Json => json_line(&mut self.buf, e, self.worker),
            AccessLogFormat::Combined => combined_line(&mut self.buf, e),
        }
        self.since.get_or_insert(now);
        if self.buf.len() >= FLUSH_BYTES {
            self.flush();
        }
    }

    /// When the loop must wake to write what it holds.
    pub fn deadline(&self) -> Option<Instant> {
        self.since.map(|t| t + FLUSH_AFTER)
    }

    /// Writes the buffer when its oldest line is due.
    pub fn tick(&mut self, now: Instant) {
        if self.deadline().is_some_and(|d| d <= now) {
            self.flush();
        }
    }

    pub fn flush(&mut self) {
        self.since = None;
        let mut rest = &self.buf[..];
        while !rest.is_empty() {
            let cut = chunk_end(rest);
            if let Err(e) = self.out.write_all(&rest[..cut]) {
                if !self.write_failed {
                    self.write_failed = true;
                    crate::log::warn(format_args!(
                        "the access log cannot be written ({e}); its lines are dropped until it can"
                    ));
                }
                break;
            }
            self.write_failed = false;
            rest = &rest[cut..];
        }
        self.buf.clear();
    }
}

impl Drop for AccessLog {
    fn drop(&mut self) {
        self.flush();
    }
}

/// The end of the next write: whole lines, at most `PIPE_BUF` bytes unless
/// one line alone is longer.
fn chunk_end(buf: &[u8]) -> usize {
    if buf.len() <= PIPE_BUF {
        return buf.len();
    }
    match buf[..PIPE_BUF].iter().rposition(|&b| b == b'\n') {
        Some(i) => i + 1,
        None => buf
            .iter()
            .position(|&b| b == b'\n')
            .map_or(buf.len(), |i| i + 1),
    }
}

/// Opens `path` to append, creating it (mode 0666 less the umask; Rust
/// opens it close-on-exec, so it does not leak into what a plugin runs).
pub fn open_append(path: &str) -> std::io::Result<File> {
    std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(path)
}

fn protocol(http_minor: u8) -> &'static str {
    if http_minor == 0 {
        "HTTP/1.0"
    } else {
        "HTTP/1.1"
    }
}

fn json_line(out: &mut Vec<u8>, e: &Entry<'_>, worker: u32) {
    let (secs, micros) = wall_clock();
    out.extend_from_slice(b"{\"time\":\"");
    rfc3339(out, secs, micros);
    out.extend_from_slice(b"\",\"client\":");
    json_str(out, e.client.as_bytes());
    out.extend_from_slice(b",\"method\":");
    json_str(out, e.method);
    out.extend_from_slice(b",\"target\":");
    json_str(out, e.target);
    let _ = write!(
        out,
        ",\"protocol\":\"{}\",\"status\":{},\"bytes\":{},\"duration_us\":{},\"worker\":{}",
        protocol(e.http_minor),
        e.status,
        e.body_bytes,
        e.duration.as_micros(),
        worker
    );
    if e.batch > 0 {
        let _ = write!(out, ",\"batch\":{}", e.batch);
    }
    if let Some(model) = crate::plugin::models::name(e.model) {
        out.extend_from_slice(b",\"model\":");
        json_str(out, model.as_bytes());
    }
    out.extend_from_slice(b",\"referer\":");
    json_str(out, e.referer);
    out.extend_from_slice(b",\"user_agent\":");
    json_str(out, e.user_agent);
    out.extend_from_slice(b"}\n");
}

/// Apache's combined format, then the duration in microseconds (as
/// `%D` would add it): `client - - [time] "request" status bytes
/// "referer" "agent" duration`.
fn combined_line(out: &mut Vec<u8>, e: &Entry<'_>) {
    let (secs, _) = wall_clock();
    out.extend_from_slice(e.client.as_bytes());
    out.extend_from_slice(b" - - [");
    clf_time(out, secs);
    out.extend_from_slice(b"] \"");
    apache_escape(out, e.method);
    out.push(b' ');
    apache_escape(out, e.target);
    out.push(b' ');
    out.extend_from_slice(protocol(e.http_minor).as_bytes());
    let _ = write!(out, "\" {} ", e.status);
    if e.body_bytes == 0 {
        out.push(b'-');
    } else {
        let _ = write!(out, "{}", e.body_bytes);
    }
    out.extend_from_slice(b" \"");
    dash_or(out, e.referer);
    out.extend_from_slice(b"\" \"");
    dash_or(out, e.user_agent);
    let _ = writeln!(out, "\" {}", e.duration.as_micros());
}

fn dash_or(out: &mut Vec<u8>, field: &[u8]) {
    if field.is_empty() {
        out.push(b'-');
    } else {
        apache_escape(out, field);
    }
}

/// As Apache escapes its log fields: `"` and `\` with a backslash, every
/// byte outside printable ASCII as `\xhh`.
fn apache_escape(out: &mut Vec<u8>, field: &[u8]) {
    for &b in field {
        match b {
            b'"' | b'\\' => out.extend_from_slice(&[b'\\', b]),
            0x20..=0x7e => out.push(b),
            _ => hex_escape(out, b),
        }
    }
}

/// `02/Dec/2026:03:14:15 +0000`
fn clf_time(out: &mut Vec<u8>, secs: u64) {
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, mo, d) = crate::http::date::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    let _ = write!(
        out,
        "{d:02}/{}/{y:04}:{:02}:{:02}:{:02} +0000",
        MONTHS[(mo - 1) as usize],
        rem / 3600,
        rem / 60 % 60,
        rem % 60
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry<'a>(target: &'a [u8], agent: &'a [u8]) -> Entry<'a> {
        Entry {
            client: "127.0.0.1",
            method: b"GET",
            target,
            http_minor: 1,
            status: 200,
            body_bytes: 13,
            duration: Duration::from_micros(1500),
            batch: 0,
            model: crate::plugin::models::NO_MODEL,
            referer: b"",
            user_agent: agent,
        }
    }

    #[test]
    fn a_json_line_escapes_quotes_controls_and_invalid_utf8() {
        let mut out = Vec::new();
        json_line(
            &mut out,
            &entry(b"/a\"b\\c\n{\x01}\xff\xfe/\xc3\xa9", b"x"),
            3,
        );
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.ends_with("}\n"));
        assert!(
            text.contains(r#""target":"/a\"b\\c\n{\u0001}\\xff\\xfe/é""#),
            "{text}"
        );
        assert!(text.contains(r#""status":200,"bytes":13,"duration_us":1500,"worker":3"#));
        assert!(!text.contains("batch"));
        assert!(!text.contains("model"));
    }

    #[test]
    fn a_json_line_names_the_requests_model() {
        let model = crate::plugin::models::register(b"log-model").unwrap();
        let mut out = Vec::new();
        json_line(
            &mut out,
            &Entry {
                model,
                batch: 3,
                ..entry(b"/v1/embeddings", b"x")
            },
            0,
        );
        let text = String::from_utf8(out).unwrap();
        assert!(
            text.contains(r#","batch":3,"model":"log-model","#),
            "{text}"
        );
    }

    #[test]
    fn a_combined_line_escapes_as_apache_does() {
        let mut out = Vec::new();
        combined_line(&mut out, &entry(b"/q?a=\"x\"\n\xff", b"curl/8 \"evil\""));
        let text = String::from_utf8(out).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(text.starts_with("127.0.0.1 - - ["), "{text}");
        assert!(
            text.contains(
                r#"] "GET /q?a=\"x\"\x0a\xff HTTP/1.1" 200 13 "-" "curl/8 \"evil\"" 1500"#
            ),
            "{text}"
        );
    }

    #[test]
    fn writes_hold_whole_lines_of_at_most_pipe_buf() {
        let line = [b'a'; 99]
            .iter()
            .copied()
            .chain([b'\n'])
            .collect::<Vec<u8>>();
        let buf: Vec<u8> = line.iter().copied().cycle().take(100 * 100).collect();
        let cut = chunk_end(&buf);
        assert!(cut <= PIPE_BUF && cut % 100 == 0, "{cut}");
        let long = [b'b'; 5000]
            .iter()
            .copied()
            .chain([b'\n'])
            .collect::<Vec<u8>>();
        assert_eq!(chunk_end(&long), long.len());
    }

    #[test]
    fn times_are_formatted_in_utc() {
        let mut out = Vec::new();
        rfc3339(&mut out, 784_111_777, 42);
        assert_eq!(out, b"1994-11-06T08:49:37.000042Z");
        out.clear();
        clf_time(&mut out, 784_111_777);
        assert_eq!(out, b"06/Nov/1994:08:49:37 +0000");
    }
}
