//! Elementwise passes over large buffers (a prefill step's activations) spread over the team in
//! blocks. Every element is computed alone, so which thread computes a block never changes a
//! value; buffers below [`MIN_SPREAD`] values (a decode step's) run on the calling thread.

use crate::team::{self, SharedOut};

/// Values below which a pass runs on the calling thread (a region costs a few microseconds).
pub const MIN_SPREAD: usize = 32 << 10;
/// Values per block (64 KiB of f32: a block stays in L2 next to its operand).
const BLOCK: usize = 16 << 10;

/// `f(block)` over consecutive blocks of `data`, spread over the team when `data` is large.
pub fn blocks(data: &mut [f32], f: &(dyn Fn(&mut [f32]) + Sync)) {
    blocks_with(data, &[], &|dst, _| f(dst));
}

/// `f(block, other_block)` over consecutive blocks of `data` and the same ranges of `other`
/// (`other` as long as `data`, or empty: then every call gets an empty slice).
pub fn blocks_with(data: &mut [f32], other: &[f32], f: &(dyn Fn(&mut [f32], &[f32]) + Sync)) {
    assert!(other.is_empty() || other.len() == data.len());
    let part = |r: std::ops::Range<usize>| if other.is_empty() { &[][..] } else { &other[r] };
    let team = if data.len() >= MIN_SPREAD {
        team::current().filter(|t| t.threads() > 1)
    } else {
        None
    };
    let Some(team) = team else {
        f(data, part(0..data.len()));
        return;
    };
    let len = data.len();
    let out = SharedOut::new(data);
    team::for_each_block(Some(&team), len.div_ceil(BLOCK), &|b| {
        let range = b * BLOCK..((b + 1) * BLOCK).min(len);
        // SAFETY: blocks are disjoint ranges of `data`, which outlives the region.
        let dst = unsafe { out.slice(range.clone()) };
        f(dst, part(range));
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_is_computed_once_on_a_team_or_alone() {
        let team = std::sync::Arc::new(crate::team::Team::new(2).unwrap());
        for len in [0, 7, MIN_SPREAD - 1, MIN_SPREAD, 3 * BLOCK + 5] {
            let other: Vec<f32> = (0..len).map(|i| i as f32).collect();
            let mut data = vec![1.0f32; len];
            crate::team::with_team(&team, || {
                blocks_with(&mut data, &other, &|d, o| {
                    d.iter_mut().zip(o).for_each(|(d, o)| *d += o)
                })
            });
            assert!(data.iter().enumerate().all(|(i, &v)| v == i as f32 + 1.0));
            crate::team::with_team(&team, || {
                blocks(&mut data, &|d| d.iter_mut().for_each(|v| *v *= 2.0))
            });
            assert!(data
                .iter()
                .enumerate()
                .all(|(i, &v)| v == 2.0 * (i as f32 + 1.0)));
        }
    }
}
