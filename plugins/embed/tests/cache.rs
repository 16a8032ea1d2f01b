//! The packed weights cache: written once, then found and mapped shared;
//! rebuilt, never trusted, when damaged or stale; written once however
//! many loads race; its layout what the crate docs tell a Python backend
//! (tests/embed/read_cache.py reads it with numpy against the
//! safetensors); an unusable cache folder refused naming the variable.

use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use m0_embed::model::{CACHE_FILE_NAME, LoadOptions, Model};
use m0_embed::settings::ENV_CACHE_DIR;

use crate::common::{TempDir, tiny_bert, venv};

fn load(dir: &Path, cache_dir: Option<&Path>) -> Model {
    Model::load(
        dir,
        LoadOptions {
            cache_dir: cache_dir.map(Path::to_path_buf),
            ..LoadOptions::default()
        },
    )
    .unwrap_or_else(|e| panic!("{e}"))
}

/// The embeddings of a few sentences of the tiny vocabulary, as bits.
fn bits(m: &Model) -> Vec<u32> {
    let batch = m
        .tokenize(&["the cat sat on the mat", "a dog", "hello world"], true)
        .unwrap();
    m.embed(&batch, false).iter().map(|f| f.to_bits()).collect()
}

fn built(m: &Model) -> Option<String> {
    m.info().weights_built.clone()
}

/// Lines of /proc/self/maps that map `path`, with the inode of each.
fn mapped_inodes(path: &Path) -> Vec<u64> {
    let maps = std::fs::read_to_string("/proc/self/maps").unwrap();
    let want = std::fs::canonicalize(path).unwrap();
    maps.lines()
        .filter(|l| l.ends_with(want.to_str().unwrap()))
        .map(|l| l.split_whitespace().nth(4).unwrap().parse().unwrap())
        .collect()
}

#[test]
fn the_cache_is_written_once_then_mapped_and_a_damaged_or_stale_one_is_rebuilt() {
    let dir = tiny_bert(&["--normalize"]);
    let cache = dir.path().join(CACHE_FILE_NAME);
    let first = load(dir.path(), None);
    assert_eq!(built(&first).as_deref(), Some("missing"));
    assert_eq!(first.info().weights_file.as_deref(), Some(cache.as_path()));
    let want = bits(&first);
    assert_eq!(mapped_inodes(&cache).len(), 1, "the cache is mapped once");
    let again = load(dir.path(), None);
    assert_eq!(built(&again), None, "a valid cache is used as it is");
    assert_eq!(bits(&again), want);
    drop((first, again));

    let len = std::fs::metadata(&cache).unwrap().len();
    type Damage = Box<dyn Fn(&Path)>;
    let cases: Vec<(&str, Damage)> = vec![
        (
            "damaged: checksum mismatch",
            Box::new(move |p| {
                let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.seek(SeekFrom::Start(len - len / 3)).unwrap();
                f.write_all(&[0x5a; 3]).unwrap();
            }),
        ),
        (
            "damaged: ",
            Box::new(move |p| {
                let f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.set_len(len / 2).unwrap();
            }),
        ),
        (
            "damaged: not a packed weights cache",
            Box::new(|p| std::fs::write(p, [0xab; 1000]).unwrap()),
        ),
        (
            "damaged: cannot be mapped",
            Box::new(|p| std::fs::write(p, []).unwrap()),
        ),
        (
            "stale: layout version",
            Box::new(|p| {
                let mut f = std::fs::OpenOptions::new().write(true).open(p).unwrap();
                f.seek(SeekFrom::Start(8)).unwrap();
                f.write_all(&99u32.to_le_bytes()).unwrap();
            }),
        ),
        (
            "stale: model.safetensors changed",
            Box::new(|p| {
                let st = p.parent().unwrap().join("model.safetensors");
                let f = std::fs::File::options().write(true).open(st).unwrap();
                let t = std::time::SystemTime::now() + std::time::Duration::from_secs(5);
                f.set_modified(t).unwrap();
            }),
        ),
    ];
    for (why, damage) in cases {
        damage(&cache);
        let m = load(dir.path(), None);
        let got = built(&m).unwrap_or_default();
        assert!(got.starts_with(why), "{why}: rebuilt because {got:?}");
        assert_eq!(bits(&m), want, "{why}: the rebuilt cache computes the same");
        assert_eq!(std::fs::metadata(&cache).unwrap().len(), len, "{why}");
        assert_eq!(built(&load(dir.path(), None)), None, "{why}: rebuilt valid");
    }
}

#[test]
fn concurrent_loads_write_the_cache_once_and_all_map_the_same_file() {
    let dir = tiny_bert(&[]);
    let n = 6;
    let barrier = std::sync::Barrier::new(n);
    let models: Vec<Model> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..n)
            .map(|_| {
                s.spawn(|| {
                    barrier.wait();
                    load(dir.path(), None)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let writers = models.iter().filter(|m| built(m).is_some()).count();
    assert_eq!(writers, 1, "exactly one load wrote the cache");
    let cache = dir.path().join(CACHE_FILE_NAME);
    let inodes = mapped_inodes(&cache);
    assert_eq!(inodes.len(), n, "every model maps the cache");
    let on_disk = std::os::unix::fs::MetadataExt::ino(&std::fs::metadata(&cache).unwrap());
    assert!(
        inodes.iter().all(|&i| i == on_disk),
        "{inodes:?} vs {on_disk}"
    );
    let want = bits(&models[0]);
    assert!(models.iter().all(|m| bits(m) == want));
    // No temporary file is left behind, only the cache and its lock.
    let stray: Vec<PathBuf> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.to_string_lossy().ends_with(".tmp"))
        .collect();
    assert!(stray.is_empty(), "{stray:?}");
}

#[test]
fn a_cache_dir_takes_the_cache_and_an_unusable_one_is_refused_naming_the_variable() {
    let dir = tiny_bert(&[]);
    let caches = TempDir::new("caches");
    let place = caches.path().join("nested/cache");
    let m = load(dir.path(), Some(&place));
    let file = m.info().weights_file.clone().unwrap();
    assert_eq!(file.parent(), Some(place.as_path()));
    assert!(!dir.path().join(CACHE_FILE_NAME).exists());
    let not_a_dir = caches.path().join("a_file");
    std::fs::write(&not_a_dir, b"x").unwrap();
    let e = Model::load(
        dir.path(),
        LoadOptions {
            cache_dir: Some(not_a_dir.clone()),
            ..LoadOptions::default()
        },
    )
    .unwrap_err();
    assert_eq!(e.file, not_a_dir);
    assert!(e.message.contains(ENV_CACHE_DIR), "{e}");
    assert!(e.fix.contains(ENV_CACHE_DIR), "{e}");
}

#[test]
fn a_python_backend_reads_the_cache_with_numpy_as_the_docs_say() {
    for args in [&["--prefix", "bert."][..], &["--f16"][..]] {
        let dir = tiny_bert(args);
        let m = load(dir.path(), None);
        let cache = m.info().weights_file.clone().unwrap();
        let out = Command::new(venv::venv_python(&venv::embed_venv()))
            .arg(venv::repo().join("tests/embed/read_cache.py"))
            .arg("check")
            .arg(dir.path())
            .arg(&cache)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        // 3 embedding tensors + a LayerNorm, then 2 layers of 4 dense
        // layers and 2 LayerNorms, each two tensors.
        assert_eq!(v["checked"], 3 + 2 + 2 * 12, "{args:?}: {v}");
    }
}
