//! A plugin's init error, split into the problem and the fix.
//!
//! The ABI carries one message (`M0Error`); plugins write it as the
//! project's errors are written, the problem and then the fix after `; `
//! ("embed: M0_EMBED_THREADS=\"x\" is not a count; set it to a count, or
//! unset it"), or after `; fix: `. The server shows the part after the
//! last such separator as the check's fix (`--doctor`'s `fix`), where a
//! generic "change the configuration the plugin names" helped no one.

/// `(problem, fix)`; no fix when the message has no separator, or runs
/// over several lines (a traceback, whose lines are all the problem).
pub fn split(message: &str) -> (&str, Option<&str>) {
    if message.contains('\n') {
        return (message, None);
    }
    let at = message
        .rfind("; fix: ")
        .map(|i| (i, "; fix: ".len()))
        .or_else(|| message.rfind("; ").map(|i| (i, 2)));
    match at {
        Some((i, len)) if !message[i + len..].trim().is_empty() => {
            (message[..i].trim_end(), Some(message[i + len..].trim()))
        }
        _ => (message, None),
    }
}

#[cfg(test)]
mod tests {
    use super::split;

    #[test]
    fn the_fix_is_what_follows_the_last_separator() {
        assert_eq!(
            split("embed: M0_EMBED_THREADS=\"x\" is not a count; set it to a count, or unset it"),
            (
                "embed: M0_EMBED_THREADS=\"x\" is not a count",
                Some("set it to a count, or unset it")
            )
        );
        assert_eq!(
            split("/m/config.json: missing; fix: use the folder as saved"),
            ("/m/config.json: missing", Some("use the folder as saved"))
        );
        assert_eq!(
            split("a; b; do this"),
            ("a; b", Some("do this")),
            "the last separator"
        );
    }

    #[test]
    fn a_message_without_a_fix_stays_whole() {
        assert_eq!(split("no fix here"), ("no fix here", None));
        assert_eq!(split("dangling; "), ("dangling; ", None));
        let traceback = "cannot import module `app`:\nTraceback; (most recent call last)";
        assert_eq!(split(traceback), (traceback, None));
    }
}
