//! `f32::exp` of 16 lanes at once, bit for bit, on AVX-512 CPUs.
//!
//! On x86_64 Linux `f32::exp` is glibc's `expf`, which on FMA CPUs is the `__expf_fma` build of
//! `sysdeps/ieee754/flt-32/e_expf.c`: the argument widened to f64, `k = round(x·32/ln 2)` by the
//! `+0x1.8p52` trick, `r = x·32/ln 2 − k`, `2^(k/32)` from a 32-entry table of bit patterns with
//! `k` added into the exponent field, a degree-3 polynomial in `r`, one f64 product, one rounding
//! to f32. [`exp16`] is that computation in 2 × 8 f64 lanes, with the FMAs exactly where that
//! build has them (read off its disassembly: `x·InvLn2N + SHIFT` and `x·InvLn2N − kd` are fused,
//! so `z` itself is never rounded; the three polynomial steps are fused; `r²` and the final
//! product are not), and the build's edge branches (|x| ≥ 88, NaN, ±inf) as lane masks.
//!
//! Another machine's libm (musl, macOS, another glibc) may round differently, so nothing uses
//! [`exp16`] unless [`verified`] holds: AVX-512F at run time and equal bits to `f32::exp` on a
//! fixed sample set of arguments (a grid over the whole finite range, random bit patterns, every
//! edge branch's bounds), checked once per process. Where it fails the callers keep their
//! scalar loops, so "the same bits as `f32::exp`" holds everywhere. On this machine's glibc the
//! kernel was checked against all 2³² arguments (`examples/expf_exhaustive.rs`).

use std::sync::OnceLock;

/// `2^(i/32)` as f64 bits, minus `i << 47` (glibc's `__exp2f_data.tab`): adding `k << 47` for
/// `k ≡ i (mod 32)` gives the bits of `2^(k/32)`.
#[cfg(target_arch = "x86_64")]
const TABLE: [u64; 32] = [
    0x3ff0000000000000,
    0x3fefd9b0d3158574,
    0x3fefb5586cf9890f,
    0x3fef9301d0125b51,
    0x3fef72b83c7d517b,
    0x3fef54873168b9aa,
    0x3fef387a6e756238,
    0x3fef1e9df51fdee1,
    0x3fef06fe0a31b715,
    0x3feef1a7373aa9cb,
    0x3feedea64c123422,
    0x3feece086061892d,
    0x3feebfdad5362a27,
    0x3feeb42b569d4f82,
    0x3feeab07dd485429,
    0x3feea47eb03a5585,
    0x3feea09e667f3bcd,
    0x3fee9f75e8ec5f74,
    0x3feea11473eb0187,
    0x3feea589994cce13,
    0x3feeace5422aa0db,
    0x3feeb737b0cdc5e5,
    0x3feec49182a3f090,
    0x3feed503b23e255d,
    0x3feee89f995ad3ad,
    0x3feeff76f2fb5e47,
    0x3fef199bdd85529c,
    0x3fef3720dcef9069,
    0x3fef5818dcfba487,
    0x3fef7c97337b9b5f,
    0x3fefa4afa2a490da,
    0x3fefd0765b6e4540,
];
/// `32/ln 2` (0x1.71547652b82fep+5).
#[cfg(target_arch = "x86_64")]
const INV_LN2_N: u64 = 0x40471547652b82fe;
/// `0x1.8p52`: adding it rounds an f64 of magnitude below 2⁵¹ to an integer, ties to even.
#[cfg(target_arch = "x86_64")]
const SHIFT: u64 = 0x4338000000000000;
/// The polynomial's coefficients of `r³`, `r²`, `r`, scaled by `32⁻³`, `32⁻²`, `32⁻¹`.
#[cfg(target_arch = "x86_64")]
const C0: u64 = 0x3ebc6af84b912394;
#[cfg(target_arch = "x86_64")]
const C1: u64 = 0x3f2ebfce50fac4f3;
#[cfg(target_arch = "x86_64")]
const C2: u64 = 0x3f962e42ff0c52d6;
/// Above `log(0x1p128)` (0x1.62e42ep6): +inf.
const OVERFLOW: u32 = 0x42b17217;
/// Below `log(0x1p-150)` (−0x1.9fe368p6): +0.
const UNDERFLOW: u32 = 0xc2cff1b4;
/// Below `log(0x1p-149)` (−0x1.9d1d9ep6), not below [`UNDERFLOW`]: the least subnormal.
const MAY_UNDERFLOW: u32 = 0xc2ce8ecf;

/// Whether [`exp16`] runs on this CPU and gives `f32::exp`'s bits on the sample set (once per
/// process; see the module comment).
pub fn verified() -> bool {
    static VERIFIED: OnceLock<bool> = OnceLock::new();
    *VERIFIED.get_or_init(|| agrees_with(f32::exp))
}

/// Whether [`exp16`] can run here and equals `reference` bit for bit on [`sample`].
pub fn agrees_with(reference: impl Fn(f32) -> f32) -> bool {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        let xs = sample();
        let mut got = xs.clone();
        // SAFETY: AVX-512F was detected at run time.
        unsafe { exp_all(&mut got) };
        return xs
            .iter()
            .zip(&got)
            .all(|(x, g)| g.to_bits() == reference(*x).to_bits());
    }
    let _ = reference;
    false
}

/// The self-check's arguments: every edge branch's bound and its neighbours, zeros,
/// infinities, NaNs, subnormals, an argument that tells the FMA build from the plain one, a
/// grid over [−110, 95] (step 1/20), and 2,048 random bit patterns. 6,000-odd values.
pub fn sample() -> Vec<f32> {
    let mut v: Vec<f32> = Vec::with_capacity(6300);
    for b in [
        OVERFLOW,
        UNDERFLOW,
        MAY_UNDERFLOW,
        88f32.to_bits(),
        (-88f32).to_bits(),
    ] {
        v.extend((b - 2..=b + 2).map(f32::from_bits));
    }
    v.extend([
        0.0,
        -0.0,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::NAN,
        f32::from_bits(0x7f800001), // signalling NaN
        f32::from_bits(0xffc12345),
        f32::MAX,
        f32::MIN,
        f32::MIN_POSITIVE,
        -f32::MIN_POSITIVE,
        f32::from_bits(1),
        f32::from_bits(0x8000_0001),
        f32::EPSILON,
        -f32::EPSILON,
        // the two arguments (of all 2³²) whose result changes if `r` is computed from a
        // rounded `x·32/ln 2` (found by exhaustive search; fusing or not at the other sites
        // changes no result): a libm built without that contraction fails the check
        f32::from_bits(0x4202422f),
        f32::from_bits(0xc27c65d9),
    ]);
    v.extend((0..=4100).map(|i| -110.0 + i as f32 / 20.0));
    let mut s = 0x9e37_79b9_7f4a_7c15u64;
    v.extend((0..2048).map(|_| {
        s ^= s << 13;
        s ^= s >> 7;
        s ^= s << 17;
        f32::from_bits((s >> 32) as u32)
    }));
    v
}

/// `x.exp()` for each value in place, by [`exp16`] (the tail through a padded vector).
///
/// # Safety
/// AVX-512F.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
pub unsafe fn exp_all(data: &mut [f32]) {
    use std::arch::x86_64::*;
    let mut chunks = data.chunks_exact_mut(16);
    for c in &mut chunks {
        // SAFETY: the chunk holds 16 values.
        unsafe { _mm512_storeu_ps(c.as_mut_ptr(), exp16(_mm512_loadu_ps(c.as_ptr()))) };
    }
    let tail = chunks.into_remainder();
    if !tail.is_empty() {
        let mut pad = [0.0f32; 16];
        pad[..tail.len()].copy_from_slice(tail);
        // SAFETY: `pad` holds 16 values.
        unsafe { _mm512_storeu_ps(pad.as_mut_ptr(), exp16(_mm512_loadu_ps(pad.as_ptr()))) };
        let n = tail.len();
        tail.copy_from_slice(&pad[..n]);
    }
}

#[cfg(target_arch = "x86_64")]
pub use avx512::exp16;

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::*;
    use std::arch::x86_64::*;

    /// `__expf_fma`'s main path on 8 f64 lanes: the f32 results.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn main_path(xd: __m512d, t: &[__m512i; 4]) -> __m256 {
        let inv_ln2_n = _mm512_set1_pd(f64::from_bits(INV_LN2_N));
        let shift = _mm512_set1_pd(f64::from_bits(SHIFT));
        // kd = round(x·32/ln 2) + SHIFT: the product is not rounded before the add
        let kd = _mm512_fmadd_pd(inv_ln2_n, xd, shift);
        let ki = _mm512_castpd_si512(kd);
        let kd = _mm512_sub_pd(kd, shift);
        // r = x·32/ln 2 − kd, again from the unrounded product
        let r = _mm512_fmsub_pd(inv_ln2_n, xd, kd);
        // TABLE[ki mod 32]: bits 0..3 pick within a half of 16, bit 4 picks the half
        let t = _mm512_mask_blend_epi64(
            _mm512_test_epi64_mask(ki, _mm512_set1_epi64(16)),
            _mm512_permutex2var_epi64(t[0], ki, t[1]),
            _mm512_permutex2var_epi64(t[2], ki, t[3]),
        );
        let s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64::<47>(ki)));
        let z = _mm512_fmadd_pd(
            r,
            _mm512_set1_pd(f64::from_bits(C0)),
            _mm512_set1_pd(f64::from_bits(C1)),
        );
        let r2 = _mm512_mul_pd(r, r);
        let y = _mm512_fmadd_pd(r, _mm512_set1_pd(f64::from_bits(C2)), _mm512_set1_pd(1.0));
        let y = _mm512_fmadd_pd(z, r2, y);
        _mm512_cvtpd_ps(_mm512_mul_pd(y, s))
    }

    /// `f32::exp` of 16 lanes: the same bits wherever [`super::verified`] holds.
    ///
    /// The edge branches of `__expf_fma` (taken for |x| ≥ 88 and NaN) as masks: −inf and
    /// x < `UNDERFLOW` give +0, x < `MAY_UNDERFLOW` the least subnormal, x > `OVERFLOW`
    /// +inf, NaN `x + x` (quieted, payload kept); the remaining |x| ≥ 88 take the main path,
    /// as in glibc.
    ///
    /// # Safety
    /// AVX-512F.
    #[inline]
    #[target_feature(enable = "avx512f")]
    pub unsafe fn exp16(x: __m512) -> __m512 {
        // SAFETY: TABLE holds 32 u64, read as four vectors of 8.
        let t = unsafe { [0, 8, 16, 24].map(|i| _mm512_loadu_si512(TABLE.as_ptr().add(i).cast())) };
        let lo = main_path(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), &t);
        let hi = main_path(
            _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(
                _mm512_castps_pd(x),
            ))),
            &t,
        );
        let e = _mm512_insertf64x4::<1>(
            _mm512_castpd256_pd512(_mm256_castps_pd(lo)),
            _mm256_castps_pd(hi),
        );
        let mut e = _mm512_castpd_ps(e);
        let bound = |b: u32| _mm512_set1_ps(f32::from_bits(b));
        e = _mm512_mask_mov_ps(
            e,
            _mm512_cmp_ps_mask::<_CMP_GT_OQ>(x, bound(OVERFLOW)),
            _mm512_set1_ps(f32::INFINITY),
        );
        e = _mm512_mask_mov_ps(
            e,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, bound(MAY_UNDERFLOW)),
            _mm512_set1_ps(f32::from_bits(1)),
        );
        e = _mm512_mask_mov_ps(
            e,
            _mm512_cmp_ps_mask::<_CMP_LT_OQ>(x, bound(UNDERFLOW)),
            _mm512_setzero_ps(),
        );
        _mm512_mask_add_ps(e, _mm512_cmp_ps_mask::<_CMP_UNORD_Q>(x, x), x, x)
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
mod tests {
    use super::*;

    /// Arguments beyond the self-check's: every fp16 value, more random bits, arguments whose
    /// results are subnormal, a dense run around 0.
    fn dense() -> Vec<f32> {
        let mut v = sample();
        v.extend((0..=u16::MAX).map(|h| half::f16::from_bits(h).to_f32()));
        let mut s = 0x2545_f491_4f6c_dd1du64;
        v.extend((0..200_000).map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            f32::from_bits(s as u32)
        }));
        // results from 2⁻¹²⁶ down to 2⁻¹⁴⁹: −87.34 … −103.98
        v.extend((0..100_000).map(|i| -87.0 - i as f32 * 17.0e-5));
        v.extend((0..100_000).map(|i| f32::from_bits(0x3c00_0000 + i * 97)));
        v.extend((0..100_000).map(|i| f32::from_bits(0xbc00_0000 + i * 97)));
        v
    }

    #[test]
    fn exp16_is_f32_exp_bit_for_bit() {
        if !is_x86_feature_detected!("avx512f") {
            return;
        }
        if cfg!(all(target_os = "linux", target_env = "gnu")) {
            assert!(verified(), "the self-check fails on this glibc");
        } else if !verified() {
            return; // another libm: the callers keep their scalar loops
        }
        let xs = dense();
        let mut got = xs.clone();
        // SAFETY: AVX-512F was detected above.
        unsafe { exp_all(&mut got) };
        for (x, g) in xs.iter().zip(&got) {
            assert_eq!(
                g.to_bits(),
                x.exp().to_bits(),
                "exp({x:e}) = {g:e}, want {:e}",
                x.exp()
            );
        }
    }

    #[test]
    fn self_check_notices_a_libm_one_ulp_off() {
        if !verified() {
            return; // no AVX-512F, or another libm (`exp16_is_f32_exp_bit_for_bit` asserts glibc's)
        }
        assert!(agrees_with(f32::exp));
        // a libm that rounds one argument of the sample the other way
        let odd = sample()[2000];
        assert!(!agrees_with(|x| if x == odd {
            f32::from_bits(x.exp().to_bits() + 1)
        } else {
            x.exp()
        }));
        // a glibc built without the contraction of `r` (its main path in scalar f64, `r` from
        // the rounded product); the same with the contraction passes
        let plain = |x: f32, fuse_r: bool| {
            if x.is_nan() || x.abs() >= 88.0 {
                return x.exp(); // the edge branches: not what this case is about
            }
            let inv = f64::from_bits(INV_LN2_N);
            let shift = f64::from_bits(SHIFT);
            let xd = f64::from(x);
            let kd = inv.mul_add(xd, shift);
            let ki = kd.to_bits();
            let kd = kd - shift;
            let r = if fuse_r {
                inv.mul_add(xd, -kd)
            } else {
                inv * xd - kd
            };
            let s = f64::from_bits(TABLE[(ki % 32) as usize].wrapping_add(ki << 47));
            let z = r.mul_add(f64::from_bits(C0), f64::from_bits(C1));
            let y = r.mul_add(f64::from_bits(C2), 1.0);
            (z.mul_add(r * r, y) * s) as f32
        };
        assert!(agrees_with(|x| plain(x, true)));
        assert!(!agrees_with(|x| plain(x, false)));
        // and one that flushes subnormal results
        assert!(!agrees_with(|x| {
            let e = x.exp();
            if e < f32::MIN_POSITIVE {
                0.0
            } else {
                e
            }
        }));
    }
}
