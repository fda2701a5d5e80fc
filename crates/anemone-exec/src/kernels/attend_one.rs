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
use super::linalg::{matmul_into, MatRef};
use super::norm::softmax;
use super::{simd, Accumulation};

/// `out[j] = Σ_i q[i]·k[i·c + j]` summed as `gemm`'s single-row product sums it (module docs):
/// `k[0][j]·q[0]`, then `fma(k[i][j], q[i], ·)` for `i = 1..d`.
pub fn scores_row(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
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

/// `mul_add` is one IEEE fused multiply-add wherever it runs (an instruction with the `fma`
/// feature, else the C library's exact `fmaf`).
#[inline(always)]
fn scores_row_generic(q: &[f32], k: &[f32], c: usize, out: &mut [f32]) {
    let out = &mut out[..c];
    let Some((&q0, rest)) = q.split_first() else {
        out.fill(0.0);
        return;
    };
    for (o, &kv) in out.iter_mut().zip(&k[..c]) {
        *o = kv * q0;
    }
    for (i, &qi) in rest.iter().enumerate() {
        let row = &k[(i + 1) * c..(i + 2) * c];
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

fn round_if(on: bool, data: &mut [f32]) {
    if on {
        round_f16_in_place(data);
    }
}

/// `out [dv]` of one query head (`w.t == 1`) over all `w.c` columns, as the six ops compute it
/// (module docs); `scores_first`: the mask add's first operand is the scores. `scratch` holds
/// the row (resized here). Call only when [`scores_match_gemm`].
pub fn attend_one(
    w: &HeadWindow,
    round: Rounding,
    scores_first: bool,
    scratch: &mut Vec<f32>,
    out: &mut [f32],
) -> Result<(), String> {
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
    scratch.resize(c, 0.0);
    let s = &mut scratch[..c];
    scores_row(w.q, w.k, c, s);
    round_if(round.scores, s);
    if scores_first {
        s.iter_mut().zip(w.mask).for_each(|(x, &m)| *x += m);
    } else {
        s.iter_mut().zip(w.mask).for_each(|(x, &m)| *x = m + *x);
    }
    round_if(round.masked, s);
    let mut max = [s.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
    round_if(round.max, &mut max);
    s.iter_mut().for_each(|x| *x -= max[0]);
    round_if(round.shifted, s);
    softmax(s, &[1, c], 1, Accumulation::F32);
    round_if(round.probs, s);
    let dot = simd::dot_f32_kernel();
    for (o, row) in out.iter_mut().zip(w.v.chunks_exact(c.max(1))) {
        *o = dot(row, s);
    }
    if c == 0 {
        out.fill(0.0);
    }
    round_if(round.out, out);
    Ok(())
}
