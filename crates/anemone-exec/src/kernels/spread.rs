//! Elementwise passes over large buffers (a prefill step's activations) spread over the team in
//! blocks. Every element is computed alone, so which thread computes a block never changes a
//! value; buffers below [`MIN_SPREAD`] values (a decode step's) run on the calling thread.

use std::ops::Range;

use anemone_mil::{BinaryOp, DType};

use super::elementwise::{self, Operand};
use crate::team::{self, SharedOut};

/// Values below which a pass runs on the calling thread (a region costs a few microseconds).
pub const MIN_SPREAD: usize = 32 << 10;
/// Values per block (64 KiB of f32: a block stays in L2 next to its operand).
const BLOCK: usize = 16 << 10;

/// The team a pass over `len` values spreads over: none below [`MIN_SPREAD`] or alone.
fn team_for(len: usize) -> Option<std::sync::Arc<team::Team>> {
    (len >= MIN_SPREAD)
        .then(team::current)
        .flatten()
        .filter(|t| t.threads() > 1)
}

/// `f(block)` over consecutive blocks of `data`, spread over the team when `data` is large.
pub fn blocks(data: &mut [f32], f: &(dyn Fn(&mut [f32]) + Sync)) {
    let len = data.len();
    in_rows(data, (len, 1), &|block, _| f(block));
}

/// `f(block, rows)` over blocks of whole rows of `data` (`extent` rows of `inner` values), `rows`
/// the block's range of rows, spread over the team when `data` is large.
fn in_rows(
    data: &mut [f32],
    (extent, inner): (usize, usize),
    f: &(dyn Fn(&mut [f32], Range<usize>) + Sync),
) {
    let Some(team) = team_for(data.len()).filter(|_| inner > 0) else {
        f(data, 0..extent);
        return;
    };
    let rows_per_block = (BLOCK / inner).max(1);
    let out = SharedOut::new(data);
    team::for_each_block(Some(&team), extent.div_ceil(rows_per_block), &|b| {
        let rows = b * rows_per_block..((b + 1) * rows_per_block).min(extent);
        // SAFETY: blocks are disjoint ranges of `data`, which outlives the region.
        let dst = unsafe { out.slice(rows.start * inner..rows.end * inner) };
        f(dst, rows);
    });
}

/// The part of an operand of `shape`, broadcast against an output split along `axis` (of the
/// output's `rank`), that output rows `rows` read: its own rows there, or all of it where it
/// broadcasts (absent or of length 1 on that axis). Returns the values and their shape.
fn operand_rows<'a>(
    data: &'a [f32],
    shape: &[usize],
    (axis, rank): (usize, usize),
    rows: Range<usize>,
) -> (&'a [f32], Vec<usize>) {
    let lead = rank - shape.len();
    match axis.checked_sub(lead) {
        Some(own) if shape[own] > 1 => {
            let inner: usize = shape[own + 1..].iter().product();
            let mut part = shape.to_vec();
            part[own] = rows.len();
            (&data[rows.start * inner..rows.end * inner], part)
        }
        _ => (data, shape.to_vec()),
    }
}

/// [`elementwise::binary_in_place`] (`buf` holds `x` of `out_shape`, `y` broadcasts to it) in
/// blocks of whole rows of the output's first axis longer than 1 (every axis before it has
/// length 1): the same values.
pub fn binary_in_place(
    kind: BinaryOp,
    dtype: DType,
    buf: &mut [f32],
    out_shape: &[usize],
    y: Operand,
) {
    let Some(axis) = out_shape.iter().position(|&d| d > 1) else {
        elementwise::binary_in_place(kind, dtype, buf, out_shape, y);
        return;
    };
    let inner: usize = out_shape[axis + 1..].iter().product();
    in_rows(buf, (out_shape[axis], inner), &|block, range| {
        let mut block_shape = out_shape.to_vec();
        block_shape[axis] = range.len();
        let (y_part, y_shape) = operand_rows(y.data, y.shape, (axis, out_shape.len()), range);
        let y = Operand {
            data: y_part,
            shape: &y_shape,
        };
        elementwise::binary_in_place(kind, dtype, block, &block_shape, y);
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_computed_once_on_a_team_or_alone() {
        let team = std::sync::Arc::new(crate::team::Team::new(2).unwrap());
        for len in [0, 7, MIN_SPREAD - 1, MIN_SPREAD, 3 * BLOCK + 5] {
            let mut data: Vec<f32> = (0..len).map(|i| i as f32).collect();
            crate::team::with_team(&team, || {
                blocks(&mut data, &|d| {
                    d.iter_mut().for_each(|v| *v = 2.0 * *v + 1.0)
                })
            });
            assert!(data
                .iter()
                .enumerate()
                .all(|(i, &v)| v == 2.0 * i as f32 + 1.0));
        }
    }

    #[test]
    fn broadcast_binary_in_blocks_equals_the_whole_op_bit_for_bit() {
        let team = std::sync::Arc::new(crate::team::Team::new(2).unwrap());
        let out = [1usize, 300, 1, 200];
        let numel: usize = out.iter().product();
        let x: Vec<f32> = (0..numel).map(|i| (i as f32 * 0.37).sin() * 3.0).collect();
        let y_shapes: [&[usize]; 5] =
            [&[1, 1, 1, 200], &[1, 300, 1, 1], &[300, 1, 200], &[1], &out];
        for y_shape in y_shapes {
            let y: Vec<f32> = (0..y_shape.iter().product::<usize>())
                .map(|i| 0.5 + (i as f32 * 0.11).cos())
                .collect();
            let op = |data, shape| Operand { data, shape };
            for kind in [BinaryOp::Mul, BinaryOp::Sub, BinaryOp::RealDiv] {
                let want = elementwise::binary(
                    kind,
                    DType::F32,
                    op(&x, &out),
                    op(&y, y_shape),
                    &out,
                    None,
                );
                let mut got = x.clone();
                crate::team::with_team(&team, || {
                    binary_in_place(kind, DType::F32, &mut got, &out, op(&y, y_shape))
                });
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "{kind:?} y {y_shape:?}");
            }
        }
    }
}
