//! One query's attention (a decode step's head: `t = 1`) as one kernel, giving bit for bit what
//! the program's six ops compute one by one:
//! - `scores = qᵀ·k` `[1 × C]`: the op hands this single-row product to `gemm`, which runs it as a
//!   matrix-vector product ([`gemm`]'s column-major gemv, after transposing the problem): each
//!   score is the first product `k[0][j]·q[0]` rounded, then one fused multiply-add per further
//!   channel `i`, in order — exactly [`scores_row`]. Whether the `gemm` of this build and CPU
//!   does that (its FMA kernels; a CPU without FMA runs unfused ones) is checked once on data
//!   ([`scores_match_gemm`]); when it does not, the caller runs the six ops;
//! - `masked = scores + mask`, `max = reduce_max(masked)`, `shifted = masked - max`,
//!   `probs = softmax(shifted)`: the same element operations, the same reduction order and the
//!   same [`softmax`] as the ops' kernels;
//! - `out = v · probsᵀ` `[dv × 1]`: a single-column product, which `matmul` computes as one
//!   [`simd::dot_f32_kernel`] dot per row of `v` — as here;
//! - every intermediate value is rounded to fp16 exactly where its op's output is
//!   ([`Rounding`]).

use std::sync::OnceLock;

use anemone_backend::round_f16_in_place;

use super::attention::{HeadWindow, Rounding};
use super::kv_elem::KvElem;
use super::linalg::{matmul_into, MatRef};
use super::norm::softmax;
use super::{simd, Accumulation};

/// `out[j] = Σ_i q[i]·k[i·c + j]` summed as `gemm`'s single-row product sums it (module docs):
/// `k[0][j]·q[0]`, then `fma(k[i][j], q[i], ·)` for `i = 1..d`.
/// K may be held as fp16 (widened exactly, in blocks: the same bits).
pub fn scores_row<E: KvElem>(q: &[f32], k: &[E], c: usize, out: &mut [f32]) {
    match E::as_f32(k) {
        Some(k) => scores_cols(q, k, c, &mut out[..c]),
        None => {
            let mut wide = vec![0.0f32; q.len() * WIDEN_COLS];
            scores_widened(q, k, c, &mut out[..c], &mut wide);
        }
    }
}

/// [`scores_row`] of the first `out.len()` columns of rows `c` apart (each column's value is
/// its own chain, whatever the others).
fn scores_cols(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
        // SAFETY: the features the function is compiled for were detected at run time.
        unsafe { scores_row_avx512(q, k, c, out) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("fma") {
        // SAFETY: the feature the function is compiled for was detected at run time.
        unsafe { scores_row_fma(q, k, c, out) };
        return;
    }
    scores_row_generic(q, k, c, out);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "fma,avx2")]
unsafe fn scores_row_fma(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
    scores_row_generic(q, k, c, out);
}

/// [`scores_row_generic`] in 16-lane registers (the same fused multiply-add per element).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma,avx2")]
unsafe fn scores_row_avx512(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
    scores_row_generic(q, k, c, out);
}

/// `mul_add` is one IEEE fused multiply-add wherever it runs (an instruction with the `fma`
/// feature, else the C library's exact `fmaf`).
#[inline(always)]
fn scores_row_generic(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
    let n = out.len();
    let Some((&q0, rest)) = q.split_first() else {
        out.fill(0.0);
        return;
    };
    for (o, &kv) in out.iter_mut().zip(&k[..n]) {
        *o = kv * q0;
    }
    // four channels a pass over `out` (each element's chain of fused multiply-adds is the
    // same, channel by channel in order), then the rest one by one
    let quads = rest.chunks_exact(4);
    let tail = quads.remainder();
    for (p, qs) in quads.enumerate() {
        let at = |r: usize| &k[(4 * p + r + 1) * c..(4 * p + r + 1) * c + n];
        let (k0, k1, k2, k3) = (at(0), at(1), at(2), at(3));
        let ks = k0.iter().zip(k1).zip(k2).zip(k3);
        for (o, (((&a, &b), &e), &f)) in out.iter_mut().zip(ks) {
            let v = a.mul_add(qs[0], *o);
            let v = b.mul_add(qs[1], v);
            let v = e.mul_add(qs[2], v);
            *o = f.mul_add(qs[3], v);
        }
    }
    let first_tail = 1 + (rest.len() - tail.len());
    for (i, &qi) in tail.iter().enumerate() {
        let row = &k[(first_tail + i) * c..(first_tail + i) * c + n];
        for (o, &kv) in out.iter_mut().zip(row) {
            *o = kv.mul_add(qi, *o);
        }
    }
}

/// Whether [`scores_row`] gives what `matmul_into` gives for a single-row product on this CPU
/// (checked once, on data where fused and unfused sums differ, with a lane tail).
pub fn scores_match_gemm() -> bool {
    static MATCH: OnceLock<bool> = OnceLock::new();
    *MATCH.get_or_init(|| {
        let (d, c) = (7usize, 45usize);
        let value = |i: usize| ((i * 7919 % 1009) as f32 - 504.0) / 97.0 + 1.0 / 3.0;
        let q: Vec<f32> = (0..d).map(|i| value(i + 11)).collect();
        let k: Vec<f32> = (0..d * c).map(|i| value(3 * i + 5)).collect();
        let mut by_gemm = vec![0.0f32; c];
        let a = MatRef::row_major(&q, d, 1).transposed();
        let b = MatRef::row_major(&k, d, c);
        if matmul_into(&mut by_gemm, a, b, false).is_err() {
            return false;
        }
        let mut ours = vec![0.0f32; c];
        scores_row(&q, &k, c, &mut ours);
        by_gemm
            .iter()
            .zip(&ours)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    })
}

/// Columns of K widened at a time when K is not held as f32 (a block of `d × WIDEN_COLS`
/// values stays in the first-level cache).
const WIDEN_COLS: usize = 64;

/// [`scores_cols`] of `out.len()` columns of a K window held in another element type, in
/// blocks of columns widened into `wide` (at least `d × WIDEN_COLS` long): each column's chain
/// of fused multiply-adds is its own, so computing it over a widened copy of its column gives
/// the same bits.
fn scores_widened<E: KvElem>(q: &[f32], k: &[E], c: usize, out: &mut [f32], wide: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if let Some(k16) = E::as_f16(k) {
        if is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("f16c")
            && is_x86_feature_detected!("fma")
        {
            // SAFETY: the features the function is compiled for were detected at run time.
            unsafe { scores_f16_avx512(q, k16, c, out) };
            return;
        }
    }
    let d = q.len();
    for (b, block) in out.chunks_mut(WIDEN_COLS).enumerate() {
        let (j0, bw) = (b * WIDEN_COLS, block.len());
        for i in 0..d {
            E::widen(
                &k[i * c + j0..i * c + j0 + bw],
                &mut wide[i * bw..(i + 1) * bw],
            );
        }
        scores_cols(q, &wide[..d * bw], bw, block);
    }
}

/// [`scores_row_generic`] of fp16 K read in place: each column's chain (`k[0][j]·q[0]`, then
/// one fused multiply-add per channel in order) in 16-lane registers, four a pass, the K values
/// widened exactly as they are loaded; the last `n % 16` columns one by one.
///
/// # Safety
/// The CPU has AVX-512F, F16C and FMA; `k` holds `q.len()` rows `c` apart of at least
/// `out.len()` values.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn scores_f16_avx512(q: &[f32], k: &[half::f16], c: usize, out: &mut [f32]) {
    use std::arch::x86_64::*;
    let (n, d) = (out.len(), q.len());
    if d == 0 {
        out.fill(0.0);
        return;
    }
    assert!(k.len() >= (d - 1) * c + n, "scores_f16: K window too short");
    let pk = k.as_ptr() as *const u8;
    // SAFETY (every load below): row `i < d`, columns `j..j + 16 <= n`, inside `k` (asserted)
    let load = |i: usize, j: usize| {
        _mm512_cvtph_ps(_mm256_loadu_si256(pk.add(2 * (i * c + j)) as *const __m256i))
    };
    let po = out.as_mut_ptr();
    let mut j = 0;
    while j + 64 <= n {
        let q0 = _mm512_set1_ps(q[0]);
        let mut a = [
            _mm512_mul_ps(load(0, j), q0),
            _mm512_mul_ps(load(0, j + 16), q0),
            _mm512_mul_ps(load(0, j + 32), q0),
            _mm512_mul_ps(load(0, j + 48), q0),
        ];
        for (i, &qi) in q.iter().enumerate().skip(1) {
            let qv = _mm512_set1_ps(qi);
            for (r, acc) in a.iter_mut().enumerate() {
                *acc = _mm512_fmadd_ps(load(i, j + 16 * r), qv, *acc);
            }
        }
        for (r, acc) in a.iter().enumerate() {
            // SAFETY: columns `j + 16 r..+16` are below `n`
            _mm512_storeu_ps(po.add(j + 16 * r), *acc);
        }
        j += 64;
    }
    while j + 16 <= n {
        let mut acc = _mm512_mul_ps(load(0, j), _mm512_set1_ps(q[0]));
        for (i, &qi) in q.iter().enumerate().skip(1) {
            acc = _mm512_fmadd_ps(load(i, j), _mm512_set1_ps(qi), acc);
        }
        // SAFETY: columns `j..j + 16` are below `n`
        _mm512_storeu_ps(po.add(j), acc);
        j += 16;
    }
    for (jj, o) in out.iter_mut().enumerate().skip(j) {
        *o = (1..d).fold(k[jj].to_f32() * q[0], |acc, i| {
            k[i * c + jj].to_f32().mul_add(q[i], acc)
        });
    }
}

fn round_if(on: bool, data: &mut [f32]) {
    if on {
        round_f16_in_place(data);
    }
}

/// Columns of the K/V window are taken in multiples of this when the rest are skipped: the
/// 32-wide steps of the value dots ([`simd::dot_f32_kernel`]), so the kept columns' products
/// go to the same accumulators in the same order as over all columns.
pub const SKIP_STEP: usize = 32;

/// The columns a single query computes when its K and V columns from `zero_from` on hold ±0
/// only: `zero_from` rounded up to a multiple of [`SKIP_STEP`] (at least one step), when that is
/// fewer than all `c`.
pub fn live_columns(c: usize, zero_from: usize) -> Option<usize> {
    let l = zero_from.max(1).div_ceil(SKIP_STEP) * SKIP_STEP;
    (l < c).then_some(l)
}

/// The largest mask value over the skipped columns, or `None` when one is NaN.
pub fn hidden_mask_max(mask: &[f32]) -> Option<f32> {
    let (max, nan) = mask
        .iter()
        .fold((f32::NEG_INFINITY, false), |(m, nan), &x| {
            (m.max(x), nan | x.is_nan())
        });
    (!nan).then_some(max)
}

/// Columns skipped by [`attend_one`]: those from `cols` on, whose K and V hold ±0 only, and the
/// largest of their mask values ([`hidden_mask_max`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Skip {
    pub cols: usize,
    pub hidden_mask_max: f32,
}

/// `out [dv]` of one query head (`w.t == 1`) as the six ops compute it over all `w.c` columns
/// (module docs); `scores_first`: the mask add's first operand is the scores. `scratch` holds
/// the row (resized here). Call only when [`scores_match_gemm`].
///
/// With `skip` (the K and V columns from `skip.cols` on hold ±0 only, `skip.cols` a multiple of
/// [`SKIP_STEP`] below `c`), only the first `skip.cols` columns are computed when that provably
/// gives the same bits, else all:
/// - a skipped score is ±0 (a chain of products of ±0 with a finite `q`, checked), so its
///   masked value is at most `B1 = round(hidden_mask_max)` (rounding is monotone), its shifted
///   value at most `B2 = round(B1 − max)`, and the argument of its exponential in `softmax` at
///   most `B2 − m` (`m` the softmax's own row maximum over the kept values);
/// - when `B2 − m < −104`, every skipped masked value is below the kept maximum (so `max` and
///   `m` are the kept ones, as `f32::max` folds them) and every skipped exponential is
///   [`super::norm::exp_or_zero`]'s +0: softmax's in-order sum gains +0 terms only (it is
///   positive: the maximum's term is 1) and the skipped probabilities are +0;
/// - each value dot then gains `(±0)·(+0)` terms after the kept columns' steps (a multiple of
///   the dot's 32-wide step), which leave its accumulators as they are: they start at +0 and a
///   sum that starts at +0 is never −0.
///
/// Answers whether columns were skipped.
pub fn attend_one<E: KvElem>(
    w: &HeadWindow<E>,
    round: Rounding,
    scores_first: bool,
    skip: Option<Skip>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<bool, String> {
    let HeadWindow { d, dv, t, c, .. } = *w;
    if t != 1
        || w.q.len() != d
        || w.k.len() != d * c
        || w.v.len() != dv * c
        || w.mask.len() != c
        || out.len() != dv
    {
        return Err(format!(
            "single-query attention: q {} k {} v {} mask {} out {} for d {d} dv {dv} t {t} c {c}",
            w.q.len(),
            w.k.len(),
            w.v.len(),
            w.mask.len(),
            out.len()
        ));
    }
    let skip = skip.filter(|s| {
        s.cols.is_multiple_of(SKIP_STEP)
            && s.cols > 0
            && s.cols < c
            && w.q.iter().all(|x| x.is_finite())
    });
    if let Some(skip) = skip {
        if attend_cols(w, round, scores_first, Some(skip), scratch, out) {
            return Ok(true);
        }
    }
    attend_cols(w, round, scores_first, None, scratch, out);
    Ok(false)
}

/// The head over its first `skip.cols` columns (all `c` without `skip`); `false` (and `out`
/// unspecified) when the skipped columns cannot be shown to change nothing.
fn attend_cols<E: KvElem>(
    w: &HeadWindow<E>,
    round: Rounding,
    scores_first: bool,
    skip: Option<Skip>,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) -> bool {
    let HeadWindow { d, dv, c, .. } = *w;
    let n = skip.map_or(c, |s| s.cols);
    // the row, then (K/V not held as f32) room for widened blocks of K and rows of V
    let room = match E::as_f32(w.k) {
        Some(_) => 0,
        None => (d * WIDEN_COLS).max(4 * n),
    };
    scratch.resize(n + room, 0.0);
    let (s, wide) = scratch.split_at_mut(n);
    match E::as_f32(w.k) {
        Some(k) => scores_cols(w.q, k, c, s),
        None => scores_widened(w.q, w.k, c, s, wide),
    }
    round_if(round.scores, s);
    let mask = &w.mask[..n];
    if scores_first {
        s.iter_mut().zip(mask).for_each(|(x, &m)| *x += m);
    } else {
        // the op's operand order (which of two NaNs' payloads an x86 add keeps)
        #[allow(clippy::assign_op_pattern)]
        s.iter_mut().zip(mask).for_each(|(x, &m)| *x = m + *x);
    }
    round_if(round.masked, s);
    let mut max = [s.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
    round_if(round.max, &mut max);
    s.iter_mut().for_each(|x| *x -= max[0]);
    round_if(round.shifted, s);
    if let Some(skip) = skip {
        // the bound on every skipped column's exponential argument (see `attend_one`)
        let mut b = [skip.hidden_mask_max];
        round_if(round.masked, &mut b);
        b[0] -= max[0];
        round_if(round.shifted, &mut b);
        let m = s.iter().fold(f32::NEG_INFINITY, |m, &v| m.max(v));
        // a NaN fails too
        if !matches!(
            (b[0] - m).partial_cmp(&-104.0),
            Some(std::cmp::Ordering::Less)
        ) {
            return false;
        }
    }
    softmax(s, &[1, n], 1, Accumulation::F32);
    round_if(round.probs, s);
    // four rows of `v` a pass where the CPU has it (each row's value is `dot`'s)
    let dot = simd::dot_f32_kernel();
    let dot4_f16 = simd::dot_f16x4_at_kernel();
    let mut done = 0;
    if let (Some(dot4), true) = (simd::dot_f32x4_kernel(), n > 0) {
        for (q, o) in out.chunks_exact_mut(4).enumerate() {
            let rows = &w.v[4 * q * c..4 * q * c + 3 * c + n];
            match (E::as_f32(rows), E::as_f16(rows), dot4_f16) {
                (Some(rows), _, _) => o.copy_from_slice(&dot4(rows, c, s)),
                // fp16 rows read in place (the same sums as over their widened values)
                (None, Some(rows), Some(dot4_f16)) => o.copy_from_slice(&dot4_f16(rows, c, s)),
                _ => {
                    // the four rows' first `n` columns, `n` apart: each row's dot is the same
                    // whatever the rows' stride
                    for r in 0..4 {
                        E::widen(&rows[r * c..r * c + n], &mut wide[r * n..(r + 1) * n]);
                    }
                    o.copy_from_slice(&dot4(&wide[..4 * n], n, s));
                }
            }
        }
        done = dv / 4 * 4;
    }
    for (o, row) in out.iter_mut().zip(w.v.chunks_exact(c.max(1))).skip(done) {
        *o = match E::as_f32(&row[..n]) {
            Some(row) => dot(row, s),
            None => {
                E::widen(&row[..n], &mut wide[..n]);
                dot(&wide[..n], s)
            }
        };
    }
    if c == 0 {
        out.fill(0.0);
    }
    round_if(round.out, out);
    true
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
        let mut s = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                ((s >> 40) as f32 / (1u64 << 24) as f32 - 0.5) * 2.0 * scale
            })
            .collect()
    }

    /// The program's six ops one by one, as the interpreter runs them.
    fn unfused(w: &HeadWindow, r: Rounding, scores_first: bool) -> Vec<f32> {
        let HeadWindow { d, dv, c, .. } = *w;
        let fin = |on: bool, mut v: Vec<f32>| {
            round_if(on, &mut v);
            v
        };
        let op = |data, shape| Operand { data, shape };
        let (sq, sk, sv, sm) = ([1, 1, d, 1], [1, 1, d, c], [1, 1, dv, c], [1, 1, 1, c]);
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
        let (a, b) = if scores_first {
            (op(&s, &sm), op(w.mask, &sm))
        } else {
            (op(w.mask, &sm), op(&s, &sm))
        };
        let m = fin(r.masked, binary(BinaryOp::Add, DType::F32, a, b, &sm, None));
        let mx = fin(
            r.max,
            reduce(ReduceOp::Max, &m, &sm, &[3], Accumulation::F32),
        );
        let sh = binary(
            BinaryOp::Sub,
            DType::F32,
            op(&m, &sm),
            op(&mx, &[1, 1, 1, 1]),
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
            &[1, 1, dv, 1],
            Accumulation::F32,
        )
        .unwrap();
        fin(r.out, out)
    }

    fn bits(v: &[f32]) -> Vec<u32> {
        v.iter().map(|x| x.to_bits()).collect()
    }

    #[test]
    fn the_probe_agrees_with_gemm_on_fma_cpus() {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma") {
            assert!(scores_match_gemm());
        }
    }

    /// fp16 rounding at every one of the six ops' outputs.
    const ROUND_EVERY_OP: Rounding = Rounding {
        scores: true,
        masked: true,
        max: true,
        shifted: true,
        probs: true,
        out: true,
    };

    #[test]
    fn one_query_gives_the_six_ops_bit_for_bit() {
        if !scores_match_gemm() {
            return;
        }
        let all = ROUND_EVERY_OP;
        let some = Rounding {
            scores: true,
            probs: true,
            ..Rounding::default()
        };
        // (d, dv, c, filled): lane tails, a head dim of 3, a full and an almost empty window
        for (d, dv, c, filled) in [
            (64, 64, 512, 100),
            (64, 64, 512, 512),
            (3, 5, 45, 7),
            (37, 29, 130, 1),
            (128, 128, 1000, 999),
            (17, 64, 2, 1),
        ] {
            let q = values(d, 1, 2.0);
            let mut k = values(d * c, 2, 3.0);
            let mut v = values(dv * c, 3, 1.0);
            // signed zeros and stale values in the hidden slots
            for j in (filled..c).step_by(3) {
                k[j] = -0.0;
                v[(dv - 1) * c + j] = -0.0;
            }
            let mask: Vec<f32> = (0..c)
                .map(|j| if j < filled { 0.0 } else { -1e4 })
                .collect();
            let w = HeadWindow {
                q: &q,
                k: &k,
                v: &v,
                mask: &mask,
                d,
                dv,
                t: 1,
                c,
            };
            for r in [Rounding::default(), all, some] {
                for scores_first in [true, false] {
                    let mut out = vec![f32::NAN; dv];
                    let mut scratch = Vec::new();
                    attend_one(&w, r, scores_first, None, &mut scratch, &mut out).unwrap();
                    assert_eq!(
                        bits(&out),
                        bits(&unfused(&w, r, scores_first)),
                        "{d}×{dv}×{c} filled {filled} {r:?} scores first {scores_first}"
                    );
                }
            }
        }
    }

    /// Fails if skipping the columns past the written part of the window changes one bit:
    /// windows of every lane tail, K/V zero (of either sign) past `filled`, stale garbage
    /// before it, masks that hide the rest (−1e4, −inf) and masks that do not (0, −50: the
    /// kernel must fall back), every rounding; and the skip must be taken where it can be.
    #[test]
    fn skipping_the_unwritten_columns_changes_no_bit() {
        if !scores_match_gemm() {
            return;
        }
        let all = ROUND_EVERY_OP;
        let mut fell_back = 0;
        // (d, dv, c, filled, visible): visible ≤ filled columns are unmasked
        for (d, dv, c, filled, visible) in [
            (64, 64, 512, 65, 65),
            (64, 64, 512, 128, 4),
            (64, 64, 512, 1, 1),
            (3, 5, 45, 7, 7),
            (37, 29, 130, 33, 20),
            (128, 128, 1000, 900, 870),
            (64, 64, 96, 95, 95),
        ] {
            let q = values(d, 11, 2.0);
            let mut k = values(d * c, 12, 3.0);
            let mut v = values(dv * c, 13, 1.0);
            for i in 0..d {
                for j in filled..c {
                    k[i * c + j] = if (i + j) % 3 == 0 { -0.0 } else { 0.0 };
                }
            }
            for i in 0..dv {
                for j in filled..c {
                    v[i * c + j] = if (i + j) % 2 == 0 { -0.0 } else { 0.0 };
                }
            }
            for hidden in [-1e4f32, f32::NEG_INFINITY, 0.0, -50.0] {
                let mask: Vec<f32> = (0..c)
                    .map(|j| if j < visible { 0.0 } else { hidden })
                    .collect();
                let w = HeadWindow {
                    q: &q,
                    k: &k,
                    v: &v,
                    mask: &mask,
                    d,
                    dv,
                    t: 1,
                    c,
                };
                let skip = live_columns(c, filled).map(|cols| Skip {
                    cols,
                    hidden_mask_max: hidden_mask_max(&mask[cols..]).unwrap(),
                });
                for r in [Rounding::default(), all] {
                    for scores_first in [true, false] {
                        let mut out = vec![f32::NAN; dv];
                        let mut scratch = Vec::new();
                        let skipped =
                            attend_one(&w, r, scores_first, skip, &mut scratch, &mut out).unwrap();
                        let case = format!("{d}×{dv}×{c} filled {filled} mask {hidden} {r:?}");
                        assert_eq!(bits(&out), bits(&unfused(&w, r, scores_first)), "{case}");
                        if hidden < -1e3 {
                            assert_eq!(skipped, skip.is_some(), "{case}");
                        } else if skip.is_some() && !skipped {
                            fell_back += 1;
                        }
                    }
                }
            }
        }
        assert!(fell_back > 0, "the unprovable masks must fall back");
        assert_eq!(live_columns(512, 0), Some(32));
        assert_eq!(live_columns(512, 481), None);
        assert_eq!(live_columns(100, 64), Some(64));
        assert_eq!(hidden_mask_max(&[-1.0, f32::NAN]), None);
    }

    /// Fails if a score's chain of fused multiply-adds changes by one bit (whichever kernel
    /// this CPU runs): every head dim to 13 (every channel tail), column counts with every lane
    /// tail, against the chain spelled out channel by channel.
    #[test]
    fn scores_keep_their_chain_for_every_shape() {
        for d in (1..=13).chain([64, 67, 128]) {
            for c in (1..=40).chain([63, 64, 65, 257]) {
                let q = values(d, 7 + d as u64, 1.7);
                let k = values(d * c, 9 + c as u64, 2.3);
                let mut got = vec![f32::NAN; c];
                scores_row(&q, &k, c, &mut got);
                let want: Vec<f32> = (0..c)
                    .map(|j| (1..d).fold(k[j] * q[0], |acc, i| k[i * c + j].mul_add(q[i], acc)))
                    .collect();
                assert_eq!(bits(&got), bits(&want), "d {d} c {c}");
            }
        }
    }

    /// Fails if reading K/V held as fp16 changes one bit against the same values held as f32:
    /// head dims and windows with every lane and block tail (past [`WIDEN_COLS`] and below
    /// it), a row count that is not a multiple of four, the zero-bound skip taken and refused,
    /// every rounding; and `scores_row` over fp16 K.
    #[test]
    fn fp16_kv_gives_the_f32_kv_results_bit_for_bit() {
        use half::f16;
        if !scores_match_gemm() {
            return;
        }
        let halves = |v: Vec<f32>| -> Vec<f16> { v.into_iter().map(f16::from_f32).collect() };
        let wide = |v: &[f16]| -> Vec<f32> { v.iter().map(|x| x.to_f32()).collect() };
        let mut skipped_some = false;
        // (d, dv, c, filled)
        for (d, dv, c, filled) in [
            (64, 64, 512, 100),
            (3, 5, 45, 7),
            (37, 29, 130, 33),
            (64, 63, 65, 64),
            (17, 7, 2, 1),
            (128, 128, 300, 299),
        ] {
            let q = values(d, 21, 2.0);
            let mut k16 = halves(values(d * c, 22, 3.0));
            let mut v16 = halves(values(dv * c, 23, 1.0));
            for i in 0..d {
                for j in filled..c {
                    k16[i * c + j] = if (i + j) % 3 == 0 {
                        -f16::ZERO
                    } else {
                        f16::ZERO
                    };
                }
            }
            for i in 0..dv {
                for j in filled..c {
                    v16[i * c + j] = if (i + j) % 2 == 0 {
                        -f16::ZERO
                    } else {
                        f16::ZERO
                    };
                }
            }
            let (k32, v32) = (wide(&k16), wide(&v16));
            let mut got = vec![f32::NAN; c];
            let mut want = vec![f32::NAN; c];
            scores_row(&q, &k16, c, &mut got);
            scores_row(&q, &k32, c, &mut want);
            assert_eq!(bits(&got), bits(&want), "scores {d}×{c}");
            for hidden in [-1e4f32, -50.0] {
                let mask: Vec<f32> = (0..c)
                    .map(|j| if j < filled { 0.0 } else { hidden })
                    .collect();
                let w32 = HeadWindow {
                    q: &q,
                    k: &k32[..],
                    v: &v32[..],
                    mask: &mask,
                    d,
                    dv,
                    t: 1,
                    c,
                };
                let w16 = HeadWindow {
                    q: &q,
                    k: &k16[..],
                    v: &v16[..],
                    mask: &mask,
                    d,
                    dv,
                    t: 1,
                    c,
                };
                let skip = live_columns(c, filled).map(|cols| Skip {
                    cols,
                    hidden_mask_max: hidden_mask_max(&mask[cols..]).unwrap(),
                });
                for r in [Rounding::default(), ROUND_EVERY_OP] {
                    for scores_first in [true, false] {
                        let case = format!("{d}×{dv}×{c} filled {filled} mask {hidden} {r:?}");
                        let (mut a, mut b) = (vec![f32::NAN; dv], vec![f32::NAN; dv]);
                        let mut scratch = Vec::new();
                        let s16 =
                            attend_one(&w16, r, scores_first, skip, &mut scratch, &mut a).unwrap();
                        let s32 =
                            attend_one(&w32, r, scores_first, skip, &mut scratch, &mut b).unwrap();
                        assert_eq!(bits(&a), bits(&b), "{case}");
                        assert_eq!(s16, s32, "{case}: skip taken differently");
                        assert_eq!(bits(&a), bits(&unfused(&w32, r, scores_first)), "{case}");
                        skipped_some |= s16;
                    }
                }
            }
        }
        assert!(skipped_some, "the skip must be exercised on fp16 K/V");
    }

    #[test]
    fn scores_are_the_fused_chain_not_the_plain_sum() {
        // values where fused and unfused sums differ: the probe is not vacuous
        let (d, c) = (7usize, 45usize);
        let q = values(d, 5, 1.3);
        let k = values(d * c, 6, 2.7);
        let mut fused = vec![0.0f32; c];
        scores_row(&q, &k, c, &mut fused);
        let plain: Vec<f32> = (0..c)
            .map(|j| (1..d).fold(k[j] * q[0], |acc, i| acc + k[i * c + j] * q[i]))
            .collect();
        assert_ne!(bits(&fused), bits(&plain));
    }
}
