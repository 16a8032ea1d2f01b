//! A small JSON writer for `--doctor`: keys come out in the order written.

use std::fmt::Write;

#[derive(Default)]
pub struct Json {
    out: String,
    /// Per open container: has it had an element yet.
    first: Vec<bool>,
}

impl Json {
    pub fn new() -> Json {
        Json::default()
    }

    fn sep(&mut self) {
        if let Some(first) = self.first.last_mut() {
            if !*first {
                self.out.push(',');
            }
            *first = false;
        }
    }

    fn key(&mut self, key: &str) {
        self.sep();
        string(&mut self.out, key);
        self.out.push(':');
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
        self.out.push('}');
        self.first.pop();
        self
    }

    pub fn begin_array(&mut self, key: &str) -> &mut Self {
        self.key(key);
        self.out.push('[');
        self.first.push(true);
        self
    }

    pub fn end_array(&mut self) -> &mut Self {
        self.out.push(']');
        self.first.pop();
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
}
