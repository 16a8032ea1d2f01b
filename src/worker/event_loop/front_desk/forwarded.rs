//! Proxy headers (`--forwarded-allow-ips`, `http/forwarded.rs`): a request
//! that passes the desk from a trusted proxy carries the client and scheme
//! the proxy names to its job.

use std::net::IpAddr;
use std::sync::Arc;

use super::FrontDesk;
use crate::http::forwarded;
use crate::http::head::RequestHead;
use crate::plugin::call::Peer;

impl FrontDesk {
    /// The client a trusted proxy names for a request (`head`, in `buf`)
    /// from `peer`, when it names one, and whether it says the client used
    /// https.
    pub(super) fn proxy_headers(
        &self,
        head: &RequestHead,
        buf: &[u8],
        peer: IpAddr,
    ) -> (Option<Arc<Peer>>, bool) {
        if self.trusted_proxies.is_empty() || !self.trusted_proxies.trusts(peer) {
            return (None, false);
        }
        let headers = head.headers.iter().map(|(n, v)| (n.get(buf), v.get(buf)));
        let Some(said) = forwarded::resolve(&self.trusted_proxies, peer, headers) else {
            return (None, false);
        };
        let client = said.client.map(|client| {
            Arc::new(Peer {
                addr: client,
                ip: client.to_string(),
                port: 0,
            })
        });
        (client, said.https.unwrap_or(false))
    }
}
