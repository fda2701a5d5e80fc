//! The decode (one-token) matrix-vector product `y = W·x` for a row-major `[y.len(), x.len()]`
//! weight, runs of rows spread over a [`Team`].
//!
//! Invariant: `y[o]` is bit for bit [`dot`]`(row o, x)`, whatever the thread, the block or the
//! kernel that computes it. Decode streams every weight once per token, so it is bound by memory
//! bandwidth; the AVX-512 kernel works on four rows at a time (one load of `x` for four rows,
//! eight independent accumulators in flight) and keeps, per row, exactly the lanes, the order and
//! the reduction of `dot`'s AVX2 path (see [`dot_rows4_avx512`]). The fp16 kernel also asks for
//! the next pass's rows (software prefetch, a hint that changes no value: the hardware prefetcher
//! stops at every 4 KiB page, and a pass's four rows are four streams); the f32 kernel does not —
//! measured, the same hint slowed Qwen2.5's fp32 decode by ≈ 9% and did nothing on SmolLM2's.

use super::kernels::{dot, dot_f16};
use anemone_backend::team::{for_each_run_from_ends, matvec_unit_rows, SharedOut, Team};
use half::f16;

/// `y[o] = dot(w[o·n_in..(o+1)·n_in], x)` for every row, on `team` (or the caller alone).
pub fn matvec(team: Option<&Team>, w: &[f32], x: &[f32], y: &mut [f32]) {
    let n_in = x.len();
    assert_eq!(
        w.len(),
        n_in * y.len(),
        "matvec: w is not [y.len(), x.len()]"
    );
    let rows = y.len();
    // runs of units claimed from both ends: long runs, single units where the threads meet
    let per_unit = matvec_unit_rows(4 * n_in);
    let out = SharedOut::new(y);
    for_each_run_from_ends(team, rows.div_ceil(per_unit), 1, &|run| {
        let first = run.start * per_unit;
        let last = (run.end * per_unit).min(rows);
        // SAFETY: runs are disjoint row ranges inside `y`, which outlives the region.
        let y = unsafe { out.slice(first..last) };
        rows_serial(&w[first * n_in..last * n_in], x, y);
    });
}

/// The rows of `w` (`[y.len(), x.len()]`) against `x` on this thread: `y[o]` is [`dot`] of
/// row `o`, bit for bit. (The LM head of a bundle's host side runs its blocks through this.)
pub fn rows_serial(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n_in = x.len();
    // rows already done by the four-row kernel
    let done = {
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx512() {
                for (q, out) in y.chunks_exact_mut(4).enumerate() {
                    let block = &w[4 * q * n_in..4 * (q + 1) * n_in];
                    // SAFETY: AVX-512F, AVX2 and FMA were detected; `block` holds four rows.
                    unsafe { dot_rows4_avx512(block, x, out) };
                }
                y.len() / 4 * 4
            } else {
                0
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            0
        }
    };
    for (o, yo) in y.iter_mut().enumerate().skip(done) {
        *yo = dot(&w[o * n_in..(o + 1) * n_in], x);
    }
}

/// [`rows_serial`] of fp16 weights: `y[o]` is [`dot_f16`] of row `o` (`w` is
/// `[y.len(), x.len()]`), bit for bit — four rows a pass where the CPU has AVX-512 and F16C.
pub fn rows_serial_f16(w: &[f16], x: &[f32], y: &mut [f32]) {
    let n_in = x.len();
    assert_eq!(
        w.len(),
        n_in * y.len(),
        "rows_serial_f16: w is not [y.len(), x.len()]"
    );
    let done = {
        #[cfg(target_arch = "x86_64")]
        {
            if has_avx512() && is_x86_feature_detected!("f16c") {
                for (q, out) in y.chunks_exact_mut(4).enumerate() {
                    let block = &w[4 * q * n_in..4 * (q + 1) * n_in];
                    // SAFETY: AVX-512F, AVX2, FMA and F16C were detected; `block` holds four
                    // rows.
                    unsafe { dot_f16_rows4_avx512(block, x, out) };
                }
                y.len() / 4 * 4
            } else {
                0
            }
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            0
        }
    };
    for (o, yo) in y.iter_mut().enumerate().skip(done) {
        *yo = dot_f16(&w[o * n_in..(o + 1) * n_in], x);
    }
}

#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
    })
}

/// `out[r] = dot(row r of w, x)` for the four rows of `w` (`[4, x.len()]`), bit-identical to
/// `dot`'s AVX2 path: that keeps four 8-lane accumulators, `acc c` lane `l` summing (fused)
/// `row[i + 8c + l]·x[i + 8c + l]` over whole 32-blocks `i`, then one more 8-block at a time
/// into `acc 0`, reduces them by `horizontal_sum(acc0, acc1, acc2, acc3)` and adds the last
/// `len % 8` products one by one (rounded, not fused). Here one 16-lane register holds
/// `[acc0 | acc1]` and one `[acc2 | acc3]` — the same lane operations in the same order — the
/// 8-blocks touch only the low half of the first, and the halves go to the same reduction.
///
/// # Safety
/// AVX-512F, AVX2 and FMA must be present; `w.len() == 4 · x.len()`, `out.len() == 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn dot_rows4_avx512(w: &[f32], x: &[f32], out: &mut [f32]) {
    use super::kernels::horizontal_sum;
    use std::arch::x86_64::*;
    let n = x.len();
    debug_assert!(w.len() == 4 * n && out.len() == 4);
    let px = x.as_ptr();
    let pw: [*const f32; 4] = std::array::from_fn(|r| w.as_ptr().add(r * n));
    let mut lo = [_mm512_setzero_ps(); 4];
    let mut hi = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        let x0 = _mm512_loadu_ps(px.add(i));
        let x1 = _mm512_loadu_ps(px.add(i + 16));
        for r in 0..4 {
            lo[r] = _mm512_fmadd_ps(_mm512_loadu_ps(pw[r].add(i)), x0, lo[r]);
            hi[r] = _mm512_fmadd_ps(_mm512_loadu_ps(pw[r].add(i + 16)), x1, hi[r]);
        }
        i += 32;
    }
    const LOW8: __mmask16 = 0x00ff;
    while i + 8 <= n {
        let xv = _mm512_maskz_loadu_ps(LOW8, px.add(i));
        for r in 0..4 {
            let wv = _mm512_maskz_loadu_ps(LOW8, pw[r].add(i));
            lo[r] = _mm512_mask3_fmadd_ps(wv, xv, lo[r], LOW8);
        }
        i += 8;
    }
    macro_rules! upper {
        ($v:expr) => {
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd($v)))
        };
    }
    for r in 0..4 {
        let mut sum = horizontal_sum(
            _mm512_castps512_ps256(lo[r]),
            upper!(lo[r]),
            _mm512_castps512_ps256(hi[r]),
            upper!(hi[r]),
        );
        for j in i..n {
            sum += *pw[r].add(j) * *px.add(j);
        }
        out[r] = sum;
    }
}

/// [`dot_rows4_avx512`] of fp16 rows, bit-identical to [`dot_f16`]'s AVX2 path, which is
/// `dot`'s on the exactly widened values: the same lanes, order and reduction, each 16 (or 8)
/// halves widened by `vcvtph2ps` where `dot_f16` widens 8.
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C must be present; `w.len() == 4 · x.len()`, `out.len() == 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn dot_f16_rows4_avx512(w: &[f16], x: &[f32], out: &mut [f32]) {
    use super::kernels::horizontal_sum;
    use std::arch::x86_64::*;
    let n = x.len();
    debug_assert!(w.len() == 4 * n && out.len() == 4);
    let px = x.as_ptr();
    let pw: [*const f16; 4] = std::array::from_fn(|r| w.as_ptr().add(r * n));
    // the same place in the next four rows (a caller's next pass)
    let ahead = 4 * n;
    // 16 halves of row r from element i, widened exactly
    macro_rules! load16 {
        ($r:expr, $i:expr) => {
            _mm512_cvtph_ps(_mm256_loadu_si256(pw[$r].add($i) as *const __m256i))
        };
    }
    let mut lo = [_mm512_setzero_ps(); 4];
    let mut hi = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        let x0 = _mm512_loadu_ps(px.add(i));
        let x1 = _mm512_loadu_ps(px.add(i + 16));
        for r in 0..4 {
            // a hint only (the next pass's rows): never dereferenced, never faults
            _mm_prefetch::<_MM_HINT_T0>(pw[r].add(i).wrapping_add(ahead) as *const i8);
            lo[r] = _mm512_fmadd_ps(load16!(r, i), x0, lo[r]);
            hi[r] = _mm512_fmadd_ps(load16!(r, i + 16), x1, hi[r]);
        }
        i += 32;
    }
    const LOW8: __mmask16 = 0x00ff;
    while i + 8 <= n {
        let xv = _mm512_maskz_loadu_ps(LOW8, px.add(i));
        for r in 0..4 {
            let h = _mm_loadu_si128(pw[r].add(i) as *const __m128i);
            let wv = _mm512_castps256_ps512(_mm256_cvtph_ps(h));
            lo[r] = _mm512_mask3_fmadd_ps(wv, xv, lo[r], LOW8);
        }
        i += 8;
    }
    macro_rules! upper {
        ($v:expr) => {
            _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd($v)))
        };
    }
    for r in 0..4 {
        let mut sum = horizontal_sum(
            _mm512_castps512_ps256(lo[r]),
            upper!(lo[r]),
            _mm512_castps512_ps256(hi[r]),
            upper!(hi[r]),
        );
        for j in i..n {
            sum += (*pw[r].add(j)).to_f32() * *px.add(j);
        }
        out[r] = sum;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
        let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
        (0..n)
            .map(|_| {
                s ^= s << 13;
                s ^= s >> 17;
                s ^= s << 5;
                (s as f32 / u32::MAX as f32) - 0.5
            })
            .collect()
    }

    /// Every output is `dot` of its row to the bit (`dot_f16` for fp16 rows), for widths with and without 32-blocks,
    /// 8-blocks and scalar tails, row counts with and without a partial quad and block, on one
    /// thread and on a team.
    #[test]
    fn matvec_gives_every_row_the_bits_of_dot() {
        let team = Team::new(2).unwrap();
        for n_in in [
            0usize, 1, 7, 8, 15, 16, 31, 32, 33, 40, 63, 64, 100, 576, 577, 896,
        ] {
            for rows in [1usize, 3, 4, 5, 9, 230, 1153] {
                let w = pseudo_random(rows * n_in, 11 + n_in as u32);
                let x = pseudo_random(n_in, 5 + rows as u32);
                let want: Vec<u32> = (0..rows)
                    .map(|o| dot(&w[o * n_in..(o + 1) * n_in], &x).to_bits())
                    .collect();
                let w16: Vec<f16> = w.iter().map(|&v| f16::from_f32(v)).collect();
                let want16: Vec<u32> = (0..rows)
                    .map(|o| dot_f16(&w16[o * n_in..(o + 1) * n_in], &x).to_bits())
                    .collect();
                let mut y = vec![f32::NAN; rows];
                rows_serial_f16(&w16, &x, &mut y);
                let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                let differing = (0..rows).find(|&o| got[o] != want16[o]);
                assert_eq!(differing, None, "fp16: n_in {n_in}, rows {rows}");
                for t in [None, Some(&team)] {
                    let mut y = vec![f32::NAN; rows];
                    matvec(t, &w, &x, &mut y);
                    let got: Vec<u32> = y.iter().map(|v| v.to_bits()).collect();
                    let differing = (0..rows).find(|&o| got[o] != want[o]);
                    assert_eq!(
                        differing,
                        None,
                        "n_in {n_in}, rows {rows}, team {}",
                        t.is_some()
                    );
                }
            }
        }
    }
}
