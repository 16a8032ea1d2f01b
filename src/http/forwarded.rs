//! Proxy headers (`--forwarded-allow-ips`): the client's address and
//! scheme as a trusted reverse proxy reports them, in `X-Forwarded-For` /
//! `X-Forwarded-Proto` or RFC 7239's `Forwarded`, with gunicorn's and
//! uvicorn's meaning: honoured only when the connection comes from an
//! address the operator trusts, ignored from anyone else (so a client
//! cannot claim another address by sending the header itself).
//!
//! The client is the rightmost address in the chain that is not itself a
//! trusted proxy (each proxy appends the address it saw), so a client that
//! sends its own `X-Forwarded-For` through nginx gains nothing.

use std::net::IpAddr;

/// The proxies whose headers are believed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trusted {
    /// `*`: every peer (only where nothing but the proxy can connect).
    All,
    List(Vec<IpAddr>),
}

impl Trusted {
    /// `127.0.0.1,::1`, `*`, or an empty string for none.
    pub fn parse(s: &str) -> Result<Trusted, String> {
        if s.trim() == "*" {
            return Ok(Trusted::All);
        }
        s.split(',')
            .map(str::trim)
            .filter(|p| !p.is_empty())
            .map(|p| {
                p.parse::<IpAddr>().map_err(|_| {
                    format!("expected IP addresses separated by commas, or *; got {p:?}")
                })
            })
            .collect::<Result<Vec<_>, _>>()
            .map(Trusted::List)
    }

    pub fn trusts(&self, ip: IpAddr) -> bool {
        let ip = ip.to_canonical();
        match self {
            Trusted::All => true,
            Trusted::List(list) => list.iter().any(|t| t.to_canonical() == ip),
        }
    }

    pub fn is_empty(&self) -> bool {
        matches!(self, Trusted::List(l) if l.is_empty())
    }

    /// As the flag takes it: `*`, or the addresses joined by commas.
    pub fn describe(&self) -> String {
        match self {
            Trusted::All => "*".into(),
            Trusted::List(l) => l
                .iter()
                .map(IpAddr::to_string)
                .collect::<Vec<_>>()
                .join(","),
        }
    }
}

/// What a trusted proxy said of the request.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Forwarded {
    /// The client's address, when the proxy named one.
    pub client: Option<IpAddr>,
    /// The scheme the client used: `Some(true)` for https.
    pub https: Option<bool>,
}

/// Reads the proxy headers of a request from `peer`: `None` unless `peer`
/// is trusted and sent one. `headers` are (name, value) pairs as received.
pub fn resolve<'h>(
    trusted: &Trusted,
    peer: IpAddr,
    headers: impl Iterator<Item = (&'h [u8], &'h [u8])>,
) -> Option<Forwarded> {
    if !trusted.trusts(peer) {
        return None;
    }
    // Every hop's addresses, oldest first, and the last scheme given.
    let mut chain: Vec<IpAddr> = Vec::new();
    let mut https = None;
    let mut forwarded_chain: Vec<IpAddr> = Vec::new();
    let mut forwarded_https = None;
    let mut rfc7239 = false;
    for (name, value) in headers {
        let Ok(value) = std::str::from_utf8(value) else {
            continue;
        };
        if name.eq_ignore_ascii_case(b"forwarded") {
            rfc7239 = true;
            for element in value.split(',') {
                for pair in element.split(';') {
                    let Some((k, v)) = pair.split_once('=') else {
                        continue;
                    };
                    let v = v.trim().trim_matches('"');
                    match k.trim().to_ascii_lowercase().as_str() {
                        "for" => forwarded_chain.extend(node_ip(v)),
                        "proto" => forwarded_https = scheme(v).or(forwarded_https),
                        _ => {}
                    }
                }
            }
        } else if name.eq_ignore_ascii_case(b"x-forwarded-for") {
            chain.extend(value.split(',').filter_map(|a| node_ip(a.trim())));
        } else if name.eq_ignore_ascii_case(b"x-forwarded-proto") {
            https = value
                .rsplit(',')
                .next()
                .and_then(|p| scheme(p.trim()))
                .or(https);
        }
    }
    // The standard header, when present, is the one believed.
    if rfc7239 {
        chain = forwarded_chain;
        https = forwarded_https;
    }
    if chain.is_empty() && https.is_none() {
        return None;
    }
    let client = chain
        .iter()
        .rev()
        .find(|ip| !trusted.trusts(**ip))
        .or(chain.first())
        .copied();
    Some(Forwarded { client, https })
}

fn scheme(v: &str) -> Option<bool> {
    match v.to_ascii_lowercase().as_str() {
        "https" => Some(true),
        "http" => Some(false),
        _ => None,
    }
}

/// An address as a proxy writes it: `203.0.113.7`, `203.0.113.7:4711`,
/// `[2001:db8::1]:4711` or `2001:db8::1`; `unknown` and obfuscated names
/// are not addresses.
fn node_ip(v: &str) -> Option<IpAddr> {
    if let Ok(ip) = v.parse() {
        return Some(ip);
    }
    if let Some(rest) = v.strip_prefix('[') {
        return rest.split_once(']')?.0.parse().ok();
    }
    v.rsplit_once(':')?.0.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn h<'a>(pairs: &'a [(&'a str, &'a str)]) -> impl Iterator<Item = (&'a [u8], &'a [u8])> {
        pairs.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes()))
    }

    fn local() -> Trusted {
        Trusted::parse("127.0.0.1,::1").unwrap()
    }

    #[test]
    fn an_untrusted_peer_changes_nothing() {
        let peer = "192.0.2.9".parse().unwrap();
        let headers = [
            ("X-Forwarded-For", "203.0.113.7"),
            ("X-Forwarded-Proto", "https"),
        ];
        assert_eq!(resolve(&local(), peer, h(&headers)), None);
    }

    #[test]
    fn the_client_is_the_rightmost_address_that_is_not_a_proxy() {
        let peer = "127.0.0.1".parse().unwrap();
        // A client that sent its own header through two proxies.
        let headers = [
            ("X-Forwarded-For", "6.6.6.6, 203.0.113.7, 127.0.0.1"),
            ("X-Forwarded-Proto", "https"),
        ];
        let got = resolve(&local(), peer, h(&headers)).unwrap();
        assert_eq!(got.client, Some("203.0.113.7".parse().unwrap()));
        assert_eq!(got.https, Some(true));
    }

    #[test]
    fn rfc_7239_is_read_and_wins() {
        let peer = "::1".parse().unwrap();
        let headers = [
            ("X-Forwarded-For", "6.6.6.6"),
            (
                "Forwarded",
                "for=\"[2001:db8::1]:4711\";proto=https, for=127.0.0.1",
            ),
        ];
        let got = resolve(&local(), peer, h(&headers)).unwrap();
        assert_eq!(got.client, Some("2001:db8::1".parse().unwrap()));
        assert_eq!(got.https, Some(true));
    }

    #[test]
    fn trust_lists_parse() {
        assert_eq!(Trusted::parse("*").unwrap(), Trusted::All);
        assert!(Trusted::parse("").unwrap().is_empty());
        assert!(Trusted::parse("10.0.0.1, nope").is_err());
        assert!(
            Trusted::parse("::ffff:127.0.0.1")
                .unwrap()
                .trusts("127.0.0.1".parse().unwrap())
        );
    }
}
