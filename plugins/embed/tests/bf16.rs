//! bf16 dense layers (issue #54): all-MiniLM-L6-v2's reference sentences
//! and the tiny families' (tests/data/families) embedded with the dense
//! layers' weights and inputs rounded to bf16, against
//! sentence-transformers' f32 vectors at cosine >= 0.9999: through the
//! portable reference kernel on every CPU (which proves the pair layout,
//! the rounding and the bf16 cache), and through this CPU's own kernel
//! (AMX-BF16 or AVX512-BF16) where it has one, with a line saying so where
//! it has none; then the bf16 cache beside the f32 one, and a forced
//! bfloat16 refused on a CPU without bf16.

use std::path::{Path, PathBuf};

use m0_embed::model::{Dtype, LoadOptions, Model, ModelError, dtype_on_this_cpu};

use crate::common::{TempDir, copy_dir, cosine, rows, strings, venv};

/// bf16's cosine to the f32 reference, for every sentence.
const COSINE: f64 = 0.9999;

/// How a test loads the model in bf16.
#[derive(Clone, Copy, Debug)]
enum Kernel {
    /// The portable reference kernel, on any CPU.
    Reference,
    /// This CPU's own ([`Model::load`] with bfloat16).
    Native,
}

fn load(dir: &Path, cache: &Path, threads: usize, kernel: Kernel) -> Result<Model, ModelError> {
    let opts = LoadOptions {
        threads,
        cache_dir: Some(cache.to_path_buf()),
        dtype: Dtype::Bfloat16,
        ..LoadOptions::default()
    };
    match kernel {
        Kernel::Reference => Model::load_bf16_reference(dir, opts),
        Kernel::Native => Model::load(dir, opts),
    }
}

/// The kernels this CPU tests: the reference always, its own when it has
/// one (else a line saying it is skipped).
fn kernels() -> Vec<Kernel> {
    match dtype_on_this_cpu(Dtype::Bfloat16) {
        Ok(_) => vec![Kernel::Reference, Kernel::Native],
        Err(_) => {
            eprintln!(
                "bf16 on this CPU's own kernel: skipped: this CPU lacks avx512_bf16 and amx_bf16"
            );
            vec![Kernel::Reference]
        }
    }
}

/// Sentences, their f32 embeddings (normalized or not as `key` says) from
/// a reference file.
fn read_reference(path: &Path, key: &str) -> (Vec<String>, Vec<Vec<f32>>) {
    let v: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display())),
    )
    .unwrap();
    (strings(&v["sentences"]), rows(&v[key]))
}

/// Every sentence alone and all of them in one batch (normalized and
/// not) at cosine >= [`COSINE`] to the reference; the worst cosine.
fn matches(m: &Model, reference: &Path, what: &str) -> f64 {
    let (sentences, normalized) = read_reference(reference, "embeddings");
    let unnormalized = read_reference(reference, "unnormalized").1;
    let texts: Vec<&str> = sentences.iter().map(String::as_str).collect();
    let enc = m.tokenize(&texts, true).unwrap();
    let dim = m.info().dim;
    let batch = m.embed(&enc, true);
    let raw = m.embed(&enc, false);
    let mut worst = 1f64;
    let mut check = |got: &[f32], want: &[f32], how: String| {
        let c = cosine(got, want);
        assert!(c >= COSINE, "{what}: {how}: cosine {c}");
        worst = worst.min(c);
    };
    for (i, e) in enc.iter().enumerate() {
        let row = i * dim..(i + 1) * dim;
        let one = m.embed(std::slice::from_ref(e), true);
        check(&one, &normalized[i], format!("sentence {i} alone"));
        check(
            &batch[row.clone()],
            &normalized[i],
            format!("sentence {i} in the batch"),
        );
        check(
            &raw[row],
            &unnormalized[i],
            format!("sentence {i} in the batch, raw"),
        );
    }
    eprintln!(
        "{what}: {} sentences, worst cosine {worst:.7}",
        sentences.len()
    );
    worst
}

fn minilm() -> PathBuf {
    venv::minilm_dir(&venv::embed_venv())
}

fn minilm_reference() -> PathBuf {
    venv::repo().join("tests/data/minilm_reference.json")
}

#[test]
fn minilm_in_bf16_matches_sentence_transformers() {
    let dir = minilm();
    for kernel in kernels() {
        let cache = TempDir::new("bf16-minilm");
        for threads in [1, 2] {
            let m = load(&dir, cache.path(), threads, kernel).unwrap_or_else(|e| panic!("{e}"));
            let info = m.info();
            assert_eq!(info.dtype, "bfloat16");
            match kernel {
                Kernel::Reference => assert_eq!(info.kernels, "portable bf16 (reference)"),
                Kernel::Native => assert!(
                    ["amx-bf16", "avx512-bf16"].contains(&info.kernels),
                    "{}",
                    info.kernels
                ),
            }
            matches(
                &m,
                &minilm_reference(),
                &format!("minilm, {kernel:?} kernel, {threads} thread(s)"),
            );
        }
    }
}

#[test]
fn the_families_in_bf16_match_sentence_transformers() {
    let families = venv::repo().join("tests/data/families");
    for kernel in kernels() {
        for family in [
            "roberta",
            "xlm_roberta",
            "camembert",
            "distilbert",
            "mpnet",
            "modernbert",
        ] {
            let dir = families.join(family);
            let cache = TempDir::new("bf16-families");
            let m = load(&dir, cache.path(), 2, kernel).unwrap_or_else(|e| panic!("{family}: {e}"));
            assert_eq!(m.info().dtype, "bfloat16", "{family}");
            matches(
                &m,
                &dir.join("reference.json"),
                &format!("{family}, {kernel:?} kernel"),
            );
        }
    }
}

/// The bf16 cache is a file of its own beside the f32 one (both kept,
/// each reused), smaller by half its dense layers' bytes; an f32 cache put
/// where the bf16 one goes is never read as bf16, but rewritten.
#[test]
fn the_bf16_cache_lives_beside_the_f32_one_and_is_never_taken_for_it() {
    let dir = TempDir::new("bf16-cache");
    copy_dir(&minilm(), dir.path());
    for f in ["model.m0embed", "model.bf16.m0embed"] {
        let _ = std::fs::remove_file(dir.path().join(f));
    }
    let f32_opts = || LoadOptions {
        dtype: Dtype::Float32,
        ..LoadOptions::default()
    };
    let f32_model = Model::load(dir.path(), f32_opts()).unwrap();
    let f32_file = dir.path().join("model.m0embed");
    assert_eq!(
        f32_model.info().weights_file.as_deref(),
        Some(f32_file.as_path())
    );
    assert_eq!(f32_model.info().dtype, "float32");
    let bf16 = || Model::load_bf16_reference(dir.path(), LoadOptions::default()).unwrap();
    let first = bf16();
    let bf16_file = dir.path().join("model.bf16.m0embed");
    assert_eq!(
        first.info().weights_file.as_deref(),
        Some(bf16_file.as_path())
    );
    assert_eq!(first.info().weights_built.as_deref(), Some("missing"));
    // The dense layers: 6 x (384 x 1152 + 384 x 384 + 2 x 384 x 1536)
    // weights, 2 bytes each fewer (padding aside: every k is even and every
    // n a multiple of 64 here).
    let dense = 6 * (384 * 1152 + 384 * 384 + 2 * 384 * 1536);
    assert_eq!(
        f32_model.info().weight_bytes - first.info().weight_bytes,
        2 * dense
    );
    assert_eq!(
        bf16().info().weights_built,
        None,
        "the bf16 cache is reused"
    );
    assert_eq!(
        Model::load(dir.path(), f32_opts())
            .unwrap()
            .info()
            .weights_built,
        None,
        "the f32 cache is still there, reused"
    );
    drop((first, f32_model));
    std::fs::copy(&f32_file, &bf16_file).unwrap();
    let rebuilt = bf16();
    let why = rebuilt.info().weights_built.clone().unwrap_or_default();
    assert!(
        why.starts_with("stale"),
        "an f32 file under the bf16 name: {why}"
    );
    matches(
        &rebuilt,
        &minilm_reference(),
        "minilm from the rewritten bf16 cache",
    );
}

/// `auto` is float32 on a CPU without bf16 and bfloat16 on one with it;
/// a forced bfloat16 without it is refused, naming the missing features,
/// the variable and the fix.
#[test]
fn a_forced_bfloat16_needs_a_bf16_cpu_and_auto_follows_the_cpu() {
    let has_bf16 = dtype_on_this_cpu(Dtype::Bfloat16).is_ok();
    let auto = dtype_on_this_cpu(Dtype::Auto).unwrap();
    assert_eq!(auto, if has_bf16 { "bfloat16" } else { "float32" });
    assert_eq!(dtype_on_this_cpu(Dtype::Float32).unwrap(), "float32");
    let cache = TempDir::new("bf16-refused");
    let loaded = load(&minilm(), cache.path(), 1, Kernel::Native);
    if has_bf16 {
        assert_eq!(loaded.unwrap().info().dtype, "bfloat16");
        eprintln!("the refusal of a forced bfloat16: skipped: this CPU has bf16");
        return;
    }
    let e = loaded.unwrap_err().to_string();
    for part in [
        "M0_EMBED_DTYPE=bfloat16",
        "avx512_bf16",
        "amx_bf16",
        "float32",
    ] {
        assert!(e.contains(part), "{part} in {e}");
    }
    assert!(
        std::fs::read_dir(cache.path()).unwrap().next().is_none(),
        "refused before any cache is written"
    );
}
