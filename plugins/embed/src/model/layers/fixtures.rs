//! The blocks checked together against sentence-transformers: naive
//! ModernBERT and MPNet forward passes (plain loops for the dense layers
//! and norms, this folder's kernels for rotary, window, bias and GeGLU)
//! over the tiny fixtures of tests/data/families/, one sentence at a time,
//! must give reference.json's pooled vectors. A wrong theta, window, bias
//! bucket or activation moves the cosines well below the 0.9999 asked
//! (tests/data/families/README.md measured how far). The served
//! ModernBERT encoder is then held to the naive pass past the fixture's
//! 40 tokens, where no reference reaches (RoPE has no position table, so
//! the folder takes 64).
//!
//! The fixtures are files: safetensors read here by hand, no torch.

use super::geglu::geglu;
use super::relative_bias::RelativeBias;
use super::rotary::{Rotary, positions};
use super::window::attention_head_banded;
use crate::model::kernels::{self, Isa, padded};
use crate::model::test_support::isas;
use serde_json::Value;
use std::collections::HashMap;

fn family(name: &str) -> std::path::PathBuf {
    std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/data/families")
        .join(name)
}

/// Every F32 tensor of the folder's model.safetensors, by name.
fn tensors(dir: &std::path::Path) -> HashMap<String, Vec<f32>> {
    let bytes = std::fs::read(dir.join("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    let header: Value = serde_json::from_slice(&bytes[8..8 + n]).unwrap();
    let data = &bytes[8 + n..];
    let mut out = HashMap::new();
    for (name, e) in header.as_object().unwrap() {
        if name == "__metadata__" {
            continue;
        }
        assert_eq!(e["dtype"], "F32", "{name}");
        let off = &e["data_offsets"];
        let (a, b) = (off[0].as_u64().unwrap(), off[1].as_u64().unwrap());
        let v = data[a as usize..b as usize]
            .chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect();
        out.insert(name.clone(), v);
    }
    out
}

fn json(path: std::path::PathBuf) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

/// y[m, n] = x[m, k] W^T (+ b), W as safetensors' `[n, k]`.
fn linear(x: &[f32], w: &[f32], b: Option<&[f32]>, k: usize) -> Vec<f32> {
    let n = w.len() / k;
    let mut y = Vec::with_capacity(x.len() / k * n);
    for row in x.chunks_exact(k) {
        for o in 0..n {
            let dot: f64 = (0..k).map(|i| row[i] as f64 * w[o * k + i] as f64).sum();
            y.push((dot + b.map_or(0.0, |b| b[o] as f64)) as f32);
        }
    }
    y
}

/// Per row: layer_norm(x) * g (+ b).
fn layer_norm(x: &mut [f32], g: &[f32], b: Option<&[f32]>, eps: f64) {
    for row in x.chunks_exact_mut(g.len()) {
        let n = row.len() as f64;
        let mean = row.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = row.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        for (i, v) in row.iter_mut().enumerate() {
            let y = (*v as f64 - mean) / (var + eps).sqrt() * g[i] as f64;
            *v = (y + b.map_or(0.0, |b| b[i] as f64)) as f32;
        }
    }
}

/// One sequence's multi-head attention over `qkv` (`[len, 3 hidden]`):
/// each head through [`attention_head_banded`], `bias(head)` its bias.
fn attention<'a>(
    isa: Isa,
    qkv: &[f32],
    len: usize,
    hidden: usize,
    heads: usize,
    half: usize,
    bias: impl Fn(usize) -> &'a [f32],
) -> Vec<f32> {
    let dh = hidden / heads;
    let mut ctx = vec![0f32; len * hidden];
    let mut out = vec![0f32; len * dh];
    let mut kt = vec![0f32; dh * padded(len)];
    let mut scores = vec![0f32; padded(len)];
    for h in 0..heads {
        attention_head_banded(
            isa,
            qkv,
            3 * hidden,
            len,
            len,
            h * dh,
            hidden + h * dh,
            2 * hidden + h * dh,
            dh,
            1.0 / (dh as f32).sqrt(),
            half,
            bias(h),
            &mut kt,
            &mut scores,
            &mut out,
        );
        for t in 0..len {
            ctx[t * hidden + h * dh..][..dh].copy_from_slice(&out[t * dh..][..dh]);
        }
    }
    ctx
}

fn add(x: &mut [f32], y: &[f32]) {
    for (a, b) in x.iter_mut().zip(y) {
        *a += b;
    }
}

fn mean_rows(x: &[f32], hidden: usize) -> Vec<f64> {
    let rows = x.len() / hidden;
    (0..hidden)
        .map(|d| (0..rows).map(|t| x[t * hidden + d] as f64).sum::<f64>() / rows as f64)
        .collect()
}

/// Every sentence's pooled vector against reference.json's `unnormalized`:
/// cosine and largest difference.
fn check(name: &str, forward: impl Fn(&[u32]) -> Vec<f64>) {
    let reference = json(family(name).join("reference.json"));
    let ids = reference["ids"].as_array().unwrap();
    let want = reference["unnormalized"].as_array().unwrap();
    let mut worst = (1f64, 0f64);
    for (s, w) in ids.iter().zip(want) {
        let s: Vec<u32> = s
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect();
        let w: Vec<f64> = w
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        let got = forward(&s);
        let dot: f64 = got.iter().zip(&w).map(|(a, b)| a * b).sum();
        let norm = |v: &[f64]| v.iter().map(|a| a * a).sum::<f64>().sqrt();
        let cos = dot / (norm(&got) * norm(&w));
        let diff = got
            .iter()
            .zip(&w)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        worst = (worst.0.min(cos), worst.1.max(diff));
        assert!(
            cos >= 0.9999 && diff < 1e-4,
            "{name}: {} tokens, cosine {cos}, max difference {diff}",
            s.len()
        );
    }
    eprintln!(
        "{name}: lowest cosine {}, largest difference {:e}",
        worst.0, worst.1
    );
}

/// The tiny ModernBERT's weights and config, and its naive pass.
struct ModernBert {
    t: HashMap<String, Vec<f32>>,
    hidden: usize,
    heads: usize,
    inter: usize,
    layers: usize,
    every: usize,
    half: usize,
    eps: f64,
    global: Rotary,
    local: Rotary,
}

impl ModernBert {
    /// Its rotary tables for `max_positions` positions.
    fn load(max_positions: usize) -> ModernBert {
        let dir = family("modernbert");
        let cfg = json(dir.join("config.json"));
        let hidden = cfg["hidden_size"].as_u64().unwrap() as usize;
        let heads = cfg["num_attention_heads"].as_u64().unwrap() as usize;
        let every = cfg["global_attn_every_n_layers"].as_u64().unwrap() as usize;
        let rope = &cfg["rope_parameters"];
        let theta = |kind: &str| rope[kind]["rope_theta"].as_f64().unwrap();
        let dh = hidden / heads;
        for (l, kind) in cfg["layer_types"].as_array().unwrap().iter().enumerate() {
            let want = if l % every == 0 {
                "full_attention"
            } else {
                "sliding_attention"
            };
            assert_eq!(kind, want, "layer {l}");
        }
        ModernBert {
            t: tensors(&dir),
            hidden,
            heads,
            inter: cfg["intermediate_size"].as_u64().unwrap() as usize,
            layers: cfg["num_hidden_layers"].as_u64().unwrap() as usize,
            every,
            half: cfg["local_attention"].as_u64().unwrap() as usize / 2,
            eps: cfg["norm_eps"].as_f64().unwrap(),
            global: Rotary::new(theta("full_attention"), dh, max_positions),
            local: Rotary::new(theta("sliding_attention"), dh, max_positions),
        }
    }

    /// The last hidden state of one sequence's tokens.
    fn states(&self, isa: Isa, ids: &[u32]) -> Vec<f32> {
        let (t, hidden, heads, inter, eps) =
            (&self.t, self.hidden, self.heads, self.inter, self.eps);
        let len = ids.len();
        let emb = &t["embeddings.tok_embeddings.weight"];
        let mut x: Vec<f32> = ids
            .iter()
            .flat_map(|&id| emb[id as usize * hidden..][..hidden].iter().copied())
            .collect();
        layer_norm(&mut x, &t["embeddings.norm.weight"], None, eps);
        for l in 0..self.layers {
            let p = format!("layers.{l}");
            let is_global = l % self.every == 0;
            let mut h = x.clone();
            if l > 0 {
                layer_norm(&mut h, &t[&format!("{p}.attn_norm.weight")], None, eps);
            }
            let mut qkv = linear(&h, &t[&format!("{p}.attn.Wqkv.weight")], None, hidden);
            let rope = if is_global { &self.global } else { &self.local };
            rope.apply(isa, &mut qkv, 3 * hidden, 2 * hidden, &positions(&[len]));
            let band = if is_global { usize::MAX } else { self.half };
            let ctx = attention(isa, &qkv, len, hidden, heads, band, |_| &[]);
            add(
                &mut x,
                &linear(&ctx, &t[&format!("{p}.attn.Wo.weight")], None, hidden),
            );
            let mut h = x.clone();
            layer_norm(&mut h, &t[&format!("{p}.mlp_norm.weight")], None, eps);
            let wi = linear(&h, &t[&format!("{p}.mlp.Wi.weight")], None, hidden);
            let mut act = vec![0f32; len * inter];
            geglu(isa, &wi, &mut act, inter);
            add(
                &mut x,
                &linear(&act, &t[&format!("{p}.mlp.Wo.weight")], None, inter),
            );
        }
        layer_norm(&mut x, &t["final_norm.weight"], None, eps);
        x
    }
}

#[test]
fn modernbert_fixture_from_rotary_window_and_geglu() {
    let m = ModernBert::load(64);
    for isa in isas() {
        check("modernbert", |ids| mean_rows(&m.states(isa, ids), m.hidden));
    }
}

/// The served encoder (arch/modernbert.rs) past the fixture's 40 tokens
/// and attention's 48-token short path: the tiny folder with
/// model_max_length 64, a packed batch of 64, 49, 5 and 1 tokens, every
/// token's state as the naive pass's (which reproduces reference.json).
#[test]
fn served_modernbert_matches_the_naive_pass_past_the_short_path() {
    let dir = std::env::temp_dir().join(format!("m0-embed-modernbert64-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    copy_tree(&family("modernbert"), &dir);
    let tc = dir.join("tokenizer_config.json");
    let mut v = json(tc.clone());
    v["model_max_length"] = 64.into();
    std::fs::write(&tc, v.to_string()).unwrap();
    let naive = ModernBert::load(64);
    let lens = [64usize, 49, 5, 1];
    let seqs: Vec<Vec<u32>> = lens
        .iter()
        .enumerate()
        .map(|(s, &n)| {
            (0..n)
                .map(|i| ((i * 37 + s * 11 + 3) % 500) as u32)
                .collect()
        })
        .collect();
    for threads in [1, 2] {
        let model = crate::model::Model::load(
            &dir,
            crate::model::LoadOptions {
                threads,
                cache_dir: Some(dir.join("cache")),
                ..Default::default()
            },
        )
        .unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(model.info().max_len, 64);
        let enc = model.tokenizer().from_ids(&seqs, false).unwrap();
        let got = model.token_states(&enc);
        let want: Vec<f32> = seqs
            .iter()
            .flat_map(|s| naive.states(model.isa, s))
            .collect();
        assert_eq!(got.len(), want.len());
        let worst = got
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert!(
            worst < 1e-4,
            "threads {threads}: largest difference {worst}"
        );
        eprintln!("served modernbert, threads {threads}: largest difference {worst:e}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn copy_tree(from: &std::path::Path, to: &std::path::Path) {
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let dst = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            std::fs::create_dir_all(&dst).unwrap();
            copy_tree(&e.path(), &dst);
        } else {
            std::fs::copy(e.path(), dst).unwrap();
        }
    }
}

#[test]
fn mpnet_fixture_from_the_relative_bias() {
    let dir = family("mpnet");
    let cfg = json(dir.join("config.json"));
    let t = tensors(&dir);
    let hidden = cfg["hidden_size"].as_u64().unwrap() as usize;
    let heads = cfg["num_attention_heads"].as_u64().unwrap() as usize;
    let layers = cfg["num_hidden_layers"].as_u64().unwrap() as usize;
    let eps = cfg["layer_norm_eps"].as_f64().unwrap();
    let rb = RelativeBias::new(&t["encoder.relative_attention_bias.weight"], heads, 40);
    for isa in isas() {
        check("mpnet", |ids| {
            let len = ids.len();
            let (word, pos) = (
                &t["embeddings.word_embeddings.weight"],
                &t["embeddings.position_embeddings.weight"],
            );
            // Positions from padding_idx + 1 = 2.
            let mut x: Vec<f32> = ids
                .iter()
                .enumerate()
                .flat_map(|(i, &id)| {
                    let w = &word[id as usize * hidden..][..hidden];
                    let p = &pos[(i + 2) * hidden..][..hidden];
                    w.iter().zip(p).map(|(a, b)| a + b).collect::<Vec<_>>()
                })
                .collect();
            let g = |n: &str| t[n].as_slice();
            layer_norm(
                &mut x,
                g("embeddings.LayerNorm.weight"),
                Some(g("embeddings.LayerNorm.bias")),
                eps,
            );
            for l in 0..layers {
                let p = format!("encoder.layer.{l}");
                let lin = |x: &[f32], n: &str, k: usize| {
                    linear(
                        x,
                        g(&format!("{p}.{n}.weight")),
                        Some(g(&format!("{p}.{n}.bias"))),
                        k,
                    )
                };
                let (q, k, v) = (
                    lin(&x, "attention.attn.q", hidden),
                    lin(&x, "attention.attn.k", hidden),
                    lin(&x, "attention.attn.v", hidden),
                );
                let qkv: Vec<f32> = (0..len)
                    .flat_map(|r| {
                        let row = r * hidden..(r + 1) * hidden;
                        [&q[row.clone()], &k[row.clone()], &v[row]].concat()
                    })
                    .collect();
                let ctx = attention(isa, &qkv, len, hidden, heads, usize::MAX, |h| {
                    rb.head(h, len)
                });
                let mut y = lin(&ctx, "attention.attn.o", hidden);
                add(&mut y, &x);
                layer_norm(
                    &mut y,
                    g(&format!("{p}.attention.LayerNorm.weight")),
                    Some(g(&format!("{p}.attention.LayerNorm.bias"))),
                    eps,
                );
                x = y;
                let mut inter = lin(&x, "intermediate.dense", hidden);
                kernels::gelu_erf(isa, &mut inter);
                let mut y = lin(&inter, "output.dense", inter.len() / len);
                add(&mut y, &x);
                layer_norm(
                    &mut y,
                    g(&format!("{p}.output.LayerNorm.weight")),
                    Some(g(&format!("{p}.output.LayerNorm.bias"))),
                    eps,
                );
                x = y;
            }
            mean_rows(&x, hidden)
        });
    }
}
