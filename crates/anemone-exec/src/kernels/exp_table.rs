//! `exp` of fp16-representable arguments by table look-up.
//!
//! In fp16 precision the arguments of SiLU's and softmax's exponentials are mostly op outputs
//! rounded to fp16, so they take one of 65,536 values. [`table`] holds `x.exp()` for each of
//! them, computed once by the very same `f32::exp`: a look-up gives the same bits as the call.
//! Each argument is checked to be fp16-exact (converted to fp16 and back, compared equal; NaN
//! fails); every other argument goes to [`super::expf_avx512::exp16`] where that vector `expf`
//! passed its self-check, else calls `exp` one lane at a time, so the kernels here give the
//! same bits as the scalar loops they replace for any input (tests over all 65,536 fp16 values
//! and over non-fp16 values assert it, on each path).

use std::sync::OnceLock;

/// `f16::from_bits(h).to_f32().exp()` for every bit pattern `h` (NaN patterns: unused).
pub fn table() -> &'static [f32] {
    static TABLE: OnceLock<Vec<f32>> = OnceLock::new();
    TABLE.get_or_init(|| {
        (0..=u16::MAX)
            .map(|h| half::f16::from_bits(h).to_f32().exp())
            .collect()
    })
}

/// Whether the AVX-512 look-up kernels can run on this CPU.
#[cfg(target_arch = "x86_64")]
fn has_avx512() -> bool {
    is_x86_feature_detected!("avx512f")
}

/// `v / (1 + exp(-v))` in place: the same bits as the scalar SiLU loop.
pub fn silu(data: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; `verified` vouches for `exp16`'s bits.
        unsafe { avx512::silu(data, table(), super::expf_avx512::verified()) };
        return;
    }
    data.iter_mut().for_each(|v| *v = silu_one(*v));
}

/// `r = exp(r - max)` for each `r` of `row`, in place (softmax's exponentials; the caller sums
/// them in order afterwards). The arguments below −104 are +0 either way (see
/// [`super::norm::exp_or_zero`], whose values these are).
pub fn exp_shifted(row: &mut [f32], max: f32) {
    #[cfg(target_arch = "x86_64")]
    if has_avx512() {
        // SAFETY: AVX-512F was detected at run time; `verified` vouches for `exp16`'s bits.
        unsafe { avx512::exp_shifted(row, max, table(), super::expf_avx512::verified()) };
        return;
    }
    row.iter_mut()
        .for_each(|r| *r = super::norm::exp_or_zero(*r - max));
}

/// The scalar SiLU that [`silu`] reproduces.
#[inline]
pub fn silu_one(v: f32) -> f32 {
    v / (1.0 + (-v).exp())
}

/// The kernels below take `vector_exp`: whether [`super::expf_avx512::exp16`] may stand in for
/// `f32::exp` (its self-check passed). Without it every argument that is not fp16-exact calls
/// `f32::exp` (or `exp_or_zero`, the same bits) one lane at a time.
#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::super::expf_avx512::exp16 as vexp16;
    use super::super::norm::exp_or_zero;
    use std::arch::x86_64::*;

    /// `exp(x)` of 16 lanes: looked up where `x` is fp16-exact, computed by `vexp16` (if
    /// `vector_exp`) or `exp_scalar` elsewhere.
    ///
    /// # Safety
    /// AVX-512F; `table` holds 65,536 values; `vector_exp` only if `vexp16` was verified.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(
        x: __m512,
        table: &[f32],
        vector_exp: bool,
        exp_scalar: impl Fn(f32) -> f32,
    ) -> __m512 {
        debug_assert_eq!(table.len(), 1 << 16);
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let exact = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_cvtph_ps(h));
        let idx = _mm512_cvtepu16_epi32(h);
        // SAFETY: every index is a u16, inside the table of 65,536 values.
        let e = unsafe {
            _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), exact, idx, table.as_ptr())
        };
        if exact == 0xFFFF {
            return e;
        }
        if vector_exp {
            // SAFETY: AVX-512F (this function's feature); verified by the caller's promise.
            // The looked-up lanes hold the same bits, so no blend is needed.
            return unsafe { vexp16(x) };
        }
        let mut xs = [0.0f32; 16];
        let mut es = [0.0f32; 16];
        // SAFETY: both arrays hold 16 values.
        unsafe {
            _mm512_storeu_ps(xs.as_mut_ptr(), x);
            _mm512_storeu_ps(es.as_mut_ptr(), e);
        }
        for j in 0..16 {
            if exact & (1 << j) == 0 {
                es[j] = exp_scalar(xs[j]);
            }
        }
        // SAFETY: `es` holds 16 values.
        unsafe { _mm512_loadu_ps(es.as_ptr()) }
    }

    /// Whether any of 16 arguments is fp16-exact. An fp32 program's arguments almost never
    /// are; a call whose first 16 have none skips the look-up: `vexp16` for every vector if
    /// `vector_exp`, else the scalar loop (the same bits either way) rather than paying the
    /// check and the fallback per vector (≈ 4% of an fp32 bundle's prefill).
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn any_fp16_exact(x: __m512) -> bool {
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_cvtph_ps(h)) != 0
    }

    /// # Safety
    /// AVX-512F; `table` holds 65,536 values; `vector_exp` only if `vexp16` was verified.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu(data: &mut [f32], table: &[f32], vector_exp: bool) {
        let n = data.len() / 16 * 16;
        let p = data.as_mut_ptr();
        let one = _mm512_set1_ps(1.0);
        let sign = _mm512_set1_ps(-0.0);
        // the scalar `v / (1.0 + e)`: one IEEE add and one IEEE division per lane
        let finish = |v: __m512, e: __m512| _mm512_div_ps(v, _mm512_add_ps(one, e));
        // SAFETY: n >= 16 means 16 values to read.
        let look_up = n > 0 && any_fp16_exact(_mm512_xor_ps(unsafe { _mm512_loadu_ps(p) }, sign));
        if !look_up && !vector_exp {
            data.iter_mut().for_each(|v| *v = super::silu_one(*v));
            return;
        }
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= data.len().
            let v = unsafe { _mm512_loadu_ps(p.add(i)) };
            let neg = _mm512_xor_ps(v, sign); // -v, exactly
                                              // SAFETY: AVX-512F; the table and `vector_exp` as promised by the caller.
            let e = unsafe {
                if look_up {
                    exp16(neg, table, vector_exp, f32::exp)
                } else {
                    vexp16(neg)
                }
            };
            // SAFETY: i + 16 <= n <= data.len().
            unsafe { _mm512_storeu_ps(p.add(i), finish(v, e)) };
            i += 16;
        }
        data[n..].iter_mut().for_each(|v| *v = super::silu_one(*v));
    }

    /// # Safety
    /// AVX-512F; `table` holds 65,536 values; `vector_exp` only if `vexp16` was verified.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_shifted(row: &mut [f32], max: f32, table: &[f32], vector_exp: bool) {
        let n = row.len() / 16 * 16;
        let p = row.as_mut_ptr();
        let m = _mm512_set1_ps(max);
        // SAFETY: n >= 16 means 16 values to read.
        let look_up = n > 0 && any_fp16_exact(_mm512_sub_ps(unsafe { _mm512_loadu_ps(p) }, m));
        if !look_up && !vector_exp {
            row.iter_mut().for_each(|r| *r = exp_or_zero(*r - max));
            return;
        }
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= row.len().
            let x = _mm512_sub_ps(unsafe { _mm512_loadu_ps(p.add(i)) }, m);
            // SAFETY: AVX-512F; the table and `vector_exp` as promised by the caller.
            // `vexp16` gives `exp`'s bits, which are `exp_or_zero`'s.
            let e = unsafe {
                if look_up {
                    exp16(x, table, vector_exp, exp_or_zero)
                } else {
                    vexp16(x)
                }
            };
            // SAFETY: i + 16 <= n <= row.len().
            unsafe { _mm512_storeu_ps(p.add(i), e) };
            i += 16;
        }
        row[n..].iter_mut().for_each(|r| *r = exp_or_zero(*r - max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::norm::exp_or_zero;

    /// Every fp16 value, then values that are not fp16 (fall back), NaN, infinities,
    /// arguments far below the underflow, mixed vectors, random bit patterns.
    fn inputs() -> Vec<f32> {
        let mut v: Vec<f32> = (0..=u16::MAX)
            .map(|h| half::f16::from_bits(h).to_f32())
            .collect();
        v.extend((0..5000).map(|i| (i as f32 - 2500.0) * 0.013_7 + 1e-4));
        v.extend([
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            -1e4,
            -104.5,
            1e-30,
            -0.0,
        ]);
        v.extend((0..7).map(|i| 70000.0 + i as f32));
        // fp16-exact and other arguments alternating within vectors; subnormal results
        v.extend((0..3000).map(|i| -110.0 + i as f32 * if i % 2 == 0 { 0.0625 } else { 0.0631 }));
        // random bit patterns (NaNs with payloads, huge, tiny)
        let mut s = 0x9e37_79b9_7f4a_7c15u64;
        v.extend((0..20_000).map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f32::from_bits((s >> 29) as u32)
        }));
        v
    }

    #[test]
    fn table_is_exp_and_exp_or_zero() {
        let t = table();
        for h in 0..=u16::MAX {
            let x = half::f16::from_bits(h).to_f32();
            if x.is_nan() {
                continue;
            }
            assert_eq!(t[h as usize].to_bits(), x.exp().to_bits(), "{x}");
            assert_eq!(t[h as usize].to_bits(), exp_or_zero(x).to_bits(), "{x}");
        }
    }

    /// The ways `silu`/`exp_shifted` may compute on this CPU: the public entry, and on AVX-512
    /// CPUs each of its paths (the vector `exp` only where verified, as the entry does).
    #[derive(Clone, Copy, Debug)]
    enum Path {
        Public,
        #[cfg(target_arch = "x86_64")]
        Avx512 {
            vector_exp: bool,
        },
    }

    fn paths() -> Vec<Path> {
        #[cfg(target_arch = "x86_64")]
        if has_avx512() {
            let mut p = vec![Path::Public, Path::Avx512 { vector_exp: false }];
            if crate::kernels::expf_avx512::verified() {
                p.push(Path::Avx512 { vector_exp: true });
            }
            return p;
        }
        vec![Path::Public]
    }

    fn silu_by(path: Path, data: &mut [f32]) {
        match path {
            Path::Public => silu(data),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F detected and `vector_exp` verified in `paths`.
            Path::Avx512 { vector_exp } => unsafe { avx512::silu(data, table(), vector_exp) },
        }
    }

    fn exp_shifted_by(path: Path, row: &mut [f32], max: f32) {
        match path {
            Path::Public => exp_shifted(row, max),
            #[cfg(target_arch = "x86_64")]
            // SAFETY: AVX-512F detected and `vector_exp` verified in `paths`.
            Path::Avx512 { vector_exp } => unsafe {
                avx512::exp_shifted(row, max, table(), vector_exp)
            },
        }
    }

    #[test]
    fn silu_is_the_scalar_loop_bit_for_bit() {
        let xs = inputs();
        // offsets so that each value lands in the vector body and in the tail; from 65,536 the
        // first 16 are not fp16 (the whole call skips the look-up)
        for path in paths() {
            for off in [0, 1, 7, 15, 1 << 16] {
                let mut got = xs[off..].to_vec();
                silu_by(path, &mut got);
                for (x, g) in xs[off..].iter().zip(&got) {
                    let want = silu_one(*x);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "{path:?}: silu({x}) = {g}, want {want}"
                    );
                }
            }
        }
    }

    #[test]
    fn exp_shifted_is_the_scalar_loop_bit_for_bit() {
        let xs = inputs();
        for path in paths() {
            for max in [0.0f32, 1.5, -3.25, 0.1, 11.0] {
                for off in [0, 3, 1 << 16] {
                    let mut got = xs[off..].to_vec();
                    exp_shifted_by(path, &mut got, max);
                    for (x, g) in xs[off..].iter().zip(&got) {
                        let want = exp_or_zero(*x - max);
                        assert!(
                            g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                            "{path:?}: exp({x} - {max}) = {g}, want {want}"
                        );
                    }
                }
            }
        }
    }
}
