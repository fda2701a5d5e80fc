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

    /// `hsum` of two vectors at once: the same adds in the same order for each.
    #[target_feature(enable = "avx2,fma")]
    unsafe fn hsum2(a: __m256, b: __m256) -> (f32, f32) {
        // [a0+a4, a1+a5, a2+a6, a3+a7] and the same for b
        let qa = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps::<1>(a));
        let qb = _mm_add_ps(_mm256_castps256_ps128(b), _mm256_extractf128_ps::<1>(b));
        // [qa0, qa2, qb0, qb2] + [qa1, qa3, qb1, qb3]
        let even = _mm_shuffle_ps::<0b10_00_10_00>(qa, qb);
        let odd = _mm_shuffle_ps::<0b11_01_11_01>(qa, qb);
        let s = _mm_add_ps(even, odd);
        // (s0 + s1), (s2 + s3)
        let r = _mm_add_ps(s, _mm_shuffle_ps::<0b10_11_00_01>(s, s));
        let mut lanes = [0.0f32; 4];
        _mm_storeu_ps(lanes.as_mut_ptr(), r);
        (lanes[0], lanes[2])
    }

    /// Two rows' [`dot_f16`] at once, sharing the loads of `x`: each result is bit for bit
    /// `dot_f16(row, x)` (the same products, accumulators and order).
    ///
    /// # Safety
    /// The CPU must support AVX2, FMA and F16C; both rows must be as long as `x`.
    #[target_feature(enable = "avx2,fma,f16c")]
    pub unsafe fn dot2_f16(w0: &[f16], w1: &[f16], x: &[f32]) -> (f32, f32) {
        let n = x.len().min(w0.len()).min(w1.len());
        let (p0, p1, px) = (
            w0.as_ptr() as *const __m128i,
            w1.as_ptr() as *const __m128i,
            x.as_ptr(),
        );
        let mut a = [_mm256_setzero_ps(); 4];
        let mut b = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let xv = _mm256_loadu_ps(px.add(i + 8 * k));
                let h0 = _mm256_cvtph_ps(_mm_loadu_si128(p0.add((i + 8 * k) / 8)));
                let h1 = _mm256_cvtph_ps(_mm_loadu_si128(p1.add((i + 8 * k) / 8)));
                a[k] = _mm256_fmadd_ps(h0, xv, a[k]);
                b[k] = _mm256_fmadd_ps(h1, xv, b[k]);
            }
            i += 32;
        }
        while i + 8 <= n {
            let xv = _mm256_loadu_ps(px.add(i));
            a[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p0.add(i / 8))), xv, a[0]);
            b[0] = _mm256_fmadd_ps(_mm256_cvtph_ps(_mm_loadu_si128(p1.add(i / 8))), xv, b[0]);
            i += 8;
        }
        let sa = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let sb = _mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3]));
        let (mut s0, mut s1) = hsum2(sa, sb);
        for j in i..n {
            s0 += w0[j].to_f32() * x[j];
            s1 += w1[j].to_f32() * x[j];
        }
        (s0, s1)
    }

    /// Two rows' [`dot_f32`] at once, sharing the loads of `b`; bit for bit `dot_f32` each.
    ///
    /// # Safety
    /// The CPU must support AVX2 and FMA; both rows must be as long as `x`.
    #[target_feature(enable = "avx2,fma")]
    pub unsafe fn dot2_f32(w0: &[f32], w1: &[f32], x: &[f32]) -> (f32, f32) {
        let n = x.len().min(w0.len()).min(w1.len());
        let (p0, p1, px) = (w0.as_ptr(), w1.as_ptr(), x.as_ptr());
        let mut a = [_mm256_setzero_ps(); 4];
        let mut b = [_mm256_setzero_ps(); 4];
        let mut i = 0;
        while i + 32 <= n {
            for k in 0..4 {
                let xv = _mm256_loadu_ps(px.add(i + 8 * k));
                a[k] = _mm256_fmadd_ps(_mm256_loadu_ps(p0.add(i + 8 * k)), xv, a[k]);
                b[k] = _mm256_fmadd_ps(_mm256_loadu_ps(p1.add(i + 8 * k)), xv, b[k]);
            }
            i += 32;
        }
        while i + 8 <= n {
            let xv = _mm256_loadu_ps(px.add(i));
            a[0] = _mm256_fmadd_ps(_mm256_loadu_ps(p0.add(i)), xv, a[0]);
            b[0] = _mm256_fmadd_ps(_mm256_loadu_ps(p1.add(i)), xv, b[0]);
            i += 8;
        }
        let sa = _mm256_add_ps(_mm256_add_ps(a[0], a[1]), _mm256_add_ps(a[2], a[3]));
        let sb = _mm256_add_ps(_mm256_add_ps(b[0], b[1]), _mm256_add_ps(b[2], b[3]));
        let (mut s0, mut s1) = hsum2(sa, sb);
        for j in i..n {
            s0 += w0[j] * x[j];
            s1 += w1[j] * x[j];
        }
        (s0, s1)
    }
}

/// Two dot products against one vector, each bit for bit the single-row kernel's.
pub type Dot2F32 = fn(&[f32], &[f32], &[f32]) -> (f32, f32);
pub type Dot2F16 = fn(&[f16], &[f16], &[f32]) -> (f32, f32);

/// The two-row form of [`dot_f32_kernel`] (same result per row).
pub fn dot2_f32_kernel() -> Dot2F32 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() {
        // SAFETY: the features `dot2_f32` is compiled for were detected at run time.
        return |a, b, x| unsafe { avx2::dot2_f32(a, b, x) };
    }
    |a, b, x| (dot_f32_portable(a, x), dot_f32_portable(b, x))
}

/// The two-row form of [`dot_f16_kernel`] (same result per row).
pub fn dot2_f16_kernel() -> Dot2F16 {
    #[cfg(target_arch = "x86_64")]
    if has_avx2_fma() && is_x86_feature_detected!("f16c") {
        // SAFETY: the features `dot2_f16` is compiled for were detected at run time.
        return |a, b, x| unsafe { avx2::dot2_f16(a, b, x) };
    }
    |a, b, x| (dot_f16_portable(a, x), dot_f16_portable(b, x))
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
            // the two-row kernels give each row's single-row result, bit for bit
            let a2: Vec<f32> = a.iter().map(|v| v * -0.75 + 0.125).collect();
            let h2: Vec<f16> = a2.iter().map(|&v| f16::from_f32(v)).collect();
            let pair = |x: f32, y: f32| (x.to_bits(), y.to_bits());
            let (s0, s1) = dot2_f32_kernel()(&a, &a2, &b);
            assert_eq!(
                pair(s0, s1),
                pair(dot_f32_kernel()(&a, &b), dot_f32_kernel()(&a2, &b)),
                "n={n}"
            );
            let (s0, s1) = dot2_f16_kernel()(&h, &h2, &b);
            assert_eq!(
                pair(s0, s1),
                pair(dot_f16_kernel()(&h, &b), dot_f16_kernel()(&h2, &b)),
                "n={n}"
            );
        }
    }
}
