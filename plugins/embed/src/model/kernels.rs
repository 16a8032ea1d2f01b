//! The element-wise and row-wise work around the matrix products: bias adds,
//! GELU, residual + layer norm, softmax, and the small attention of one
//! sequence and one head.
//!
//! Each kernel is written once as plain Rust over fixed 16-lane chunks that
//! LLVM vectorises, and compiled three times: for AVX-512F, for AVX2+FMA and
//! without either (the scalar fallback). [`Isa::detect`] picks one at run
//! time with `is_x86_feature_detected!`; nothing is built for the build
//! machine's CPU.

/// The instruction set the kernels run with, detected once at load.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Isa {
    /// AVX-512F (and AVX2, FMA).
    Avx512,
    /// AVX2 and FMA.
    Avx2,
    /// Neither: portable code.
    Scalar,
}

impl Isa {
    /// The best this CPU runs.
    pub(crate) fn detect() -> Isa {
        #[cfg(target_arch = "x86_64")]
        {
            let avx2 = is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma");
            if avx2 && is_x86_feature_detected!("avx512f") {
                return Isa::Avx512;
            }
            if avx2 {
                return Isa::Avx2;
            }
        }
        Isa::Scalar
    }

    /// Every instruction set this CPU can run (for tests).
    #[cfg(test)]
    pub(crate) fn all_supported() -> Vec<Isa> {
        match Isa::detect() {
            Isa::Avx512 => vec![Isa::Avx512, Isa::Avx2, Isa::Scalar],
            Isa::Avx2 => vec![Isa::Avx2, Isa::Scalar],
            Isa::Scalar => vec![Isa::Scalar],
        }
    }
}

/// Defines `pub(crate) fn $name(isa: Isa, args...)` that runs `$body`
/// compiled for the instruction set `isa` names.
macro_rules! kernel {
    ($(#[$meta:meta])* fn $name:ident($($arg:ident : $ty:ty),* $(,)?) $(-> $ret:ty)? $body:block) => {
        $(#[$meta])*
        #[allow(clippy::too_many_arguments)]
        pub(crate) fn $name(isa: Isa, $($arg: $ty),*) $(-> $ret)? {
            // FMA: compiled where fused multiply-adds are native (the body's
            // `madd::<FMA>` is then one instruction, else a multiply and an
            // add: a fused one without the instruction is a libm call).
            #[inline(always)]
            #[allow(clippy::too_many_arguments)]
            fn imp<const FMA: bool>($($arg: $ty),*) $(-> $ret)? $body
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx512($($arg: $ty),*) $(-> $ret)? {
                imp::<true>($($arg),*)
            }
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2,fma")]
            #[allow(clippy::too_many_arguments)]
            fn avx2($($arg: $ty),*) $(-> $ret)? {
                imp::<true>($($arg),*)
            }
            match isa {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Isa::Avx512 is only made by Isa::detect, after
                // is_x86_feature_detected! found avx512f, avx2 and fma.
                Isa::Avx512 => unsafe { avx512($($arg),*) },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: Isa::Avx2 is only made by Isa::detect, after
                // is_x86_feature_detected! found avx2 and fma.
                Isa::Avx2 => unsafe { avx2($($arg),*) },
                _ => imp::<false>($($arg),*),
            }
        }
    };
}

pub(crate) const LANES: usize = 16;

/// a * b + c: fused (one rounding, one instruction) in a kernel compiled
/// with FMA, a multiply and an add otherwise. Rust never fuses `a * b + c`
/// by itself, so a loop of them runs twice the instructions it needs.
#[inline(always)]
pub(crate) fn madd<const FMA: bool>(a: f32, b: f32, c: f32) -> f32 {
    if FMA { a.mul_add(b, c) } else { a * b + c }
}

/// Sum of a slice, 16 lanes at a time.
#[inline(always)]
fn sum(x: &[f32]) -> f32 {
    let mut acc = [0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            acc[i] += c[i];
        }
    }
    let mut s = 0.0;
    for v in it.remainder() {
        s += v;
    }
    hsum(acc) + s
}

#[inline(always)]
pub(crate) fn hsum(acc: [f32; LANES]) -> f32 {
    let mut a = acc;
    let mut w = LANES / 2;
    while w > 0 {
        for i in 0..w {
            a[i] += a[i + w];
        }
        w /= 2;
    }
    a[0]
}

/// Dot product of two equal-length slices.
#[inline(always)]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    let (a, b) = (&a[..n], &b[..n]);
    let mut acc = [0f32; LANES];
    let mut ia = a.chunks_exact(LANES);
    let mut ib = b.chunks_exact(LANES);
    for (x, y) in (&mut ia).zip(&mut ib) {
        for i in 0..LANES {
            acc[i] += x[i] * y[i];
        }
    }
    let mut s = 0.0;
    for (x, y) in ia.remainder().iter().zip(ib.remainder()) {
        s += x * y;
    }
    hsum(acc) + s
}

/// e^x to ~2 ulp over the range that matters (clamped to about ±87, where
/// f32 under- or overflows). Branch-free, so loops over it vectorise.
#[inline(always)]
pub(crate) fn exp<const FMA: bool>(x: f32) -> f32 {
    const LOG2E: f32 = std::f32::consts::LOG2_E;
    // ln 2 split in two so n * LN2_HI is exact for |n| < 2^9.
    const LN2_HI: f32 = 0.693_145_75;
    const LN2_LO: f32 = 1.428_606_8e-6;
    // 1.5 * 2^23: adding it rounds to an integer held in the low mantissa.
    const MAGIC: f32 = 12_582_912.0;
    let x = x.clamp(-87.0, 88.0);
    let t = madd::<FMA>(x, LOG2E, MAGIC);
    let n = t - MAGIC;
    let r = madd::<FMA>(-n, LN2_LO, madd::<FMA>(-n, LN2_HI, x));
    // e^r on |r| <= ln2/2: Taylor to r^6 (error < 2e-7 relative).
    let p = 1.0 / 720.0;
    let p = madd::<FMA>(p, r, 1.0 / 120.0);
    let p = madd::<FMA>(p, r, 1.0 / 24.0);
    let p = madd::<FMA>(p, r, 1.0 / 6.0);
    let p = madd::<FMA>(p, r, 0.5);
    let p = madd::<FMA>(p, r, 1.0);
    let p = madd::<FMA>(p, r, 1.0);
    let ni = t.to_bits().wrapping_sub(MAGIC.to_bits());
    let scale = f32::from_bits(ni.wrapping_add(127) << 23);
    p * scale
}

/// erf(x), |error| < 5e-7 (relative 1e-6 near 0): a rational function,
/// odd polynomial in x over even, of x clamped to ±4 (past which erf is
/// ±1 in f32); the coefficients are Eigen's (`generic_fast_erf_float`).
/// One division and eleven multiply-adds: about half the work of the
/// Taylor series and Abramowitz & Stegun 7.1.26 (with an exp) it replaces,
/// which GELU over a pass's intermediate rows spent 5% of a pass on.
#[inline(always)]
pub(crate) fn erf<const FMA: bool>(x: f32) -> f32 {
    let x = x.clamp(-4.0, 4.0);
    let z = x * x;
    let p = -2.726_142_3e-10;
    let p = madd::<FMA>(p, z, 2.770_681_4e-8);
    let p = madd::<FMA>(p, z, -2.101_024e-6);
    let p = madd::<FMA>(p, z, -5.692_506_4e-5);
    let p = madd::<FMA>(p, z, -7.349_906_3e-4);
    let p = madd::<FMA>(p, z, -2.954_6e-3);
    let p = madd::<FMA>(p, z, -1.609_603_3e-2);
    let q = -1.456_607_2e-5;
    let q = madd::<FMA>(q, z, -2.133_740_6e-4);
    let q = madd::<FMA>(q, z, -1.682_827e-3);
    let q = madd::<FMA>(q, z, -7.373_329e-3);
    let q = madd::<FMA>(q, z, -1.426_474e-2);
    x * p / q
}

#[inline(always)]
fn gelu_erf1<const FMA: bool>(x: f32) -> f32 {
    0.5 * x * (1.0 + erf::<FMA>(x * std::f32::consts::FRAC_1_SQRT_2))
}

#[inline(always)]
fn gelu_tanh1<const FMA: bool>(x: f32) -> f32 {
    // tanh(u) = 1 - 2 / (e^(2u) + 1)
    let u = 0.797_884_6 * (x + 0.044_715 * x * x * x);
    let th = 1.0 - 2.0 / (exp::<FMA>(2.0 * u) + 1.0);
    0.5 * x * (1.0 + th)
}

kernel! {
    /// y = gelu(y), GELU in its exact erf form (as BERT's "gelu").
    fn gelu_erf(y: &mut [f32]) {
        for v in y.iter_mut() {
            *v = gelu_erf1::<FMA>(*v);
        }
    }
}

kernel! {
    /// y = gelu(y), GELU in its tanh form ("gelu_new").
    fn gelu_tanh(y: &mut [f32]) {
        for v in y.iter_mut() {
            *v = gelu_tanh1::<FMA>(*v);
        }
    }
}

kernel! {
    /// y = max(y, 0).
    fn relu(y: &mut [f32]) {
        for v in y.iter_mut() {
            *v = v.max(0.0);
        }
    }
}

/// One row: x = layer_norm(x) * g + beta.
#[inline(always)]
fn layer_norm_row(x: &mut [f32], g: &[f32], beta: &[f32], eps: f32) {
    let n = x.len() as f32;
    let mean = sum(x) / n;
    let mut acc = [0f32; LANES];
    let mut it = x.chunks_exact(LANES);
    for c in &mut it {
        for i in 0..LANES {
            let d = c[i] - mean;
            acc[i] += d * d;
        }
    }
    let mut tail = 0.0;
    for v in it.remainder() {
        tail += (v - mean) * (v - mean);
    }
    let var = (hsum(acc) + tail) / n;
    let inv = 1.0 / (var + eps).sqrt();
    for ((v, g), b) in x.iter_mut().zip(g).zip(beta) {
        *v = (*v - mean) * inv * g + b;
    }
}

kernel! {
    /// Per row of `x` (rows of `g.len()`): x = layer_norm(x + y) * g + beta,
    /// the residual and the norm in one pass.
    fn residual_layer_norm(x: &mut [f32], y: &[f32], g: &[f32], beta: &[f32], eps: f32) {
        let n = g.len();
        for (xr, yr) in x.chunks_exact_mut(n).zip(y.chunks_exact(n)) {
            for (v, y) in xr.iter_mut().zip(yr) {
                *v += y;
            }
            layer_norm_row(xr, g, beta, eps);
        }
    }
}

kernel! {
    /// The embeddings of one token: out = layer_norm(word + pos + ty) * g + beta.
    fn embed_layer_norm(out: &mut [f32], word: &[f32], pos: &[f32], ty: &[f32], g: &[f32], beta: &[f32], eps: f32) {
        for (((o, w), p), t) in out.iter_mut().zip(word).zip(pos).zip(ty) {
            *o = w + p + t;
        }
        layer_norm_row(out, g, beta, eps);
    }
}

kernel! {
    /// Per row of `x` (rows of `g.len()`): out = layer_norm(x) * g + beta,
    /// x kept (a pre-norm block's input to its sublayer).
    fn layer_norm_to(out: &mut [f32], x: &[f32], g: &[f32], beta: &[f32], eps: f32) {
        let n = g.len();
        for (or, xr) in out.chunks_exact_mut(n).zip(x.chunks_exact(n)) {
            or.copy_from_slice(xr);
            layer_norm_row(or, g, beta, eps);
        }
    }
}

kernel! {
    /// x += y (a pre-norm block's residual).
    fn add(x: &mut [f32], y: &[f32]) {
        for (v, y) in x.iter_mut().zip(y) {
            *v += y;
        }
    }
}

/// In place: s = softmax(s).
#[inline(always)]
fn softmax_row<const FMA: bool>(s: &mut [f32]) {
    let mut m = f32::NEG_INFINITY;
    for v in s.iter() {
        m = m.max(*v);
    }
    let mut acc = 0.0;
    for v in s.iter_mut() {
        *v = exp::<FMA>(*v - m);
        acc += *v;
    }
    let inv = 1.0 / acc;
    for v in s.iter_mut() {
        *v *= inv;
    }
}

kernel! {
    /// Softmax of every row (rows of `n`) of `s`, after scaling it by `scale`.
    fn softmax_rows(s: &mut [f32], n: usize, scale: f32) {
        for row in s.chunks_exact_mut(n) {
            for v in row.iter_mut() {
                *v *= scale;
            }
            softmax_row::<FMA>(row);
        }
    }
}

/// Padded length of a score row: whole 16-lane chunks.
pub(crate) const fn padded(len: usize) -> usize {
    len.next_multiple_of(LANES)
}

/// Scores of `Q` queries (`qs`, each `dh` long) against keys transposed
/// into `kt` (`dh` rows of `lp`): `s[qi * lp..][..lp]`. Each load of a
/// key chunk serves every query, and the `2 Q` chains of multiply-adds in
/// flight (eight ymm at `Q = 2` on AVX2) cover the latency of fused ones.
#[inline(always)]
fn scores_of<const FMA: bool, const Q: usize>(
    kt: &[f32],
    lp: usize,
    qs: [&[f32]; Q],
    s: &mut [f32],
) {
    let dh = qs[0].len();
    for c in 0..lp / LANES {
        let mut acc = [[[0f32; LANES]; 2]; Q];
        let mut d = 0;
        while d + 1 < dh {
            let r0 = &kt[d * lp + c * LANES..][..LANES];
            let r1 = &kt[(d + 1) * lp + c * LANES..][..LANES];
            for (a, qi) in acc.iter_mut().zip(&qs) {
                let (x0, x1) = (qi[d], qi[d + 1]);
                for l in 0..LANES {
                    a[0][l] = madd::<FMA>(x0, r0[l], a[0][l]);
                    a[1][l] = madd::<FMA>(x1, r1[l], a[1][l]);
                }
            }
            d += 2;
        }
        if d < dh {
            let r0 = &kt[d * lp + c * LANES..][..LANES];
            for (a, qi) in acc.iter_mut().zip(&qs) {
                for l in 0..LANES {
                    a[0][l] = madd::<FMA>(qi[d], r0[l], a[0][l]);
                }
            }
        }
        for (qi, a) in acc.iter().enumerate() {
            let sc = &mut s[qi * lp + c * LANES..][..LANES];
            for l in 0..LANES {
                sc[l] = a[0][l] + a[1][l];
            }
        }
    }
}

/// In place: a padded row of scores (`len` real, the rest ignored) to
/// e^(s - max), lanes past `len` 0; returns 1 / their sum.
#[inline(always)]
fn exp_row<const FMA: bool>(s: &mut [f32], len: usize) -> f32 {
    let mut mx = [f32::MIN; LANES];
    for (c, sc) in s.chunks_exact(LANES).enumerate() {
        for l in 0..LANES {
            let x = if c * LANES + l < len { sc[l] } else { f32::MIN };
            mx[l] = if x > mx[l] { x } else { mx[l] };
        }
    }
    let m = mx.iter().fold(f32::MIN, |a, &b| if b > a { b } else { a });
    let mut acc = [0f32; LANES];
    for (c, sc) in s.chunks_exact_mut(LANES).enumerate() {
        for l in 0..LANES {
            let e = exp::<FMA>(sc[l] - m);
            let e = if c * LANES + l < len { e } else { 0.0 };
            sc[l] = e;
            acc[l] += e;
        }
    }
    1.0 / hsum(acc)
}

/// `o[qi][d] = scale[qi] * sum over j of p[qi][j] * rows[j * stride + d]`
/// for `Q` queries at once: each load of a value row serves every query.
#[inline(always)]
fn values_of<const FMA: bool, const Q: usize>(
    o: [&mut [f32]; Q],
    p: [&[f32]; Q],
    scale: [f32; Q],
    rows: &[f32],
    stride: usize,
) {
    let (dh, len) = (o[0].len(), p[0].len());
    let mut c = 0;
    while c + 2 * LANES <= dh {
        let mut acc = [[[0f32; LANES]; 2]; Q];
        for j in 0..len {
            let r = &rows[j * stride + c..][..2 * LANES];
            for (a, pq) in acc.iter_mut().zip(&p) {
                let pj = pq[j];
                for l in 0..LANES {
                    a[0][l] = madd::<FMA>(pj, r[l], a[0][l]);
                    a[1][l] = madd::<FMA>(pj, r[LANES + l], a[1][l]);
                }
            }
        }
        for (qi, a) in acc.iter().enumerate() {
            for l in 0..LANES {
                o[qi][c + l] = a[0][l] * scale[qi];
                o[qi][c + LANES + l] = a[1][l] * scale[qi];
            }
        }
        c += 2 * LANES;
    }
    for (qi, oq) in o.into_iter().enumerate() {
        if c < dh {
            weighted_rows(&mut oq[c..], p[qi], scale[qi], &rows[c..], stride);
        }
    }
}

kernel! {
    /// Self-attention of one sequence and one head, for short sequences.
    ///
    /// `qkv` holds the sequence's rows (`len` of them, `stride` apart) with
    /// this head's query, key and value at columns `q`, `k` and `v`, each
    /// `dh` wide. `out` gets the context of the first `queries` queries
    /// (all `len`, or the first alone where only the first token's state
    /// is read), `queries` rows of `dh`. `kt` (at least `dh * padded(len)`)
    /// and `scores` (at least `2 * padded(len)`) are scratch.
    ///
    /// The keys are transposed (and scaled) once, so a row of scores is
    /// `dh` broadcast multiply-adds over whole 16-lane chunks rather than
    /// `len` dot products; lanes past `len` are excluded from the softmax by
    /// selection. Queries go two at a time (the scores and the values each
    /// load once for both): about half the instructions of one at a time,
    /// which this kernel is bound by at these lengths.
    fn attention_head(qkv: &[f32], stride: usize, len: usize, queries: usize, q: usize, k: usize, v: usize, dh: usize, scale: f32, kt: &mut [f32], scores: &mut [f32], out: &mut [f32]) {
        let lp = padded(len);
        let kt = &mut kt[..dh * lp];
        for j in 0..lp {
            for d in 0..dh {
                kt[d * lp + j] = if j < len { qkv[j * stride + k + d] * scale } else { 0.0 };
            }
        }
        let s = &mut scores[..2 * lp];
        let query = |i: usize| &qkv[i * stride + q..][..dh];
        let values = &qkv[v..];
        let queries = queries.min(len);
        let mut rows = out[..queries * dh].chunks_exact_mut(dh);
        let mut i = 0;
        while i + 2 <= queries {
            let (Some(o0), Some(o1)) = (rows.next(), rows.next()) else { break };
            scores_of::<FMA, 2>(kt, lp, [query(i), query(i + 1)], s);
            let (a, b) = s.split_at_mut(lp);
            let inv = [exp_row::<FMA>(a, len), exp_row::<FMA>(b, len)];
            values_of::<FMA, 2>([o0, o1], [&a[..len], &b[..len]], inv, values, stride);
            i += 2;
        }
        if let Some(o0) = rows.next() {
            let s = &mut s[..lp];
            scores_of::<FMA, 1>(kt, lp, [query(i)], s);
            let inv = exp_row::<FMA>(s, len);
            values_of::<FMA, 1>([o0], [&s[..len]], [inv], values, stride);
        }
    }
}

/// o[d] = scale * sum over j of p[j] * rows[j * stride + d]: the context of
/// one query, accumulated in registers 16 lanes (or 32) at a time.
#[inline(always)]
pub(crate) fn weighted_rows(o: &mut [f32], p: &[f32], scale: f32, rows: &[f32], stride: usize) {
    let dh = o.len();
    let mut c = 0;
    while c + 2 * LANES <= dh {
        let mut a0 = [0f32; LANES];
        let mut a1 = [0f32; LANES];
        for (j, &pj) in p.iter().enumerate() {
            let r = &rows[j * stride + c..][..2 * LANES];
            for l in 0..LANES {
                a0[l] += pj * r[l];
                a1[l] += pj * r[LANES + l];
            }
        }
        for l in 0..LANES {
            o[c + l] = a0[l] * scale;
            o[c + LANES + l] = a1[l] * scale;
        }
        c += 2 * LANES;
    }
    while c + LANES <= dh {
        let mut a0 = [0f32; LANES];
        for (j, &pj) in p.iter().enumerate() {
            let r = &rows[j * stride + c..][..LANES];
            for l in 0..LANES {
                a0[l] += pj * r[l];
            }
        }
        for l in 0..LANES {
            o[c + l] = a0[l] * scale;
        }
        c += LANES;
    }
    for (d, od) in o.iter_mut().enumerate().skip(c) {
        let mut a = 0.0;
        for (j, &pj) in p.iter().enumerate() {
            a += pj * rows[j * stride + d];
        }
        *od = a * scale;
    }
}

kernel! {
    /// out[d] = sum over rows of x (rows of `out.len()`).
    fn sum_rows(out: &mut [f32], x: &[f32]) {
        out.fill(0.0);
        for row in x.chunks_exact(out.len()) {
            for (o, v) in out.iter_mut().zip(row) {
                *o += v;
            }
        }
    }
}

kernel! {
    /// out[d] = max over rows of x (rows of `out.len()`).
    fn max_rows(out: &mut [f32], x: &[f32]) {
        out.fill(f32::NEG_INFINITY);
        for row in x.chunks_exact(out.len()) {
            for (o, v) in out.iter_mut().zip(row) {
                *o = o.max(*v);
            }
        }
    }
}

kernel! {
    /// x *= a
    fn scale(x: &mut [f32], a: f32) {
        for v in x.iter_mut() {
            *v *= a;
        }
    }
}

kernel! {
    /// The sum of squares of x.
    fn sum_squares(x: &[f32]) -> f32 {
        dot(x, x)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::{erf64, noise};

    #[test]
    fn exp_and_erf_are_accurate() {
        exp_and_erf_are_accurate_as::<false>();
        exp_and_erf_are_accurate_as::<true>();
    }

    fn exp_and_erf_are_accurate_as<const FMA: bool>() {
        let mut x = -80.0f32;
        while x < 80.0 {
            let want = (x as f64).exp();
            let got = exp::<FMA>(x) as f64;
            assert!(
                ((got - want) / want).abs() < 4e-7,
                "exp({x}) = {got}, want {want}"
            );
            x += 0.0137;
        }
        let mut worst = 0f64;
        let mut x = -6.0f32;
        while x < 6.0 {
            let want = erf64(x as f64);
            let got = erf::<FMA>(x) as f64;
            worst = worst.max((got - want).abs());
            assert!(
                (got - want).abs() < 5e-7 && (got - want).abs() < 1e-6 * want.abs().max(0.5),
                "erf({x}) = {got}, want {want}"
            );
            x += 0.001;
        }
        eprintln!("erf (fused: {FMA}): worst absolute error {worst:e}");
        assert!(exp::<FMA>(-1000.0) < 1e-37);
        assert!(exp::<FMA>(1000.0).is_finite());
    }

    fn ref_ln(x: &[f32], g: &[f32], b: &[f32], eps: f32) -> Vec<f32> {
        let n = x.len() as f64;
        let mean = x.iter().map(|&v| v as f64).sum::<f64>() / n;
        let var = x.iter().map(|&v| (v as f64 - mean).powi(2)).sum::<f64>() / n;
        x.iter()
            .zip(g)
            .zip(b)
            .map(|((&v, &g), &b)| {
                ((v as f64 - mean) / (var + eps as f64).sqrt() * g as f64 + b as f64) as f32
            })
            .collect()
    }

    #[test]
    fn kernels_agree_with_plain_formulas_on_every_isa() {
        for isa in Isa::all_supported() {
            for n in [1usize, 7, 16, 33, 384] {
                let x0 = noise(3 * n, 1);
                let y = noise(3 * n, 2);
                let g = noise(n, 4);
                let beta = noise(n, 5);
                let mut x = x0.clone();
                residual_layer_norm(isa, &mut x, &y, &g, &beta, 1e-12);
                for r in 0..3 {
                    let t: Vec<f32> = (0..n).map(|i| x0[r * n + i] + y[r * n + i]).collect();
                    let want = ref_ln(&t, &g, &beta, 1e-12);
                    for i in 0..n {
                        assert!((x[r * n + i] - want[i]).abs() < 1e-4, "{isa:?} n={n}");
                    }
                }
                let mut normed = vec![f32::NAN; 3 * n];
                layer_norm_to(isa, &mut normed, &x0, &g, &beta, 1e-5);
                let mut summed = x0.clone();
                add(isa, &mut summed, &y);
                for r in 0..3 {
                    let want = ref_ln(&x0[r * n..(r + 1) * n], &g, &beta, 1e-5);
                    for i in 0..n {
                        assert!((normed[r * n + i] - want[i]).abs() < 1e-4, "{isa:?} n={n}");
                        assert_eq!(summed[r * n + i], x0[r * n + i] + y[r * n + i]);
                    }
                }
                let mut gl = x0.clone();
                gelu_erf(isa, &mut gl);
                for (i, v) in gl.iter().enumerate() {
                    let t = x0[i] as f64;
                    let want = 0.5 * t * (1.0 + erf64(t / 2f64.sqrt()));
                    assert!((*v as f64 - want).abs() < 1e-6, "{isa:?} gelu({t})");
                }
                let mut s = x0.clone();
                softmax_rows(isa, &mut s, n, 0.5);
                for r in 0..3 {
                    let row = &x0[r * n..(r + 1) * n];
                    let m = row.iter().cloned().fold(f32::MIN, f32::max) as f64;
                    let z: f64 = row.iter().map(|&v| (0.5 * (v as f64 - m)).exp()).sum();
                    for i in 0..n {
                        let want = (0.5 * (row[i] as f64 - m)).exp() / z;
                        assert!((s[r * n + i] as f64 - want).abs() < 1e-6);
                    }
                }
                let ss = sum_squares(isa, &x0);
                let want: f32 = x0.iter().map(|v| v * v).sum();
                assert!((ss - want).abs() < 1e-3 * want.max(1.0));
            }
        }
    }

    #[test]
    fn attention_head_matches_the_definition() {
        for isa in Isa::all_supported() {
            for (len, dh, heads) in [(5, 8, 2), (1, 4, 3), (16, 32, 2), (33, 12, 1)] {
                let stride = 3 * dh * heads;
                let qkv = noise(len * stride, 9);
                for h in 0..heads {
                    let (q, k, v) = (h * dh, heads * dh + h * dh, 2 * heads * dh + h * dh);
                    let mut out = vec![0.0; len * dh];
                    let mut kt = vec![f32::NAN; dh * padded(len)];
                    let mut scores = vec![f32::NAN; 2 * padded(len)];
                    attention_head(
                        isa,
                        &qkv,
                        stride,
                        len,
                        len,
                        q,
                        k,
                        v,
                        dh,
                        0.3,
                        &mut kt,
                        &mut scores,
                        &mut out,
                    );
                    for i in 0..len {
                        let s: Vec<f64> = (0..len)
                            .map(|j| {
                                0.3 * (0..dh)
                                    .map(|d| {
                                        qkv[i * stride + q + d] as f64
                                            * qkv[j * stride + k + d] as f64
                                    })
                                    .sum::<f64>()
                            })
                            .collect();
                        let m = s.iter().cloned().fold(f64::MIN, f64::max);
                        let z: f64 = s.iter().map(|x| (x - m).exp()).sum();
                        for d in 0..dh {
                            let want: f64 = (0..len)
                                .map(|j| (s[j] - m).exp() / z * qkv[j * stride + v + d] as f64)
                                .sum();
                            assert!((out[i * dh + d] as f64 - want).abs() < 1e-5, "{isa:?}");
                        }
                    }
                }
            }
        }
    }
}
