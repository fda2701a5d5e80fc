//! Rounding f32 values to fp16 and back, as the Neural Engine stores them.

use half::f16;

/// Rounds one value to the nearest fp16 (ties to even) and back.
#[inline]
pub fn round_f16(v: f32) -> f32 {
    f16::from_f32(v).to_f32()
}

/// Rounds every value to fp16 in place (nearest even, ±inf beyond the range; F16C where the
/// CPU has it).
pub fn round_f16_in_place(data: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx") && is_x86_feature_detected!("f16c") {
        // SAFETY: the features `round_f16` is compiled for were detected at run time.
        unsafe { f16c::round_f16(data) };
        return;
    }
    data.iter_mut().for_each(|v| *v = round_f16(*v));
}

/// Whether rounding to fp16 leaves every value as it is, bit for bit (what
/// [`round_f16_in_place`] would do to them is nothing; NaN payloads included).
pub fn is_f16_exact(data: &[f32]) -> bool {
    const BLOCK: usize = 64;
    let mut rounded = [0f32; BLOCK];
    data.chunks(BLOCK).all(|block| {
        let rounded = &mut rounded[..block.len()];
        rounded.copy_from_slice(block);
        round_f16_in_place(rounded);
        rounded
            .iter()
            .zip(block)
            .fold(true, |same, (r, x)| same & (r.to_bits() == x.to_bits()))
    })
}

#[cfg(target_arch = "x86_64")]
mod f16c {
    use std::arch::x86_64::*;

    /// # Safety
    /// The CPU must support AVX and F16C.
    #[target_feature(enable = "avx,f16c")]
    pub unsafe fn round_f16(data: &mut [f32]) {
        let n = data.len() / 8 * 8;
        let p = data.as_mut_ptr();
        let mut i = 0;
        while i < n {
            let v = _mm256_loadu_ps(p.add(i));
            let h = _mm256_cvtps_ph::<_MM_FROUND_TO_NEAREST_INT>(v);
            _mm256_storeu_ps(p.add(i), _mm256_cvtph_ps(h));
            i += 8;
        }
        for v in &mut data[n..] {
            *v = half::f16::from_f32(*v).to_f32();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn simd_fp16_rounding_matches_half() {
        let mut v: Vec<f32> = (0..1000)
            .map(|i| ((i as f32) - 500.0) * 131.071 + (i % 7) as f32 * 1e-3)
            .chain([
                65504.0,
                65519.0,
                65520.0,
                -65520.0,
                1e-8,
                -1e-8,
                6.1e-5,
                f32::NAN,
                f32::INFINITY,
            ])
            .collect();
        let want: Vec<u32> = v
            .iter()
            .map(|&x| f16::from_f32(x).to_f32().to_bits())
            .collect();
        round_f16_in_place(&mut v);
        for (i, (g, w)) in v.iter().zip(&want).enumerate() {
            assert!(
                g.to_bits() == *w || (g.is_nan() && f32::from_bits(*w).is_nan()),
                "element {i}: {g} vs {}",
                f32::from_bits(*w)
            );
        }
    }

    #[test]
    fn f16_exactness_is_what_rounding_leaves_unchanged() {
        let exact: Vec<f32> = (0..300)
            .map(|i| round_f16((i as f32 - 150.0) * 0.37))
            .chain([
                0.0,
                -0.0,
                65504.0,
                f32::INFINITY,
                f32::NEG_INFINITY,
                round_f16(6.0e-8),
            ])
            .collect();
        assert!(is_f16_exact(&exact));
        assert!(is_f16_exact(&[]));
        // one value that fp16 cannot hold, anywhere (SIMD body, block edge, tail)
        for at in [0, 7, 63, 64, 200, exact.len() - 1] {
            for bad in [0.1f32, 65520.0, 1e-9, f32::from_bits(0x7fc0_0001)] {
                let mut v = exact.clone();
                v[at] = bad;
                assert!(!is_f16_exact(&v), "{bad} at {at}");
            }
        }
    }
}
