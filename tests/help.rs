//! `-h` is a short page and `--help` the long one: the short names of every
//! shipped plugin, `--venv` for every Python plugin, every exit code and
//! every `M0_EMBED_*` setting the plugins read.

use std::process::Command;

use crate::support::OutputBounded;
use crate::support::{binary, repo_root};

fn help(flag: &str) -> String {
    let out = Command::new(binary())
        .arg(flag)
        .env("COLUMNS", "100")
        .output_bounded()
        .unwrap();
    assert_eq!(out.status.code(), Some(0), "{flag}");
    String::from_utf8(out.stdout).unwrap()
}

/// The text of `flag`'s entry in a help page: its line and the indented
/// lines under it.
fn entry(page: &str, flag: &str) -> String {
    // An option's own line is indented by at most six spaces (`  -w, `),
    // its description by more.
    let starts = |l: &str| {
        let indent = l.len() - l.trim_start().len();
        indent <= 6 && l.trim_start().starts_with(&format!("{flag} "))
    };
    let mut lines = page.lines().skip_while(|l| !starts(l));
    let first = lines
        .next()
        .unwrap_or_else(|| panic!("no {flag} in:\n{page}"));
    let indent = first.len() - first.trim_start().len();
    let rest = lines.take_while(|l| {
        let i = l.len() - l.trim_start().len();
        !l.trim().is_empty() && i > indent && !l.trim_start().starts_with('-')
    });
    std::iter::once(first)
        .chain(rest)
        .collect::<Vec<&str>>()
        .join(" ")
}

#[test]
fn dash_h_is_short_and_dash_dash_help_long() {
    let short = help("-h");
    let long = help("--help");
    assert!(
        short.lines().count() * 2 < long.lines().count(),
        "-h ({} lines) should be well under half of --help ({} lines)",
        short.lines().count(),
        long.lines().count()
    );
    // Tuning flags are only in the long page; the common ones in both.
    assert!(!short.contains("--idle-spin-us") && long.contains("--idle-spin-us"));
    for flag in [
        "--plugin",
        "-w, --workers",
        "-b, --bind",
        "--doctor",
        "--log-format",
    ] {
        assert!(short.contains(flag) && long.contains(flag), "{flag}");
    }
    assert!(
        short.contains("--help"),
        "-h points to the long page:\n{short}"
    );
}

#[test]
fn both_pages_name_every_plugin_and_venv_serves_every_python_plugin() {
    for page in [help("-h"), help("--help")] {
        let plugin = entry(&page, "--plugin");
        for name in ["hello_c", "hello_rs", "wsgi", "embed", "pyembed"] {
            assert!(plugin.contains(name), "--plugin lacks {name}: {plugin}");
        }
        let venv = entry(&page, "--venv");
        assert!(
            venv.contains("wsgi") && venv.contains("pyembed") && venv.contains("embed "),
            "{venv}"
        );
    }
}

#[test]
fn the_long_help_has_every_exit_code_and_every_embed_setting() {
    let long = help("--help");
    for (code, says) in [
        ("0", "stopped cleanly"),
        ("1", "startup failure"),
        ("2", "usage error"),
        ("3", "--graceful-timeout"),
        ("78", "configuration refused"),
    ] {
        assert!(
            long.lines()
                .any(|l| l.trim_start().starts_with(&format!("{code} ")) && l.contains(says)),
            "exit code {code} ({says}) not in --help:\n{long}"
        );
    }
    // Every M0_EMBED_ variable the plugins' sources name.
    let mut names = std::collections::BTreeSet::new();
    for dir in ["plugins/embed/src", "plugins/pyembed/src"] {
        collect_embed_vars(&repo_root().join(dir), &mut names);
    }
    assert!(names.len() >= 10, "{names:?}");
    for name in &names {
        assert!(long.contains(name.as_str()), "{name} not in --help");
    }
}

fn collect_embed_vars(dir: &std::path::Path, names: &mut std::collections::BTreeSet<String>) {
    for entry in std::fs::read_dir(dir).unwrap().flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect_embed_vars(&path, names);
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap();
            for piece in text.split("\"M0_EMBED_").skip(1) {
                let name: String = piece
                    .chars()
                    .take_while(|c| c.is_ascii_uppercase() || *c == '_')
                    .collect();
                if piece[name.len()..].starts_with('"') && !name.is_empty() {
                    names.insert(format!("M0_EMBED_{name}"));
                }
            }
        }
    }
}
