//! `exp` of fp16-representable arguments by table look-up.
//!
//! In fp16 precision the arguments of SiLU's and softmax's exponentials are mostly op outputs
//! rounded to fp16, so they take one of 65,536 values. [`table`] holds `x.exp()` for each of
//! them, computed once by the very same `f32::exp`: a look-up gives the same bits as the call.
//! Each argument is checked to be fp16-exact (converted to fp16 and back, compared equal; NaN
//! fails); every other argument calls `exp` as before, so the kernels here give the same bits
//! as the scalar loops they replace for any input (tests over all 65,536 fp16 values and over
//! non-fp16 values assert it).

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
        // SAFETY: AVX-512F was detected at run time.
        unsafe { avx512::silu(data, table()) };
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
        // SAFETY: AVX-512F was detected at run time.
        unsafe { avx512::exp_shifted(row, max, table()) };
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

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    /// `exp(x)` of 16 lanes: looked up where `x` is fp16-exact, computed by `exp_scalar`
    /// elsewhere.
    ///
    /// # Safety
    /// AVX-512F; `table` holds 65,536 values.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn exp16(x: __m512, table: &[f32], exp_scalar: impl Fn(f32) -> f32) -> __m512 {
        debug_assert_eq!(table.len(), 1 << 16);
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        let exact = _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_cvtph_ps(h));
        let idx = _mm512_cvtepu16_epi32(h);
        // SAFETY: every index is a u16, inside the table of 65,536 values.
        let e = _mm512_mask_i32gather_ps::<4>(_mm512_setzero_ps(), exact, idx, table.as_ptr());
        if exact == 0xFFFF {
            return e;
        }
        let mut xs = [0.0f32; 16];
        let mut es = [0.0f32; 16];
        _mm512_storeu_ps(xs.as_mut_ptr(), x);
        _mm512_storeu_ps(es.as_mut_ptr(), e);
        for j in 0..16 {
            if exact & (1 << j) == 0 {
                es[j] = exp_scalar(xs[j]);
            }
        }
        _mm512_loadu_ps(es.as_ptr())
    }

    /// Whether any of 16 arguments is fp16-exact. An fp32 program's arguments almost never
    /// are; a call whose first 16 have none runs the scalar loop (the same bits) rather than
    /// paying the check and the fallback per vector (≈ 4% of an fp32 bundle's prefill).
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn any_fp16_exact(x: __m512) -> bool {
        let h = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(x);
        _mm512_cmp_ps_mask::<_CMP_EQ_OQ>(x, _mm512_cvtph_ps(h)) != 0
    }

    /// # Safety
    /// AVX-512F; `table` holds 65,536 values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn silu(data: &mut [f32], table: &[f32]) {
        let n = data.len() / 16 * 16;
        let p = data.as_mut_ptr();
        let one = _mm512_set1_ps(1.0);
        let sign = _mm512_set1_ps(-0.0);
        // SAFETY: n >= 16 means 16 values to read.
        if n == 0 || !any_fp16_exact(_mm512_xor_ps(_mm512_loadu_ps(p), sign)) {
            data.iter_mut().for_each(|v| *v = super::silu_one(*v));
            return;
        }
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= data.len().
            let v = _mm512_loadu_ps(p.add(i));
            let neg = _mm512_xor_ps(v, sign); // -v, exactly
            let e = exp16(neg, table, f32::exp);
            // the scalar `v / (1.0 + e)`: one IEEE add and one IEEE division per lane
            _mm512_storeu_ps(p.add(i), _mm512_div_ps(v, _mm512_add_ps(one, e)));
            i += 16;
        }
        data[n..].iter_mut().for_each(|v| *v = super::silu_one(*v));
    }

    /// # Safety
    /// AVX-512F; `table` holds 65,536 values.
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp_shifted(row: &mut [f32], max: f32, table: &[f32]) {
        let n = row.len() / 16 * 16;
        let p = row.as_mut_ptr();
        let m = _mm512_set1_ps(max);
        // SAFETY: n >= 16 means 16 values to read.
        if n == 0 || !any_fp16_exact(_mm512_sub_ps(_mm512_loadu_ps(p), m)) {
            row.iter_mut()
                .for_each(|r| *r = super::super::norm::exp_or_zero(*r - max));
            return;
        }
        let mut i = 0;
        while i < n {
            // SAFETY: i + 16 <= n <= row.len().
            let x = _mm512_sub_ps(_mm512_loadu_ps(p.add(i)), m);
            let e = exp16(x, table, super::super::norm::exp_or_zero);
            _mm512_storeu_ps(p.add(i), e);
            i += 16;
        }
        row[n..]
            .iter_mut()
            .for_each(|r| *r = super::super::norm::exp_or_zero(*r - max));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::norm::exp_or_zero;

    /// Every fp16 value, then values that are not fp16 (fall back), NaN, infinities, and
    /// arguments far below the underflow.
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

    #[test]
    fn silu_is_the_scalar_loop_bit_for_bit() {
        let xs = inputs();
        // offsets so that each value lands in the vector body and in the tail; from 65,536 the
        // first 16 are not fp16 (the whole call takes the scalar loop)
        for off in [0, 1, 7, 15, 1 << 16] {
            let mut got = xs[off..].to_vec();
            silu(&mut got);
            for (x, g) in xs[off..].iter().zip(&got) {
                let want = silu_one(*x);
                assert!(
                    g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                    "silu({x}) = {g}, want {want}"
                );
            }
        }
    }

    #[test]
    fn exp_shifted_is_the_scalar_loop_bit_for_bit() {
        let xs = inputs();
        for max in [0.0f32, 1.5, -3.25, 0.1, 11.0] {
            for off in [0, 3, 1 << 16] {
                let mut got = xs[off..].to_vec();
                exp_shifted(&mut got, max);
                for (x, g) in xs[off..].iter().zip(&got) {
                    let want = exp_or_zero(*x - max);
                    assert!(
                        g.to_bits() == want.to_bits() || (g.is_nan() && want.is_nan()),
                        "exp({x} - {max}) = {g}, want {want}"
                    );
                }
            }
        }
    }
}
