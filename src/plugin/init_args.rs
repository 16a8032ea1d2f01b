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
        let strings = vec![
            CString::new(cfg.cli.arg.clone().unwrap_or_default()).unwrap_or_default(),
            CString::new(cfg.cli.app_dir.display().to_string()).unwrap_or_default(),
            CString::new(venv).unwrap_or_default(),
            CString::new(server_ip).unwrap_or_default(),
        ];
        let view = |i: usize| abi::M0Str::from_bytes(strings[i].as_bytes());
        let args = abi::M0InitArgs {
            size: std::mem::size_of::<abi::M0InitArgs>() as u32,
            worker_index: index,
            workers: cfg.cli.workers,
            handler_threads,
            max_handler_threads,
            spawned: u32::from(spawned),
            arg: view(0),
            app_dir: view(1),
            venv: view(2),
            server: abi::M0SockAddr { ip: view(3), port },
        };
        // The views point into the CStrings' heap buffers, which do not move
        // when the Vec does.
        InitArgsOwned {
            args,
            _strings: strings,
        }
    }
}
