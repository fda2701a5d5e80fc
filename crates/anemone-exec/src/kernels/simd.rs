//! Dot products for matvecs: AVX2+FMA (+F16C for fp16 weights) when the CPU has them,
//! portable loops otherwise. Selected once per matvec, never per element.

use half::f16;

/// A dot product of a weight row (f32 or f16) with an f32 vector of the same length.
pub type DotF32 = fn(&[f32], &[f32]) -> f32;
pub type DotF16 = fn(&[f16], &[f32]) -> f32;

fn dot_f32_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0.0f32; 8];
    let chunks = a.len().min(b.len()) / 8 * 8;
    for (ca, cb) in a[..chunks].chunks_exact(8).zip(b[..chunks].chunks_exact(8)) {
        for l in 0..8 {
            acc[l] += ca[l] * cb[l];
        }
    }
    let mut s = (acc[0] + acc[4]) + (acc[1] + acc[5]) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
    for (x, y) in a[chunks..].iter().zip(&b[chunks..]) {
        s += x * y;
    }
    s
}

fn dot_f16_portable(w: &[f16], x: &[f32]) -> f32 {
    use half::slice::HalfFloatSliceExt;
    const CHUNK: usize = 256;
    let mut buf = [0.0f32; CHUNK];
    let mut acc = 0.0f32;
    for (wc, xc) in w.chunks(CHUNK).zip(x.chunks(CHUNK)) {
        let b = &mut buf[..wc.len()];
        wc.convert_to_f32_slice(b);
        acc += dot_f32_portable(b, xc);
    }
    acc
}

#[cfg(target_arch = "x86_64")]
mod avx2 {
    use std::arch::x86_64::*;

    use half::f16;

    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum(v: __m256) -> f32 {
        let mut lanes = [0.0f32; 8];
        _mm256_storeu_ps(lanes.as_mut_ptr(), v);
        (lanes[0] + lanes[4])
            + (lanes[1] + lanes[5])
            + ((lanes[2] + lanes[6]) + (lanes[3] + lanes[7]))
    }

    /// # Safety
    /// The CPU must support AVX2 and FMA.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot_f32(a: &[f32], b: &[f32]) -> f32 {
        let n = a.len().min(b.len());
        let (pa, pb) = (a.as_ptr(), b.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a_k) in acc.iter_mut().enumerate() {
                let x = _mm256_loadu_ps(pa.add(i + 8 * k));
                let y = _mm256_loadu_ps(pb.add(i + 8 * k));
                *a_k = _mm256_fmadd_ps(x, y, *a_k);
            }
            i += 32;
        }
        while i + 8 <= n {
            acc[0] = _mm256_fmadd_ps(
                _mm256_loadu_ps(pa.add(i)),
                _mm256_loadu_ps(pb.add(i)),
                acc[0],
            );
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(sum);
        for j in i..n {
            s += a[j] * b[j];
        }
        s
    }

    /// # Safety
    /// The CPU must support AVX2, FMA and F16C.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot_f16(w: &[f16], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let (pw, px) = (w.as_ptr() as *const __m128i, x.as_ptr());
        let mut acc = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a_k) in acc.iter_mut().enumerate() {
                // 8 halves = 16 bytes at element i + 8k
                let h = _mm_loadu_si128(pw.add((i + 8 * k) / 8));
                let wv = _mm256_cvtph_ps(h);
                *a_k = _mm256_fmadd_ps(wv, _mm256_loadu_ps(px.add(i + 8 * k)), *a_k);
            }
            i += 32;
        }
        while i + 8 <= n {
            let wv = _mm256_cvtph_ps(_mm_loadu_si128(pw.add(i / 8)));
            acc[0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(px.add(i)), acc[0]);
            i += 8;
        }
        let sum = _mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3]));
        let mut s = hsum(sum);
        for j in i..n {
            s += w[j].to_f32() * x[j];
        }
        s
    }
}

/// `R` rows a pass (fp16 or f32), sharing the loads of `x`: AVX-512 registers holding two of the
/// one-row dot's 8-lane accumulators side by side, so each row's sum is `avx2::dot_f16`'s /
/// `avx2::dot_f32`'s bit for bit. Each pass asks for the next pass's rows ahead (software
/// prefetch: a single-token matvec streams its weights from memory once, and the hardware
/// prefetcher stops at every page boundary); hints change no value.
#[cfg(target_arch = "x86_64")]
pub(crate) mod avx512 {
    use std::arch::x86_64::*;

    use half::f16;

    /// The dots of the `R` rows `w[r k..(r + 1) k]` (`k = x.len()`) with `x`, each in the order
    /// of `avx2::dot_f16`: element `i + 8a + l` of a 32-wide step into accumulator `a`, lane
    /// `l` (register `a / 2`, lane `8 (a % 2) + l`); an 8-wide tail step into accumulator 0
    /// (the low half of register 0, the high half kept by the mask); then
    /// `(acc0 + acc1) + (acc2 + acc3)`, the lanes summed as its horizontal sum, and the last
    /// `k % 8` products added one by one.
    ///
    /// # Safety
    /// `w` holds `R · x.len()` values and the CPU has AVX-512F, AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn dot_f16_rows<const R: usize>(w: &[f16], x: &[f32]) -> [f32; R] {
        dot_f16_rows_at::<R>(w, x.len(), x)
    }

    /// [`dot_f16_rows`] of rows `rs` apart (`w[r rs..r rs + k]`).
    ///
    /// # Safety
    /// `w` holds `(R - 1) rs + x.len()` values and the CPU has AVX-512F, AVX2, FMA and F16C.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn dot_f16_rows_at<const R: usize>(w: &[f16], rs: usize, x: &[f32]) -> [f32; R] {
        let n = x.len();
        let (pw, px) = (w.as_ptr() as *const u8, x.as_ptr());
        // row r's halves from element i, as bytes
        let at = |r: usize, i: usize| pw.add(2 * (r * rs + i));
        let mut a01 = [_mm512_setzero_ps(); R];
        let mut a23 = [_mm512_setzero_ps(); R];
        let mut i = 0;
        // the same place of the next `R` rows (a matvec's next pass), in bytes: asked for
        // ahead, as the hardware prefetcher does not cross pages
        let ahead = 2 * R * rs;
        while i + 32 <= n {
            let x0 = _mm512_loadu_ps(px.add(i));
            let x1 = _mm512_loadu_ps(px.add(i + 16));
            for r in 0..R {
                // a hint only: never dereferenced, never faults
                _mm_prefetch::<_MM_HINT_T0>(at(r, i).wrapping_add(ahead) as *const i8);
                let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(at(r, i) as *const __m256i));
                let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(at(r, i + 16) as *const __m256i));
                a01[r] = _mm512_fmadd_ps(w0, x0, a01[r]);
                a23[r] = _mm512_fmadd_ps(w1, x1, a23[r]);
            }
            i += 32;
        }
        while i + 8 <= n {
            let xv = _mm512_castps256_ps512(_mm256_loadu_ps(px.add(i)));
            for (r, a) in a01.iter_mut().enumerate() {
                let wv = _mm256_cvtph_ps(_mm_loadu_si128(at(r, i) as *const __m128i));
                *a = _mm512_mask3_fmadd_ps(_mm512_castps256_ps512(wv), xv, *a, 0x00FF);
            }
            i += 8;
        }
        let mut sums = [0.0f32; R];
        for r in 0..R {
            let mut s = reduce(a01[r], a23[r]);
            for j in i..n {
                s += w[r * rs + j].to_f32() * x[j];
            }
            sums[r] = s;
        }
        sums
    }

    /// The sum of [`dot_f16_rows_at`]'s two accumulators of a row: lanes `l` and `l + 8` of
    /// each added, the two results added, then the eight lanes as
    /// `(l0 + l4) + (l1 + l5) + ((l2 + l6) + (l3 + l7))`.
    #[inline]
    #[target_feature(enable = "avx512f,avx2")]
    pub(crate) fn reduce(a01: __m512, a23: __m512) -> f32 {
        let pair = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        let sum = _mm256_add_ps(pair(a01), pair(a23));
        let mut l = [0.0f32; 8];
        // SAFETY: eight lanes into eight floats
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), sum) };
        (l[0] + l[4]) + (l[1] + l[5]) + ((l[2] + l[6]) + (l[3] + l[7]))
    }

    /// The dots of the `R` f32 rows at `w[r rs..r rs + k]` (`k = x.len()`) with `x`, each in the
    /// order of `avx2::dot_f32`: element `i + 8a + l` of a 32-wide step into accumulator `a`,
    /// lane `l` (register `a / 2`, lane `8 (a % 2) + l`); an 8-wide tail step into accumulator
    /// 0 (the low half of register 0, the high half kept by the mask); then
    /// `(acc0 + acc1) + (acc2 + acc3)`, the lanes summed as its horizontal sum, and the last
    /// `k % 8` products added one by one (rounded, not fused).
    ///
    /// # Safety
    /// `w` holds `(R - 1) rs + x.len()` values and the CPU has AVX-512F, AVX2 and FMA.
    #[inline]
    #[target_feature(enable = "avx512f,avx2,fma")]
    pub unsafe fn dot_f32_rows<const R: usize>(w: &[f32], rs: usize, x: &[f32]) -> [f32; R] {
        let n = x.len();
        let (pw, px) = (w.as_ptr(), x.as_ptr());
        // row r's values from element i
        let at = |r: usize, i: usize| pw.add(r * rs + i);
        let mut a01 = [_mm512_setzero_ps(); R];
        let mut a23 = [_mm512_setzero_ps(); R];
        let mut i = 0;
        // the same place of the next `R` rows (a matvec's next pass): asked for ahead
        let ahead = R * rs;
        while i + 32 <= n {
            let x0 = _mm512_loadu_ps(px.add(i));
            let x1 = _mm512_loadu_ps(px.add(i + 16));
            for r in 0..R {
                // hints only: never dereferenced, never fault
                _mm_prefetch::<_MM_HINT_T0>(at(r, i).wrapping_add(ahead) as *const i8);
                _mm_prefetch::<_MM_HINT_T0>(at(r, i + 16).wrapping_add(ahead) as *const i8);
                a01[r] = _mm512_fmadd_ps(_mm512_loadu_ps(at(r, i)), x0, a01[r]);
                a23[r] = _mm512_fmadd_ps(_mm512_loadu_ps(at(r, i + 16)), x1, a23[r]);
            }
            i += 32;
        }
        const LOW8: __mmask16 = 0x00FF;
        while i + 8 <= n {
            let xv = _mm512_maskz_loadu_ps(LOW8, px.add(i));
            for (r, a) in a01.iter_mut().enumerate() {
                let wv = _mm512_maskz_loadu_ps(LOW8, at(r, i));
                *a = _mm512_mask3_fmadd_ps(wv, xv, *a, LOW8);
            }
            i += 8;
        }
        let mut sums = [0.0f32; R];
        for r in 0..R {
            let pair = |v: __m512| {
                _mm256_add_ps(
                    _mm512_castps512_ps256(v),
                    _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
                )
            };
            let sum = _mm256_add_ps(pair(a01[r]), pair(a23[r]));
            let mut l = [0.0f32; 8];
            _mm256_storeu_ps(l.as_mut_ptr(), sum);
            let mut s = (l[0] + l[4]) + (l[1] + l[5]) + ((l[2] + l[6]) + (l[3] + l[7]));
            for (j, xj) in x.iter().enumerate().skip(i) {
                s += *at(r, j) * xj;
            }
            sums[r] = s;
        }
        sums
    }
}

/// Four f32 rows `w[r rs..r rs + k]` (`k = x.len()`, `rs` the row stride, `w` holding at least
/// `3 rs + k` values) dotted with `x`.
pub type DotF32x4 = fn(&[f32], usize, &[f32]) -> [f32; 4];

/// Four rows a pass when this CPU has AVX-512 (each row's value is [`dot_f32_kernel`]'s bit for
/// bit), else `None`.
pub fn dot_f32x4_kernel() -> Option<DotF32x4> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && is_x86_feature_detected!("avx512f") {
        // SAFETY: the features `dot_f32_rows` is compiled for were detected at run time; the
        // slice length is checked (a short `w` takes the row-by-row path).
        return Some(|w, rs, x| {
            let k = x.len();
            if w.len() >= 3 * rs + k {
                unsafe { avx512::dot_f32_rows::<4>(w, rs, x) }
            } else {
                let d = dot_f32_kernel();
                std::array::from_fn(|r| d(w.get(r * rs..r * rs + k).unwrap_or(&[]), x))
            }
        });
    }
    None
}

/// Four fp16 rows `w[r k..(r + 1) k]` (`k = x.len()`, `w.len() == 4 k`) dotted with `x`.
pub type DotF16x4 = fn(&[f16], &[f32]) -> [f32; 4];

/// Four rows a pass when this CPU has AVX-512 (each row's value is [`dot_f16_kernel`]'s bit for
/// bit), else `None`.
pub fn dot_f16x4_kernel() -> Option<DotF16x4> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx512f") {
        // SAFETY: the features `dot_f16_rows` is compiled for were detected at run time; the
        // slice length is checked (a short `w` takes the row-by-row path).
        return Some(|w, x| {
            if w.len() == 4 * x.len() {
                unsafe { avx512::dot_f16_rows::<4>(w, x) }
            } else {
                let d = dot_f16_kernel();
                let k = x.len();
                std::array::from_fn(|r| d(w.get(r * k..(r + 1) * k).unwrap_or(&[]), x))
            }
        });
    }
    None
}

/// Four fp16 rows `w[r rs..r rs + k]` (`k = x.len()`, `rs` the row stride, `w` holding at
/// least `3 rs + k` values) dotted with `x`.
pub type DotF16x4At = fn(&[f16], usize, &[f32]) -> [f32; 4];

/// Four rows `rs` apart a pass when this CPU has AVX-512 (each row's value is
/// [`dot_f16_kernel`]'s bit for bit), else `None`.
pub fn dot_f16x4_at_kernel() -> Option<DotF16x4At> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx512f") {
        // SAFETY: the features `dot_f16_rows_at` is compiled for were detected at run time;
        // the slice length is checked (a short `w` takes the row-by-row path).
        return Some(|w, rs, x| {
            let k = x.len();
            if w.len() >= 3 * rs + k {
                unsafe { avx512::dot_f16_rows_at::<4>(w, rs, x) }
            } else {
                let d = dot_f16_kernel();
                std::array::from_fn(|r| d(w.get(r * rs..r * rs + k).unwrap_or(&[]), x))
            }
        });
    }
    None
}

#[cfg(target_arch = "x86_64")]
fn has_avx2_fma() -> bool {
    is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma")
}

/// The fastest f32 dot product this CPU runs.
pub fn dot_f32_kernel() -> DotF32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the features `dot_f32` is compiled for were detected at run time.
        return |a, b| unsafe { avx2::dot_f32(a, b) };
    }
    dot_f32_portable
}

/// The fastest fp16-weight dot product this CPU runs.
pub fn dot_f16_kernel() -> DotF16 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && is_x86_feature_detected!("f16c") {
        // SAFETY: the features `dot_f16` is compiled for were detected at run time.
        return |w, x| unsafe { avx2::dot_f16(w, x) };
    }
    dot_f16_portable
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_arch = "x86_64")]
    /// The summation order of the x86 dots, spelled out in scalar code: element `i + 8k` of
    /// each 32-wide step into accumulator `k`, lane `i` (fused multiply-add); the 8-wide tail
    /// steps into accumulator 0; then `(acc0 + acc1) + (acc2 + acc3)` lane-wise, the lanes
    /// summed as `((l0 + l4) + (l1 + l5)) + ((l2 + l6) + (l3 + l7))`, and the last `n % 8`
    /// products added one by one (not fused).
    fn dot_spec(w: &[f32], x: &[f32]) -> f32 {
        let n = w.len().min(x.len());
        let mut acc = [[0.0f32; 8]; 4];
        let mut i = 0;
        while i + 32 <= n {
            for (k, a) in acc.iter_mut().enumerate() {
                for (l, lane) in a.iter_mut().enumerate() {
                    *lane = w[i + 8 * k + l].mul_add(x[i + 8 * k + l], *lane);
                }
            }
            i += 32;
        }
        while i + 8 <= n {
            for (l, lane) in acc[0].iter_mut().enumerate() {
                *lane = w[i + l].mul_add(x[i + l], *lane);
            }
            i += 8;
        }
        let v: Vec<f32> = (0..8)
            .map(|l| (acc[0][l] + acc[1][l]) + (acc[2][l] + acc[3][l]))
            .collect();
        let mut s = ((v[0] + v[4]) + (v[1] + v[5])) + ((v[2] + v[6]) + (v[3] + v[7]));
        for j in i..n {
            s += w[j] * x[j];
        }
        s
    }

    /// Fails if the SIMD dots' values change: bit equality with the spelled-out order on
    /// awkward lengths (tails of every size, long rows).
    #[cfg(target_arch = "x86_64")]
    #[test]
    fn simd_dots_keep_their_summation_order_bit_for_bit() {
        if !(has_avx2_fma() && is_x86_feature_detected!("f16c")) {
            return;
        }
        for n in [
            0usize, 1, 3, 7, 8, 9, 15, 16, 17, 31, 32, 33, 39, 40, 63, 64, 65, 95, 96, 100, 257,
            576, 583, 896, 1536, 4864,
        ] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 7919 % 2003) as f32 - 1001.0) / 977.0)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 104_729 % 1009) as f32 - 504.0) / 311.0)
                .collect();
            let h: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
            let widened: Vec<f32> = h.iter().map(|v| v.to_f32()).collect();
            assert_eq!(
                dot_f32_kernel()(&a, &b).to_bits(),
                dot_spec(&a, &b).to_bits(),
                "f32 n={n}"
            );
            assert_eq!(
                dot_f16_kernel()(&h, &b).to_bits(),
                dot_spec(&widened, &b).to_bits(),
                "f16 n={n}"
            );
        }
    }

    /// A xorshift64 stream of test values from `seed`.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    /// Fails if a row of the four-row fp16 dot differs from the one-row dot by one bit: every
    /// length to 160 (every tail), long rows, values across fp16's range (subnormals, ±0,
    /// ±inf, large products), each row different.
    #[test]
    fn four_row_f16_dot_is_the_one_row_dot_bit_for_bit() {
        let Some(dot4) = dot_f16x4_kernel() else {
            return;
        };
        let dot = dot_f16_kernel();
        let mut next = xorshift(0x2545_F491_4F6C_DD1Du64);
        let lengths = (0..=160).chain([255, 256, 257, 576, 583, 896, 1536, 4864]);
        for (case, n) in lengths.enumerate() {
            let w: Vec<f16> = (0..4 * n)
                .map(|_| {
                    let bits = next() as u16;
                    // mostly finite values of varied magnitude, some specials
                    match bits % 64 {
                        0 => f16::INFINITY,
                        1 => f16::NEG_ZERO,
                        2 => f16::from_bits(bits >> 6), // subnormal
                        _ if case % 3 == 0 => f16::from_bits(bits & 0x7BFF),
                        _ => f16::from_f32(((bits % 2001) as f32 - 1000.0) / 777.0),
                    }
                })
                .collect();
            let x: Vec<f32> = (0..n)
                .map(|_| ((next() % 200_001) as f32 - 100_000.0) / 31_337.0)
                .collect();
            let got = dot4(&w, &x);
            for (r, g) in got.iter().enumerate() {
                let want = dot(&w[r * n..(r + 1) * n], &x);
                assert_eq!(g.to_bits(), want.to_bits(), "n={n} row {r}: {g} vs {want}");
            }
        }
    }

    /// Fails if a row of the four-row f32 dot differs from the one-row dot by one bit: every
    /// length to 160 (every tail), long rows, rows packed and strided, values of varied
    /// magnitude with specials (±0, ±inf, subnormals), each row different.
    #[test]
    fn four_row_f32_dot_is_the_one_row_dot_bit_for_bit() {
        let Some(dot4) = dot_f32x4_kernel() else {
            return;
        };
        let dot = dot_f32_kernel();
        let mut next = xorshift(0x9E37_79B9_7F4A_7C15u64);
        let lengths = (0..=160).chain([255, 256, 257, 576, 583, 896, 1536, 4864]);
        for (case, n) in lengths.enumerate() {
            for rs in [n, n + 3] {
                let w: Vec<f32> = (0..3 * rs + n)
                    .map(|_| {
                        let bits = next();
                        match bits % 97 {
                            0 => f32::INFINITY,
                            1 => -0.0,
                            2 => f32::from_bits((bits >> 20) as u32 & 0x007F_FFFF), // subnormal
                            _ if case % 3 == 0 => {
                                // any finite value from 2^-30 to 2^30, either sign
                                let e = (97 + (bits >> 8) % 60) as u32;
                                f32::from_bits((bits >> 32) as u32 & 0x807F_FFFF | e << 23)
                            }
                            _ => ((bits % 200_001) as f32 - 100_000.0) / 77_777.0,
                        }
                    })
                    .collect();
                let x: Vec<f32> = (0..n)
                    .map(|_| ((next() % 200_001) as f32 - 100_000.0) / 31_337.0)
                    .collect();
                let got = dot4(&w, rs, &x);
                for (r, g) in got.iter().enumerate() {
                    let want = dot(&w[r * rs..r * rs + n], &x);
                    assert_eq!(
                        g.to_bits(),
                        want.to_bits(),
                        "n={n} rs={rs} row {r}: {g} vs {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn simd_and_portable_dots_agree() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 100, 896] {
            let a: Vec<f32> = (0..n)
                .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
                .collect();
            let b: Vec<f32> = (0..n)
                .map(|i| ((i * 53 % 97) as f32 - 48.0) / 32.0)
                .collect();
            let h: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
            let exact: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            let tol = 1e-5 * (1.0 + exact.abs());
            for got in [
                dot_f32_kernel()(&a, &b),
                dot_f32_portable(&a, &b),
                dot_f16_kernel()(&h, &b),
                dot_f16_portable(&h, &b),
            ] {
                assert!((got as f64 - exact).abs() <= tol, "n={n}: {got} vs {exact}");
            }
        }
    }
}
