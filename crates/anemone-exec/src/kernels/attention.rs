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
//!
//! The kernel holds the intermediate values transposed (`[L × T]`: `attend_head`). Its first
//! product is `scoresᵀ = kᵀ·q`, whose elements are the same `d` products summed in the same
//! order (`d ≤ 256`: one block); the softmax then runs down the columns
//! ([`super::norm::softmax_columns`], each row's max and sum in order), and `probsᵀ` is the
//! second product's right operand as it stands (unless the program's own product takes
//! `gemm`'s horizontal kernels, `dv·T ≤ 256`: then probs go back to the program's layout). Both
//! products otherwise have unit column strides, which takes them to [`super::gemm_avx512`]
//! where it reproduces `gemm`'s blocked path.

use std::cmp::Ordering::{Equal, Greater, Less};

use anemone_backend::round_f16_in_place;

use super::linalg::{matmul_on, MatRef, PARALLEL_WORK};
use super::norm::softmax_columns;

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
    let visible = w.mask.chunks_exact(c).map(visible_len).max()?;
    let l = visible.max(1).div_ceil(COLUMN_STEP) * COLUMN_STEP;
    (l < c && l <= MAX_COLUMNS).then_some(l)
}

/// Lanes of the scans below: blocks of this many values, each lane folded on its own, so that
/// the compiler can keep a block in one vector.
const LANES: usize = 16;

/// The length of `row` up to its last column that a mask value does not hide (NaN included).
fn visible_len(row: &[f32]) -> usize {
    let hides = |m: f32| matches!(m.partial_cmp(&HIDDEN), Some(Less | Equal));
    let mut end = row.len();
    while end > 0 {
        let start = end.saturating_sub(LANES);
        let block = &row[start..end];
        if !block.iter().fold(true, |all, &m| all & hides(m)) {
            let last = block.iter().rposition(|&m| !hides(m)).unwrap_or(0);
            return start + last + 1;
        }
        end = start;
    }
    0
}

/// The largest `|x|` of `values`, and whether every value is finite. The maximum of
/// magnitudes does not depend on the order it is taken in.
fn finite_max_abs(values: &[f32]) -> (bool, f32) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected at run time.
        return unsafe { finite_max_abs_avx512(values) };
    }
    finite_max_abs_lanes(values)
}

/// [`finite_max_abs_lanes`] compiled for AVX-512F.
///
/// # Safety
/// The CPU must support AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn finite_max_abs_avx512(values: &[f32]) -> (bool, f32) {
    use std::arch::x86_64::*;
    let magnitude = _mm512_set1_epi32(0x7fff_ffff);
    let largest_finite = _mm512_set1_ps(f32::MAX);
    let mut max = _mm512_setzero_ps();
    let mut not_finite: __mmask16 = 0;
    let mut add = |x: __m512| {
        let a = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(x), magnitude));
        // true for ±∞ and NaN
        not_finite |= _mm512_cmp_ps_mask::<_CMP_NLE_UQ>(a, largest_finite);
        max = _mm512_max_ps(max, a);
    };
    let blocks = values.chunks_exact(16);
    let tail = blocks.remainder();
    for block in blocks {
        add(_mm512_loadu_ps(block.as_ptr()));
    }
    if !tail.is_empty() {
        let lanes = (1u16 << tail.len()) - 1;
        add(_mm512_maskz_loadu_ps(lanes, tail.as_ptr()));
    }
    (not_finite == 0, _mm512_reduce_max_ps(max))
}

#[inline(always)]
fn finite_max_abs_lanes(values: &[f32]) -> (bool, f32) {
    let mut finite = [true; LANES];
    let mut max_abs = [0.0f32; LANES];
    let blocks = values.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for ((ok, m), x) in finite.iter_mut().zip(&mut max_abs).zip(block) {
            *ok &= x.abs() <= f32::MAX;
            *m = m.max(x.abs());
        }
    }
    for (lane, x) in tail.iter().enumerate() {
        finite[lane] &= x.abs() <= f32::MAX;
        max_abs[lane] = max_abs[lane].max(x.abs());
    }
    (
        finite.iter().all(|&ok| ok),
        max_abs.iter().copied().fold(0.0, f32::max),
    )
}

/// The largest value of `values` (NaNs ignored, −∞ when there is none); which of +0 and −0
/// it answers for a largest zero is left open.
fn max_ignoring_nan(values: &[f32]) -> f32 {
    let mut max = [f32::NEG_INFINITY; LANES];
    let blocks = values.chunks_exact(LANES);
    let tail = blocks.remainder();
    for block in blocks {
        for (m, x) in max.iter_mut().zip(block) {
            *m = m.max(*x);
        }
    }
    for (m, x) in max.iter_mut().zip(tail) {
        *m = m.max(*x);
    }
    max.iter().copied().fold(f32::NEG_INFINITY, f32::max)
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
        (0..rows)
            .map(|i| finite_max_abs(&m[i * c + l..(i + 1) * c]))
            .fold((true, 0.0f32), |(ok, max), (row_ok, row_max)| {
                (ok & row_ok, max.max(row_max))
            })
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
    let columns = Columns::Filled { l, k_max };
    let mask = MaskColumns::new(w, columns);
    let keys = keys_by_column(w, columns);
    attend_head(w, columns, &mask, &keys, round, true)
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

impl Columns {
    fn count(self, c: usize) -> usize {
        match self {
            Columns::Filled { l, .. } => l,
            Columns::All => c,
        }
    }
}

/// What the heads reading one mask share over the columns they compute: the mask's columns
/// laid out one per row (`[l × t]`), and for filled columns each query row's largest hidden
/// mask value.
pub(crate) struct MaskColumns {
    by_column: Vec<f32>,
    hidden_max: Vec<f32>,
}

impl MaskColumns {
    pub(crate) fn new(w: &HeadWindow, columns: Columns) -> Self {
        let (t, c) = (w.t, w.c);
        let l = columns.count(c);
        let mut by_column = vec![0.0f32; l * t];
        let mut hidden_max = Vec::new();
        for (tr, row) in w.mask.chunks_exact(c).enumerate() {
            for (j, &m) in row[..l].iter().enumerate() {
                by_column[j * t + tr] = m;
            }
            if let Columns::Filled { .. } = columns {
                hidden_max.push(max_ignoring_nan(&row[l..]));
            }
        }
        MaskColumns {
            by_column,
            hidden_max,
        }
    }
}

/// The columns of `k` that `columns` computes, laid out one per row (`[l × d]`): what the
/// query heads of a KV head share.
pub(crate) fn keys_by_column(w: &HeadWindow, columns: Columns) -> Vec<f32> {
    let (d, c) = (w.d, w.c);
    let l = columns.count(c);
    let mut by_column = vec![0.0f32; l * d];
    for (i, row) in w.k.chunks_exact(c).enumerate() {
        for (j, &k) in row[..l].iter().enumerate() {
            by_column[j * d + i] = k;
        }
    }
    by_column
}

/// One head's `out [dv × t]` over `columns`, or `None` when filled columns cannot be shown to
/// be the whole answer (or the shape is outside `3 ≤ d ≤ 256`, `dv, t ≥ 2`, `l ≥ 3`, where the
/// program's products take other `gemm` paths). `mask` and `keys` are [`MaskColumns::new`] and
/// [`keys_by_column`] of this head's mask and K for these columns. `parallel`: whether its
/// products may spread over the threads (the values do not depend on it; a caller running
/// heads side by side passes `false`).
///
/// The intermediate values are held transposed (`[l × t]`, a query row per column), so that
/// the softmax of every query row runs in vector lanes — each row's max and sum still taken
/// over its columns in order — and its result is the second product's right operand as it
/// stands. `scoresᵀ = kᵀ·q` sums each element over the same `d` products in the same order as
/// `qᵀ·k`: `d ≤ 256` keeps that sum one block of `gemm`'s (module docs).
pub(crate) fn attend_head(
    w: &HeadWindow,
    columns: Columns,
    mask: &MaskColumns,
    keys: &[f32],
    round: Rounding,
    parallel: bool,
) -> Result<Option<Vec<f32>>, String> {
    let HeadWindow { d, dv, t, c, .. } = *w;
    let l = columns.count(c);
    // the program's products then take `gemm`'s blocked or horizontal paths only (see below)
    if !(3..=MAX_COLUMNS).contains(&d) || dv < 2 || t < 2 || l < 3 {
        return Ok(None);
    }
    if keys.len() != l * d || mask.by_column.len() != l * t || w.q.len() != d * t {
        return Err(format!(
            "attention head {d}×{t} over {l} of {c} columns: shared operands of {} and {} values",
            keys.len(),
            mask.by_column.len()
        ));
    }
    // scoresᵀ [l × t] = k[:, :l]ᵀ · q
    let mut s = vec![0.0f32; l * t];
    let keys = MatRef::row_major(keys, l, d);
    product(&mut s, keys, MatRef::row_major(w.q, d, t), parallel)?;
    round_if(round.scores, &mut s);
    for (row, mask) in s.chunks_exact_mut(t).zip(mask.by_column.chunks_exact(t)) {
        row.iter_mut().zip(mask).for_each(|(x, m)| *x += m);
    }
    round_if(round.masked, &mut s);
    let mut max = vec![f32::NEG_INFINITY; t];
    for row in s.chunks_exact(t) {
        max.iter_mut().zip(row).for_each(|(m, &x)| *m = m.max(x));
    }
    round_if(round.max, &mut max);
    if let Columns::Filled { k_max, .. } = columns {
        if !hidden_columns_vanish(w, k_max, &mask.hidden_max, &max) {
            return Ok(None);
        }
    }
    for row in s.chunks_exact_mut(t) {
        row.iter_mut().zip(&max).for_each(|(x, m)| *x -= m);
    }
    round_if(round.shifted, &mut s);
    softmax_columns(&mut s, l, t);
    round_if(round.probs, &mut s);

    // out [dv × t] = v[:, :l] · probsᵀ. The program reads probsᵀ along probs' rows, and where
    // `dv·t ≤ 256` that layout takes `gemm` to its horizontal kernels, which order the sums
    // otherwise: there the product runs on probs laid out as the program holds them.
    let mut out = vec![0.0f32; dv * t];
    let vl = MatRef {
        data: w.v,
        rows: dv,
        cols: l,
        rs: c,
        cs: 1,
    };
    let probs_rows;
    let probs_t = if dv * t <= HORIZONTAL_OUTPUTS {
        probs_rows = transposed(&s, l, t);
        MatRef::row_major(&probs_rows, t, l).transposed()
    } else {
        MatRef::row_major(&s, l, t)
    };
    product(&mut out, vl, probs_t, parallel)?;
    round_if(round.out, &mut out);
    Ok(Some(out))
}

/// `gemm` takes products of at most this many outputs whose operands are both read along k
/// with unit stride to its horizontal kernels.
const HORIZONTAL_OUTPUTS: usize = 256;

/// `x [rows × cols]` row-major, transposed into `[cols × rows]` row-major.
fn transposed(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    let mut out = vec![0.0f32; rows * cols];
    for (r, row) in x.chunks_exact(cols).enumerate() {
        for (j, &v) in row.iter().enumerate() {
            out[j * rows + r] = v;
        }
    }
    out
}

/// `dst = a · b` as [`super::linalg::matmul_into`] computes it, spread over the threads only
/// when `parallel` allows it.
fn product(dst: &mut [f32], a: MatRef, b: MatRef, parallel: bool) -> Result<(), String> {
    let wide = a.rows * b.cols * a.cols >= PARALLEL_WORK;
    matmul_on(dst, a, b, false, parallel && wide)
}

/// Whether every row's visible maximum (`max`, rounded as the program rounds it) exceeds the
/// bound on its hidden masked scores by 128 (module docs; `hidden_mask_max` is each row's
/// largest hidden mask value); a NaN anywhere fails.
fn hidden_columns_vanish(w: &HeadWindow, k_max: f32, hidden_mask_max: &[f32], max: &[f32]) -> bool {
    // ‖q_t‖₁ of every row, each summed over the channels in order
    let mut q1 = vec![0.0f32; w.t];
    for channel in w.q.chunks_exact(w.t) {
        q1.iter_mut()
            .zip(channel)
            .for_each(|(sum, x)| *sum += x.abs());
    }
    max.iter()
        .zip(&q1)
        .zip(hidden_mask_max)
        .all(|((&row_max, &q1), &mask_max)| {
            // a zero's sign cannot matter: +16 follows
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
    use crate::kernels::norm::{reduce, softmax};
    use crate::kernels::Accumulation;

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
    fn hidden_scans_see_every_value() {
        for len in [0usize, 1, 15, 16, 17, 40, 448] {
            let base = values(len, 9, 3.0);
            let want = base.iter().fold(0.0f32, |m, x| m.max(x.abs()));
            assert_eq!(finite_max_abs(&base), (true, want), "{len} values");
            assert_eq!(finite_max_abs_lanes(&base), (true, want), "{len} values");
            for at in [0, len / 2, len.saturating_sub(1)]
                .into_iter()
                .filter(|&i| i < len)
            {
                for bad in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut v = base.clone();
                    v[at] = bad;
                    assert!(!finite_max_abs(&v).0, "{bad} at {at} of {len}");
                    assert!(!finite_max_abs_lanes(&v).0, "{bad} at {at} of {len}");
                }
                let mut v = base.clone();
                v[at] = -7.5;
                assert_eq!(finite_max_abs(&v).1, 7.5, "at {at} of {len}");
            }
        }
        let mut row = vec![HIDDEN; 100];
        assert_eq!(visible_len(&row), 0);
        for at in [0, 15, 16, 63, 99] {
            row[at] = 0.0;
            assert_eq!(visible_len(&row), at + 1);
        }
        row[40] = f32::NAN;
        assert_eq!(max_ignoring_nan(&row[..50]), 0.0);
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
