//! The pieces of a log line, shared by the server's log and the access log
//! (`worker::access_log`), so both say the time and escape text alike.

use std::io::Write;
use std::time::{SystemTime, UNIX_EPOCH};

/// Now, as Unix seconds and microseconds.
pub fn wall_clock() -> (u64, u32) {
    let now = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (now.as_secs(), now.subsec_micros())
}

/// Unix seconds as UTC (year, month, day, hour, minute, second).
fn civil_utc(secs: u64) -> (i64, u32, u32, u64, u64, u64) {
    let (y, mo, d) = crate::http::date::civil_from_days((secs / 86_400) as i64);
    let rem = secs % 86_400;
    (y, mo, d, rem / 3600, rem / 60 % 60, rem % 60)
}

/// `2026-12-02T03:14:15.123456Z`
pub fn rfc3339(out: &mut Vec<u8>, secs: u64, micros: u32) {
    let (y, mo, d, h, mi, s) = civil_utc(secs);
    let _ = write!(
        out,
        "{y:04}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{micros:06}Z"
    );
}

/// `2026-12-02 03:14:15 +0000`, as gunicorn dates its lines (in UTC).
pub fn text_time(out: &mut Vec<u8>, secs: u64) {
    let (y, mo, d, h, mi, s) = civil_utc(secs);
    let _ = write!(out, "{y:04}-{mo:02}-{d:02} {h:02}:{mi:02}:{s:02} +0000");
}

/// `\xhh`
pub fn hex_escape(out: &mut Vec<u8>, b: u8) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    out.extend_from_slice(&[b'\\', b'x', HEX[(b >> 4) as usize], HEX[(b & 15) as usize]]);
}

/// A JSON string of `field`: valid UTF-8 kept, control characters escaped,
/// each byte of invalid UTF-8 written as the text `\xhh`.
pub fn json_str(out: &mut Vec<u8>, field: &[u8]) {
    out.push(b'"');
    for chunk in field.utf8_chunks() {
        for c in chunk.valid().chars() {
            match c {
                '"' => out.extend_from_slice(b"\\\""),
                '\\' => out.extend_from_slice(b"\\\\"),
                '\n' => out.extend_from_slice(b"\\n"),
                '\r' => out.extend_from_slice(b"\\r"),
                '\t' => out.extend_from_slice(b"\\t"),
                c if (c as u32) < 0x20 || c == '\u{7f}' => {
                    let _ = write!(out, "\\u{:04x}", c as u32);
                }
                c => {
                    let mut utf8 = [0u8; 4];
                    out.extend_from_slice(c.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
        for &b in chunk.invalid() {
            // `\\` in JSON: the decoded text reads `\xhh`.
            out.push(b'\\');
            hex_escape(out, b);
        }
    }
    out.push(b'"');
}

/// One line of the server's log, as `--log-format json` writes it.
pub struct JsonLine<'a> {
    pub secs: u64,
    pub micros: u32,
    pub pid: u32,
    pub level: &'a str,
    /// "supervisor", "worker 1"; empty before either exists.
    pub role: &'a str,
    /// Written by a plugin through the host table.
    pub plugin: bool,
    pub message: &'a str,
}

/// `{"time":…,"pid":…,"level":…,"process":…,"message":…}` and a newline;
/// `"process"` only once the process has a role, `"source":"plugin"` only
/// for a plugin's line.
pub fn json_line(out: &mut Vec<u8>, l: &JsonLine<'_>) {
    out.extend_from_slice(b"{\"time\":\"");
    rfc3339(out, l.secs, l.micros);
    let _ = write!(out, "\",\"pid\":{},\"level\":\"{}\"", l.pid, l.level);
    if !l.role.is_empty() {
        out.extend_from_slice(b",\"process\":");
        json_str(out, l.role.as_bytes());
    }
    if l.plugin {
        out.extend_from_slice(b",\"source\":\"plugin\"");
    }
    out.extend_from_slice(b",\"message\":");
    json_str(out, l.message.as_bytes());
    out.extend_from_slice(b"}\n");
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_time_is_gunicorns_layout_in_utc() {
        let mut out = Vec::new();
        // 2026-12-05 11:30:00 UTC
        text_time(&mut out, 1_796_470_200);
        assert_eq!(String::from_utf8(out).unwrap(), "2026-12-05 11:30:00 +0000");
    }

    #[test]
    fn a_json_line_escapes_its_message() {
        let mut out = Vec::new();
        json_line(
            &mut out,
            &JsonLine {
                secs: 0,
                micros: 5,
                pid: 7,
                level: "info",
                role: "worker 0",
                plugin: true,
                message: "a \"quoted\"\nline",
            },
        );
        assert_eq!(
            String::from_utf8(out).unwrap(),
            "{\"time\":\"1970-01-01T00:00:00.000005Z\",\"pid\":7,\"level\":\"info\",\
             \"process\":\"worker 0\",\"source\":\"plugin\",\"message\":\"a \\\"quoted\\\"\\nline\"}\n"
        );
    }
}
