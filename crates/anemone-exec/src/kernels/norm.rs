//! Reductions over axis sets: softmax, layer_norm, reduce_*. Sums accumulate in f32, or in
//! fp16 blocks under [`Accumulation::Fp16Blocks`].

use anemone_mil::ReduceOp;

use super::{fp16acc, Accumulation};

use crate::decompress::strides;

/// Flat offsets of every coordinate combination over `axes` (in the listed order, row-major),
/// and over the remaining axes (ascending, row-major).
fn axis_offsets(shape: &[usize], axes: &[usize]) -> (Vec<usize>, Vec<usize>) {
    let st = strides(shape);
    let enumerate = |ax: &[usize]| -> Vec<usize> {
        let mut offs = vec![0usize];
        for &a in ax {
            let mut next = Vec::with_capacity(offs.len() * shape[a]);
            for &o in &offs {
                for i in 0..shape[a] {
                    next.push(o + i * st[a]);
                }
            }
            offs = next;
        }
        offs
    };
    let rest: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    (enumerate(axes), enumerate(&rest))
}

/// `x.exp()`, with the arguments whose exponential rounds to +0 in f32 (below ln 2⁻¹⁵⁰ ≈
/// −103.97) answered without the library's slow underflow path: masked attention positions
/// (≈ −1e4) are most of a softmax row.
#[inline]
pub fn exp_or_zero(x: f32) -> f32 {
    if x < -104.0 {
        0.0
    } else {
        x.exp()
    }
}

/// Softmax along `axis`, with the row maximum subtracted first.
pub fn softmax(data: &mut [f32], shape: &[usize], axis: usize, acc: Accumulation) {
    let outer: usize = shape[..axis].iter().product();
    let n = shape[axis];
    let inner: usize = shape[axis + 1..].iter().product();
    if inner == 1 && acc == Accumulation::F32 && n > 0 {
        // rows are contiguous: the same operations in the same order, without the gather
        for row in data.chunks_exact_mut(n) {
            let max = row.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
            // the exponentials first (the same values), then their sum in the same order
            super::exp_table::exp_shifted(row, max);
            let sum = row.iter().fold(0.0f32, |s, &r| s + r);
            row.iter_mut().for_each(|r| *r /= sum);
        }
        return;
    }
    let mut row = vec![0.0f32; n];
    for o in 0..outer {
        for i in 0..inner {
            let base = o * n * inner + i;
            let mut max = f32::NEG_INFINITY;
            for (k, r) in row.iter_mut().enumerate() {
                *r = data[base + k * inner];
                max = max.max(*r);
            }
            let mut sum = 0.0f32;
            for r in row.iter_mut() {
                *r = exp_or_zero(*r - max);
                sum += *r;
            }
            match acc {
                Accumulation::F32 => {}
                Accumulation::Fp16Blocks => sum = fp16acc::sum(row.iter().copied()),
            }
            for (k, r) in row.iter().enumerate() {
                data[base + k * inner] = r / sum;
            }
        }
    }
}

/// Softmax down each column of `data` (`[n × cols]` row-major): the values [`softmax`] gives
/// each row of the transposed `[cols × n]`, bit for bit — every column's max and sum taken over
/// its `n` values in order, as a row's are — with the columns side by side in vector lanes.
pub fn softmax_columns(data: &mut [f32], n: usize, cols: usize) {
    if n == 0 || cols == 0 || data.len() != n * cols {
        return;
    }
    let mut max = vec![f32::NEG_INFINITY; cols];
    for row in data.chunks_exact(cols) {
        max.iter_mut().zip(row).for_each(|(m, &v)| *m = m.max(v));
    }
    // `exp_shifted(x, 0)` computes `exp(x - 0) = exp(x)`: each value's exponential of
    // `value - max` as a row's
    for row in data.chunks_exact_mut(cols) {
        row.iter_mut().zip(&max).for_each(|(r, m)| *r -= m);
    }
    super::exp_table::exp_shifted(data, 0.0);
    let mut sum = vec![0.0f32; cols];
    for row in data.chunks_exact(cols) {
        sum.iter_mut().zip(row).for_each(|(s, &r)| *s += r);
    }
    for row in data.chunks_exact_mut(cols) {
        row.iter_mut().zip(&sum).for_each(|(r, s)| *r /= s);
    }
}

/// `(x - mean) / sqrt(var + eps) * gamma + beta` over `axes` (biased variance); gamma and
/// beta are indexed by the coordinates along `axes` in the listed order.
pub fn layer_norm(
    data: &mut [f32],
    shape: &[usize],
    axes: &[usize],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    epsilon: f32,
    acc: Accumulation,
) {
    let (norm, rest) = axis_offsets(shape, axes);
    let n = norm.len() as f32;
    let total = |terms: &mut dyn Iterator<Item = f32>| match acc {
        Accumulation::F32 => terms.sum::<f32>(),
        Accumulation::Fp16Blocks => fp16acc::sum(terms),
    };
    for &r in &rest {
        let mean = total(&mut norm.iter().map(|&k| data[r + k])) / n;
        let var = total(&mut norm.iter().map(|&k| {
            let d = data[r + k] - mean;
            d * d
        })) / n;
        let inv = 1.0 / (var + epsilon).sqrt();
        for (j, &k) in norm.iter().enumerate() {
            let mut y = (data[r + k] - mean) * inv;
            if let Some(g) = gamma {
                y *= g[j];
            }
            if let Some(b) = beta {
                y += b[j];
            }
            data[r + k] = y;
        }
    }
}

/// Reduces over `axes`; the result is laid out over the remaining axes in order (which is
/// the output layout with or without kept size-1 dims).
pub fn reduce(
    kind: ReduceOp,
    data: &[f32],
    shape: &[usize],
    axes: &[usize],
    acc: Accumulation,
) -> Vec<f32> {
    let rank = shape.len();
    let trailing = !axes.is_empty()
        && axes
            .iter()
            .enumerate()
            .all(|(i, &a)| a == rank - axes.len() + i);
    if trailing && acc == Accumulation::F32 {
        // the reduced values of each output are one contiguous run, visited in the same order
        let len: usize = axes.iter().map(|&a| shape[a]).product();
        if len > 0 {
            return data
                .chunks_exact(len)
                .map(|run| match kind {
                    ReduceOp::Sum => run.iter().sum::<f32>(),
                    ReduceOp::Mean => run.iter().sum::<f32>() / len as f32,
                    ReduceOp::Max => run.iter().copied().fold(f32::NEG_INFINITY, f32::max),
                })
                .collect();
        }
    }
    if let ([a], Accumulation::F32) = (axes, acc) {
        if let Some(out) = reduce_middle_axis(kind, data, shape, *a) {
            return out;
        }
    }
    let (red, rest) = axis_offsets(shape, axes);
    let n = red.len() as f32;
    let total = |r: usize| match acc {
        Accumulation::F32 => red.iter().map(|&k| data[r + k]).sum::<f32>(),
        Accumulation::Fp16Blocks => fp16acc::sum(red.iter().map(|&k| data[r + k])),
    };
    rest.iter()
        .map(|&r| match kind {
            ReduceOp::Sum => total(r),
            ReduceOp::Mean => total(r) / n,
            ReduceOp::Max => red
                .iter()
                .map(|&k| data[r + k])
                .fold(f32::NEG_INFINITY, f32::max),
        })
        .collect()
}

/// [`reduce`] over one axis that is not the last (e.g. channels of `[1, C, 1, T]`), each output
/// folding its values in the same order from the same start, whole rows of outputs at a time
/// (vectorisable) instead of one gathered output at a time.
fn reduce_middle_axis(kind: ReduceOp, data: &[f32], shape: &[usize], a: usize) -> Option<Vec<f32>> {
    let outer: usize = shape[..a].iter().product();
    let n = shape[a];
    let inner: usize = shape.get(a + 1..)?.iter().product();
    if n == 0 || inner <= 1 || data.len() != outer * n * inner {
        return None;
    }
    // the start `Iterator::sum` folds from
    let zero: f32 = std::iter::empty::<f32>().sum();
    let init = match kind {
        ReduceOp::Sum | ReduceOp::Mean => zero,
        ReduceOp::Max => f32::NEG_INFINITY,
    };
    let mut out = vec![init; outer * inner];
    for (dst, block) in out
        .chunks_exact_mut(inner)
        .zip(data.chunks_exact(n * inner))
    {
        for src in block.chunks_exact(inner) {
            match kind {
                ReduceOp::Sum | ReduceOp::Mean => {
                    dst.iter_mut().zip(src).for_each(|(d, &x)| *d += x)
                }
                ReduceOp::Max => dst.iter_mut().zip(src).for_each(|(d, &x)| *d = d.max(x)),
            }
        }
    }
    if kind == ReduceOp::Mean {
        out.iter_mut().for_each(|d| *d /= n as f32);
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn column_softmax_is_the_row_softmax_of_the_transpose_bit_for_bit() {
        let (n, cols) = (70usize, 37usize);
        let mut data: Vec<f32> = (0..n * cols)
            .map(|i| match i % 13 {
                0 => -0.0,
                1 => -1e4,
                2 => -300.0,
                _ => ((i * 7919 % 263) as f32 - 131.0) * 0.173,
            })
            .collect();
        // a column with a NaN, one wholly −∞, one of zeros of both signs
        data[5 * cols + 3] = f32::NAN;
        (0..n).for_each(|r| data[r * cols + 7] = f32::NEG_INFINITY);
        (0..n).for_each(|r| data[r * cols + 11] = if r % 2 == 0 { 0.0 } else { -0.0 });
        let mut rows: Vec<f32> = (0..cols * n)
            .map(|i| data[(i % n) * cols + i / n])
            .collect();
        softmax(&mut rows, &[cols, n], 1, Accumulation::F32);
        softmax_columns(&mut data, n, cols);
        for (i, got) in data.iter().enumerate() {
            let want = rows[(i % cols) * n + i / cols];
            assert!(
                got.to_bits() == want.to_bits() || (got.is_nan() && want.is_nan()),
                "row {} column {}: {got} vs {want}",
                i / cols,
                i % cols
            );
        }
    }

    /// The middle-axis path gives the general (gathering) path's results bit for bit.
    #[test]
    fn middle_axis_equals_the_general_path() {
        let shape = [2usize, 37, 3, 5];
        let mixed: Vec<f32> = (0..2 * 37 * 15)
            .map(|i| match i % 11 {
                0 => -0.0,
                1 => f32::NAN,
                _ => ((i * 7919 % 263) as f32 - 131.0) * 0.37,
            })
            .collect();
        // all −0 terms: the sum keeps the sign the general path's start gives
        let zeros = vec![-0.0f32; 2 * 37 * 15];
        for data in [mixed, zeros] {
            for kind in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
                for a in [1usize, 2] {
                    let fast = reduce_middle_axis(kind, &data, &shape, a).unwrap();
                    let (red, rest) = axis_offsets(&shape, &[a]);
                    let slow: Vec<f32> = rest
                        .iter()
                        .map(|&r| gathered(kind, &data, r, &red))
                        .collect();
                    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                    assert_eq!(bits(&fast), bits(&slow), "{kind:?} over axis {a}");
                }
            }
        }
    }

    /// The reduction of `data[r + k]` over the offsets `red`, gathered one value at a time.
    fn gathered(kind: ReduceOp, data: &[f32], r: usize, red: &[usize]) -> f32 {
        let vals = red.iter().map(|&k| data[r + k]);
        match kind {
            ReduceOp::Sum => vals.sum::<f32>(),
            ReduceOp::Mean => vals.sum::<f32>() / red.len() as f32,
            ReduceOp::Max => vals.fold(f32::NEG_INFINITY, f32::max),
        }
    }

    /// The contiguous fast paths give the general (gathering) path's results bit for bit.
    #[test]
    fn contiguous_paths_equal_the_general_path() {
        let shape = [2usize, 3, 37];
        let data: Vec<f32> = (0..222)
            .map(|i| ((i * 7919 % 263) as f32 - 131.0) * 0.37 - if i % 5 == 0 { 1e4 } else { 0.0 })
            .collect();
        for kind in [ReduceOp::Sum, ReduceOp::Mean, ReduceOp::Max] {
            for axes in [vec![2usize], vec![1, 2]] {
                let fast = reduce(kind, &data, &shape, &axes, Accumulation::F32);
                // the general path, reached through an equivalent leading unit axis order
                let (red, rest) = axis_offsets(&shape, &axes);
                let slow: Vec<f32> = rest
                    .iter()
                    .map(|&r| gathered(kind, &data, r, &red))
                    .collect();
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&fast), bits(&slow), "{kind:?} over {axes:?}");
            }
        }
        // softmax over the last axis (contiguous) against the same rows moved to a strided axis
        let mut fast = data.clone();
        softmax(&mut fast, &shape, 2, Accumulation::F32);
        let mut moved = vec![0.0f32; 222];
        for r in 0..6 {
            for k in 0..37 {
                moved[k * 6 + r] = data[r * 37 + k];
            }
        }
        softmax(&mut moved, &[37, 6], 0, Accumulation::F32);
        for r in 0..6 {
            for k in 0..37 {
                assert_eq!(fast[r * 37 + k].to_bits(), moved[k * 6 + r].to_bits());
            }
        }
    }

    #[test]
    fn exp_or_zero_is_exp() {
        let mut x = -120.0f32;
        while x < 1.0 {
            assert_eq!(exp_or_zero(x).to_bits(), x.exp().to_bits(), "{x}");
            x += 0.0137;
        }
        for x in [-1e4f32, f32::NEG_INFINITY, -104.0, -103.97, -103.27, -87.0] {
            assert_eq!(exp_or_zero(x).to_bits(), x.exp().to_bits(), "{x}");
        }
        assert!(exp_or_zero(f32::NAN).is_nan());
    }
}
