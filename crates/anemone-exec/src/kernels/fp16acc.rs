//! The pessimistic accumulation of [`crate::Accumulation::Fp16Blocks`]: every sum of a
//! reduction (matmul/conv/linear dot products, softmax denominators, layer_norm moments,
//! reduce_sum/mean) runs as an fp16 accumulator would. Terms are added in f32 in blocks of
//! [`BLOCK`] consecutive terms (an adder tree's width); each block's sum is rounded to fp16 and
//! added to an fp16 running total, which is rounded to fp16 after every add. Products are
//! formed in f32 (the operands are fp16 values already, so each product is exact in f32 up to
//! its rounding to f32). Used to bracket the Neural Engine, whose accumulator width is not
//! documented: a bundle that passes the gate both in this mode and in the f32-accumulating one
//! does not depend on it.

use half::f16;
use rayon::prelude::*;

use super::linalg::MatRef;
use super::simd;

/// Terms summed in f32 before the block's sum is rounded into the fp16 accumulator.
pub const BLOCK: usize = 32;

#[inline]
fn r16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Adds one block's f32 sum into the fp16 running total.
#[inline]
fn add_block(acc: f32, block_sum: f32) -> f32 {
    r16(acc + r16(block_sum))
}

/// Folds per-output block sums into their fp16 running totals and clears the blocks.
pub fn fold_block(acc: &mut [f32], block: &mut [f32]) {
    for (a, b) in acc.iter_mut().zip(block.iter_mut()) {
        *a = add_block(*a, *b);
        *b = 0.0;
    }
}

/// `Σ terms` with fp16 accumulation in blocks.
pub fn sum(terms: impl IntoIterator<Item = f32>) -> f32 {
    let mut acc = 0.0f32;
    let mut block = 0.0f32;
    let mut n = 0;
    for t in terms {
        block += t;
        n += 1;
        if n == BLOCK {
            acc = add_block(acc, block);
            block = 0.0;
            n = 0;
        }
    }
    if n > 0 {
        acc = add_block(acc, block);
    }
    acc
}

/// `Σ a[i]·b[i]` with fp16 accumulation in blocks.
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let d = simd::dot_f32_kernel();
    a.chunks(BLOCK)
        .zip(b.chunks(BLOCK))
        .fold(0.0, |acc, (x, y)| add_block(acc, d(x, y)))
}

/// `Σ w[i]·x[i]` over fp16 weights with fp16 accumulation in blocks.
pub fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
    let d = simd::dot_f16_kernel();
    w.chunks(BLOCK)
        .zip(x.chunks(BLOCK))
        .fold(0.0, |acc, (x, y)| add_block(acc, d(x, y)))
}

/// `dst = W · x` for an fp16 row-major `W [rows × x.len()]`.
pub fn matvec_f16(dst: &mut [f32], w: &[f16], x: &[f32]) -> Result<(), String> {
    let k = x.len();
    if w.len() != dst.len() * k {
        return Err(format!(
            "fp16 matvec: weight of {} values for {} rows of {k}",
            w.len(),
            dst.len()
        ));
    }
    dst.par_iter_mut()
        .enumerate()
        .for_each(|(i, d)| *d = dot_f16(&w[i * k..(i + 1) * k], x));
    Ok(())
}

/// `dst (row-major m×n) = a (m×k) · b (k×n)`: rows of `a` and columns of `b` are gathered
/// contiguous once, then every output is one blocked dot product.
pub fn matmul_into(dst: &mut [f32], a: MatRef, b: MatRef) -> Result<(), String> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() != m * n {
        return Err(format!(
            "matmul operands disagree: {}×{} · {}×{} into {} values",
            a.rows,
            a.cols,
            b.rows,
            b.cols,
            dst.len()
        ));
    }
    let at: Vec<f32> = (0..m)
        .flat_map(|i| (0..k).map(move |j| a.data[i * a.rs + j * a.cs]))
        .collect();
    let bt: Vec<f32> = (0..n)
        .flat_map(|j| (0..k).map(move |i| b.data[i * b.rs + j * b.cs]))
        .collect();
    dst.par_chunks_mut(n.max(1))
        .enumerate()
        .for_each(|(i, row)| {
            let ai = &at[i * k..(i + 1) * k];
            for (j, d) in row.iter_mut().enumerate() {
                *d = dot(ai, &bt[j * k..(j + 1) * k]);
            }
        });
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn block_sums_round_into_an_fp16_total() {
        // block 1: 2048 + 31 = 2079 → fp16 2080 (ties to even); block 2: + 32 → 2112
        let terms: Vec<f32> = std::iter::once(2048.0).chain([1.0; 63]).collect();
        assert_eq!(terms.iter().sum::<f32>(), 2111.0);
        assert_eq!(sum(terms.iter().copied()), 2112.0);
        let ones = vec![1.0f32; 64];
        assert_eq!(dot(&terms, &ones), 2112.0);
        let w: Vec<f16> = terms.iter().map(|&v| f16::from_f32(v)).collect();
        assert_eq!(dot_f16(&w, &ones), 2112.0);
        let mut y = [0.0f32; 1];
        matvec_f16(&mut y, &w, &ones).unwrap();
        assert_eq!(y[0], 2112.0);
        let mut m = [0.0f32; 1];
        let a = MatRef::row_major(&terms, 1, 64);
        let b = MatRef::row_major(&ones, 64, 1);
        matmul_into(&mut m, a, b).unwrap();
        assert_eq!(m[0], 2112.0);
    }
}
