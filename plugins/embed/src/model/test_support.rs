//! What the kernels' and layers' unit tests share: the instruction sets
//! this CPU runs (saying which it lacks), seeded noise, and erf in f64.

use super::kernels::Isa;

/// The instruction sets to test, saying which this CPU cannot run.
pub(crate) fn isas() -> Vec<Isa> {
    let all = Isa::all_supported();
    if !all.contains(&Isa::Avx512) {
        eprintln!("skipped: the AVX-512 kernels (this CPU lacks avx512f)");
    }
    if !all.contains(&Isa::Avx2) {
        eprintln!("skipped: the AVX2 kernels (this CPU lacks avx2 or fma)");
    }
    all
}

/// `n` values in [-2, 2) from an xorshift seeded with `seed`.
pub(crate) fn noise(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2_654_435_761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) * 4.0 - 2.0
        })
        .collect()
}

/// erf in f64: its series below 2.5, a continued fraction beyond; a
/// reference independent of the A&S formula the kernels use.
pub(crate) fn erf64(x: f64) -> f64 {
    if x.abs() < 2.5 {
        let mut term = x;
        let mut s = x;
        for n in 1..200 {
            term *= -x * x / n as f64;
            s += term / (2 * n + 1) as f64;
        }
        s * 2.0 / std::f64::consts::PI.sqrt()
    } else {
        let a = x.abs();
        let mut f = 0.0;
        for k in (1..60).rev() {
            f = (k as f64 / 2.0) / (a + f);
        }
        let erfc = (-a * a).exp() / std::f64::consts::PI.sqrt() / (a + f);
        (1.0 - erfc).copysign(x)
    }
}
