//! The host LM head's rows: [`rows_serial_f16`]'s / [`rows_serial`]'s values bit for bit, four
//! rows a pass that also asks for the next pass's rows ahead (software prefetch). A head streams tens of
//! MiB of weights from memory per token, and the hardware prefetcher stops at every 4 KiB page
//! boundary; a prefetch is a hint and changes no value.

use anemone_models::reference::{rows_serial, rows_serial_f16};
use half::f16;

/// `y[o]` = the dot of row `o` of `w` (`[y.len(), x.len()]`) with `x`, each exactly
/// [`rows_serial_f16`]'s (which is `reference::kernels::dot_f16`'s).
pub(super) fn rows_f16(w: &[f16], x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() && w.len() == x.len() * y.len() {
        let n = x.len();
        let (quads, rest) = y.split_at_mut(y.len() / 4 * 4);
        for (q, out) in quads.chunks_exact_mut(4).enumerate() {
            // SAFETY: the features were detected; `w` holds four rows of `n` from `4 q n`.
            unsafe { rows4(&w[4 * q * n..4 * (q + 1) * n], x, out) };
        }
        let first = quads.len();
        rows_serial_f16(&w[first * n..], x, rest);
        return;
    }
    rows_serial_f16(w, x, y);
}

/// `y[o]` = the dot of row `o` of `w` (`[y.len(), x.len()]`) with `x`, each exactly
/// [`rows_serial`]'s (which is `reference::kernels::dot`'s).
pub(super) fn rows_f32(w: &[f32], x: &[f32], y: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if avx512() && w.len() == x.len() * y.len() {
        let n = x.len();
        let (quads, rest) = y.split_at_mut(y.len() / 4 * 4);
        for (q, out) in quads.chunks_exact_mut(4).enumerate() {
            // SAFETY: the features were detected; `w` holds four rows of `n` from `4 q n`.
            unsafe { rows4_f32(&w[4 * q * n..4 * (q + 1) * n], x, out) };
        }
        let first = quads.len();
        rows_serial(&w[first * n..], x, rest);
        return;
    }
    rows_serial(w, x, y);
}

#[cfg(target_arch = "x86_64")]
fn avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        is_x86_feature_detected!("avx512f")
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    })
}

/// Four rows in the reference's order: per row, 16-lane accumulators `lo` (elements `i..i+16`
/// of each 32-wide step) and `hi` (`i+16..i+32`), an 8-wide tail step into the low half of
/// `lo`; then the four 8-lane halves summed `(lo₀ + lo₁) + (hi₀ + hi₁)`, the lanes as
/// `((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7))`, and the last `n % 8` products added one
/// by one (not fused).
///
/// # Safety
/// AVX-512F, AVX2, FMA and F16C must be present; `w.len() == 4 · x.len()`, `out.len() == 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,f16c")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows4(w: &[f16], x: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    debug_assert!(w.len() == 4 * n && out.len() == 4);
    let px = x.as_ptr();
    let pw: [*const f16; 4] = std::array::from_fn(|r| w.as_ptr().add(r * n));
    // the same place of the next four rows, in halves
    let ahead = 4 * n;
    let mut lo = [_mm512_setzero_ps(); 4];
    let mut hi = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        let x0 = _mm512_loadu_ps(px.add(i));
        let x1 = _mm512_loadu_ps(px.add(i + 16));
        for r in 0..4 {
            // a hint only: never dereferenced, never faults
            _mm_prefetch::<_MM_HINT_T0>(pw[r].add(i).wrapping_add(ahead) as *const i8);
            let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(pw[r].add(i) as *const __m256i));
            let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(pw[r].add(i + 16) as *const __m256i));
            lo[r] = _mm512_fmadd_ps(w0, x0, lo[r]);
            hi[r] = _mm512_fmadd_ps(w1, x1, hi[r]);
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
    for r in 0..4 {
        let mut sum = reduce(lo[r], hi[r]);
        for j in i..n {
            sum += (*pw[r].add(j)).to_f32() * *px.add(j);
        }
        out[r] = sum;
    }
}

/// [`rows4`] of f32 rows (the same lanes, order and reduction; two cache lines a step).
///
/// # Safety
/// AVX-512F, AVX2 and FMA must be present; `w.len() == 4 · x.len()`, `out.len() == 4`.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f")]
#[allow(clippy::needless_range_loop)]
unsafe fn rows4_f32(w: &[f32], x: &[f32], out: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    debug_assert!(w.len() == 4 * n && out.len() == 4);
    let px = x.as_ptr();
    let pw: [*const f32; 4] = std::array::from_fn(|r| w.as_ptr().add(r * n));
    let ahead = 4 * n;
    let mut lo = [_mm512_setzero_ps(); 4];
    let mut hi = [_mm512_setzero_ps(); 4];
    let mut i = 0;
    while i + 32 <= n {
        let x0 = _mm512_loadu_ps(px.add(i));
        let x1 = _mm512_loadu_ps(px.add(i + 16));
        for r in 0..4 {
            // hints only: never dereferenced, never fault
            _mm_prefetch::<_MM_HINT_T0>(pw[r].add(i).wrapping_add(ahead) as *const i8);
            _mm_prefetch::<_MM_HINT_T0>(pw[r].add(i + 16).wrapping_add(ahead) as *const i8);
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
    for r in 0..4 {
        let mut sum = reduce(lo[r], hi[r]);
        for j in i..n {
            sum += *pw[r].add(j) * *px.add(j);
        }
        out[r] = sum;
    }
}

/// The reference's reduction of a row's `lo` and `hi` accumulators (see [`rows4`]).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,avx512f")]
unsafe fn reduce(lo: std::arch::x86_64::__m512, hi: std::arch::x86_64::__m512) -> f32 {
    use std::arch::x86_64::*;
    let upper = |v: __m512| _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v)));
    let acc = _mm256_add_ps(
        _mm256_add_ps(_mm512_castps512_ps256(lo), upper(lo)),
        _mm256_add_ps(_mm512_castps512_ps256(hi), upper(hi)),
    );
    let s = _mm_add_ps(_mm256_extractf128_ps(acc, 1), _mm256_castps256_ps128(acc));
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails if a row differs from the reference's by one bit: every length to 100 (every
    /// tail), the real models' widths, values across fp16's range with specials, row counts
    /// that leave a remainder.
    #[test]
    fn head_rows_are_the_reference_rows_bit_for_bit() {
        let mut state = 0x2545_F491_4F6C_DD1Du64;
        let mut next = || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        };
        for n in (0..=100).chain([255, 576, 896, 1536]) {
            for rows in [1usize, 4, 7, 13] {
                let w: Vec<f16> = (0..rows * n)
                    .map(|_| {
                        let bits = next() as u16;
                        match bits % 61 {
                            0 => f16::NEG_ZERO,
                            1 => f16::from_bits(bits >> 6),
                            _ => f16::from_f32(((bits % 2001) as f32 - 1000.0) / 313.0),
                        }
                    })
                    .collect();
                let x: Vec<f32> = (0..n)
                    .map(|_| ((next() % 200_001) as f32 - 100_000.0) / 31_337.0)
                    .collect();
                let (mut got, mut want) = (vec![f32::NAN; rows], vec![f32::NAN; rows]);
                rows_f16(&w, &x, &mut got);
                rows_serial_f16(&w, &x, &mut want);
                let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
                assert_eq!(bits(&got), bits(&want), "fp16 n={n} rows={rows}");
                // the same rows as f32 values, and f32 values fp16 cannot hold
                let w32: Vec<f32> = w
                    .iter()
                    .enumerate()
                    .map(|(i, h)| h.to_f32() * (1.0 + (i % 5) as f32 / 7.0))
                    .collect();
                rows_f32(&w32, &x, &mut got);
                rows_serial(&w32, &x, &mut want);
                assert_eq!(bits(&got), bits(&want), "f32 n={n} rows={rows}");
            }
        }
    }
}
