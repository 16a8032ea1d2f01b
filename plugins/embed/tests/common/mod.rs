//! Shared by the embed plugin's integration tests: temp folders, the tiny
//! BERT that tests/embed/tiny_bert.py writes, reference files, cosine.

#[path = "../../../../tests/support/venv.rs"]
pub mod venv;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A folder removed when dropped.
pub struct TempDir(pub PathBuf);

impl TempDir {
    pub fn new(tag: &str) -> TempDir {
        static N: AtomicUsize = AtomicUsize::new(0);
        let p = std::env::temp_dir().join(format!(
            "m0-embed-{tag}-{}-{}",
            std::process::id(),
            N.fetch_add(1, Ordering::Relaxed)
        ));
        let _ = std::fs::remove_dir_all(&p);
        std::fs::create_dir_all(&p).expect("create a temp dir");
        TempDir(p)
    }

    pub fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A tiny random BERT folder from tests/embed/tiny_bert.py, with `args`
/// (e.g. `--pooling cls --normalize --prefix bert.`).
pub fn tiny_bert(args: &[&str]) -> TempDir {
    let dir = TempDir::new("tiny");
    let venv = venv::embed_venv();
    let script = venv::repo().join("tests/embed/tiny_bert.py");
    let out = Command::new(venv::venv_python(&venv))
        .arg(&script)
        .arg("make")
        .arg(dir.path())
        .args(args)
        .output()
        .expect("run tiny_bert.py");
    assert!(
        out.status.success(),
        "tiny_bert.py make failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    dir
}

/// A reference file's list of strings (its `sentences`).
pub fn strings(v: &serde_json::Value) -> Vec<String> {
    v.as_array()
        .expect("a list of strings")
        .iter()
        .map(|s| s.as_str().expect("a string").to_owned())
        .collect()
}

/// A reference file's token ids, a list per sentence.
pub fn id_rows(v: &serde_json::Value) -> Vec<Vec<u32>> {
    v.as_array()
        .expect("a list of id lists")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("a list of ids")
                .iter()
                .map(|x| x.as_u64().expect("an id") as u32)
                .collect()
        })
        .collect()
}

pub fn rows(v: &serde_json::Value) -> Vec<Vec<f32>> {
    v.as_array()
        .expect("a list of rows")
        .iter()
        .map(|r| {
            r.as_array()
                .expect("a row")
                .iter()
                .map(|x| x.as_f64().expect("a number") as f32)
                .collect()
        })
        .collect()
}

pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let dot: f64 = a.iter().zip(b).map(|(x, y)| *x as f64 * *y as f64).sum();
    let na: f64 = a.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    let nb: f64 = b.iter().map(|x| (*x as f64).powi(2)).sum::<f64>().sqrt();
    if na == 0.0 && nb == 0.0 {
        return 1.0;
    }
    dot / (na * nb)
}

pub fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
    a.iter()
        .zip(b)
        .map(|(x, y)| (x - y).abs())
        .fold(0.0, f32::max)
}

/// Copies a model folder (files and one level of subfolders).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap().flatten() {
        let p = e.path();
        if p.is_dir() {
            copy_dir(&p, &to.join(e.file_name()));
        } else {
            std::fs::copy(&p, to.join(e.file_name())).unwrap();
        }
    }
}
