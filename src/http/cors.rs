//! CORS for browser clients (`--cors-allow-origin`): the core answers a
//! preflight itself and adds `Access-Control-Allow-Origin` and
//! `Vary: Origin` to the responses of allowed origins; other origins get no
//! CORS header, so the browser keeps the response from the page.

/// The origins whose pages may call the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Origins {
    /// `*`: any page (no credentials, which API keys sent by script are not).
    any: bool,
    /// Serialized origins as browsers send them: `scheme://host[:port]`,
    /// lowercase.
    list: Vec<String>,
}

/// What a response to an allowed origin says in
/// `Access-Control-Allow-Origin`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Allow {
    Any,
    /// The request's `Origin`, echoed.
    Origin,
}

impl Allow {
    /// The `Access-Control-Allow-Origin` value: `*`, or the request's
    /// `Origin` (`origin`, a span of `buf`).
    pub fn value(self, origin: super::Span, buf: &[u8]) -> &[u8] {
        match self {
            Allow::Any => b"*",
            Allow::Origin => origin.get(buf),
        }
    }
}

/// The most seconds a browser may cache a preflight's answer.
pub const MAX_AGE: &[u8] = b"600";

impl Origins {
    /// One `--cors-allow-origin` value: `*` or `http[s]://host[:port]`.
    pub fn parse_one(s: &str) -> Result<String, String> {
        let s = s.trim();
        if s == "*" {
            return Ok(s.to_string());
        }
        let lower = s.to_ascii_lowercase();
        let rest = lower
            .strip_prefix("http://")
            .or_else(|| lower.strip_prefix("https://"));
        let ok = rest.is_some_and(|r| {
            !r.is_empty()
                && r.bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b"-._~:[]".contains(&b))
        });
        if ok {
            Ok(lower)
        } else {
            Err(format!(
                "expected * or an origin such as https://app.example.com:8443 (scheme, host, optional port; no path), got {s:?}"
            ))
        }
    }

    pub fn from_values(values: &[String]) -> Origins {
        Origins {
            any: values.iter().any(|v| v == "*"),
            list: values.iter().filter(|v| *v != "*").cloned().collect(),
        }
    }

    pub fn is_on(&self) -> bool {
        self.any || !self.list.is_empty()
    }

    /// How to answer a request carrying `Origin: origin`, if allowed.
    pub fn allow(&self, origin: &[u8]) -> Option<Allow> {
        if self
            .list
            .iter()
            .any(|o| o.as_bytes().eq_ignore_ascii_case(origin))
        {
            Some(Allow::Origin)
        } else if self.any {
            Some(Allow::Any)
        } else {
            None
        }
    }

    pub fn describe(&self) -> String {
        let mut all: Vec<&str> = self.list.iter().map(String::as_str).collect();
        if self.any {
            all.insert(0, "*");
        }
        all.join(",")
    }
}

/// A preflight's `Access-Control-Request-Headers`: a list of field names
/// is echoed in `Access-Control-Allow-Headers`; anything else is not.
pub fn is_header_list(value: &[u8]) -> bool {
    value.len() <= 1024
        && value.split(|&b| b == b',').all(|name| {
            let name = name.trim_ascii();
            !name.is_empty() && name.iter().all(|&b| crate::http::response::is_tchar(b))
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn origins_are_parsed_and_matched_as_browsers_send_them() {
        assert_eq!(
            Origins::parse_one("HTTPS://App.Example:8443").unwrap(),
            "https://app.example:8443"
        );
        for bad in [
            "app.example",
            "https://a/b",
            "ftp://x",
            "https://",
            "http://a b",
        ] {
            assert!(Origins::parse_one(bad).is_err(), "{bad}");
        }
        let o = Origins::from_values(&["http://127.0.0.1:9000".into()]);
        assert_eq!(o.allow(b"http://127.0.0.1:9000"), Some(Allow::Origin));
        assert_eq!(o.allow(b"http://127.0.0.1:9001"), None);
        assert_eq!(o.allow(b"null"), None);
        let any = Origins::from_values(&["*".into()]);
        assert_eq!(any.allow(b"https://anyone"), Some(Allow::Any));
        assert!(!Origins::default().is_on());
    }

    #[test]
    fn only_a_list_of_field_names_is_echoed() {
        assert!(is_header_list(b"authorization, content-type"));
        assert!(!is_header_list(b"x\r\ny"));
        assert!(!is_header_list(b""));
        assert!(!is_header_list(b"a,,b"));
    }
}
