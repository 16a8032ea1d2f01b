//! The `M0InitArgs` a plugin's init is called with, built from the
//! configuration and what the caller decided (worker index, pool size,
//! the address served). The worker and the doctor's probe child both build
//! them here, so a plugin is started with the same arguments in both.

use std::ffi::CString;

use m0serve_abi as abi;

use crate::config::Config;

/// `M0InitArgs` and the strings it points into.
pub struct InitArgsOwned {
    pub args: abi::M0InitArgs,
    _strings: Vec<CString>,
    /// The views of every ARG that `args.args` points at.
    _arg_views: Vec<abi::M0Str>,
}

impl InitArgsOwned {
    pub fn new(
        cfg: &Config,
        index: u32,
        spawned: bool,
        handler_threads: u32,
        max_handler_threads: u32,
        server_ip: &str,
        port: u16,
    ) -> InitArgsOwned {
        let venv = cfg
            .cli
            .venv
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        let mut strings = vec![
            CString::new(cfg.cli.app_dir.display().to_string()).unwrap_or_default(),
            CString::new(venv).unwrap_or_default(),
            CString::new(server_ip).unwrap_or_default(),
        ];
        // The ARGs follow, in order; a string with a NUL cannot come from a
        // command line, and is empty here.
        strings.extend(
            cfg.cli
                .args
                .iter()
                .map(|a| CString::new(a.as_str()).unwrap_or_default()),
        );
        let view = |i: usize| abi::M0Str::from_bytes(strings[i].as_bytes());
        let arg_views: Vec<abi::M0Str> = (3..strings.len()).map(view).collect();
        let args = abi::M0InitArgs {
            size: std::mem::size_of::<abi::M0InitArgs>() as u32,
            worker_index: index,
            workers: cfg.cli.workers,
            handler_threads,
            max_handler_threads,
            spawned: u32::from(spawned),
            arg: arg_views.first().copied().unwrap_or(abi::M0Str::EMPTY),
            app_dir: view(0),
            venv: view(1),
            server: abi::M0SockAddr { ip: view(2), port },
            args: if arg_views.is_empty() {
                std::ptr::null()
            } else {
                arg_views.as_ptr()
            },
            arg_count: arg_views.len(),
        };
        // The views point into the CStrings' heap buffers and `args` into
        // the views' buffer, none of which moves when its Vec does.
        InitArgsOwned {
            args,
            _strings: strings,
            _arg_views: arg_views,
        }
    }
}
