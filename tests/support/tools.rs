//! The system tools some tests run (nginx, chromium, Prometheus, systemd's
//! socket activator, curl), listed with their Debian packages, the tests
//! that need them and why in tests/system-tools.txt. tests/install-tools
//! installs them (tests/run calls it before the tests); no test installs
//! anything. A test whose tool is missing fails at once, in one line naming
//! every missing tool and the command that installs them all.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use super::repo_root;

/// Looked in after PATH: Debian keeps nginx in /usr/sbin, which a user's
/// PATH may lack (tests/install-tools looks there too).
const SBIN: [&str; 2] = ["/usr/sbin", "/sbin"];

fn executable(path: &Path) -> bool {
    std::fs::metadata(path).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
}

/// Where `tool` is: on PATH, else in /usr/sbin or /sbin.
pub fn find_tool(tool: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(SBIN.iter().map(PathBuf::from))
        .map(|dir| dir.join(tool))
        .find(|p| executable(p))
}

/// tests/system-tools.txt's (tool, Debian package) pairs.
pub fn listed_tools() -> Vec<(String, String)> {
    let list = repo_root().join("tests/system-tools.txt");
    let text =
        std::fs::read_to_string(&list).unwrap_or_else(|e| panic!("read {}: {e}", list.display()));
    text.lines()
        .filter(|l| !l.trim_start().starts_with('#'))
        .filter_map(|l| {
            let mut fields = l.split_whitespace();
            Some((fields.next()?.to_string(), fields.next()?.to_string()))
        })
        .collect()
}

/// The one line a test whose tool is missing fails with: every tool of the
/// list that is missing, and the command that installs them all.
pub fn missing_tools_line(listed: &[(String, String)]) -> Option<String> {
    let missing: Vec<String> = listed
        .iter()
        .filter(|(tool, _)| find_tool(tool).is_none())
        .map(|(tool, package)| format!("{tool} ({package})"))
        .collect();
    if missing.is_empty() {
        return None;
    }
    // SAFETY: geteuid has no preconditions and cannot fail.
    let root = unsafe { libc::geteuid() } == 0;
    let sudo = if root { "" } else { "sudo " };
    Some(format!(
        "missing system tools: {}; install every tool the tests run with `{sudo}tests/install-tools` \
         (tests/system-tools.txt says which test needs each and why; tests/run calls it first)",
        missing.join(", ")
    ))
}

/// The path of `tool`, one of tests/system-tools.txt's; a test that needs
/// one that is missing fails here, at once, with [`missing_tools_line`].
pub fn system_tool(tool: &str) -> PathBuf {
    if let Some(path) = find_tool(tool) {
        return path;
    }
    let listed = listed_tools();
    assert!(
        listed.iter().any(|(t, _)| t == tool),
        "{tool} is not in tests/system-tools.txt: add it there (tool, Debian package, test, why) \
         so that tests/install-tools installs it"
    );
    panic!(
        "{}",
        missing_tools_line(&listed).unwrap_or_else(|| format!("{tool} is missing"))
    );
}
