//! Token vectors to one sentence vector, and the optional L2 normalisation.

use super::config::Pooling;
use super::kernels::{self, Isa};

/// out (dim) from one sequence's token rows (len x dim).
pub(crate) fn pool(isa: Isa, mode: Pooling, rows: &[f32], dim: usize, out: &mut [f32]) {
    let len = rows.len() / dim;
    if len == 0 {
        out.fill(0.0);
        return;
    }
    match mode {
        Pooling::Mean => {
            kernels::sum_rows(isa, out, rows);
            kernels::scale(isa, out, 1.0 / len as f32);
        }
        Pooling::MeanSqrtLen => {
            kernels::sum_rows(isa, out, rows);
            kernels::scale(isa, out, 1.0 / (len as f32).sqrt());
        }
        Pooling::Max => kernels::max_rows(isa, out, rows),
        Pooling::Cls => out.copy_from_slice(&rows[..dim]),
        Pooling::LastToken => out.copy_from_slice(&rows[(len - 1) * dim..]),
    }
}

/// x /= max(|x|, 1e-12), as torch.nn.functional.normalize does.
pub(crate) fn normalize(isa: Isa, x: &mut [f32]) {
    let norm = kernels::sum_squares(isa, x).sqrt().max(1e-12);
    kernels::scale(isa, x, 1.0 / norm);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pooling_modes() {
        let isa = Isa::detect();
        let rows = [1.0, -2.0, 3.0, 4.0, 5.0, 0.0];
        let mut out = [0.0; 2];
        pool(isa, Pooling::Mean, &rows, 2, &mut out);
        assert_eq!(out, [3.0, 2.0 / 3.0]);
        pool(isa, Pooling::Cls, &rows, 2, &mut out);
        assert_eq!(out, [1.0, -2.0]);
        pool(isa, Pooling::Max, &rows, 2, &mut out);
        assert_eq!(out, [5.0, 4.0]);
        pool(isa, Pooling::LastToken, &rows, 2, &mut out);
        assert_eq!(out, [5.0, 0.0]);
        pool(isa, Pooling::MeanSqrtLen, &rows, 2, &mut out);
        assert!((out[0] - 9.0 / 3f32.sqrt()).abs() < 1e-6);
        pool(isa, Pooling::Mean, &[], 2, &mut out);
        assert_eq!(out, [0.0, 0.0]);
        let mut v = [3.0, 4.0];
        normalize(isa, &mut v);
        assert!((v[0] - 0.6).abs() < 1e-7 && (v[1] - 0.8).abs() < 1e-7);
        let mut z = [0.0, 0.0];
        normalize(isa, &mut z);
        assert_eq!(z, [0.0, 0.0]);
    }
}
