//! Data-movement kernels: slices, slice_update, concat, split, transpose.

use crate::decompress::strides;

/// Visits every index of `shape` in row-major order, passing the flat offset into a tensor
/// laid out with `src_strides` (any strides, e.g. a slice or permutation of another tensor).
fn for_each_strided(shape: &[usize], src_strides: &[usize], base: usize, mut f: impl FnMut(usize)) {
    let numel: usize = shape.iter().product();
    if numel == 0 {
        return;
    }
    let rank = shape.len();
    if rank == 0 {
        f(base);
        return;
    }
    let inner = shape[rank - 1];
    let step = src_strides[rank - 1];
    let mut coord = vec![0usize; rank - 1];
    let mut off = base;
    let mut done = 0;
    while done < numel {
        for j in 0..inner {
            f(off + j * step);
        }
        done += inner;
        for ax in (0..rank - 1).rev() {
            coord[ax] += 1;
            off += src_strides[ax];
            if coord[ax] < shape[ax] {
                break;
            }
            off -= src_strides[ax] * shape[ax];
            coord[ax] = 0;
        }
    }
}

/// `x[begin:end:stride]` (bounds already checked by the program's type inference).
pub fn slice_by_index<T: Copy>(
    x: &[T],
    x_shape: &[usize],
    begin: &[usize],
    stride: &[usize],
    out_shape: &[usize],
) -> Vec<T> {
    let xs = strides(x_shape);
    let base: usize = begin.iter().zip(&xs).map(|(b, s)| b * s).sum();
    let src: Vec<usize> = xs.iter().zip(stride).map(|(s, st)| s * st).collect();
    let mut out = Vec::with_capacity(out_shape.iter().product());
    let rank = out_shape.len();
    if rank > 0 && src[rank - 1] == 1 {
        // contiguous rows: copy each innermost run at once
        let run = out_shape[rank - 1];
        let mut outer_shape = out_shape.to_vec();
        outer_shape[rank - 1] = 1;
        for_each_strided(&outer_shape, &src, base, |i| {
            out.extend_from_slice(&x[i..i + run])
        });
    } else {
        for_each_strided(out_shape, &src, base, |i| out.push(x[i]));
    }
    out
}

/// Writes `update` into `x` at `begin` (the caller checked that the window fits).
pub fn slice_update<T: Copy>(
    x: &mut [T],
    x_shape: &[usize],
    update: &[T],
    update_shape: &[usize],
    begin: &[usize],
) {
    let xs = strides(x_shape);
    let base: usize = begin.iter().zip(&xs).map(|(b, s)| b * s).sum();
    let mut k = 0;
    for_each_strided(update_shape, &xs, base, |i| {
        x[i] = update[k];
        k += 1;
    });
}

/// Concatenation along `axis` of tensors that agree elsewhere.
pub fn concat(parts: &[(&[f32], &[usize])], axis: usize, out_shape: &[usize]) -> Vec<f32> {
    let outer: usize = out_shape[..axis].iter().product();
    let inner: usize = out_shape[axis + 1..].iter().product();
    let mut out = Vec::with_capacity(out_shape.iter().product());
    for o in 0..outer {
        for (data, shape) in parts {
            let run = shape[axis] * inner;
            out.extend_from_slice(&data[o * run..(o + 1) * run]);
        }
    }
    out
}

/// Pieces of `x` along `axis` of the given sizes.
pub fn split(x: &[f32], x_shape: &[usize], axis: usize, sizes: &[usize]) -> Vec<Vec<f32>> {
    let outer: usize = x_shape[..axis].iter().product();
    let inner: usize = x_shape[axis + 1..].iter().product();
    let total = x_shape[axis] * inner;
    let mut start = 0;
    sizes
        .iter()
        .map(|&s| {
            let run = s * inner;
            let mut piece = Vec::with_capacity(outer * run);
            for o in 0..outer {
                piece.extend_from_slice(&x[o * total + start..o * total + start + run]);
            }
            start += run;
            piece
        })
        .collect()
}

/// `x` with axes permuted (`out.shape[i] = x.shape[perm[i]]`).
pub fn transpose(x: &[f32], x_shape: &[usize], perm: &[usize]) -> Vec<f32> {
    let xs = strides(x_shape);
    let out_shape: Vec<usize> = perm.iter().map(|&p| x_shape[p]).collect();
    let src: Vec<usize> = perm.iter().map(|&p| xs[p]).collect();
    let mut out = Vec::with_capacity(x.len());
    for_each_strided(&out_shape, &src, 0, |i| out.push(x[i]));
    out
}
