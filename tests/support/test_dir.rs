//! Folders a test makes under target/tmp, removed when the test passes
//! (kept when it fails, to be looked at), and model folders linked instead
//! of copied: the suite leaves behind what its build needs, not what each
//! test wrote.

use std::path::{Path, PathBuf};

/// Files larger than this are linked by [`link_tree`]; smaller ones (the
/// JSON files a test edits) are copied, so an edit never writes through a
/// link into the original.
const LINK_ABOVE: u64 = 1 << 20;

/// `target/tmp/NAME`, emptied when made and removed when dropped unless
/// the thread is panicking (a failed test keeps it).
pub struct TestDir {
    path: PathBuf,
}

impl TestDir {
    pub fn new(name: &str) -> TestDir {
        let path = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(name);
        let _ = std::fs::remove_dir_all(&path);
        std::fs::create_dir_all(&path).unwrap_or_else(|e| panic!("create {}: {e}", path.display()));
        TestDir { path }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl std::ops::Deref for TestDir {
    type Target = Path;

    fn deref(&self) -> &Path {
        &self.path
    }
}

impl AsRef<Path> for TestDir {
    fn as_ref(&self) -> &Path {
        &self.path
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.path);
        }
    }
}

/// `src`'s tree recreated in `dst`: folders made, files over 1 MiB (the
/// weights, a cache) hard-linked (symlinked across file systems), the rest
/// copied. A model folder so made costs a few MB, not the model's 87 MB
/// or more; a test may edit or remove its small files, and must replace,
/// never write into, a large one.
pub fn link_tree(src: &Path, dst: &Path) {
    std::fs::create_dir_all(dst).unwrap_or_else(|e| panic!("create {}: {e}", dst.display()));
    let entries = std::fs::read_dir(src).unwrap_or_else(|e| panic!("read {}: {e}", src.display()));
    for e in entries.flatten() {
        let (from, to) = (e.path(), dst.join(e.file_name()));
        let meta =
            std::fs::metadata(&from).unwrap_or_else(|err| panic!("stat {}: {err}", from.display()));
        if meta.is_dir() {
            link_tree(&from, &to);
        } else if meta.len() > LINK_ABOVE {
            std::fs::hard_link(&from, &to)
                .or_else(|_| std::os::unix::fs::symlink(&from, &to))
                .unwrap_or_else(|err| panic!("link {} to {}: {err}", to.display(), from.display()));
        } else {
            std::fs::copy(&from, &to)
                .unwrap_or_else(|err| panic!("copy {} to {}: {err}", from.display(), to.display()));
        }
    }
}
