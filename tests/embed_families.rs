//! The encoder families beyond BERT over real sockets: each tiny folder of
//! tests/data/families (made once with transformers and
//! sentence-transformers by make_families.py beside them) served by the
//! embed plugin, its vectors checked against the folder's reference.json
//! alone and in concurrent mixed batches, unnormalized too; `--doctor`
//! names the architecture; a `model_type` not served is refused with 78,
//! naming it and the ones served.

use std::path::PathBuf;

use serde_json::json;

use crate::support::embed::{
    check_alone_and_mixed, cosine, embed_doctor, embeddable, post, reference_at, serve_dir, vectors,
};
use crate::support::test_dir::TestDir;
use crate::support::{Client, repo_root};

/// Each folder and the architecture the plugin reports for it.
const FAMILIES: [(&str, &str); 6] = [
    ("xlm_roberta", "xlm-roberta"),
    ("roberta", "roberta"),
    ("camembert", "camembert"),
    ("distilbert", "distilbert"),
    ("mpnet", "mpnet"),
    ("modernbert", "modernbert"),
];

fn folder(name: &str) -> PathBuf {
    repo_root().join("tests/data/families").join(name)
}

#[test]
fn every_family_matches_sentence_transformers_alone_and_in_concurrent_mixed_batches() {
    // The packed weights go to a folder of this test, not beside the
    // checked-in model.
    let cache = TestDir::new("embed_families_cache");
    let env = [("M0_EMBED_CACHE_DIR", cache.to_str().unwrap())];
    for (name, _) in FAMILIES {
        let dir = folder(name);
        let r = reference_at(&dir.join("reference.json"));
        for mode in [
            &["--workers", "1"][..],
            &["--workers", "2", "--spawn-workers"][..],
        ] {
            let s = serve_dir(&dir, mode, &env);
            check_alone_and_mixed(&s, &r);
            // normalize=false: the pooled vectors before any Normalize.
            let mut c = Client::connect(s.addr);
            for i in embeddable(&r) {
                let body = json!({"inputs": r.sentences[i], "truncate": true, "normalize": false});
                let (status, v, _) = post(&mut c, "/embed", &body);
                assert_eq!(status, 200, "{name}: {v}");
                let got = vectors(&v);
                let cos = cosine(&got[0], &r.unnormalized[i]);
                assert!(
                    cos >= 0.9999,
                    "{name} sentence {i} unnormalized: cosine {cos}"
                );
                let norm = |x: &[f64]| x.iter().map(|a| a * a).sum::<f64>().sqrt();
                let ratio = norm(&got[0]) / norm(&r.unnormalized[i]);
                assert!(
                    (ratio - 1.0).abs() < 1e-4,
                    "{name} sentence {i}: norm ratio {ratio}"
                );
            }
            assert_eq!(s.log_count("replacing it"), 0, "{name}: {}", s.log());
        }
    }
}

#[test]
fn the_doctor_names_each_families_architecture() {
    let cache = TestDir::new("embed_families_doctor");
    let env = [("M0_EMBED_CACHE_DIR", cache.to_str().unwrap())];
    for (name, arch) in FAMILIES {
        let (code, v) = embed_doctor(&folder(name), &env);
        assert_eq!(code, Some(0), "{name}: {v}");
        assert_eq!(
            v["plugin"]["facts"]["embed.architecture"], arch,
            "{name}: {v}"
        );
    }
}

#[test]
fn a_model_type_not_served_is_refused_with_78_naming_it_and_the_served_ones() {
    let dir = TestDir::new("embed_families_t5");
    for entry in std::fs::read_dir(folder("distilbert")).unwrap() {
        let entry = entry.unwrap();
        if entry.file_type().unwrap().is_file() {
            std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
        }
    }
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(&config, text.replace("\"distilbert\"", "\"t5\"")).unwrap();
    let (code, v) = embed_doctor(&dir, &[]);
    assert_eq!(code, Some(78), "{v}");
    let said = v.to_string();
    assert!(said.contains("t5"), "{said}");
    for (_, arch) in FAMILIES {
        assert!(said.contains(arch), "{arch} not named: {said}");
    }
}
