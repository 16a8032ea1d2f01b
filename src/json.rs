//! A small JSON writer for `--doctor`: keys come out in the order written,
//! on one line, or indented by two spaces a level for a person to read.

use std::fmt::Write;

#[derive(Default)]
pub struct Json {
    out: String,
    /// Per open container: has it had an element yet.
    first: Vec<bool>,
    /// Each element on a line of its own, indented.
    pretty: bool,
}

impl Json {
    /// One line, no spaces.
    pub fn new() -> Json {
        Json::default()
    }

    /// Indented, each element on a line of its own.
    pub fn pretty() -> Json {
        Json {
            pretty: true,
            ..Json::default()
        }
    }

    fn newline(&mut self, depth: usize) {
        self.out.push('\n');
        for _ in 0..depth {
            self.out.push_str("  ");
        }
    }

    fn sep(&mut self) {
        let depth = self.first.len();
        if let Some(first) = self.first.last_mut() {
            if !*first {
                self.out.push(',');
            }
            *first = false;
            if self.pretty {
                self.newline(depth);
            }
        }
    }

    fn key(&mut self, key: &str) {
        self.sep();
        string(&mut self.out, key);
        self.out.push(':');
        if self.pretty {
            self.out.push(' ');
        }
    }

    /// Closes the innermost container with `close`; an empty one stays on
    /// its opening line (`{}`).
    fn close(&mut self, close: char) {
        let empty = self.first.pop().unwrap_or(true);
        if self.pretty && !empty {
            self.newline(self.first.len());
        }
        self.out.push(close);
    }

    pub fn begin_object(&mut self, key: Option<&str>) -> &mut Self {
        match key {
            Some(k) => self.key(k),
            None => self.sep(),
        }
        self.out.push('{');
        self.first.push(true);
        self
    }

    pub fn end_object(&mut self) -> &mut Self {
        self.close('}');
        self
    }

    pub fn begin_array(&mut self, key: &str) -> &mut Self {
        self.key(key);
        self.out.push('[');
        self.first.push(true);
        self
    }

    pub fn end_array(&mut self) -> &mut Self {
        self.close(']');
        self
    }

    pub fn str(&mut self, key: &str, value: &str) -> &mut Self {
        self.key(key);
        string(&mut self.out, value);
        self
    }

    pub fn opt_str(&mut self, key: &str, value: Option<&str>) -> &mut Self {
        match value {
            Some(v) => self.str(key, v),
            None => self.null(key),
        }
    }

    pub fn item_str(&mut self, value: &str) -> &mut Self {
        self.sep();
        string(&mut self.out, value);
        self
    }

    pub fn num(&mut self, key: &str, value: impl std::fmt::Display) -> &mut Self {
        self.key(key);
        let _ = write!(self.out, "{value}");
        self
    }

    pub fn bool(&mut self, key: &str, value: bool) -> &mut Self {
        self.key(key);
        self.out.push_str(if value { "true" } else { "false" });
        self
    }

    pub fn null(&mut self, key: &str) -> &mut Self {
        self.key(key);
        self.out.push_str("null");
        self
    }

    pub fn finish(self) -> String {
        self.out
    }
}

fn string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nested_with_escapes() {
        let mut j = Json::new();
        j.begin_object(None)
            .str("a", "x\"y\n")
            .num("b", 2)
            .begin_array("c")
            .item_str("z")
            .end_array();
        j.begin_object(Some("d"))
            .bool("e", true)
            .null("f")
            .end_object()
            .end_object();
        assert_eq!(
            j.finish(),
            r#"{"a":"x\"y\n","b":2,"c":["z"],"d":{"e":true,"f":null}}"#
        );
    }

    #[test]
    fn pretty_indents_each_element_and_keeps_empty_containers_short() {
        let mut j = Json::pretty();
        j.begin_object(None)
            .num("a", 1)
            .begin_array("b")
            .item_str("x")
            .item_str("y")
            .end_array()
            .begin_object(Some("c"))
            .end_object()
            .begin_array("d")
            .end_array()
            .end_object();
        assert_eq!(
            j.finish(),
            "{\n  \"a\": 1,\n  \"b\": [\n    \"x\",\n    \"y\"\n  ],\n  \"c\": {},\n  \"d\": []\n}"
        );
    }
}
