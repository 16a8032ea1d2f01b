//! What the host tells the plugin at init, as owned Rust values.

use std::path::PathBuf;

use m0serve_abi::{M0InitArgs, M0Str};

/// The worker the plugin starts in and the command line's say.
#[derive(Clone, Debug)]
pub struct InitArgs {
    /// This worker's index, from 0.
    pub worker_index: u32,
    /// Worker processes in all.
    pub workers: u32,
    /// Handler threads this worker starts with.
    pub handler_threads: u32,
    /// Most handler threads this worker may grow to.
    pub max_handler_threads: u32,
    /// Whether the worker was started by fork+exec.
    pub spawned: bool,
    /// The ARG after `--plugin` on the command line (may be empty). Bytes
    /// that are not UTF-8 are replaced.
    pub arg: String,
    /// `--app-dir` (`.` when unset).
    pub app_dir: PathBuf,
    /// `--venv`, when set.
    pub venv: Option<PathBuf>,
    /// The listener's address.
    pub server_ip: String,
    pub server_port: u16,
}

fn bytes(s: &M0Str) -> &[u8] {
    // SAFETY: the host's views are valid for the whole init call, during
    // which this runs.
    unsafe { s.as_bytes() }
}

fn path(s: &M0Str) -> PathBuf {
    use std::os::unix::ffi::OsStrExt;
    PathBuf::from(std::ffi::OsStr::from_bytes(bytes(s)))
}

impl InitArgs {
    /// # Safety
    /// `args` is NULL or the host's valid `M0InitArgs` for the init call.
    pub(crate) unsafe fn read(args: *const M0InitArgs) -> Result<InitArgs, String> {
        if args.is_null() {
            return Err("the host passed no init arguments".into());
        }
        // SAFETY: non-null and valid for the call (the caller's contract).
        let args = unsafe { &*args };
        if (args.size as usize) < size_of::<M0InitArgs>() {
            return Err(format!(
                "the host's init arguments are {} bytes, this plugin needs {}: upgrade m0serve",
                args.size,
                size_of::<M0InitArgs>()
            ));
        }
        let app_dir = path(&args.app_dir);
        Ok(InitArgs {
            worker_index: args.worker_index,
            workers: args.workers,
            handler_threads: args.handler_threads,
            max_handler_threads: args.max_handler_threads,
            spawned: args.spawned != 0,
            arg: String::from_utf8_lossy(bytes(&args.arg)).into_owned(),
            app_dir: if app_dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                app_dir
            },
            venv: Some(path(&args.venv)).filter(|p| !p.as_os_str().is_empty()),
            server_ip: String::from_utf8_lossy(bytes(&args.server.ip)).into_owned(),
            server_port: args.server.port,
        })
    }
}
