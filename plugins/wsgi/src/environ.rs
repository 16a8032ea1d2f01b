//! Building the WSGI environ.
//!
//! The constant part (wsgi.version, wsgi.errors, SERVER_NAME, ...) lives in a
//! per-thread template dict; each request starts from a copy of it (one
//! `PyDict_Copy`, no rehashing) and sets only the per-request entries. Every
//! key is an interned string made once; header names map to their interned
//! `HTTP_*` key through a per-thread cache keyed by the raw name bytes.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

use m0serve_plugin::{Addr, RawBody, Request};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyString, PyTuple};

use crate::errors::WsgiErrors;
use crate::filewrapper::FileWrapper;
use crate::input::WsgiInput;

/// Interned strings made once at init.
pub struct Keys {
    pub request_method: Py<PyString>,
    pub script_name: Py<PyString>,
    pub path_info: Py<PyString>,
    pub query_string: Py<PyString>,
    pub content_type: Py<PyString>,
    pub content_length: Py<PyString>,
    pub server_name: Py<PyString>,
    pub server_port: Py<PyString>,
    pub server_protocol: Py<PyString>,
    pub remote_addr: Py<PyString>,
    pub remote_port: Py<PyString>,
    pub wsgi_input: Py<PyString>,
    pub empty: Py<PyString>,
    pub http11: Py<PyString>,
    pub http10: Py<PyString>,
    /// Common methods, so REQUEST_METHOD costs no allocation.
    pub methods: Vec<(&'static [u8], Py<PyString>)>,
}

impl Keys {
    pub fn new(py: Python<'_>) -> Keys {
        let k = |s: &str| PyString::intern(py, s).unbind();
        Keys {
            request_method: k("REQUEST_METHOD"),
            script_name: k("SCRIPT_NAME"),
            path_info: k("PATH_INFO"),
            query_string: k("QUERY_STRING"),
            content_type: k("CONTENT_TYPE"),
            content_length: k("CONTENT_LENGTH"),
            server_name: k("SERVER_NAME"),
            server_port: k("SERVER_PORT"),
            server_protocol: k("SERVER_PROTOCOL"),
            remote_addr: k("REMOTE_ADDR"),
            remote_port: k("REMOTE_PORT"),
            wsgi_input: k("wsgi.input"),
            empty: k(""),
            http11: k("HTTP/1.1"),
            http10: k("HTTP/1.0"),
            methods: ["GET", "POST", "HEAD", "PUT", "DELETE", "PATCH", "OPTIONS"]
                .iter()
                .map(|m| (m.as_bytes(), k(m)))
                .collect(),
        }
    }
}

/// What the process knows about itself, for the constant environ entries.
pub struct ServerInfo {
    /// SERVER_NAME and SERVER_PORT when the host told them at init; when the
    /// port was 0 they are taken from each request instead.
    pub name_port: Option<(Py<PyString>, Py<PyString>)>,
    pub multithread: bool,
    pub multiprocess: bool,
}

/// Builds the constant part of the environ for one handler thread.
pub fn make_template<'py>(
    py: Python<'py>,
    keys: &Keys,
    server: &ServerInfo,
    errors: &Bound<'py, WsgiErrors>,
) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item(keys.script_name.bind(py), keys.empty.bind(py))?;
    if let Some((name, port)) = &server.name_port {
        d.set_item(keys.server_name.bind(py), name.bind(py))?;
        d.set_item(keys.server_port.bind(py), port.bind(py))?;
    }
    d.set_item(keys.query_string.bind(py), keys.empty.bind(py))?;
    // What gunicorn and uWSGI set too: apps and middleware log it.
    d.set_item(
        "SERVER_SOFTWARE",
        PyString::intern(py, concat!("m0serve-wsgi/", env!("CARGO_PKG_VERSION"))),
    )?;
    d.set_item("wsgi.version", PyTuple::new(py, [1, 0])?)?;
    d.set_item("wsgi.url_scheme", PyString::intern(py, "http"))?;
    d.set_item("wsgi.errors", errors)?;
    d.set_item("wsgi.multithread", PyBool::new(py, server.multithread))?;
    d.set_item("wsgi.multiprocess", PyBool::new(py, server.multiprocess))?;
    d.set_item("wsgi.run_once", false)?;
    d.set_item("wsgi.file_wrapper", py.get_type::<FileWrapper>())?;
    // The body is framed (and de-chunked) by the host: reading to EOF is safe.
    d.set_item("wsgi.input_terminated", true)?;
    Ok(d)
}

/// FNV-1a: header names are short, so a cheap hash beats SipHash here.
#[derive(Default)]
pub struct Fnv(u64);

impl Hasher for Fnv {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        let mut h = if self.0 == 0 {
            0xcbf2_9ce4_8422_2325
        } else {
            self.0
        };
        for &b in bytes {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        self.0 = h;
    }
}

/// What a request header becomes in the environ.
enum Slot {
    /// Not passed (Proxy, names with `_`, Transfer-Encoding).
    Skip,
    ContentType,
    ContentLength,
    Http(Py<PyString>),
}

/// Most distinct header names cached per thread; beyond that keys are made
/// per request (a client sending random names cannot grow memory).
const HEADER_CACHE_MAX: usize = 512;

/// Per-thread scratch state for building environs.
pub struct EnvironCache {
    headers: HashMap<Box<[u8]>, Slot, BuildHasherDefault<Fnv>>,
    /// Keys set in the current request, to merge repeated headers.
    seen: Vec<*mut ffi::PyObject>,
    path: Vec<u8>,
    last_ip: Option<(Vec<u8>, Py<PyString>)>,
    last_port: Option<(u16, Py<PyString>)>,
}

impl EnvironCache {
    pub fn new() -> Self {
        EnvironCache {
            headers: HashMap::default(),
            seen: Vec::with_capacity(32),
            path: Vec::with_capacity(256),
            last_ip: None,
            last_port: None,
        }
    }

    fn slot_for(&self, py: Python<'_>, name: &[u8]) -> Slot {
        let is = |s: &str| name.eq_ignore_ascii_case(s.as_bytes());
        // httpoxy: a `Proxy:` header must never become HTTP_PROXY. Names with
        // `_` are dropped so `X_Forwarded_For` cannot spoof `X-Forwarded-For`.
        if name.contains(&b'_') || name.is_empty() || is("proxy") || is("transfer-encoding") {
            return Slot::Skip;
        }
        if is("content-type") {
            return Slot::ContentType;
        }
        if is("content-length") {
            return Slot::ContentLength;
        }
        let mut key = String::with_capacity(5 + name.len());
        key.push_str("HTTP_");
        for &b in name {
            key.push(match b {
                b'-' => '_',
                b => (b as char).to_ascii_uppercase(),
            });
        }
        Slot::Http(PyString::intern(py, &key).unbind())
    }
}

impl Default for EnvironCache {
    fn default() -> Self {
        Self::new()
    }
}

/// Latin-1 bytes to str, as PEP 3333 wants for every CGI value.
pub fn latin1<'py>(py: Python<'py>, bytes: &[u8]) -> PyResult<Bound<'py, PyString>> {
    // SAFETY: the pointer and length describe `bytes`; latin-1 decoding
    // cannot fail except on memory exhaustion, which returns NULL with an
    // exception set (turned into Err).
    unsafe {
        let p = ffi::PyUnicode_DecodeLatin1(
            bytes.as_ptr().cast(),
            bytes.len() as isize,
            std::ptr::null(),
        );
        Bound::from_owned_ptr_or_err(py, p).map(|b| b.cast_into_unchecked())
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// Percent-decodes `src` into `out`; malformed escapes stay as they are.
pub fn percent_decode(src: &[u8], out: &mut Vec<u8>) {
    out.clear();
    let mut i = 0;
    while i < src.len() {
        let b = src[i];
        if b == b'%'
            && i + 2 < src.len()
            && let (Some(h), Some(l)) = (hex(src[i + 1]), hex(src[i + 2]))
        {
            out.push(h << 4 | l);
            i += 3;
            continue;
        }
        out.push(b);
        i += 1;
    }
}

fn decimal<'py>(py: Python<'py>, mut n: u64) -> PyResult<Bound<'py, PyString>> {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    latin1(py, &buf[i..])
}

/// Builds the environ of one request. Returns it with its `wsgi.input`,
/// which reads the body of this call: the caller invalidates it before the
/// call returns.
pub fn build<'py>(
    py: Python<'py>,
    keys: &Keys,
    template: &Bound<'py, PyDict>,
    cache: &mut EnvironCache,
    server_from_request: bool,
    req: &Request<'_>,
    body: RawBody,
) -> PyResult<(Bound<'py, PyDict>, Bound<'py, WsgiInput>)> {
    let env = template.copy()?;
    let method = req.method();
    match keys.methods.iter().find(|(m, _)| *m == method) {
        Some((_, s)) => env.set_item(keys.request_method.bind(py), s.bind(py))?,
        None => env.set_item(keys.request_method.bind(py), latin1(py, method)?)?,
    }

    let path = req.path();
    let path_str = if path.contains(&b'%') {
        percent_decode(path, &mut cache.path);
        latin1(py, &cache.path)?
    } else {
        latin1(py, path)?
    };
    env.set_item(keys.path_info.bind(py), path_str)?;

    let query = req.query();
    if !query.is_empty() {
        env.set_item(keys.query_string.bind(py), latin1(py, query)?)?;
    }
    let proto = if req.http_minor() == 0 {
        &keys.http10
    } else {
        &keys.http11
    };
    env.set_item(keys.server_protocol.bind(py), proto.bind(py))?;

    set_peer(py, keys, &env, cache, req.peer())?;
    if req.https() {
        // A proxy the server trusts says the client used https (the
        // template says http): what url_for and redirects build on.
        env.set_item("wsgi.url_scheme", PyString::intern(py, "https"))?;
        env.set_item("HTTPS", PyString::intern(py, "on"))?;
    }
    if server_from_request {
        let server = req.server();
        env.set_item(keys.server_name.bind(py), latin1(py, server.ip.as_bytes())?)?;
        env.set_item(
            keys.server_port.bind(py),
            decimal(py, u64::from(server.port))?,
        )?;
    }

    let mut has_length_header = false;
    cache.seen.clear();
    for (name, value) in req.headers() {
        let mut fresh = None;
        let slot = match cache.headers.get(name) {
            Some(s) => s,
            None => &*fresh.insert(cache.slot_for(py, name)),
        };
        let key = match slot {
            Slot::Skip => None,
            Slot::ContentLength => {
                has_length_header = true;
                None
            }
            Slot::ContentType => Some(keys.content_type.bind(py).clone()),
            Slot::Http(k) => Some(k.bind(py).clone()),
        };
        if let Some(s) = fresh
            && cache.headers.len() < HEADER_CACHE_MAX
        {
            cache.headers.insert(name.into(), s);
        }
        let Some(key) = key else {
            continue;
        };
        let value = latin1(py, value)?;
        if cache.seen.contains(&key.as_ptr()) {
            // A repeated header: join the values as RFC 9110 allows
            // (cookies with "; ", as RFC 6265 sends them).
            let sep = if key.to_str()? == "HTTP_COOKIE" {
                "; "
            } else {
                ", "
            };
            if let Some(prev) = env.get_item(&key)? {
                let joined = format!("{}{sep}{}", prev.str()?.to_cow()?, value.to_cow()?);
                env.set_item(&key, joined)?;
                continue;
            }
        }
        cache.seen.push(key.as_ptr());
        env.set_item(&key, value)?;
    }
    if has_length_header || req.content_length() > 0 {
        env.set_item(
            keys.content_length.bind(py),
            decimal(py, req.content_length())?,
        )?;
    }

    let input = Bound::new(py, WsgiInput::new(body, req.content_length()))?;
    env.set_item(keys.wsgi_input.bind(py), &input)?;
    Ok((env, input))
}

fn set_peer<'py>(
    py: Python<'py>,
    keys: &Keys,
    env: &Bound<'py, PyDict>,
    cache: &mut EnvironCache,
    peer: Addr<'_>,
) -> PyResult<()> {
    let ip = peer.ip.as_bytes();
    let ip_str = match &cache.last_ip {
        Some((b, s)) if b.as_slice() == ip => s.bind(py).clone(),
        _ => {
            let s = latin1(py, ip)?;
            cache.last_ip = Some((ip.to_vec(), s.clone().unbind()));
            s
        }
    };
    env.set_item(keys.remote_addr.bind(py), ip_str)?;
    let port_str = match &cache.last_port {
        Some((p, s)) if *p == peer.port => s.bind(py).clone(),
        _ => {
            let s = decimal(py, u64::from(peer.port))?;
            cache.last_port = Some((peer.port, s.clone().unbind()));
            s
        }
    };
    env.set_item(keys.remote_port.bind(py), port_str)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        let mut out = Vec::new();
        percent_decode(b"/a%20b/%E9%zz%4", &mut out);
        assert_eq!(out, b"/a b/\xe9%zz%4");
        percent_decode(b"%2F%2f", &mut out);
        assert_eq!(out, b"//");
        percent_decode(b"%41", &mut out);
        assert_eq!(out, b"A");
    }
}
