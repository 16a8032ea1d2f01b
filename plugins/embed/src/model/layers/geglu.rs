//! ModernBERT's gated feed-forward activation (GeGLU).
//!
//! transformers' `ModernBertMLP` runs `input, gate = Wi(x).chunk(2)` and
//! `Wo(act(input) * gate)`: `Wi` is one `[hidden, 2 * intermediate]`
//! product whose row holds the input half then the gate half, and `act` is
//! `ACT2FN[config.hidden_activation]`, "gelu" for every ModernBERT
//! checkpoint: `nn.functional.gelu`, the exact erf form (not tanh).
//!
//! `Wo` reads `[tokens, intermediate]` rows, half as wide as `Wi`'s
//! output, so the activation also compacts: [`geglu`] writes a second
//! buffer (rows independent, so a caller splits them over threads).

use crate::model::kernels::{self, Isa};

/// gelu(a) * g, GELU in its exact erf form.
#[inline(always)]
fn gated<const FMA: bool>(a: f32, g: f32) -> f32 {
    0.5 * a * (1.0 + kernels::erf::<FMA>(a * std::f32::consts::FRAC_1_SQRT_2)) * g
}

kernel! {
    /// Per token: `out[t][c] = gelu(x[t][c]) * x[t][inter + c]`, `x` in
    /// rows of `2 * inter` (Wi's output: input half, gate half), `out` in
    /// rows of `inter`; as many rows as both hold.
    fn geglu(x: &[f32], out: &mut [f32], inter: usize) {
        for (xr, or) in x.chunks_exact(2 * inter).zip(out.chunks_exact_mut(inter)) {
            let (a, g) = xr.split_at(inter);
            for ((o, a), g) in or.iter_mut().zip(a).zip(g) {
                *o = gated::<FMA>(*a, *g);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{erf64, isas};

    fn noise(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) * 8.0 - 4.0
            })
            .collect()
    }

    /// The definition: gelu(input) * gate, GELU = x/2 (1 + erf(x / sqrt 2)).
    fn reference(x: &[f32], inter: usize) -> Vec<f64> {
        x.chunks_exact(2 * inter)
            .flat_map(|r| {
                (0..inter).map(move |c| {
                    let a = r[c] as f64;
                    0.5 * a * (1.0 + erf64(a / 2f64.sqrt())) * r[inter + c] as f64
                })
            })
            .collect()
    }

    #[test]
    fn geglu_is_gelu_of_the_input_half_times_the_gate_half_on_every_isa() {
        for isa in isas() {
            for (rows, inter) in [(1, 1), (3, 7), (5, 16), (4, 33), (2, 64), (3, 1152)] {
                let x = noise(rows * 2 * inter, (rows * 100 + inter) as u32);
                let want = reference(&x, inter);
                let mut out = vec![f32::NAN; rows * inter];
                geglu(isa, &x, &mut out, inter);
                for (i, w) in want.iter().enumerate() {
                    // erf's error (< 5e-7) times |x| * |gate| <= 16, plus
                    // f32 rounding.
                    let tol = 1e-5 * w.abs().max(1.0);
                    assert!(
                        (out[i] as f64 - w).abs() < tol,
                        "{isa:?} rows {rows} inter {inter} at {i}: {} want {w}",
                        out[i]
                    );
                }
            }
        }
    }

    #[test]
    fn geglu_takes_the_first_half_as_input_and_the_second_as_gate() {
        // gelu(0) = 0 and gelu(large) = large: the order of the halves
        // shows.
        let x = [0.0, 10.0, 3.0, 0.5];
        for isa in isas() {
            let mut out = [f32::NAN; 2];
            geglu(isa, &x, &mut out, 2);
            assert_eq!(out[0], 0.0);
            assert!((out[1] - 5.0).abs() < 1e-5, "{out:?}");
        }
    }
}
