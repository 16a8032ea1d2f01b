//! What the host tells the plugin at init, as owned Rust values.

use std::path::PathBuf;

use m0serve_abi::{INIT_ARGS_ARGS_END, M0InitArgs, M0SockAddr, M0Str, covers};

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
    /// The first ARG after `--plugin` on the command line (empty when
    /// there is none). Bytes that are not UTF-8 are replaced.
    pub arg: String,
    /// Every ARG after `--plugin`, in order (ABI 1.6; from an older host,
    /// `arg` alone when it is not empty).
    pub args: Vec<String>,
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
        // SAFETY: non-null, and `size` is the first field of every version.
        let size = unsafe { (*args).size };
        // Every host hands at least the 1.0 struct, which ends at `server`.
        let least = core::mem::offset_of!(M0InitArgs, server) + size_of::<M0SockAddr>();
        if (size as usize) < least {
            return Err(format!(
                "the host's init arguments are {size} bytes, this plugin needs at least \
                 {least}: upgrade m0serve"
            ));
        }
        // The struct is read field by field through the pointer, never as
        // a whole: an older host's is shorter than ours.
        // SAFETY: valid for the call (the caller's contract), and the size
        // check covers each 1.0 field read here.
        let (arg, app_dir, venv, server) =
            unsafe { ((*args).arg, (*args).app_dir, (*args).venv, (*args).server) };
        // SAFETY: as above.
        let (worker_index, workers, handler_threads, max_handler_threads, spawned) = unsafe {
            (
                (*args).worker_index,
                (*args).workers,
                (*args).handler_threads,
                (*args).max_handler_threads,
                (*args).spawned,
            )
        };
        let first = String::from_utf8_lossy(bytes(&arg)).into_owned();
        let all = if covers(size, INIT_ARGS_ARGS_END) {
            // SAFETY: `size` covers both fields; the host hands `arg_count`
            // views at `args` (NULL only with none), valid for the call.
            let (ptr, count) = unsafe { ((*args).args, (*args).arg_count) };
            if ptr.is_null() || count == 0 {
                Vec::new()
            } else {
                // SAFETY: as above.
                unsafe { std::slice::from_raw_parts(ptr, count) }
                    .iter()
                    .map(|a| String::from_utf8_lossy(bytes(a)).into_owned())
                    .collect()
            }
        } else if first.is_empty() {
            Vec::new()
        } else {
            vec![first.clone()]
        };
        let app_dir = path(&app_dir);
        Ok(InitArgs {
            worker_index,
            workers,
            handler_threads,
            max_handler_threads,
            spawned: spawned != 0,
            arg: first,
            args: all,
            app_dir: if app_dir.as_os_str().is_empty() {
                PathBuf::from(".")
            } else {
                app_dir
            },
            venv: Some(path(&venv)).filter(|p| !p.as_os_str().is_empty()),
            server_ip: String::from_utf8_lossy(bytes(&server.ip)).into_owned(),
            server_port: server.port,
        })
    }
}
