//! One query head's attention over only the filled columns of its KV window, giving bit for
//! bit what the unfused program computes over every column.
//!
//! The program computes, per query head, `scores = qᵀ·k` `[T × C]`, `masked = scores + mask`,
//! `max = reduce_max(masked, -1)`, `shifted = masked - max`, `probs = softmax(shifted, -1)` and
//! `out = v · probsᵀ` `[dv × T]`, over all `C` slots of the KV state, although a prefill window
//! sees only the slots written so far (the mask holds −1e4 on the others). [`attend_filled`]
//! runs the same kernels on the first `L` columns (the visible ones, rounded up to a multiple of
//! 64) and proves on the data that the rest would change nothing:
//! - every hidden column's masked score is at most `mask + |score| + 16` (fp16 rounding near
//!   −1e4 is at most 4 per step), with `|score| ≤ 1.01·‖q_t‖₁·max|k|` over the hidden columns;
//!   when each row's visible maximum exceeds that bound by 128, the row maximum is the visible
//!   one and every hidden `shifted` value is below −104, whose exponential
//!   ([`super::norm::exp_or_zero`]) is exactly +0: softmax's sum gains only +0 terms and the
//!   hidden probabilities are exactly +0;
//! - `out`'s sums then gain `v·(+0) = ±0` terms, which leave an f32 sum that starts at +0
//!   unchanged (such a sum is never −0), provided the hidden `v` (and `k`) are finite;
//! - the summation order is that of the full product: `gemm` sums each output along k in order
//!   within blocks of at least 256 (`L ≤ 256` lies in the first), and the shapes keep every
//!   product on `gemm`'s blocked path (`k ≥ 3`, both output dims ≥ 2, `dv·T > 256`).
//!
//! When any of this does not hold, [`attend_filled`] answers `None` and the caller runs the
//! program's ops as they are.

use std::cmp::Ordering::{Equal, Greater, Less};

use anemone_backend::round_f16_in_place;

use super::linalg::{matmul_on, MatRef, PARALLEL_WORK};
use super::norm::softmax;
use super::Accumulation;

/// Mask values at or below this hide a column.
pub const HIDDEN: f32 = -1e4;
/// Columns are taken in multiples of this.
const COLUMN_STEP: usize = 64;
/// The most columns taken (the smallest first k-block of `gemm`'s full product is longer).
const MAX_COLUMNS: usize = 256;

/// One query head's operands, channels first as the program holds them; K and V in the
/// element type the KV state is held in (f32 unless said: the prefill kernels here read f32).
#[derive(Clone, Copy)]
pub struct HeadWindow<'a, E = f32> {
    /// `[d × t]`
    pub q: &'a [f32],
    /// `[d × c]`
    pub k: &'a [E],
    /// `[dv × c]`
    pub v: &'a [E],
    /// `[t × c]`, additive
    pub mask: &'a [f32],
    pub d: usize,
    pub dv: usize,
    pub t: usize,
    pub c: usize,
}

/// Which op outputs are rounded to fp16 (each op's declared dtype under fp16 precision).
#[derive(Clone, Copy, Debug, Default)]
pub struct Rounding {
    pub scores: bool,
    pub masked: bool,
    pub max: bool,
    pub shifted: bool,
    pub probs: bool,
    pub out: bool,
}

fn round_if(on: bool, data: &mut [f32]) {
    if on {
        round_f16_in_place(data);
    }
}

/// The number of columns to compute: the visible ones rounded up to a multiple of 64, when that
/// is fewer than all and the shapes keep the products' summation order (see the module docs).
pub fn filled_columns(w: &HeadWindow) -> Option<usize> {
    let HeadWindow { d, dv, t, c, .. } = *w;
    if t < 2 || !(3..=MAX_COLUMNS).contains(&d) || dv < 2 || dv * t <= 256 {
        return None;
    }
    if w.q.len() != d * t || w.k.len() != d * c || w.v.len() != dv * c || w.mask.len() != t * c {
        return None;
    }
    let visible = w
        .mask
        .chunks_exact(c)
        .map(|row| {
            row.iter()
                .rposition(|&m| !matches!(m.partial_cmp(&HIDDEN), Some(Less | Equal)))
                .map_or(0, |j| j + 1)
        })
        .max()?;
    let l = visible.max(1).div_ceil(COLUMN_STEP) * COLUMN_STEP;
    (l < c && l <= MAX_COLUMNS).then_some(l)
}

/// `out [dv × t]` of the head over its first [`filled_columns`] columns, or `None` when the
/// hidden columns cannot be shown to contribute nothing (the caller then runs the full ops).
pub fn attend_filled(w: &HeadWindow, round: Rounding) -> Result<Option<Vec<f32>>, String> {
    let Some(l) = filled_columns(w) else {
        return Ok(None);
    };
    match hidden_key_bound(w, l) {
        Some(k_max) => attend_columns(w, l, k_max, round),
        None => Ok(None),
    }
}

/// The largest `|k|` over the columns from `l` on, or `None` when a hidden `k` or `v` is not
/// finite. Depends on `k`, `v` and `l` only: query heads sharing a KV head may share it.
pub fn hidden_key_bound(w: &HeadWindow, l: usize) -> Option<f32> {
    let c = w.c;
    let hidden = |m: &'_ [f32], rows: usize| {
        let rows = (0..rows).map(move |i| &m[i * c + l..(i + 1) * c]);
        let finite = rows
            .clone()
            .all(|r| r.iter().fold(true, |ok, x| ok & x.is_finite()));
        let max_abs = rows
            .map(|r| r.iter().fold(0.0f32, |a, x| a.max(x.abs())))
            .fold(0.0f32, f32::max);
        (finite, max_abs)
    };
    let ((k_finite, k_max), (v_finite, _)) = (hidden(w.k, w.d), hidden(w.v, w.dv));
    (k_finite && v_finite).then_some(k_max)
}

/// [`attend_filled`] over the first `l` columns (from [`filled_columns`]) with the bound of
/// [`hidden_key_bound`].
pub fn attend_columns(
    w: &HeadWindow,
    l: usize,
    k_max: f32,
    round: Rounding,
) -> Result<Option<Vec<f32>>, String> {
    if filled_columns(w) != Some(l) {
        return Ok(None);
    }
    attend_filled_columns(w, l, k_max, round)
}

/// [`attend_columns`] without its check that `l` is `filled_columns(w)`: the caller must have
/// computed `l` so, on this very mask (the interpreter reuses it across the heads that share
/// the mask, which it scans once).
pub(crate) fn attend_filled_columns(
    w: &HeadWindow,
    l: usize,
    k_max: f32,
    round: Rounding,
) -> Result<Option<Vec<f32>>, String> {
    attend_head(w, Columns::Filled { l, k_max }, round, true)
}

/// Which columns of a head's window [`attend_head`] computes.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Columns {
    /// The first `l` ([`filled_columns`] of this mask), the rest proven to change nothing by
    /// the bound `k_max` ([`hidden_key_bound`]).
    Filled { l: usize, k_max: f32 },
    /// Every column: the program's six ops as they are, fused only in that no intermediate
    /// value leaves the kernel.
    All,
}

/// One head's `out [dv × t]` over `columns`, or `None` when filled columns cannot be shown to
/// be the whole answer. `parallel`: whether its products may spread over the threads (the
/// values do not depend on it; a caller running heads side by side passes `false`).
pub(crate) fn attend_head(
    w: &HeadWindow,
    columns: Columns,
    round: Rounding,
    parallel: bool,
) -> Result<Option<Vec<f32>>, String> {
    let HeadWindow { d, dv, t, c, .. } = *w;
    let l = match columns {
        Columns::Filled { l, .. } => l,
        Columns::All => c,
    };

    // scores [t × l] = qᵀ · k[:, :l]
    let mut s = vec![0.0f32; t * l];
    let qt = MatRef::row_major(w.q, d, t).transposed();
    let kl = MatRef {
        data: w.k,
        rows: d,
        cols: l,
        rs: c,
        cs: 1,
    };
    product(&mut s, qt, kl, parallel)?;
    round_if(round.scores, &mut s);
    for (row, mask) in s.chunks_exact_mut(l).zip(w.mask.chunks_exact(c)) {
        row.iter_mut().zip(mask).for_each(|(x, m)| *x += m);
    }
    round_if(round.masked, &mut s);
    let mut max: Vec<f32> = s
        .chunks_exact(l)
        .map(|row| row.iter().copied().fold(f32::NEG_INFINITY, f32::max))
        .collect();
    round_if(round.max, &mut max);
    if let Columns::Filled { k_max, .. } = columns {
        if !hidden_columns_vanish(w, l, k_max, &max) {
            return Ok(None);
        }
    }
    for (row, &m) in s.chunks_exact_mut(l).zip(&max) {
        row.iter_mut().for_each(|x| *x -= m);
    }
    round_if(round.shifted, &mut s);
    softmax(&mut s, &[t, l], 1, Accumulation::F32);
    round_if(round.probs, &mut s);

    // out [dv × t] = v[:, :l] · probsᵀ
    let mut out = vec![0.0f32; dv * t];
    let vl = MatRef {
        data: w.v,
        rows: dv,
        cols: l,
        rs: c,
        cs: 1,
    };
    let probs_t = MatRef::row_major(&s, t, l).transposed();
    product(&mut out, vl, probs_t, parallel)?;
    round_if(round.out, &mut out);
    Ok(Some(out))
}

/// `dst = a · b` as [`super::linalg::matmul_into`] computes it, spread over the threads only
/// when `parallel` allows it.
fn product(dst: &mut [f32], a: MatRef, b: MatRef, parallel: bool) -> Result<(), String> {
    let wide = a.rows * b.cols * a.cols >= PARALLEL_WORK;
    matmul_on(dst, a, b, false, parallel && wide)
}

/// Whether every row's visible maximum (`max`, rounded as the program rounds it) exceeds the
/// bound on its hidden masked scores by 128 (module docs); a NaN anywhere fails.
fn hidden_columns_vanish(w: &HeadWindow, l: usize, k_max: f32, max: &[f32]) -> bool {
    let HeadWindow { d, t, c, .. } = *w;
    max.iter().enumerate().all(|(tr, &row_max)| {
        let q1: f32 = (0..d).map(|i| w.q[i * t + tr].abs()).sum();
        let mask_max = w.mask[tr * c + l..(tr + 1) * c]
            .iter()
            .copied()
            .fold(f32::NEG_INFINITY, f32::max);
        let bound = mask_max + 1.01 * q1 * k_max + 16.0;
        matches!((row_max - bound).partial_cmp(&128.0), Some(Greater | Equal))
    })
}

#[cfg(test)]
mod tests {
    use anemone_mil::{BinaryOp, DType, ReduceOp};

    use super::*;
    use crate::kernels::elementwise::{binary, Operand};
    use crate::kernels::linalg::batched_matmul;
    use crate::kernels::norm::reduce;

    /// Deterministic values in about ±scale.
    fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
        let mut s = seed
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        (0..n)
            .map(|_| {
                s = s
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    /// The program's six ops, unfused, over all columns (as the interpreter runs them).
    fn unfused(w: &HeadWindow, r: Rounding) -> Vec<f32> {
        let HeadWindow { d, dv, t, c, .. } = *w;
        let fin = |on: bool, mut v: Vec<f32>| {
            round_if(on, &mut v);
            v
        };
        let op = |data, shape| Operand { data, shape };
        let (sq, sk, sv, sm) = ([1, 1, d, t], [1, 1, d, c], [1, 1, dv, c], [1, 1, t, c]);
        let s_max = [1, 1, t, 1];
        let s = batched_matmul(
            op(w.q, &sq),
            op(w.k, &sk),
            true,
            false,
            &sm,
            Accumulation::F32,
        )
        .unwrap();
        let s = fin(r.scores, s);
        let m = binary(
            BinaryOp::Add,
            DType::F32,
            op(&s, &sm),
            op(w.mask, &sm),
            &sm,
            None,
        );
        let m = fin(r.masked, m);
        let mx = fin(
            r.max,
            reduce(ReduceOp::Max, &m, &sm, &[3], Accumulation::F32),
        );
        let sh = binary(
            BinaryOp::Sub,
            DType::F32,
            op(&m, &sm),
            op(&mx, &s_max),
            &sm,
            None,
        );
        let mut p = fin(r.shifted, sh);
        softmax(&mut p, &sm, 3, Accumulation::F32);
        let p = fin(r.probs, p);
        let out = batched_matmul(
            op(w.v, &sv),
            op(&p, &sm),
            false,
            true,
            &[1, 1, dv, t],
            Accumulation::F32,
        )
        .unwrap();
        fin(r.out, out)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    /// A causal prefill mask: row `r` sees columns `..=start + r`.
    fn causal(t: usize, c: usize, start: usize) -> Vec<f32> {
        (0..t * c)
            .map(|i| if i % c <= start + i / c { 0.0 } else { HIDDEN })
            .collect()
    }

    #[test]
    fn filled_columns_give_the_full_ops_bit_for_bit() {
        let fp16 = Rounding {
            scores: true,
            masked: true,
            max: true,
            shifted: true,
            probs: true,
            out: true,
        };
        // (d, dv, t, c, start): awkward sizes, windows ending inside and at a 64-column step
        for (d, dv, t, c, start) in [
            (64, 64, 64, 512, 0),
            (64, 64, 64, 512, 64),
            (37, 29, 13, 300, 5),
            (17, 64, 7, 199, 0),
            (64, 48, 9, 130, 100),
            (128, 128, 33, 1024, 150),
        ] {
            let q = values(d * t, 1, 2.0);
            let mut k = values(d * c, 2, 3.0);
            let mut v = values(dv * c, 3, 1.0);
            // stale cache contents beyond the window must not matter either
            for i in 0..d {
                for j in start + t..c {
                    k[i * c + j] = if j % 3 == 0 { 0.0 } else { k[i * c + j] * 4.0 };
                }
            }
            for i in 0..dv {
                v[i * c + (c - 1)] = -0.0;
            }
            let mask = causal(t, c, start);
            let w = HeadWindow {
                q: &q,
                k: &k,
                v: &v,
                mask: &mask,
                d,
                dv,
                t,
                c,
            };
            for r in [Rounding::default(), fp16] {
                let got = attend_filled(&w, r).unwrap();
                let got = got.unwrap_or_else(|| panic!("not taken for {d}×{dv}×{t}×{c}+{start}"));
                assert_eq!(
                    bits(&got),
                    bits(&unfused(&w, r)),
                    "{d}×{dv}×{t}×{c}+{start} {r:?}"
                );
            }
        }
    }

    #[test]
    fn unprovable_windows_fall_back() {
        let (d, dv, t, c) = (64usize, 64usize, 64usize, 512usize);
        let q = values(d * t, 4, 2.0);
        let k = values(d * c, 5, 3.0);
        let v = values(dv * c, 6, 1.0);
        let mask = causal(t, c, 0);
        let w = HeadWindow {
            q: &q,
            k: &k,
            v: &v,
            mask: &mask,
            d,
            dv,
            t,
            c,
        };
        assert!(attend_filled(&w, Rounding::default()).unwrap().is_some());
        // a non-finite hidden value
        let mut v2 = v.clone();
        v2[3 * c + 400] = f32::INFINITY;
        let w2 = HeadWindow { v: &v2, ..w };
        assert!(attend_filled(&w2, Rounding::default()).unwrap().is_none());
        // hidden keys so large that a hidden score could reach the visible maximum
        let mut k2 = k.clone();
        k2[c + 300] = 1e4;
        let w3 = HeadWindow { k: &k2, ..w };
        assert!(attend_filled(&w3, Rounding::default()).unwrap().is_none());
        // a row with nothing visible
        let mut m2 = mask.clone();
        m2[..c].fill(HIDDEN);
        let w4 = HeadWindow { mask: &m2, ..w };
        assert!(attend_filled(&w4, Rounding::default()).unwrap().is_none());
        // a window past 256 columns, and a single query, run the full ops
        let m3 = causal(t, c, 250);
        assert!(filled_columns(&HeadWindow { mask: &m3, ..w }).is_none());
        let w5 = HeadWindow {
            q: &q[..d],
            mask: &mask[..c],
            t: 1,
            ..w
        };
        assert!(filled_columns(&w5).is_none());
    }
}
