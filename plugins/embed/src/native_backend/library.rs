//! Opening a backend library and checking its table before any call into
//! it but the entry point: the ABI major, the table's size, its functions.
//! Every refusal names the library, what is wrong and the fix, and exits
//! the worker 78 (a configuration the server will not run).

use std::path::{Path, PathBuf};

use libloading::os::unix::{Library as Dl, RTLD_LOCAL, RTLD_NOW};
use m0embed_backend_abi::{
    M0_EMBED_ABI_MAJOR, M0_EMBED_ABI_MINOR, M0_EMBED_BACKEND_SYMBOL, M0EmbedDescribeFn,
    M0EmbedEntryFn, M0EmbedForwardFn, M0EmbedLoadFn, M0EmbedUnloadFn, MIN_BACKEND_SIZE,
};
use m0serve_plugin::InitError;

use super::ENV_BACKEND;

/// An opened backend library and its checked table: every function is
/// there (none is NULL).
pub(super) struct Library {
    /// Kept open for the life of the backend: the table's functions live
    /// in it.
    _dl: Dl,
    /// The ABI (major, minor) the backend was built for.
    pub abi: (u32, u32),
    pub load: M0EmbedLoadFn,
    pub describe: M0EmbedDescribeFn,
    pub forward: M0EmbedForwardFn,
    pub unload: M0EmbedUnloadFn,
    pub path: PathBuf,
}

/// The fix for a library built against another header.
fn rebuild(path: &Path) -> String {
    format!(
        "rebuild {} against this server's include/m0embed_backend.h (ABI {M0_EMBED_ABI_MAJOR}.\
         {M0_EMBED_ABI_MINOR}), or point {ENV_BACKEND} at one that is",
        path.display()
    )
}

impl Library {
    /// Opens `path` (`RTLD_NOW | RTLD_LOCAL`), calls its entry point and
    /// checks the table it returns.
    pub fn open(path: &Path) -> Result<Library, InitError> {
        let refused = |what: String| {
            InitError::refused(format!(
                "embed: backend {} ({ENV_BACKEND}) {what}",
                path.display()
            ))
        };
        // SAFETY: opening a library runs its initialisers; the path is
        // the operator's choice of backend, which is what they asked to
        // run. RTLD_LOCAL keeps its symbols from any other plugin's.
        let dl = unsafe { Dl::open(Some(path), RTLD_NOW | RTLD_LOCAL) }.map_err(|e| {
            refused(format!(
                "cannot be opened: {e}; set {ENV_BACKEND} to the path of a backend's .so"
            ))
        })?;
        let symbol = format!("{M0_EMBED_BACKEND_SYMBOL}\0");
        // SAFETY: the symbol is declared by include/m0embed_backend.h with
        // exactly this type; a library that exports another thing under
        // the name breaks the header's one rule.
        let entry: M0EmbedEntryFn = *unsafe { dl.get::<M0EmbedEntryFn>(symbol.as_bytes()) }
            .map_err(|_| {
                refused(format!(
                    "exports no `{M0_EMBED_BACKEND_SYMBOL}`: it is not an m0-embed backend; \
                     {}",
                    rebuild(path)
                ))
            })?;
        // SAFETY: the entry point takes nothing and returns a pointer to
        // a table that lives as long as the library.
        let table = unsafe { entry() };
        if table.is_null() {
            return Err(refused(format!(
                "returned no table from `{M0_EMBED_BACKEND_SYMBOL}`"
            )));
        }
        // The three leading u32s (size, major, minor) are in every version
        // of the table; nothing past them is read before they are checked.
        // SAFETY: `table` is non-null and points at a table whose first
        // fields are these, by the header.
        let (size, major, minor) = unsafe {
            let words = table.cast::<u32>();
            (words.read(), words.add(1).read(), words.add(2).read())
        };
        if major != M0_EMBED_ABI_MAJOR {
            return Err(refused(format!(
                "is built for backend ABI {major}.{minor}, and this plugin speaks \
                 {M0_EMBED_ABI_MAJOR}.{M0_EMBED_ABI_MINOR} (another major is never loaded); {}",
                rebuild(path)
            )));
        }
        if size < MIN_BACKEND_SIZE {
            return Err(refused(format!(
                "returned a table of {size} bytes, less than the {MIN_BACKEND_SIZE} of ABI \
                 {M0_EMBED_ABI_MAJOR}.0; {}",
                rebuild(path)
            )));
        }
        // SAFETY: the table holds at least the 1.0 fields (its size says
        // so), which are all of M0EmbedBackend this plugin knows.
        let table = unsafe { table.read() };
        let (Some(load), Some(describe), Some(forward), Some(unload)) =
            (table.load, table.describe, table.forward, table.unload)
        else {
            let missing: Vec<&str> = [
                ("load", table.load.is_none()),
                ("describe", table.describe.is_none()),
                ("forward", table.forward.is_none()),
                ("unload", table.unload.is_none()),
            ]
            .into_iter()
            .filter_map(|(name, none)| none.then_some(name))
            .collect();
            return Err(refused(format!(
                "has no {} in its table (NULL); every function of M0EmbedBackend is required",
                missing.join(", ")
            )));
        };
        Ok(Library {
            _dl: dl,
            abi: (major, minor),
            load,
            describe,
            forward,
            unload,
            path: path.to_path_buf(),
        })
    }
}
