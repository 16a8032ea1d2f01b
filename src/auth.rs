//! API keys: with any key set (`--api-key`, `--api-key-file`,
//! `M0_API_KEY`), the core answers a request without
//! `Authorization: Bearer <a key>` with 401 before any plugin sees it.
//!
//! Keys are kept where a core dump does not reach them (an anonymous
//! mapping marked `MADV_DONTDUMP`, zeroed before it is unmapped), padded to
//! one length so that checking a token reads the same bytes whatever it is.
//! They never reach a log line, an error or `--doctor`, which say how many
//! keys there are and where they came from.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::ptr::NonNull;

/// Where the keys come from: `--api-key`, `--api-key-file` and
/// `--api-key-open-path` as given (`M0_API_KEY` is read here).
pub struct KeySources<'a> {
    pub keys: &'a [String],
    pub file: Option<&'a Path>,
    pub open_paths: &'a [String],
}

/// The longest key taken: every check compares this many bytes per key.
pub const MAX_KEY_BYTES: usize = 256;
/// The variable a key may come from.
pub const ENV_API_KEY: &str = "M0_API_KEY";

/// One key's slot: its length, then its bytes padded with zeros.
const SLOT: usize = 2 + MAX_KEY_BYTES;

pub struct ApiKeys {
    map: NonNull<u8>,
    len: usize,
    count: usize,
    /// Where the keys came from, for the doctor and the start line.
    sources: Vec<String>,
    from_command_line: bool,
    /// Paths answered without a key (exact match), besides the core's own.
    open_paths: Vec<String>,
}

// SAFETY: the mapping is written once, in `new`, before the value is
// shared, and only read afterwards.
unsafe impl Send for ApiKeys {}
// SAFETY: as above: shared references only read.
unsafe impl Sync for ApiKeys {}

impl std::fmt::Debug for ApiKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the keys themselves.
        write!(f, "ApiKeys({})", self.describe())
    }
}

/// Why the keys were refused, and what to do.
#[derive(Debug)]
pub struct KeyError {
    pub problem: String,
    pub fix: String,
}

impl ApiKeys {
    fn new(
        keys: &[Vec<u8>],
        sources: Vec<String>,
        from_command_line: bool,
    ) -> std::io::Result<ApiKeys> {
        use nix::sys::mman::{MapFlags, MmapAdvise, ProtFlags, madvise, mmap_anonymous};
        let len = (keys.len() * SLOT).max(1);
        let size = std::num::NonZeroUsize::new(len).expect("at least one byte");
        // SAFETY: a fresh private anonymous mapping; nothing else refers to it.
        let map = unsafe {
            mmap_anonymous(
                None,
                size,
                ProtFlags::PROT_READ | ProtFlags::PROT_WRITE,
                MapFlags::MAP_PRIVATE,
            )
        }?;
        // SAFETY: the range is the mapping just made.
        unsafe { madvise(map, len, MmapAdvise::MADV_DONTDUMP) }?;
        let base = map.cast::<u8>();
        for (i, key) in keys.iter().enumerate() {
            // SAFETY: slot i lies inside the mapping (len = keys * SLOT),
            // and key.len() <= MAX_KEY_BYTES was checked by the caller.
            unsafe {
                let slot = base.as_ptr().add(i * SLOT);
                let n = key.len() as u16;
                std::ptr::copy_nonoverlapping(n.to_le_bytes().as_ptr(), slot, 2);
                std::ptr::copy_nonoverlapping(key.as_ptr(), slot.add(2), key.len());
            }
        }
        Ok(ApiKeys {
            map: base,
            len,
            count: keys.len(),
            sources,
            from_command_line,
            open_paths: Vec::new(),
        })
    }

    fn slot(&self, i: usize) -> (usize, &[u8]) {
        // SAFETY: i < count, so the slot lies inside the mapping, which
        // lives as long as self and is only read after `new`.
        let bytes = unsafe { std::slice::from_raw_parts(self.map.as_ptr().add(i * SLOT), SLOT) };
        let n = u16::from_le_bytes([bytes[0], bytes[1]]) as usize;
        (n, &bytes[2..])
    }

    /// Whether `token` is one of the keys. Every key's whole padded slot is
    /// compared, with no early exit, so the time taken says nothing about
    /// how much of a key a token got right.
    pub fn accepts(&self, token: &[u8]) -> bool {
        let mut padded = [0u8; MAX_KEY_BYTES];
        let n = token.len().min(MAX_KEY_BYTES);
        padded[..n].copy_from_slice(&token[..n]);
        let too_long = u8::from(token.len() > MAX_KEY_BYTES);
        let mut found = 0u8;
        for i in 0..self.count {
            let (len, key) = self.slot(i);
            let mut diff = u8::from(len != token.len()) | too_long;
            for (a, b) in key.iter().zip(padded.iter()) {
                diff |= a ^ b;
            }
            found |= u8::from(std::hint::black_box(diff) == 0);
        }
        found != 0
    }

    /// Whether the request's `Authorization` value carries a key.
    pub fn authorizes(&self, authorization: Option<&[u8]>) -> bool {
        let Some(value) = authorization else {
            return false;
        };
        let value = value.trim_ascii();
        let Some((scheme, token)) = value.split_at_checked(6) else {
            return false;
        };
        if !scheme.eq_ignore_ascii_case(b"bearer") || !token.starts_with(b" ") {
            return false;
        }
        self.accepts(token.trim_ascii())
    }

    pub fn is_open(&self, path: &[u8]) -> bool {
        self.open_paths.iter().any(|p| p.as_bytes() == path)
    }

    pub fn count(&self) -> usize {
        self.count
    }

    pub fn sources(&self) -> &[String] {
        &self.sources
    }

    pub fn open_paths(&self) -> &[String] {
        &self.open_paths
    }

    pub fn from_command_line(&self) -> bool {
        self.from_command_line
    }

    /// "2 key(s) from --api-key-file /etc/m0/keys (2)": never the keys.
    pub fn describe(&self) -> String {
        format!("{} key(s) from {}", self.count, self.sources.join(", "))
    }
}

impl Drop for ApiKeys {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and nothing borrows it past self.
        unsafe {
            std::ptr::write_bytes(self.map.as_ptr(), 0, self.len);
            let _ = nix::sys::mman::munmap(self.map.cast(), self.len);
        }
    }
}

/// The keys the command line, the environment and the key file give, or
/// None when there are none (the server is open, as by default).
pub fn load(from: KeySources<'_>) -> Result<Option<ApiKeys>, KeyError> {
    let mut keys: Vec<Vec<u8>> = Vec::new();
    let mut sources = Vec::new();
    let check = |key: &[u8], from: &str| -> Result<(), KeyError> {
        if key.is_empty() || key.len() > MAX_KEY_BYTES {
            return Err(KeyError {
                problem: format!("an API key from {from} is {} bytes long", key.len()),
                fix: format!("use keys of 1 to {MAX_KEY_BYTES} bytes"),
            });
        }
        if !key.iter().all(|b| b.is_ascii_graphic()) {
            return Err(KeyError {
                problem: format!(
                    "an API key from {from} holds a space or a byte that is not printable ASCII"
                ),
                fix: "use keys of visible ASCII characters (a client sends them in a header)"
                    .into(),
            });
        }
        Ok(())
    };
    if !from.keys.is_empty() {
        for key in from.keys {
            check(key.as_bytes(), "--api-key")?;
            keys.push(key.as_bytes().to_vec());
        }
        sources.push(format!("--api-key ({})", from.keys.len()));
    }
    if let Some(key) = std::env::var_os(ENV_API_KEY) {
        use std::os::unix::ffi::OsStrExt;
        let key = key.as_bytes().trim_ascii();
        check(key, ENV_API_KEY)?;
        keys.push(key.to_vec());
        sources.push(ENV_API_KEY.to_string());
    }
    if let Some(path) = from.file {
        let from_file = read_key_file(path)?;
        for key in &from_file {
            check(key, &format!("--api-key-file {}", path.display()))?;
        }
        sources.push(format!(
            "--api-key-file {} ({})",
            path.display(),
            from_file.len()
        ));
        keys.extend(from_file);
    }
    if keys.is_empty() {
        if !from.open_paths.is_empty() {
            return Err(KeyError {
                problem: "--api-key-open-path is set but no API key is".into(),
                fix: "set a key with --api-key-file, M0_API_KEY or --api-key, or drop --api-key-open-path".into(),
            });
        }
        return Ok(None);
    }
    let mut out = ApiKeys::new(&keys, sources, !from.keys.is_empty()).map_err(|e| KeyError {
        problem: format!("cannot set aside memory for the API keys: {e}"),
        fix: "free some memory".into(),
    })?;
    for key in &mut keys {
        key.fill(0);
    }
    out.open_paths = from.open_paths.to_vec();
    Ok(Some(out))
}

/// One key a line; blank lines and `#` comments skipped. Refused when
/// others than its owner may read it, as ssh refuses a private key.
fn read_key_file(path: &Path) -> Result<Vec<Vec<u8>>, KeyError> {
    let shown = path.display();
    let meta = std::fs::metadata(path).map_err(|e| KeyError {
        problem: format!("--api-key-file {shown} cannot be read: {e}"),
        fix: "pass a readable file with one key a line".into(),
    })?;
    let mode = meta.permissions().mode();
    if mode & 0o077 != 0 {
        return Err(KeyError {
            problem: format!(
                "--api-key-file {shown} may be read by others than its owner (mode {:o})",
                mode & 0o777
            ),
            fix: format!("chmod 600 {shown}"),
        });
    }
    let mut text = std::fs::read(path).map_err(|e| KeyError {
        problem: format!("--api-key-file {shown} cannot be read: {e}"),
        fix: "pass a readable file with one key a line".into(),
    })?;
    let keys: Vec<Vec<u8>> = text
        .split(|&b| b == b'\n')
        .map(<[u8]>::trim_ascii)
        .filter(|l| !l.is_empty() && !l.starts_with(b"#"))
        .map(<[u8]>::to_vec)
        .collect();
    text.fill(0);
    if keys.is_empty() {
        return Err(KeyError {
            problem: format!("--api-key-file {shown} holds no key"),
            fix: "write one key a line (lines starting with # are comments)".into(),
        });
    }
    Ok(keys)
}

/// Overwrite the key the environment holds, where it lies, and remove
/// the variable: the application a worker runs cannot read it, and a core
/// dump or /proc/PID/environ no longer shows it.
///
/// # Safety
/// No other thread may read or write the environment meanwhile.
pub unsafe fn scrub_environment() {
    let name = c"M0_API_KEY";
    // SAFETY: per the contract the environment is ours alone; getenv's
    // pointer is into the writable block of that variable's value.
    unsafe {
        let value = libc::getenv(name.as_ptr());
        if !value.is_null() {
            let n = libc::strlen(value);
            std::ptr::write_bytes(value, 0, n);
        }
        libc::unsetenv(name.as_ptr());
    }
}

/// Zero the keys the command line gave once they are loaded (argv's own
/// copy stays: `ps` shows it, which is why the start warns about it).
pub fn scrub_keys(keys: &mut Vec<String>) {
    for key in keys.drain(..) {
        let mut bytes = key.into_bytes();
        bytes.fill(0);
        std::hint::black_box(&bytes);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(list: &[&str]) -> ApiKeys {
        let v: Vec<Vec<u8>> = list.iter().map(|k| k.as_bytes().to_vec()).collect();
        ApiKeys::new(&v, vec!["test".into()], false).unwrap()
    }

    #[test]
    fn a_token_is_accepted_only_when_it_is_a_whole_key() {
        let k = keys(&["sk-right", "other"]);
        assert!(k.accepts(b"sk-right"));
        assert!(k.accepts(b"other"));
        for wrong in [
            &b"sk-righ"[..],
            b"sk-rightt",
            b"",
            b"sk-wrong",
            b"sk-right\0",
        ] {
            assert!(!k.accepts(wrong), "{wrong:?}");
        }
        assert!(!k.accepts(&[b'a'; MAX_KEY_BYTES + 10]));
    }

    #[test]
    fn the_header_must_say_bearer() {
        let k = keys(&["abc"]);
        assert!(k.authorizes(Some(b"Bearer abc")));
        assert!(k.authorizes(Some(b"bearer   abc ")));
        for bad in [
            &b"Basic abc"[..],
            b"Bearerabc",
            b"abc",
            b"Bearer",
            b"Bearer abcd",
        ] {
            assert!(!k.authorizes(Some(bad)), "{bad:?}");
        }
        assert!(!k.authorizes(None));
    }

    #[test]
    fn debug_and_describe_never_show_a_key() {
        let k = keys(&["sk-secret-value"]);
        assert!(!format!("{k:?}").contains("secret"));
        assert!(!k.describe().contains("secret"));
    }

    /// Right and wrong keys of equal length take the same time: batches
    /// alternate, and the medians' ratio of a key right in all but its last
    /// byte against one wrong in its first stays near 1 (an early-exit
    /// comparison reads 1 byte of one and 255 of the other).
    #[test]
    fn a_check_takes_as_long_for_a_near_miss_as_for_a_far_one() {
        let key = "k".repeat(MAX_KEY_BYTES);
        let k = keys(&[&key]);
        let mut near = key.clone().into_bytes();
        *near.last_mut().unwrap() = b'x';
        let mut far = key.into_bytes();
        far[0] = b'x';
        let time = |token: &[u8]| {
            let t = std::time::Instant::now();
            for _ in 0..2000 {
                std::hint::black_box(k.accepts(std::hint::black_box(token)));
            }
            t.elapsed().as_nanos() as f64
        };
        let (mut a, mut b) = (Vec::new(), Vec::new());
        for _ in 0..41 {
            a.push(time(&near));
            b.push(time(&far));
        }
        a.sort_by(f64::total_cmp);
        b.sort_by(f64::total_cmp);
        let ratio = a[20] / b[20];
        assert!((0.7..1.43).contains(&ratio), "near/far = {ratio:.2}");
    }
}
