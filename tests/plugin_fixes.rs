//! Fixes that help: a misspelt `--plugin` gets "did you mean" and the
//! plugins found, and a plugin's refusal carries the plugin's own fix in
//! the check's `fix`, not a generic one.

use std::process::Command;

use crate::support;
use crate::support::OutputBounded;
use crate::support::{binary, plugin};

fn m0serve(args: &[&str]) -> Command {
    let mut cmd = Command::new(binary());
    cmd.args(["--port", "0"])
        .args(args)
        .env_remove("M0_PLUGIN")
        .env_remove("M0_PLUGIN_PATH")
        .env_remove("M0_WORKERS");
    cmd
}

fn doctor(args: &[&str]) -> (Option<i32>, serde_json::Value) {
    support::doctor_json(&m0serve(args).arg("--doctor").output_bounded().unwrap())
}

fn failed_check(j: &serde_json::Value) -> &serde_json::Value {
    j["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["ok"] == false)
        .unwrap_or_else(|| panic!("no failed check: {j:#}"))
}

#[test]
fn a_misspelt_plugin_gets_did_you_mean_and_the_plugins_found() {
    // Built beside the binary, where the lookup finds them.
    plugin("hello_c");
    plugin("hello_rs");
    let (code, j) = doctor(&["--plugin", "helo_c"]);
    assert_eq!(code, Some(1), "{j:#}");
    let check = failed_check(&j);
    assert_eq!(check["name"], "plugin");
    let detail = check["detail"].as_str().unwrap();
    assert!(detail.contains("did you mean hello_c?"), "{detail}");
    let found = detail
        .split("plugins found: ")
        .nth(1)
        .unwrap_or_else(|| panic!("no list of plugins found: {detail}"));
    assert!(
        found.contains("hello_c") && found.contains("hello_rs"),
        "{detail}"
    );
    assert_eq!(check["fix"], "pass --plugin hello_c", "{j:#}");
    let listed: Vec<&str> = j["plugin"]["found"]
        .as_array()
        .expect("plugin.found")
        .iter()
        .map(|v| v.as_str().unwrap())
        .collect();
    assert!(
        listed.contains(&"hello_c") && listed.contains(&"hello_rs"),
        "{listed:?}"
    );

    // The server says the same on its log, as an error line.
    let out = m0serve(&["--plugin", "helo_c"]).output_bounded().unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("[ERROR] ") && err.contains("did you mean hello_c?"),
        "{err}"
    );
    assert!(err.contains("pass --plugin hello_c"), "{err}");

    // Nothing like it: no guess, the list and what to do.
    let (_, j) = doctor(&["--plugin", "flask"]);
    let check = failed_check(&j);
    let detail = check["detail"].as_str().unwrap();
    assert!(!detail.contains("did you mean"), "{detail}");
    assert!(detail.contains("plugins found: "), "{detail}");
    assert!(
        check["fix"].as_str().unwrap().contains("M0_PLUGIN_PATH"),
        "{j:#}"
    );
}

#[test]
fn a_plugins_refusal_carries_its_own_fix() {
    let faults = plugin("sdk_faults");
    let (code, j) = doctor(&["--plugin", faults.to_str().unwrap(), "refuse-init"]);
    assert_eq!(code, Some(78), "{j:#}");
    let check = failed_check(&j);
    assert_eq!(check["name"], "plugin-init", "{j:#}");
    assert_eq!(check["fix"], "pass another ARG", "{j:#}");
    let detail = check["detail"].as_str().unwrap();
    assert!(
        detail.ends_with("ARG refuse-init refuses the configuration"),
        "{detail}"
    );

    // A failure with no fix in its message keeps the server's own.
    let (code, j) = doctor(&["--plugin", faults.to_str().unwrap(), "fail-init"]);
    assert_eq!(code, Some(1), "{j:#}");
    assert_eq!(
        failed_check(&j)["fix"],
        "fix the application or its arguments",
        "{j:#}"
    );
}
