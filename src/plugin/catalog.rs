//! The plugins a short name may name: what the search directories hold,
//! for the message of a name that is not there ("did you mean hello_c").

use std::path::{Path, PathBuf};

/// The short name a plugin file answers to (`libm0_wsgi.so` is `wsgi`,
/// `libhello_c.so` is `hello_c`), or None for a file that is no plugin's.
fn short_name(file: &str) -> Option<&str> {
    let stem = file.strip_suffix(".so")?;
    let name = stem
        .strip_prefix("libm0_")
        .or_else(|| stem.strip_prefix("lib"))
        .unwrap_or(stem);
    (!name.is_empty()).then_some(name)
}

/// The short names of the plugin files in `dirs`, sorted, each once, and
/// the directories that held any.
pub fn found(dirs: &[PathBuf]) -> (Vec<String>, Vec<PathBuf>) {
    let mut names = Vec::new();
    let mut holding = Vec::new();
    for dir in dirs {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        let before = names.len();
        for entry in entries.flatten() {
            let is_file = entry
                .file_type()
                .is_ok_and(|t| t.is_file() || t.is_symlink());
            let file = entry.file_name();
            if let (true, Some(name)) = (is_file, file.to_str().and_then(short_name)) {
                names.push(name.to_string());
            }
        }
        if names.len() > before {
            holding.push(dir.clone());
        }
    }
    names.sort();
    names.dedup();
    (names, holding)
}

/// The found name `wanted` was most likely meant to be: a typo away (an
/// edit distance of at most 2, or a third of the name), or the start of it.
pub fn closest<'a>(wanted: &str, names: &'a [String]) -> Option<&'a str> {
    let limit = (wanted.chars().count() / 3).max(2);
    names
        .iter()
        .map(|n| (distance(wanted, n), n))
        .filter(|(d, n)| *d <= limit || (wanted.len() >= 3 && n.starts_with(wanted)))
        .min_by_key(|(d, _)| *d)
        .map(|(_, n)| n.as_str())
}

/// Levenshtein distance, by characters.
fn distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, &cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1)
                .min(row[j] + 1)
                .min(diagonal + usize::from(ca != cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

/// `a, b (in DIR, DIR)` for the message; "none" when nothing was found.
pub fn describe(names: &[String], holding: &[PathBuf]) -> String {
    if names.is_empty() {
        return "none".to_string();
    }
    let dirs: Vec<String> = holding.iter().map(|d| show(d)).collect();
    format!("{} (in {})", names.join(", "), dirs.join(", "))
}

fn show(dir: &Path) -> String {
    // `bin/../lib/m0serve` reads better as the folder it is.
    std::fs::canonicalize(dir)
        .unwrap_or_else(|_| dir.to_path_buf())
        .display()
        .to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn file_names_give_the_short_names_they_answer_to() {
        assert_eq!(short_name("libm0_wsgi.so"), Some("wsgi"));
        assert_eq!(short_name("libhello_c.so"), Some("hello_c"));
        assert_eq!(short_name("custom.so"), Some("custom"));
        assert_eq!(short_name("m0serve"), None);
        assert_eq!(short_name("libhello_c.d"), None);
    }

    #[test]
    fn a_typo_finds_the_plugin_it_misspells() {
        let found = names(&["embed", "hello_c", "hello_rs", "pyembed", "wsgi"]);
        assert_eq!(closest("helo_c", &found), Some("hello_c"));
        assert_eq!(closest("hello-rs", &found), Some("hello_rs"));
        assert_eq!(closest("wsig", &found), Some("wsgi"));
        assert_eq!(closest("pyembd", &found), Some("pyembed"));
        assert_eq!(closest("embedding", &found), None);
        assert_eq!(closest("flask", &found), None);
        assert_eq!(closest("x", &[]), None);
    }

    #[test]
    fn distances() {
        assert_eq!(distance("", "abc"), 3);
        assert_eq!(distance("kitten", "sitting"), 3);
        assert_eq!(distance("same", "same"), 0);
    }
}
