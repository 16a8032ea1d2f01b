//! Finding a plugin file, opening it and checking that it speaks our ABI.
//!
//! Opened `RTLD_NOW | RTLD_LOCAL` (unresolved symbols fail here, not on the
//! first request; plugins cannot see each other) and never unloaded: a
//! runtime such as CPython crashes if its library goes away under a thread.

use std::ffi::c_void;
use std::path::{Path, PathBuf};

use m0serve_abi as abi;

use super::descriptor::Descriptor;
use crate::process::{EXIT_REFUSED, EXIT_STARTUP, EXIT_USAGE};

#[derive(Debug, Clone)]
pub struct PluginError {
    pub exit_code: i32,
    /// What is wrong.
    pub message: String,
    /// What to change, where the code that found the problem knows it
    /// (the checks report it as the fix; `Display` joins the two).
    pub fix: Option<String>,
}

impl PluginError {
    fn refused(message: String) -> PluginError {
        PluginError {
            exit_code: EXIT_REFUSED,
            message,
            fix: None,
        }
    }
    fn startup(message: String) -> PluginError {
        PluginError {
            exit_code: EXIT_STARTUP,
            message,
            fix: None,
        }
    }
    fn fix(mut self, fix: impl Into<String>) -> PluginError {
        self.fix = Some(fix.into());
        self
    }
}

/// The problem, then its fix: the line a worker or the server prints.
impl std::fmt::Display for PluginError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.fix {
            Some(fix) => write!(f, "{}; {fix}", self.message),
            None => f.write_str(&self.message),
        }
    }
}

/// The fix for a plugin built against another header.
const REBUILD: &str = "rebuild the plugin against this m0serve's include/m0serve.h";

/// The file names a short name may have, in lookup order.
fn candidate_names(short: &str) -> [String; 3] {
    [
        format!("lib{short}.so"),
        format!("libm0_{short}.so"),
        format!("{short}.so"),
    ]
}

/// The directories searched for a short name: beside the binary (a build's
/// `target/release`), then `../lib/m0serve` from it (an installed
/// `PREFIX/bin/m0serve` finds `PREFIX/lib/m0serve`, where `deploy/install`
/// puts the plugins), then each entry of `M0_PLUGIN_PATH`.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        let installed = dir.join("../lib/m0serve");
        dirs.push(dir);
        if installed.is_dir() {
            dirs.push(installed);
        }
    }
    if let Some(path) = std::env::var_os("M0_PLUGIN_PATH") {
        dirs.extend(std::env::split_paths(&path).filter(|p| !p.as_os_str().is_empty()));
    }
    dirs
}

/// Resolve `--plugin` to a file: a path is taken as given, a short name is
/// looked up. The error lists every place tried.
pub fn resolve(spec: &str) -> Result<PathBuf, PluginError> {
    if spec.is_empty() {
        return Err(PluginError {
            exit_code: EXIT_USAGE,
            message: "--plugin is empty".into(),
            fix: Some("name a plugin with --plugin".into()),
        });
    }
    if spec.contains('/') || spec.ends_with(".so") {
        let path = PathBuf::from(spec);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(
                PluginError::startup(format!("plugin file {spec} does not exist"))
                    .fix("pass a path to a built plugin or a short name such as hello_c"),
            )
        };
    }
    let dirs = search_dirs();
    let mut tried = Vec::new();
    for dir in &dirs {
        for name in candidate_names(spec) {
            let path = dir.join(name);
            if path.is_file() {
                return Ok(path);
            }
            tried.push(path.display().to_string());
        }
    }
    let (found, holding) = super::catalog::found(&dirs);
    let suggestion = super::catalog::closest(spec, &found);
    let mut message = format!("plugin {spec:?} not found");
    if let Some(name) = suggestion {
        message.push_str(&format!(" (did you mean {name}?)"));
    }
    message.push_str(&format!(
        "; plugins found: {}; looked for {}",
        super::catalog::describe(&found, &holding),
        tried.join(", ")
    ));
    let fix = match suggestion {
        Some(name) => format!("pass --plugin {name}"),
        None if !found.is_empty() => "pass --plugin with one of the plugins found, or a path \
             to a plugin's .so, or add the folder that holds it to M0_PLUGIN_PATH"
            .to_string(),
        None => "build the plugins (cargo build --release puts them beside the binary; \
             deploy/install puts them in PREFIX/lib/m0serve), or set M0_PLUGIN_PATH to the \
             folder that holds them"
            .to_string(),
    };
    Err(PluginError::startup(message).fix(fix))
}

/// An opened plugin whose descriptor passed the ABI checks.
pub struct Plugin {
    pub path: PathBuf,
    pub descriptor: Descriptor,
    init: abi::M0InitFn,
}

/// The plugin's calls table, checked and copied.
#[derive(Clone, Copy)]
pub struct Calls {
    pub handle:
        unsafe extern "C" fn(*mut c_void, *const abi::M0Request, *mut abi::M0Response) -> i32,
    pub thread_start: Option<unsafe extern "C" fn(*mut c_void, u32) -> i32>,
    pub thread_stop: Option<unsafe extern "C" fn(*mut c_void, u32)>,
    pub handle_batch: Option<abi::M0HandleBatchFn>,
    pub shutdown: Option<unsafe extern "C" fn(*mut c_void)>,
    /// 1.5: absent from a table too short to hold it.
    pub admit: Option<abi::M0AdmitFn>,
    pub state: *mut c_void,
}

// SAFETY: the plugin's state pointer is handed to its calls from whichever
// threads its declared call model allows; the plugin promises that by
// declaring it, and the pool honours the declaration.
unsafe impl Send for Calls {}
// SAFETY: as above; Calls itself is immutable.
unsafe impl Sync for Calls {}

impl Plugin {
    /// Open the file and check its descriptor.
    pub fn open(path: &Path) -> Result<Plugin, PluginError> {
        let flags = libc::RTLD_NOW | libc::RTLD_LOCAL;
        // SAFETY: opening a library runs its constructors; loading the plugin
        // the user named is the point of this program, and we do it in a
        // worker process (or the doctor's throwaway probe), never in the
        // supervisor.
        let lib =
            unsafe { libloading::os::unix::Library::open(Some(path), flags) }.map_err(|e| {
                PluginError::startup(format!("cannot open plugin {}: {e}", path.display()))
            })?;
        // Never unloaded: see the module docs.
        let lib: &'static libloading::os::unix::Library = Box::leak(Box::new(lib));
        let missing = |sym: &str, e: libloading::Error| {
            PluginError::refused(format!(
                "plugin {} does not export {sym} ({e})",
                path.display()
            ))
            .fix("export m0_plugin_describe and m0_plugin_init from the plugin, as include/m0serve.h declares them")
        };
        // SAFETY: the symbol's type is fixed by the ABI (M0DescribeFn).
        let describe = unsafe { lib.get::<abi::M0DescribeFn>(abi::DESCRIBE_SYMBOL) }
            .map_err(|e| missing(abi::DESCRIBE_SYMBOL, e))?;
        // SAFETY: the symbol's type is fixed by the ABI (M0InitFn).
        let init = unsafe { lib.get::<abi::M0InitFn>(abi::INIT_SYMBOL) }
            .map_err(|e| missing(abi::INIT_SYMBOL, e))?;
        let describe: abi::M0DescribeFn = *describe;
        let init: abi::M0InitFn = *init;
        // SAFETY: describe is side-effect free by contract and returns a
        // pointer to a static descriptor or NULL.
        let info = unsafe { describe() };
        let descriptor = check_info(path, info)?;
        Ok(Plugin {
            path: path.to_path_buf(),
            descriptor,
            init,
        })
    }

    /// Run the plugin's init in this worker and check the calls table.
    pub fn init(
        &self,
        host: &'static abi::M0Host,
        args: &abi::M0InitArgs,
    ) -> Result<Calls, PluginError> {
        let mut calls: *const abi::M0PluginCalls = std::ptr::null();
        let mut state: *mut c_void = std::ptr::null_mut();
        let mut error = abi::M0Error {
            size: std::mem::size_of::<abi::M0Error>() as u32,
            message_len: 0,
            message: [0; abi::M0_ERROR_MESSAGE_LEN],
        };
        // SAFETY: every pointer is valid for the call; the plugin writes the
        // out-parameters only on success and the message into our buffer.
        let status = unsafe { (self.init)(host, args, &mut calls, &mut state, &mut error) };
        let name = &self.descriptor.name;
        if status != abi::M0_OK {
            let len = (error.message_len as usize).min(error.message.len());
            let detail = String::from_utf8_lossy(&error.message[..len])
                .trim_end()
                .to_string();
            let detail = if detail.is_empty() {
                "no detail given".to_string()
            } else {
                detail
            };
            let exit_code = if status == abi::M0_INIT_REFUSED {
                EXIT_REFUSED
            } else {
                EXIT_STARTUP
            };
            let verb = if exit_code == EXIT_REFUSED {
                "refused the configuration"
            } else {
                "failed to start"
            };
            // The plugin's message says what to change, if anything does:
            // its fix becomes the error's (see `refusal`).
            let (problem, fix) = super::refusal::split(&detail);
            return Err(PluginError {
                exit_code,
                message: format!("plugin {name} {verb}: {problem}"),
                fix: fix.map(str::to_string),
            });
        }
        if calls.is_null() {
            return Err(PluginError::refused(format!(
                "plugin {name} returned no calls table from m0_plugin_init"
            ))
            .fix("return a static M0PluginCalls from m0_plugin_init on success"));
        }
        // SAFETY: non-null, and the plugin keeps the table alive for the process.
        let size = unsafe { (*calls).size };
        if size < abi::MIN_PLUGIN_CALLS_SIZE {
            return Err(PluginError::refused(format!(
                "plugin {name}'s M0PluginCalls is {size} bytes, smaller than ABI 1.0's {}",
                abi::MIN_PLUGIN_CALLS_SIZE
            ))
            .fix(REBUILD));
        }
        // SAFETY: the plugin's table is `size` bytes long (it says so), and an
        // all-zero M0PluginCalls is valid (every entry point absent).
        let table = unsafe { copy_declared(calls, size) };
        let Some(handle) = table.handle else {
            return Err(PluginError::refused(format!(
                "plugin {name}'s calls table has no handle function"
            ))
            .fix("set handle in the M0PluginCalls that m0_plugin_init returns"));
        };
        Ok(Calls {
            handle,
            thread_start: table.thread_start,
            thread_stop: table.thread_stop,
            handle_batch: table.handle_batch,
            shutdown: table.shutdown,
            // `copy_declared` left it zero (None) where `size` ends before it.
            admit: table
                .admit
                .filter(|_| abi::covers(size, abi::PLUGIN_CALLS_ADMIT_END)),
            state,
        })
    }
}

fn check_info(path: &Path, info: *const abi::M0PluginInfo) -> Result<Descriptor, PluginError> {
    let shown = path.display();
    if info.is_null() {
        return Err(PluginError::refused(format!(
            "plugin {shown}: m0_plugin_describe returned NULL"
        ))
        .fix("return a static M0PluginInfo from m0_plugin_describe"));
    }
    // SAFETY: non-null; the first field is the struct's size, which every
    // version has, so reading it is in bounds.
    let size = unsafe { (*info).size };
    // The versions come right after size, so they can be named even in a
    // descriptor that is too small.
    let header_len = 3 * std::mem::size_of::<u32>() as u32;
    if size >= header_len {
        // SAFETY: size covers abi_major and abi_minor.
        let (major, minor) = unsafe { ((*info).abi_major, (*info).abi_minor) };
        if major != abi::M0_ABI_MAJOR {
            return Err(PluginError::refused(format!(
                "plugin {shown} was built for m0serve ABI {major}.{minor}, this m0serve speaks ABI {}.{}",
                abi::M0_ABI_MAJOR,
                abi::M0_ABI_MINOR
            ))
            .fix(REBUILD));
        }
        if minor > abi::M0_ABI_MINOR {
            return Err(PluginError::refused(format!(
                "plugin {shown} needs m0serve ABI {major}.{minor}, newer than this m0serve's {}.{}",
                abi::M0_ABI_MAJOR,
                abi::M0_ABI_MINOR
            ))
            .fix("upgrade m0serve"));
        }
    }
    if size < abi::MIN_PLUGIN_INFO_SIZE {
        return Err(PluginError::refused(format!(
            "plugin {shown}'s M0PluginInfo is {size} bytes, smaller than ABI 1.0's {}",
            abi::MIN_PLUGIN_INFO_SIZE
        ))
        .fix(REBUILD));
    }
    // SAFETY: the descriptor is `size` bytes long (it says so), and an
    // all-zero M0PluginInfo is valid (null strings, everything undeclared).
    let info = unsafe { copy_declared(info, size) };
    Ok(Descriptor::from_info(&info))
}

/// A copy of a plugin's struct made of the bytes its `size` says it has,
/// at most our own `size_of`: a plugin built against an older minor has a
/// shorter struct, and reading our whole struct from it would read past its
/// end. The fields it lacks stay zero, which the ABI reads as undeclared.
///
/// # Safety
/// `src` points to at least `size` readable bytes, and a `T` of all zero
/// bytes is valid (true of M0PluginInfo and M0PluginCalls: integers, raw
/// pointers and optional function pointers).
unsafe fn copy_declared<T>(src: *const T, size: u32) -> T {
    let len = (size as usize).min(std::mem::size_of::<T>());
    let mut out = std::mem::MaybeUninit::<T>::zeroed();
    // SAFETY: `len` bytes are readable at `src` (caller) and writable in
    // `out`; all-zero bytes with any prefix copied over form a valid T
    // (caller), so `assume_init` is sound.
    unsafe {
        std::ptr::copy_nonoverlapping(src.cast::<u8>(), out.as_mut_ptr().cast::<u8>(), len);
        out.assume_init()
    }
}

#[cfg(test)]
mod tests {
    use super::copy_declared;

    /// A struct one field longer than its writer knew, as a descriptor of
    /// a later minor would be to a plugin built before it.
    #[repr(C)]
    #[derive(Debug, PartialEq)]
    struct Grown {
        size: u32,
        old: u32,
        added: u64,
    }

    #[test]
    fn a_shorter_struct_is_copied_up_to_its_size_and_the_rest_reads_zero() {
        // Exactly the bytes the older writer had, in a box of that size, so
        // a read past them would be out of bounds (and caught by Miri or a
        // sanitizer).
        let older: Box<[u32; 2]> = Box::new([8, 7]);
        // SAFETY: 8 readable bytes at the pointer, and an all-zero Grown is valid.
        let copy = unsafe { copy_declared(older.as_ptr().cast::<Grown>(), 8) };
        assert_eq!(
            copy,
            Grown {
                size: 8,
                old: 7,
                added: 0
            }
        );
    }

    #[test]
    fn a_longer_struct_is_copied_up_to_our_size() {
        #[repr(C)]
        struct Newer {
            known: Grown,
            later: u64,
        }
        let newer = Newer {
            known: Grown {
                size: 24,
                old: 5,
                added: 9,
            },
            later: 0xdead,
        };
        // SAFETY: 24 readable bytes, of which we take our 16.
        let copy = unsafe { copy_declared((&raw const newer).cast::<Grown>(), 24) };
        assert_eq!((copy.size, copy.old, copy.added), (24, 5, 9));
        assert_eq!(newer.later, 0xdead);
    }
}
