//! The C ABI from the plugin author's side: the header compiles as C and
//! C++, C lays the structs out as Rust does, and a plugin that breaks the
//! ABI is refused with a message that says what and why.

use std::mem::{offset_of, size_of};
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use m0serve_abi as abi;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{Server, bad_plugin, cc, command, repo_root, scratch_dir};

/// Run the server with a plugin and expect it to stop before serving.
fn refused(plugin: &Path) -> (i32, String) {
    let mut cmd = command(&["--plugin", plugin.to_str().unwrap()]);
    let out = cmd.output_bounded().expect("run m0serve");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn example_plugin_compiles_as_strict_c11_and_as_cpp() {
    let src = repo_root().join("plugins/hello_c/hello.c");
    let dir = scratch_dir("hello_variants");
    cc(
        &["-pedantic", "-shared", src.to_str().unwrap()],
        &dir.join("libhello_pedantic.so"),
    );
    let status = Command::new("c++")
        .args([
            "-x",
            "c++",
            "-std=c++20",
            "-Wall",
            "-Wextra",
            "-Werror",
            "-fsyntax-only",
            "-I",
        ])
        .arg(repo_root().join("include"))
        .arg(&src)
        .status()
        .expect("run c++");
    assert!(status.success(), "hello.c does not compile as C++");
}

#[test]
fn c_lays_out_every_boundary_struct_as_rust_does() {
    let exe = scratch_dir("layout").join("layout");
    cc(
        &[repo_root().join("tests/c/layout.c").to_str().unwrap()],
        &exe,
    );
    let out = Command::new(&exe).output_bounded().expect("run layout");
    let text = String::from_utf8(out.stdout).unwrap();
    let expected: Vec<(&str, usize)> = vec![
        ("M0Str", size_of::<abi::M0Str>()),
        ("M0Header", size_of::<abi::M0Header>()),
        ("M0SockAddr", size_of::<abi::M0SockAddr>()),
        ("M0PluginInfo", size_of::<abi::M0PluginInfo>()),
        ("M0Request", size_of::<abi::M0Request>()),
        ("M0Error", size_of::<abi::M0Error>()),
        ("M0Host", size_of::<abi::M0Host>()),
        ("M0InitArgs", size_of::<abi::M0InitArgs>()),
        ("M0PluginCalls", size_of::<abi::M0PluginCalls>()),
        (
            "M0PluginInfo.max_batch",
            offset_of!(abi::M0PluginInfo, max_batch),
        ),
        (
            "M0PluginInfo.max_batch_bytes",
            offset_of!(abi::M0PluginInfo, max_batch_bytes),
        ),
        ("M0PluginInfo.name", offset_of!(abi::M0PluginInfo, name)),
        ("M0Request.headers", offset_of!(abi::M0Request, headers)),
        (
            "M0Request.content_length",
            offset_of!(abi::M0Request, content_length),
        ),
        ("M0Request.peer", offset_of!(abi::M0Request, peer)),
        ("M0Request.host_data", offset_of!(abi::M0Request, host_data)),
        ("M0Request.flags", offset_of!(abi::M0Request, flags)),
        ("M0Request.queued_ns", offset_of!(abi::M0Request, queued_ns)),
        ("M0Host.log", offset_of!(abi::M0Host, log)),
        ("M0Host.counter_add", offset_of!(abi::M0Host, counter_add)),
        ("M0Host.fact", offset_of!(abi::M0Host, fact)),
        (
            "M0Host.response_reason",
            offset_of!(abi::M0Host, response_reason),
        ),
        ("M0Host.set_ready", offset_of!(abi::M0Host, set_ready)),
        ("M0InitArgs.arg", offset_of!(abi::M0InitArgs, arg)),
        ("M0InitArgs.server", offset_of!(abi::M0InitArgs, server)),
        (
            "M0PluginCalls.handle",
            offset_of!(abi::M0PluginCalls, handle),
        ),
        (
            "M0PluginCalls.shutdown",
            offset_of!(abi::M0PluginCalls, shutdown),
        ),
        ("M0PluginCalls.admit", offset_of!(abi::M0PluginCalls, admit)),
        ("M0Error.message", offset_of!(abi::M0Error, message)),
        (
            "M0Host.model_register",
            offset_of!(abi::M0Host, model_register),
        ),
        (
            "M0Host.request_model",
            offset_of!(abi::M0Host, request_model),
        ),
        (
            "M0Host.model_in_flight",
            offset_of!(abi::M0Host, model_in_flight),
        ),
        (
            "M0Host.metric_define",
            offset_of!(abi::M0Host, metric_define),
        ),
        (
            "M0Host.metric_record",
            offset_of!(abi::M0Host, metric_record),
        ),
        ("M0InitArgs.args", offset_of!(abi::M0InitArgs, args)),
        (
            "M0InitArgs.arg_count",
            offset_of!(abi::M0InitArgs, arg_count),
        ),
    ];
    for (name, rust) in expected {
        let c: usize = text
            .lines()
            .find_map(|l| l.strip_prefix(name).and_then(|r| r.strip_prefix(' ')))
            .unwrap_or_else(|| panic!("layout printed no {name}"))
            .parse()
            .unwrap();
        assert_eq!(c, rust, "{name}: C says {c}, Rust says {rust}");
    }
}

#[test]
fn plugin_built_for_another_major_is_refused_with_78() {
    let (code, err) = refused(&bad_plugin("major2", &["-DABI_MAJOR=2"]));
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("ABI 2.") && err.contains("rebuild"), "{err}");
    assert_eq!(
        err.matches("rebuild").count(),
        1,
        "the fix is said once: {err}"
    );
}

#[test]
fn plugin_built_for_a_newer_minor_is_refused_and_an_older_one_accepted() {
    let (code, err) = refused(&bad_plugin("minor9", &["-DABI_MINOR=9"]));
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("upgrade m0serve"), "{err}");
    // hello_c is built for this minor; a plugin built for minor 0 (before
    // inline calls) loads too, and is never called inline.
    let p = support::plugin("hello_c");
    let s = Server::start(&["--plugin", p.to_str().unwrap()]);
    assert_eq!(support::get(s.addr, "/").status, 200);
    let old = bad_plugin("minor0", &["-DABI_MINOR=0"]);
    let s = Server::start(&["--plugin", old.to_str().unwrap()]);
    // Its handler answers every request with M0_ERR_INTERNAL: a 500 proves
    // it loaded and was called.
    assert_eq!(support::get(s.addr, "/").status, 500);
    assert!(
        s.wait_for_log("inline calls off", Duration::from_secs(10)),
        "{}",
        s.log()
    );
}

/// `tests/c/abi_1_0_plugin.c`, a plugin written against the 1.0 types (its
/// own copies, not today's header), built with `defines`.
fn abi_1_0_plugin(name: &str, defines: &[&str]) -> std::path::PathBuf {
    let out = scratch_dir("abi_1_0_plugins").join(format!("lib{name}.so"));
    let src = repo_root().join("tests/c/abi_1_0_plugin.c");
    let mut args = vec!["-shared", src.to_str().unwrap()];
    args.extend_from_slice(defines);
    cc(&args, &out);
    out
}

/// The `key=value` words of the 1.0 fixture's `/sizes` answer.
fn sizes(s: &Server) -> std::collections::HashMap<String, u64> {
    support::get(s.addr, "/sizes")
        .text()
        .split_whitespace()
        .filter_map(|w| w.split_once('='))
        .map(|(k, v)| (k.to_string(), v.parse().unwrap()))
        .collect()
}

#[test]
fn a_plugin_written_for_abi_1_0_loads_serves_and_is_never_called_inline() {
    let p = abi_1_0_plugin("v1_0", &[]);
    let s = Server::start(&["--plugin", p.to_str().unwrap()]);
    let r = support::get(s.addr, "/");
    assert_eq!(r.status, 200);
    assert_eq!(r.body, b"served by a 1.0 plugin\n");
    assert_eq!(support::get(s.addr, "/elsewhere").status, 404);
    for _ in 0..20 {
        assert_eq!(support::get(s.addr, "/").status, 200);
    }
    // It was handed today's host table and request, both longer than the
    // 1.0 ones it was written against, and no call carried M0_REQ_ON_LOOP.
    let seen = sizes(&s);
    assert_eq!(seen["host"], size_of::<abi::M0Host>() as u64, "{seen:?}");
    assert_eq!(
        seen["host_known"],
        u64::from(abi::MIN_HOST_SIZE),
        "{seen:?}"
    );
    assert!(seen["host"] > seen["host_known"], "{seen:?}");
    assert_eq!(seen["host_minor"], u64::from(abi::M0_ABI_MINOR), "{seen:?}");
    assert!(seen["request"] > seen["request_known"], "{seen:?}");
    assert_eq!(seen["on_loop"], 0, "{seen:?}");
    assert!(
        s.wait_for_log("inline calls off", Duration::from_secs(10)),
        "{}",
        s.log()
    );

    // A 1.0 plugin that sets the bit 1.1 later named M0_CAP_INLINE meant
    // nothing by it: it is still never called on the loop.
    let stray = abi_1_0_plugin("v1_0_stray_bit", &["-DCAPS=4"]);
    let s = Server::start(&["--plugin", stray.to_str().unwrap()]);
    for _ in 0..20 {
        assert_eq!(support::get(s.addr, "/").status, 200);
    }
    assert_eq!(sizes(&s)["on_loop"], 0);
    assert!(
        s.wait_for_log(
            "inline calls off (M0_CAP_INLINE ignored: the plugin is built for ABI 1.0",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
}

#[test]
fn a_batching_plugin_written_for_abi_1_0_is_batched_with_no_byte_limit() {
    // Its descriptor ends before max_batch_bytes (1.3): the host must not
    // read past it, and reads the limit as absent.
    let p = abi_1_0_plugin("v1_0_batch", &["-DBATCH"]);
    let mut s = Server::start(&["--plugin", p.to_str().unwrap()]);
    assert!(
        s.wait_for_log(
            "batching on (up to 4 requests, any number of bytes per call; ",
            Duration::from_secs(10)
        ),
        "{}",
        s.log()
    );
    let addr = s.addr;
    let clients: Vec<_> = (0..16)
        .map(|_| std::thread::spawn(move || support::get(addr, "/")))
        .collect();
    for c in clients {
        let r = c.join().unwrap();
        assert_eq!(r.status, 200);
        assert_eq!(r.body, b"served by a 1.0 plugin\n");
    }
    s.signal(libc::SIGTERM);
    assert!(
        s.wait_exit(Duration::from_secs(10)).is_some(),
        "{}",
        s.log()
    );
    assert!(
        s.log().contains("batching: ") && s.log().contains("for 16 request(s)"),
        "{}",
        s.log()
    );
}

#[test]
fn a_plugin_written_for_abi_1_1_loads_serves_and_is_called_inline() {
    // The same fixture as its author would have built it against the 1.1
    // header: M0Request with `flags`, M0_CAP_INLINE, a host table without
    // 1.2's `fact`.
    let p = abi_1_0_plugin("v1_1", &["-DMINOR_1"]);
    let s = Server::start(&["--plugin", p.to_str().unwrap()]);
    for _ in 0..20 {
        let r = support::get(s.addr, "/");
        assert_eq!(
            (r.status, r.text().as_str()),
            (200, "served by a 1.1 plugin\n")
        );
    }
    assert_eq!(support::get(s.addr, "/elsewhere").status, 404);
    let seen = sizes(&s);
    // Today's host table is longer than the one 1.1 knew (no `fact`), and
    // so is the request (1.5's `queued_ns` after 1.1's `flags`), which the
    // plugin reads no further than it knows.
    assert_eq!(
        seen["host_known"],
        u64::from(abi::MIN_HOST_SIZE),
        "{seen:?}"
    );
    assert!(seen["host"] > seen["host_known"], "{seen:?}");
    assert!(seen["request"] > seen["request_known"], "{seen:?}");
    // Its inline declaration holds: calls came on the loop with the flag.
    assert!(seen["on_loop"] > 0, "{seen:?}\n{}", s.log());
    assert!(!s.log().contains("inline calls off"), "{}", s.log());
}

#[test]
fn missing_entry_point_is_refused_with_78() {
    let (code, err) = refused(&bad_plugin("noinit", &["-DNO_INIT"]));
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("does not export m0_plugin_init"), "{err}");
}

#[test]
fn too_small_descriptor_is_refused_with_78() {
    let (code, err) = refused(&bad_plugin("small", &["-DINFO_SIZE=16"]));
    assert_eq!(code, 78, "{err}");
    assert!(err.contains("M0PluginInfo is 16 bytes"), "{err}");
}

#[test]
fn too_small_calls_table_is_refused_by_the_worker_with_problem_and_fix() {
    // The calls table comes from init, which only a worker runs: the
    // worker's error line says what is wrong and what to do, once each.
    let (code, err) = refused(&bad_plugin("small_calls", &["-DCALLS_SIZE=8"]));
    assert_eq!(code, 78, "{err}");
    let line = err
        .lines()
        .find(|l| l.contains("M0PluginCalls is 8 bytes"))
        .unwrap_or_else(|| panic!("no worker error line:\n{err}"));
    assert!(
        line.contains("smaller than ABI 1.0's 48; rebuild the plugin against"),
        "{line}"
    );
    assert_eq!(line.matches("rebuild").count(), 1, "{line}");
}

#[test]
fn init_refusal_is_78_and_init_failure_is_1_with_the_plugins_message() {
    let (code, err) = refused(&bad_plugin("refuses", &["-DINIT_REFUSES"]));
    assert_eq!(code, 78, "{err}");
    assert!(
        err.contains("refused the configuration: this plugin says no: set FOO to fix it"),
        "{err}"
    );
    let (code, err) = refused(&bad_plugin("fails", &["-DINIT_FAILS"]));
    assert_eq!(code, 1, "{err}");
    assert!(
        err.contains("failed to start: this plugin says no"),
        "{err}"
    );
}

#[test]
fn plugin_that_crashes_while_loading_is_reported_not_fatal_to_the_supervisor() {
    let (code, err) = refused(&bad_plugin("crashes", &["-DCRASH_AT_LOAD"]));
    assert_eq!(code, 1, "{err}");
    assert!(err.contains("crashed while loading"), "{err}");
}

#[test]
fn short_names_are_found_on_m0_plugin_path_and_misses_list_where_we_looked() {
    let dir = scratch_dir("plugin_path");
    std::fs::copy(support::plugin("hello_c"), dir.join("libgreeter.so")).unwrap();
    let mut cmd = command(&["--plugin", "greeter"]);
    cmd.env("M0_PLUGIN_PATH", &dir);
    let s = Server::start_cmd(cmd);
    assert_eq!(support::get(s.addr, "/").body, b"hello, world\n");

    let out = command(&["--plugin", "no_such_plugin"])
        .output_bounded()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("not found")
            && err.contains("; looked for ")
            && err.contains("libno_such_plugin.so"),
        "{err}"
    );
}

#[test]
fn several_args_to_a_plugin_built_before_1_6_are_refused_with_78_naming_it() {
    // A 1.0 plugin sees only M0InitArgs.arg: a second ARG would be dropped
    // without a word, so the server refuses the configuration instead.
    let p = abi_1_0_plugin("v1_0_args", &[]);
    let out = command(&["--plugin", p.to_str().unwrap(), "one", "two"])
        .output_bounded()
        .expect("run m0serve");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(
        err.contains("plugin abi_1_0 takes one ARG") && err.contains("one two"),
        "{err}"
    );
    assert!(err.contains("pass one ARG after --plugin"), "{err}");
    // One ARG is still what it always took.
    let s = Server::start(&["--plugin", p.to_str().unwrap(), "one"]);
    assert_eq!(support::get(s.addr, "/").status, 200);
}
