//! all-mpnet-base-v2, the real MPNet (12 layers, 768 wide, up to 384
//! tokens: attention's long path with the relative bias as well as the
//! short one), against sentence-transformers' vectors in
//! tests/data/mpnet_reference.json: every sentence alone and all of them
//! in one batch, normalized and not, on 1 and 2 threads, ids as the
//! reference's. The weights are not in the repository:
//! `tests/data/make_mpnet_reference.py assemble target/all-mpnet-base-v2`
//! puts them where this test looks; without them it says it skipped.

use m0_embed::model::{LoadOptions, Model};

use crate::common::{TempDir, cosine, rows, venv};

#[test]
fn all_mpnet_base_v2_matches_sentence_transformers() {
    let dir = venv::repo().join("target/all-mpnet-base-v2");
    if !dir.join("model.safetensors").is_file() {
        eprintln!(
            "skipped: all-mpnet-base-v2 is not at {} (run tests/data/make_mpnet_reference.py \
             assemble target/all-mpnet-base-v2)",
            dir.display()
        );
        return;
    }
    let path = venv::repo().join("tests/data/mpnet_reference.json");
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    let sentences: Vec<&str> = v["sentences"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let ids: Vec<Vec<u32>> = v["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            r.as_array()
                .unwrap()
                .iter()
                .map(|x| x.as_u64().unwrap() as u32)
                .collect()
        })
        .collect();
    let (embeddings, unnormalized) = (rows(&v["embeddings"]), rows(&v["unnormalized"]));
    let cache = TempDir::new("all-mpnet-cache");
    let mut worst = 1f64;
    for threads in [1, 2] {
        let m = Model::load(
            &dir,
            LoadOptions {
                threads,
                cache_dir: Some(cache.path().to_path_buf()),
                ..LoadOptions::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let info = m.info();
        assert_eq!(info.architecture, "mpnet");
        assert_eq!((info.dim, info.max_len), (768, 384));
        let enc = m.tokenize(&sentences, true).unwrap();
        for (e, want) in enc.iter().zip(&ids) {
            assert_eq!(e.ids(), want.as_slice(), "ids");
        }
        let dim = info.dim;
        let batch = m.embed(&enc, true);
        let raw = m.embed(&enc, false);
        let mut check = |got: &[f32], want: &[f32], what: &str| {
            let c = cosine(got, want);
            assert!(c >= 0.9999, "threads {threads} {what}: cosine {c}");
            worst = worst.min(c);
        };
        for (i, e) in enc.iter().enumerate() {
            let row = i * dim..(i + 1) * dim;
            let what = format!("sentence {i} ({} tokens)", ids[i].len());
            check(
                &m.embed(std::slice::from_ref(e), true),
                &embeddings[i],
                &format!("{what} alone"),
            );
            check(
                &batch[row.clone()],
                &embeddings[i],
                &format!("{what} in the batch"),
            );
            check(
                &raw[row],
                &unnormalized[i],
                &format!("{what} in the batch, raw"),
            );
        }
    }
    eprintln!(
        "all-mpnet-base-v2: {} sentences, worst cosine 1 - {:.1e}",
        sentences.len(),
        1.0 - worst
    );
}
