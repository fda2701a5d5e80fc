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
    let out = &mut out[..c];
    let Some((&q0, rest)) = q.split_first() else {
        out.fill(0.0);
        return;
    };
    for (o, &kv) in out.iter_mut().zip(&k[..c]) {
        *o = kv * q0;
    }
    // four channels a pass over `out` (each element's chain of fused multiply-adds is the
    // same, channel by channel in order), then the rest one by one
    let quads = rest.chunks_exact(4);
    let tail = quads.remainder();
    for (p, qs) in quads.enumerate() {
        let at = |r: usize| &k[(4 * p + r + 1) * c..(4 * p + r + 2) * c];
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
        let row = &k[(first_tail + i) * c..(first_tail + i + 1) * c];
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
        // the op's operand order (which of two NaNs' payloads an x86 add keeps)
        #[allow(clippy::assign_op_pattern)]
        s.iter_mut().zip(w.mask).for_each(|(x, &m)| *x = m + *x);
    }
    round_if(round.masked, s);
    let mut max = [s.iter().copied().fold(f32::NEG_INFINITY, f32::max)];
    round_if(round.max, &mut max);
    s.iter_mut().for_each(|x| *x -= max[0]);
    round_if(round.shifted, s);
    softmax(s, &[1, c], 1, Accumulation::F32);
    round_if(round.probs, s);
    // four rows of `v` a pass where the CPU has it (each row's value is `dot`'s)
    let dot = simd::dot_f32_kernel();
    let mut done = 0;
    if let (Some(dot4), true) = (simd::dot_f32x4_kernel(), c > 0) {
        for (q, o) in out.chunks_exact_mut(4).enumerate() {
            o.copy_from_slice(&dot4(&w.v[4 * q * c..4 * (q + 1) * c], c, s));
        }
        done = dv / 4 * 4;
    }
    for (o, row) in out.iter_mut().zip(w.v.chunks_exact(c.max(1))).skip(done) {
        *o = dot(row, s);
    }
    if c == 0 {
        out.fill(0.0);
    }
    round_if(round.out, out);
    Ok(())
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

    #[test]
    fn one_query_gives_the_six_ops_bit_for_bit() {
        if !scores_match_gemm() {
            return;
        }
        let all = Rounding {
            scores: true,
            masked: true,
            max: true,
            shifted: true,
            probs: true,
            out: true,
        };
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
                    attend_one(&w, r, scores_first, &mut scratch, &mut out).unwrap();
                    assert_eq!(
                        bits(&out),
                        bits(&unfused(&w, r, scores_first)),
                        "{d}×{dv}×{c} filled {filled} {r:?} scores first {scores_first}"
                    );
                }
            }
        }
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
