//! Causal (optionally sliding-window) attention of a batch of new queries over the KV cache, in
//! blocks of query rows per head so a tile of keys or values is read once per block instead of
//! once per query.
//!
//! Invariant: every query's arithmetic is exactly the plain per-query loop's — its scores are
//! `dot(query, key) · scale` for each visible slot, softmaxed by [`softmax`] in slot order, and
//! its output accumulates `p · value` by [`axpy`] in increasing slot order. Only the order in
//! which independent queries are worked on changes, so the values are bit-identical.

use super::kernels::{axpy, dot, dot4, softmax};
use crate::attention::{first_visible_slot, visible_slots};
use anemone_backend::team::{for_each_block, SharedOut, Team};
use rayon::prelude::*;

/// Query rows of one head worked on together (their keys and values shared from cache).
const ROWS_PER_BLOCK: usize = 16;
/// Key (and value) slots per tile: 256 slots of a 64-wide head are 64 KiB, within L2.
const SLOTS_PER_TILE: usize = 256;

/// The shape of one attention call.
#[derive(Debug, Clone, Copy)]
pub struct AttentionShape {
    pub heads: usize,
    /// Query heads per KV head.
    pub group: usize,
    pub head_dim: usize,
    /// Slot of the batch's first query (positions before it are already cached).
    pub first_position: usize,
    pub scale: f32,
    pub window: Option<usize>,
}

/// `out [rows, heads·d]` = attention of `q [rows, heads·d]` over `keys`, `values`
/// `[slots, kv_heads·d]`, where query `row` sits at slot `first_position + row`.
///
/// A batch of one block of rows (decode: one row) with a `team` runs its heads on the team (no
/// rayon wake-up per layer); the values are the same either way.
pub fn attend(
    shape: AttentionShape,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
    out: &mut [f32],
    team: Option<&Team>,
) {
    let AttentionShape {
        heads, head_dim: d, ..
    } = shape;
    let q_dim = heads * d;
    let rows = q.len() / q_dim;
    debug_assert_eq!(out.len(), rows * q_dim);
    let blocks = rows.div_ceil(ROWS_PER_BLOCK);
    if rows == 1 {
        if let Some(team) = team {
            // one row: head h's output is out[h·d..(h+1)·d]
            let shared = SharedOut::new(out);
            for_each_block(Some(team), heads, &|head| {
                let head_out = attend_block(shape, head, 0..1, q, keys, values);
                // SAFETY: each head writes its own d values of `out`, which outlives the region.
                unsafe { shared.slice(head * d..(head + 1) * d) }.copy_from_slice(&head_out);
            });
            return;
        }
    }
    // tasks (head, block of rows); the output of one task is scattered over its rows, so each
    // task fills its own buffer and the buffers are placed afterwards
    let results: Vec<(usize, usize, Vec<f32>)> = (0..heads * blocks)
        .into_par_iter()
        .map(|task| {
            let (head, block) = (task % heads, task / heads);
            let first_row = block * ROWS_PER_BLOCK;
            let last_row = (first_row + ROWS_PER_BLOCK).min(rows);
            let block_out = attend_block(shape, head, first_row..last_row, q, keys, values);
            (head, first_row, block_out)
        })
        .collect();
    for (head, first_row, block_out) in results {
        for (r, row_out) in block_out.chunks_exact(d).enumerate() {
            let at = (first_row + r) * q_dim + head * d;
            out[at..at + d].copy_from_slice(row_out);
        }
    }
}

/// One head over rows `rows` of the batch: `[rows.len(), d]` outputs.
fn attend_block(
    shape: AttentionShape,
    head: usize,
    rows: std::ops::Range<usize>,
    q: &[f32],
    keys: &[f32],
    values: &[f32],
) -> Vec<f32> {
    let d = shape.head_dim;
    let q_dim = shape.heads * d;
    let kv_dim = q_dim / shape.group;
    let kv_offset = (head / shape.group) * d;
    let span = |row: usize| {
        first_visible_slot(shape.first_position, row, shape.window)
            ..visible_slots(shape.first_position, row)
    };
    let key = |t: usize| &keys[t * kv_dim + kv_offset..t * kv_dim + kv_offset + d];
    let value = |t: usize| &values[t * kv_dim + kv_offset..t * kv_dim + kv_offset + d];
    let lowest = span(rows.start).start;
    let highest = span(rows.end - 1).end;

    // scores[r] holds row r's scores for its visible slots, in slot order
    let mut scores: Vec<Vec<f32>> = rows.clone().map(|row| vec![0.0; span(row).len()]).collect();
    for tile_start in (lowest..highest).step_by(SLOTS_PER_TILE) {
        let tile = tile_start..(tile_start + SLOTS_PER_TILE).min(highest);
        for (row, row_scores) in rows.clone().zip(scores.iter_mut()) {
            let visible = span(row);
            let query = &q[row * q_dim + head * d..row * q_dim + (head + 1) * d];
            let (from, to) = (tile.start.max(visible.start), tile.end.min(visible.end));
            let mut t = from;
            while t + 4 <= to {
                let dots = dot4(query, [key(t), key(t + 1), key(t + 2), key(t + 3)]);
                for (i, d) in dots.iter().enumerate() {
                    row_scores[t + i - visible.start] = d * shape.scale;
                }
                t += 4;
            }
            for t in t..to {
                row_scores[t - visible.start] = dot(query, key(t)) * shape.scale;
            }
        }
    }
    scores.iter_mut().for_each(|s| softmax(s));

    let mut out = vec![0.0f32; rows.len() * d];
    for tile_start in (lowest..highest).step_by(SLOTS_PER_TILE) {
        let tile = tile_start..(tile_start + SLOTS_PER_TILE).min(highest);
        for ((row, row_scores), row_out) in rows.clone().zip(&scores).zip(out.chunks_exact_mut(d)) {
            let visible = span(row);
            for t in tile.start.max(visible.start)..tile.end.min(visible.end) {
                axpy(row_scores[t - visible.start], value(t), row_out);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The plain loop the blocked one must equal to the bit: one query at a time.
    fn attend_plain(shape: AttentionShape, q: &[f32], keys: &[f32], values: &[f32]) -> Vec<f32> {
        let d = shape.head_dim;
        let q_dim = shape.heads * d;
        let kv_dim = q_dim / shape.group;
        let rows = q.len() / q_dim;
        let mut out = vec![0.0f32; rows * q_dim];
        for row in 0..rows {
            for head in 0..shape.heads {
                let kv_offset = (head / shape.group) * d;
                let query = &q[row * q_dim + head * d..row * q_dim + (head + 1) * d];
                let visible = visible_slots(shape.first_position, row);
                let start = first_visible_slot(shape.first_position, row, shape.window);
                let mut scores: Vec<f32> = (start..visible)
                    .map(|t| dot(query, &keys[t * kv_dim + kv_offset..][..d]) * shape.scale)
                    .collect();
                softmax(&mut scores);
                let o = &mut out[row * q_dim + head * d..row * q_dim + (head + 1) * d];
                for (t, p) in (start..visible).zip(&scores) {
                    axpy(*p, &values[t * kv_dim + kv_offset..][..d], o);
                }
            }
        }
        out
    }

    fn pseudo_random(n: usize, seed: u64) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32) * 4.0 - 2.0
            })
            .collect()
    }

    #[test]
    fn blocked_attention_equals_the_plain_loop_to_the_bit() {
        // batches across block and tile edges, decode steps, GQA, windows shorter and longer
        // than a tile, head widths that are not a multiple of the SIMD width
        for (rows, first_position, heads, group, d, window) in [
            (1, 0, 4, 2, 8, None),
            (1, 700, 6, 3, 64, None),
            (1, 700, 4, 2, 64, Some(300)),
            (37, 0, 4, 4, 16, None),
            (33, 300, 2, 1, 12, Some(5)),
            (70, 250, 4, 2, 64, Some(300)),
            (16, 513, 3, 3, 20, Some(600)),
        ] {
            let slots = first_position + rows;
            let q_dim = heads * d;
            let kv_dim = q_dim / group;
            let q = pseudo_random(rows * q_dim, 1);
            let keys = pseudo_random(slots * kv_dim, 2);
            let values = pseudo_random(slots * kv_dim, 3);
            let shape = AttentionShape {
                heads,
                group,
                head_dim: d,
                first_position,
                scale: 1.0 / (d as f32).sqrt(),
                window,
            };
            let plain = attend_plain(shape, &q, &keys, &values);
            let team = Team::new(2).unwrap();
            for on_team in [false, true] {
                let mut blocked = vec![f32::NAN; rows * q_dim];
                let team = on_team.then_some(&team);
                attend(shape, &q, &keys, &values, &mut blocked, team);
                let differing = blocked
                    .iter()
                    .zip(&plain)
                    .position(|(a, b)| a.to_bits() != b.to_bits());
                assert_eq!(
                    differing, None,
                    "rows {rows} at {first_position}, heads {heads}/{group}, d {d}, window \
                     {window:?}, team {on_team}: first differing element {differing:?}"
                );
            }
        }
    }
}
