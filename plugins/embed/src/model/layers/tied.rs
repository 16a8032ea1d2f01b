//! The product against a row-major `[n, k]` table read as the transposed
//! weight of a dense layer: an MLM decoder whose weights are tied to the
//! word embeddings (SPLADE's), computed a block of the table's rows at a
//! time so that no `[tokens x vocabulary]` matrix is ever held, and without
//! a second, panel-packed copy of the table in the cache.

/// out[m, rows lo..hi of `table`] = a[m, k] x table[lo..hi, :]^T + bias[lo..hi]:
/// `out` is `m x (hi - lo)`, row-major.
///
/// Panics when the slices are shorter than the shapes say, or lo..hi is
/// not within the table's rows.
pub(crate) fn product_t(
    a: &[f32],
    m: usize,
    table: &[f32],
    bias: &[f32],
    k: usize,
    (lo, hi): (usize, usize),
    out: &mut [f32],
) {
    let n = hi - lo;
    assert!(
        lo <= hi && table.len() >= hi * k && bias.len() >= hi,
        "rows {lo}..{hi} of a table of {} x {k}",
        table.len() / k.max(1)
    );
    assert!(
        a.len() >= m * k && out.len() >= m * n,
        "a is {} (want {m} x {k}), out is {} (want {m} x {n})",
        a.len(),
        out.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    for row in out.chunks_exact_mut(n).take(m) {
        row.copy_from_slice(&bias[lo..hi]);
    }
    // SAFETY: dst is out (m x n, column stride 1, row stride n), lhs is a
    // (m x k, column stride 1, row stride k), rhs is the k x n transposed
    // block of the table (element (i, j) at table[(lo + j) * k + i]: column
    // stride k, row stride 1), all in bounds by the asserts above; out is
    // ours alone (a &mut) and aliases neither input.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            out.as_mut_ptr(),
            1,
            n as isize,
            true,
            a.as_ptr(),
            1,
            k as isize,
            table.as_ptr().add(lo * k),
            k as isize,
            1,
            1.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::None,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::test_support::noise;

    #[test]
    fn matches_the_naive_product() {
        let (m, k, rows) = (5, 24, 37);
        let a = noise(m * k, 1);
        let table = noise(rows * k, 2);
        let bias = noise(rows, 3);
        for (lo, hi) in [(0, rows), (3, 19), (36, 37), (10, 10)] {
            let mut out = vec![f32::NAN; m * (hi - lo)];
            product_t(&a, m, &table, &bias, k, (lo, hi), &mut out);
            for r in 0..m {
                for j in 0..hi - lo {
                    let want: f32 = bias[lo + j]
                        + (0..k)
                            .map(|i| a[r * k + i] * table[(lo + j) * k + i])
                            .sum::<f32>();
                    let got = out[r * (hi - lo) + j];
                    assert!(
                        (got - want).abs() < 1e-4,
                        "{lo}..{hi} [{r},{j}]: {got} vs {want}"
                    );
                }
            }
        }
    }
}
