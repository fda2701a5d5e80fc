//! Numeric kernels of the reference forward: dot products, matrix-vector and matrix-matrix
//! products against `[out, in]` row-major weights, RMSNorm, SiLU and softmax.
//!
//! Decode is memory-bandwidth bound, so [`matvec`] streams each weight row once through an FMA dot
//! product split across the model's thread pool; prefill is compute bound and goes through
//! [`matmul_t`]: register-tiled AVX-512 dot products (`matmul.rs`) where the CPU has AVX-512F/VL,
//! else `gemm`.

use rayon::prelude::*;

/// `Σ a[i]·b[i]` over the common length, with 32 independent f32 accumulators.
#[inline]
pub fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() {
            // SAFETY: the CPU supports AVX2 and FMA (checked above); slices are bounds-limited to n.
            return unsafe { dot_avx2(&a[..n], &b[..n]) };
        }
    }
    dot_portable(&a[..n], &b[..n])
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx2_fma() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2") && is_x86_feature_detected!("fma"))
}

fn dot_portable(a: &[f32], b: &[f32]) -> f32 {
    let mut acc = [0f32; 16];
    let chunks = a.len() / 16;
    for c in 0..chunks {
        let (x, y) = (&a[c * 16..c * 16 + 16], &b[c * 16..c * 16 + 16]);
        for j in 0..16 {
            acc[j] += x[j] * y[j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 16..a.len() {
        sum += a[i] * b[i];
    }
    sum
}

/// The sum of four 8-lane accumulators, reduced in one fixed order (so every dot that uses it
/// sums its lanes identically).
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn horizontal_sum(
    acc0: std::arch::x86_64::__m256,
    acc1: std::arch::x86_64::__m256,
    acc2: std::arch::x86_64::__m256,
    acc3: std::arch::x86_64::__m256,
) -> f32 {
    use std::arch::x86_64::*;
    let acc = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
    let hi = _mm256_extractf128_ps(acc, 1);
    let lo = _mm256_castps256_ps128(acc);
    let s = _mm_add_ps(hi, lo);
    let s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    let s = _mm_add_ss(s, _mm_shuffle_ps(s, s, 1));
    _mm_cvtss_f32(s)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma")]
unsafe fn dot_avx2(a: &[f32], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = a.len();
    let (pa, pb) = (a.as_ptr(), b.as_ptr());
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 8)),
            _mm256_loadu_ps(pb.add(i + 8)),
            acc1,
        );
        acc2 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 16)),
            _mm256_loadu_ps(pb.add(i + 16)),
            acc2,
        );
        acc3 = _mm256_fmadd_ps(
            _mm256_loadu_ps(pa.add(i + 24)),
            _mm256_loadu_ps(pb.add(i + 24)),
            acc3,
        );
        i += 32;
    }
    while i + 8 <= n {
        acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(i)), _mm256_loadu_ps(pb.add(i)), acc0);
        i += 8;
    }
    let mut sum = horizontal_sum(acc0, acc1, acc2, acc3);
    while i < n {
        sum += *pa.add(i) * *pb.add(i);
        i += 1;
    }
    sum
}

/// [`dot`] of fp16 weights with f32 values: bit-identical to `dot(&widened, b)` where `widened`
/// is `w` widened to f32 (widening is exact and the sums run in the same order), reading half the
/// bytes. Used where fp16 weights stay fp16 in memory (a bundle's host embedding and LM head).
#[inline]
pub fn dot_f16(w: &[half::f16], b: &[f32]) -> f32 {
    let n = w.len().min(b.len());
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() && std::arch::is_x86_feature_detected!("f16c") {
            // SAFETY: AVX2, FMA and F16C were detected; slices are bounds-limited to n.
            return unsafe { dot_f16_avx2(&w[..n], &b[..n]) };
        }
    }
    let (w, b) = (&w[..n], &b[..n]);
    let mut acc = [0f32; 16];
    let chunks = n / 16;
    for c in 0..chunks {
        for j in 0..16 {
            acc[j] += w[c * 16 + j].to_f32() * b[c * 16 + j];
        }
    }
    let mut sum: f32 = acc.iter().sum();
    for i in chunks * 16..n {
        sum += w[i].to_f32() * b[i];
    }
    sum
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_f16_avx2(w: &[half::f16], b: &[f32]) -> f32 {
    use std::arch::x86_64::*;
    let n = w.len();
    let (pw, pb) = (w.as_ptr() as *const u8, b.as_ptr());
    // 8 halves (16 bytes) at element i, widened exactly to f32
    macro_rules! load {
        ($i:expr) => {
            _mm256_cvtph_ps(_mm_loadu_si128(pw.add(2 * $i) as *const __m128i))
        };
    }
    let mut acc0 = _mm256_setzero_ps();
    let mut acc1 = _mm256_setzero_ps();
    let mut acc2 = _mm256_setzero_ps();
    let mut acc3 = _mm256_setzero_ps();
    let mut i = 0;
    while i + 32 <= n {
        acc0 = _mm256_fmadd_ps(load!(i), _mm256_loadu_ps(pb.add(i)), acc0);
        acc1 = _mm256_fmadd_ps(load!(i + 8), _mm256_loadu_ps(pb.add(i + 8)), acc1);
        acc2 = _mm256_fmadd_ps(load!(i + 16), _mm256_loadu_ps(pb.add(i + 16)), acc2);
        acc3 = _mm256_fmadd_ps(load!(i + 24), _mm256_loadu_ps(pb.add(i + 24)), acc3);
        i += 32;
    }
    while i + 8 <= n {
        acc0 = _mm256_fmadd_ps(load!(i), _mm256_loadu_ps(pb.add(i)), acc0);
        i += 8;
    }
    let mut sum = horizontal_sum(acc0, acc1, acc2, acc3);
    while i < n {
        sum += w[i].to_f32() * *pb.add(i);
        i += 1;
    }
    sum
}

/// `y[o] = Σ_i w[o·n_in + i]·x[i]` for a row-major `[y.len(), x.len()]` weight, rows split across
/// the current rayon pool.
pub fn matvec(w: &[f32], x: &[f32], y: &mut [f32]) {
    let n_in = x.len();
    debug_assert_eq!(w.len(), n_in * y.len());
    // Rows per task: enough to amortise scheduling (~64 KiB of weights), few enough to balance.
    let rows_per_task = (16384 / n_in.max(1)).clamp(8, 1024);
    y.par_chunks_mut(rows_per_task)
        .enumerate()
        .for_each(|(task, out)| {
            let first = task * rows_per_task;
            for (r, yo) in out.iter_mut().enumerate() {
                let row = &w[(first + r) * n_in..(first + r + 1) * n_in];
                *yo = dot(row, x);
            }
        });
}

/// `y[s, o] = Σ_i x[s, i]·w[o, i]` (`y = x·wᵀ`) for row-major `x: [rows, n_in]`,
/// `w: [n_out, n_in]`, `y: [rows, n_out]`; uses the current rayon pool. With AVX-512F/VL each
/// output's summation order is the one `matmul.rs` documents (whatever the tiling or the
/// threads); `x` rows on 64-byte boundaries (an aligned buffer, rows a multiple of 16 long) save
/// it a copy.
pub fn matmul_t(x: &[f32], w: &[f32], y: &mut [f32], rows: usize, n_in: usize, n_out: usize) {
    assert_eq!(x.len(), rows * n_in, "matmul_t: x is not [rows, n_in]");
    assert_eq!(w.len(), n_out * n_in, "matmul_t: w is not [n_out, n_in]");
    assert_eq!(y.len(), rows * n_out, "matmul_t: y is not [rows, n_out]");
    if rows == 0 || n_out == 0 {
        return;
    }
    if rows == 1 {
        matvec(w, x, y);
        return;
    }
    #[cfg(target_arch = "x86_64")]
    {
        if super::matmul::has_avx512() {
            super::matmul::matmul_t_avx512(x, w, y, rows, n_in, n_out);
            return;
        }
    }
    matmul_t_gemm(x, w, y, rows, n_in, n_out);
}

/// `matmul_t` through the `gemm` crate (the path on CPUs without AVX-512).
pub fn matmul_t_gemm(x: &[f32], w: &[f32], y: &mut [f32], rows: usize, n_in: usize, n_out: usize) {
    assert_eq!(x.len(), rows * n_in, "matmul_t: x is not [rows, n_in]");
    assert_eq!(w.len(), n_out * n_in, "matmul_t: w is not [n_out, n_in]");
    assert_eq!(y.len(), rows * n_out, "matmul_t: y is not [rows, n_out]");
    if rows == 0 || n_out == 0 {
        return;
    }
    // SAFETY: the three buffers have exactly the extents described by (m, n, k) and the strides
    // below (checked by the asserts above); `dst` does not alias the inputs.
    unsafe {
        gemm::gemm(
            rows,
            n_out,
            n_in,
            y.as_mut_ptr(),
            1,
            n_out as isize,
            false,
            x.as_ptr(),
            1,
            n_in as isize,
            w.as_ptr(),
            n_in as isize,
            1,
            0.0,
            1.0,
            false,
            false,
            false,
            gemm::Parallelism::Rayon(rayon::current_num_threads()),
        );
    }
}

/// RMSNorm of every `weight.len()`-sized row of `x` in place: `x / sqrt(mean(x²) + eps) · weight`
/// (the mean of squares accumulated in f32, as Hugging Face does).
pub fn rms_norm_rows(x: &mut [f32], weight: &[f32], eps: f32) {
    let n = weight.len();
    for row in x.chunks_exact_mut(n) {
        let mean_sq = dot(row, row) / n as f32;
        let inv = 1.0 / (mean_sq + eps).sqrt();
        for (v, w) in row.iter_mut().zip(weight) {
            *v = w * (*v * inv);
        }
    }
}

/// `out = rms_norm(x) · weight` row by row into a separate buffer.
pub fn rms_norm_into(x: &[f32], weight: &[f32], eps: f32, out: &mut [f32]) {
    out.copy_from_slice(x);
    rms_norm_rows(out, weight, eps);
}

#[inline]
/// GELU with the tanh approximation (PyTorch `gelu(approximate="tanh")`, Gemma's activation).
pub fn gelu_tanh(v: f32) -> f32 {
    let k = (2.0 / std::f32::consts::PI).sqrt();
    0.5 * v * (1.0 + (k * (v + 0.044715 * v * v * v)).tanh())
}

pub fn silu(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// In-place softmax with the maximum subtracted first.
pub fn softmax(x: &mut [f32]) {
    let max = x.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let mut sum = 0.0;
    for v in x.iter_mut() {
        *v = (*v - max).exp();
        sum += *v;
    }
    let inv = 1.0 / sum;
    for v in x.iter_mut() {
        *v *= inv;
    }
}

/// `y += a·x`, each element `y + (a·x)` with the product rounded before the add (never fused).
#[inline]
pub fn axpy(a: f32, x: &[f32], y: &mut [f32]) {
    let n = x.len().min(y.len());
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx2_fma() {
            // SAFETY: AVX2 was detected; both slices are bounds-limited to n.
            unsafe { axpy_avx2(a, &x[..n], &mut y[..n]) };
            return;
        }
    }
    for (yv, xv) in y[..n].iter_mut().zip(&x[..n]) {
        *yv += a * xv;
    }
}

/// [`axpy`] 8 lanes at a time: a multiply then an add per element, as the scalar loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn axpy_avx2(a: f32, x: &[f32], y: &mut [f32]) {
    use std::arch::x86_64::*;
    let n = x.len();
    let (px, py) = (x.as_ptr(), y.as_mut_ptr());
    let av = _mm256_set1_ps(a);
    let mut i = 0;
    while i + 8 <= n {
        let product = _mm256_mul_ps(av, _mm256_loadu_ps(px.add(i)));
        _mm256_storeu_ps(
            py.add(i),
            _mm256_add_ps(_mm256_loadu_ps(py.add(i)), product),
        );
        i += 8;
    }
    for j in i..n {
        *py.add(j) += a * *px.add(j);
    }
}

/// `[dot(query, keys[0]), …, dot(query, keys[3])]`, each bit-identical to [`dot`] (the same
/// lanes, accumulators, horizontal sum and tail), computed together so the query is loaded once
/// and the four sums overlap. Keys must be at least as long as the query.
#[inline]
pub fn dot4(query: &[f32], keys: [&[f32]; 4]) -> [f32; 4] {
    #[cfg(target_arch = "x86_64")]
    {
        if has_avx512vl() && keys.iter().all(|k| k.len() >= query.len()) {
            // SAFETY: AVX2, FMA and AVX-512VL were detected; every key holds query.len() values.
            return unsafe { dot4_avx2(query, keys) };
        }
    }
    keys.map(|k| dot(query, k))
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn has_avx512vl() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| has_avx2_fma() && is_x86_feature_detected!("avx512vl"))
}

/// [`dot4`] on 256-bit lanes; AVX-512VL only lends the 32 vector registers its 16 accumulators need.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,avx512f,avx512vl")]
#[allow(clippy::needless_range_loop)]
unsafe fn dot4_avx2(query: &[f32], keys: [&[f32]; 4]) -> [f32; 4] {
    use std::arch::x86_64::*;
    let n = query.len();
    let pq = query.as_ptr();
    let pk = keys.map(|k| k.as_ptr());
    let mut acc = [[_mm256_setzero_ps(); 4]; 4];
    let mut i = 0;
    while i + 32 <= n {
        for c in 0..4 {
            let q = _mm256_loadu_ps(pq.add(i + 8 * c));
            for k in 0..4 {
                acc[k][c] = _mm256_fmadd_ps(q, _mm256_loadu_ps(pk[k].add(i + 8 * c)), acc[k][c]);
            }
        }
        i += 32;
    }
    while i + 8 <= n {
        let q = _mm256_loadu_ps(pq.add(i));
        for k in 0..4 {
            acc[k][0] = _mm256_fmadd_ps(q, _mm256_loadu_ps(pk[k].add(i)), acc[k][0]);
        }
        i += 8;
    }
    let mut sums = [0f32; 4];
    for k in 0..4 {
        sums[k] = horizontal_sum(acc[k][0], acc[k][1], acc[k][2], acc[k][3]);
        for j in i..n {
            sums[k] += *pq.add(j) * *pk[k].add(j);
        }
    }
    sums
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

    #[test]
    fn dot_f16_is_bit_identical_to_dot_of_the_widened_weights() {
        for n in [0usize, 1, 7, 8, 31, 32, 33, 100, 896] {
            let w: Vec<half::f16> = pseudo_random(n, 3)
                .iter()
                .map(|&v| half::f16::from_f32(v))
                .collect();
            let widened: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
            let x = pseudo_random(n, 9);
            assert_eq!(
                dot_f16(&w, &x).to_bits(),
                dot(&widened, &x).to_bits(),
                "n={n}"
            );
        }
    }

    fn naive_matmul_t(x: &[f32], w: &[f32], rows: usize, n_in: usize, n_out: usize) -> Vec<f32> {
        let mut y = vec![0f32; rows * n_out];
        for s in 0..rows {
            for o in 0..n_out {
                let mut acc = 0f64;
                for i in 0..n_in {
                    acc += x[s * n_in + i] as f64 * w[o * n_in + i] as f64;
                }
                y[s * n_out + o] = acc as f32;
            }
        }
        y
    }

    fn max_abs_diff(a: &[f32], b: &[f32]) -> f32 {
        a.iter()
            .zip(b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    #[test]
    fn dot_matches_naive_for_awkward_lengths() {
        for n in [0, 1, 7, 8, 31, 32, 33, 100, 577] {
            let (a, b) = (pseudo_random(n, 1), pseudo_random(n, 2));
            let naive: f64 = a.iter().zip(&b).map(|(x, y)| *x as f64 * *y as f64).sum();
            assert!((dot(&a, &b) as f64 - naive).abs() < 1e-5, "n={n}");
            assert!((dot_portable(&a, &b) as f64 - naive).abs() < 1e-5, "n={n}");
        }
    }

    #[test]
    fn dot4_and_axpy_keep_the_bits_of_dot_and_the_scalar_loop() {
        for n in [0usize, 1, 7, 8, 9, 31, 32, 33, 64, 100, 128, 257] {
            let q = pseudo_random(n, 7);
            let keys: Vec<Vec<f32>> = (0..4).map(|k| pseudo_random(n + k, 8 + k as u32)).collect();
            let got = dot4(&q, [&keys[0], &keys[1], &keys[2], &keys[3]]);
            for k in 0..4 {
                assert_eq!(
                    got[k].to_bits(),
                    dot(&q, &keys[k]).to_bits(),
                    "n {n}, key {k}"
                );
            }
            let mut y = pseudo_random(n, 9);
            let mut want = y.clone();
            axpy(0.37, &q, &mut y);
            for (w, x) in want.iter_mut().zip(&q) {
                *w += 0.37 * x;
            }
            let differing = (0..n).find(|&i| y[i].to_bits() != want[i].to_bits());
            assert_eq!(differing, None, "axpy, n {n}");
        }
    }

    #[test]
    fn matvec_and_gemm_match_naive() {
        for (rows, n_in, n_out) in [
            (1, 33, 70),
            (5, 64, 129),
            (17, 100, 3),
            (64, 96, 200),
            (7, 15, 37),
            (9, 577, 66),
        ] {
            let x = pseudo_random(rows * n_in, 3);
            let w = pseudo_random(n_out * n_in, 4);
            let want = naive_matmul_t(&x, &w, rows, n_in, n_out);
            let mut y = vec![f32::NAN; rows * n_out];
            matmul_t(&x, &w, &mut y, rows, n_in, n_out);
            let err = max_abs_diff(&y, &want);
            assert!(err < 1e-4, "({rows},{n_in},{n_out}): max abs error {err}");
            let mut y = vec![f32::NAN; rows * n_out];
            matmul_t_gemm(&x, &w, &mut y, rows, n_in, n_out);
            let err = max_abs_diff(&y, &want);
            assert!(
                err < 1e-4,
                "gemm ({rows},{n_in},{n_out}): max abs error {err}"
            );
        }
    }

    #[test]
    fn rms_norm_and_softmax_match_definitions() {
        let mut x = vec![1.0, -2.0, 3.0, 0.5, 4.0, -1.0];
        let w = [0.5, 2.0, 1.0];
        let orig = x.clone();
        rms_norm_rows(&mut x, &w, 1e-6);
        for r in 0..2 {
            let row = &orig[r * 3..r * 3 + 3];
            let rms = (row.iter().map(|v| v * v).sum::<f32>() / 3.0 + 1e-6).sqrt();
            for c in 0..3 {
                assert!((x[r * 3 + c] - row[c] / rms * w[c]).abs() < 1e-6);
            }
        }
        let mut p = vec![1000.0, 1001.0, 999.0];
        softmax(&mut p);
        let e = [(-1f32).exp(), 1.0, (-2f32).exp()];
        let z: f32 = e.iter().sum();
        for (pv, ev) in p.iter().zip(e) {
            assert!((pv - ev / z).abs() < 1e-6);
        }
    }
}
