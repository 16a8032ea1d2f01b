//! `--bind HOST:PORT` (`-b`), gunicorn's and uvicorn's spelling of
//! `--host` and `--port`.

/// The address `--bind` names; `port` is `None` for a HOST alone, which
/// leaves `--port` as it is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bind {
    pub host: String,
    pub port: Option<u16>,
}

impl Bind {
    /// `127.0.0.1:8000`, `0.0.0.0`, `[::1]:8000`, `::1`, `localhost:8000`.
    /// A unix socket is refused with why and what to pass instead (clap
    /// reports it as a usage error naming `--bind`).
    pub fn parse(s: &str) -> Result<Bind, String> {
        let s = s.trim();
        if let Some(path) = s.strip_prefix("unix:") {
            return Err(format!(
                "m0serve listens on TCP only and cannot serve the unix socket {path}; pass \
                 HOST:PORT (e.g. 127.0.0.1:8000), and let a proxy such as nginx listen on the \
                 socket if you need one"
            ));
        }
        if s.starts_with("fd://") {
            return Err(
                "m0serve does not take a listener by descriptor number; pass HOST:PORT, or let \
                 systemd pass the socket (socket activation, see the README)"
                    .to_string(),
            );
        }
        let (host, port) = if let Some(rest) = s.strip_prefix('[') {
            // [v6] or [v6]:port
            let (inner, after) = rest
                .split_once(']')
                .ok_or_else(|| format!("expected HOST:PORT such as [::1]:8000, got {s:?}"))?;
            match after {
                "" => (inner, None),
                _ => match after.strip_prefix(':') {
                    Some(port) => (inner, Some(port)),
                    None => return Err(format!("expected [HOST]:PORT, got {s:?}")),
                },
            }
        } else {
            match s.split_once(':') {
                // One colon: HOST:PORT; more: an IPv6 address alone.
                Some((host, port)) if !port.contains(':') => (host, Some(port)),
                _ => (s, None),
            }
        };
        let port = match port {
            Some(p) => Some(p.parse::<u16>().map_err(|_| {
                format!("expected a port from 0 to 65535 after the colon, got {p:?} in {s:?}")
            })?),
            None => None,
        };
        if host.is_empty() {
            return Err(format!(
                "expected HOST:PORT with a host, such as 127.0.0.1:8000 (0.0.0.0 for every \
                 interface), got {s:?}"
            ));
        }
        crate::listener::parse_host(host).map_err(|_| {
            format!(
                "{host:?} is not an IP address; pass HOST:PORT with an IP such as 127.0.0.1, \
                 0.0.0.0 or [::1], or localhost"
            )
        })?;
        Ok(Bind {
            host: host.to_string(),
            port,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::Bind;

    fn bind(host: &str, port: Option<u16>) -> Bind {
        Bind {
            host: host.into(),
            port,
        }
    }

    #[test]
    fn host_and_port_in_each_spelling() {
        assert_eq!(
            Bind::parse("127.0.0.1:8000"),
            Ok(bind("127.0.0.1", Some(8000)))
        );
        assert_eq!(Bind::parse("0.0.0.0"), Ok(bind("0.0.0.0", None)));
        assert_eq!(Bind::parse("[::1]:9000"), Ok(bind("::1", Some(9000))));
        assert_eq!(Bind::parse("[::1]"), Ok(bind("::1", None)));
        assert_eq!(Bind::parse("::1"), Ok(bind("::1", None)));
        assert_eq!(Bind::parse("localhost:80"), Ok(bind("localhost", Some(80))));
    }

    #[test]
    fn what_it_cannot_serve_is_refused_saying_why() {
        let unix = Bind::parse("unix:/run/m0.sock").unwrap_err();
        assert!(
            unix.contains("TCP only") && unix.contains("HOST:PORT"),
            "{unix}"
        );
        assert!(Bind::parse("127.0.0.1:http").is_err());
        assert!(Bind::parse("127.0.0.1:70000").is_err());
        assert!(Bind::parse("example.com:80").is_err());
        assert!(Bind::parse("[::1]8000").is_err());
        assert!(Bind::parse("fd://3").is_err());
        assert!(Bind::parse(":8001").is_err());
    }
}
