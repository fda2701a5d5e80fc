//! Element types a KV state is held in (f32, or fp16 for an fp16 program's fp16 cache) and
//! their exact widening to f32, so the attention kernels read either without a copy of the
//! state.

use half::f16;

/// An element of a KV window: f32 or fp16, widened exactly to f32 where it is computed with.
pub trait KvElem: Copy + Send + Sync + 'static {
    /// The window as f32 values, when it already is (no widening needed).
    fn as_f32(values: &[Self]) -> Option<&[f32]>;

    /// The window as fp16 values, when it is (read by the fp16 kernels).
    fn as_f16(values: &[Self]) -> Option<&[f16]>;

    /// `dst[i] = src[i]` as f32 (exact); the slices have the same length.
    fn widen(src: &[Self], dst: &mut [f32]);
}

impl KvElem for f32 {
    fn as_f32(values: &[f32]) -> Option<&[f32]> {
        Some(values)
    }

    fn as_f16(_: &[f32]) -> Option<&[f16]> {
        None
    }

    fn widen(src: &[f32], dst: &mut [f32]) {
        dst.copy_from_slice(src);
    }
}

impl KvElem for f16 {
    fn as_f32(_: &[f16]) -> Option<&[f32]> {
        None
    }

    fn as_f16(values: &[f16]) -> Option<&[f16]> {
        Some(values)
    }

    fn widen(src: &[f16], dst: &mut [f32]) {
        widen_f16(src, dst);
    }
}

/// A window of a state in its element type.
#[derive(Clone, Copy, Debug)]
pub enum KvSlice<'a> {
    F32(&'a [f32]),
    F16(&'a [f16]),
}

impl<'a> KvSlice<'a> {
    pub fn len(&self) -> usize {
        match self {
            KvSlice::F32(s) => s.len(),
            KvSlice::F16(s) => s.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The elements `r` (`None` when out of range).
    pub fn get(&self, r: std::ops::Range<usize>) -> Option<KvSlice<'a>> {
        Some(match *self {
            KvSlice::F32(s) => KvSlice::F32(s.get(r)?),
            KvSlice::F16(s) => KvSlice::F16(s.get(r)?),
        })
    }

    /// The elements `r` (in range: the caller checked).
    pub(crate) fn range(&self, r: std::ops::Range<usize>) -> KvSlice<'a> {
        match *self {
            KvSlice::F32(s) => KvSlice::F32(&s[r]),
            KvSlice::F16(s) => KvSlice::F16(&s[r]),
        }
    }

    /// The values as f32: borrowed when they are, else widened into `buf` (resized here).
    pub fn to_f32<'b>(&self, buf: &'b mut Vec<f32>) -> &'b [f32]
    where
        'a: 'b,
    {
        match *self {
            KvSlice::F32(s) => s,
            KvSlice::F16(s) => {
                buf.resize(s.len(), 0.0);
                widen_f16(s, buf);
                buf
            }
        }
    }

    /// The address of the first element (an identity for memos; never dereferenced).
    pub fn addr(&self) -> usize {
        match self {
            KvSlice::F32(s) => s.as_ptr() as usize,
            KvSlice::F16(s) => s.as_ptr() as usize,
        }
    }
}

/// `dst[i] = src[i]` widened (exact: every fp16 value is an f32 value).
pub fn widen_f16(src: &[f16], dst: &mut [f32]) {
    assert_eq!(src.len(), dst.len(), "widen_f16: lengths differ");
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("avx512f") {
        // SAFETY: the feature the function is compiled for was detected at run time.
        unsafe { widen_avx512(src, dst) };
        return;
    }
    #[cfg(target_arch = "x86_64")]
    if is_x86_feature_detected!("f16c") && is_x86_feature_detected!("avx") {
        // SAFETY: the features the function is compiled for were detected at run time.
        unsafe { widen_f16c(src, dst) };
        return;
    }
    widen_scalar(src, dst);
}

fn widen_scalar(src: &[f16], dst: &mut [f32]) {
    for (d, s) in dst.iter_mut().zip(src) {
        *d = s.to_f32();
    }
}

/// 16 lanes an instruction (`vcvtph2ps`: exact, NaN payloads kept as the scalar path keeps
/// them), the tail scalar.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let n = src.len().min(dst.len());
    let full = n / 16 * 16;
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 16 <= n` elements of both slices are in bounds; unaligned loads and
        // stores; f16 is a 2-byte plain value.
        unsafe {
            let h = _mm256_loadu_si256(src.as_ptr().add(i) as *const __m256i);
            _mm512_storeu_ps(dst.as_mut_ptr().add(i), _mm512_cvtph_ps(h));
        }
        i += 16;
    }
    widen_scalar(&src[full..n], &mut dst[full..n]);
}

/// 8 lanes an instruction (F16C), the tail scalar.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "f16c,avx")]
unsafe fn widen_f16c(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m128i, _mm256_cvtph_ps, _mm256_storeu_ps, _mm_loadu_si128};
    let n = src.len().min(dst.len());
    let full = n / 8 * 8;
    let mut i = 0;
    while i < full {
        // SAFETY: `i + 8 <= n` elements of both slices are in bounds; unaligned accesses.
        unsafe {
            let h = _mm_loadu_si128(src.as_ptr().add(i) as *const __m128i);
            _mm256_storeu_ps(dst.as_mut_ptr().add(i), _mm256_cvtph_ps(h));
        }
        i += 8;
    }
    widen_scalar(&src[full..n], &mut dst[full..n]);
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Fails if a widening path differs from the scalar conversion in one bit: every fp16 bit
    /// pattern (NaNs, infinities, subnormals, signed zeros), at lengths with every lane tail.
    #[test]
    fn widening_is_exact_for_every_fp16_value() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        let mut got = vec![0.0f32; all.len()];
        widen_f16(&all, &mut got);
        for (h, g) in all.iter().zip(&got) {
            let want = h.to_f32();
            assert!(
                want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                "{:#06x}: {g} vs {want}",
                h.to_bits()
            );
            if !want.is_nan() {
                assert_eq!(f16::from_f32(*g), *h);
            }
        }
        for n in 0..40 {
            let src = &all[1000..1000 + n];
            let mut dst = vec![f32::NAN; n];
            widen_f16(src, &mut dst);
            let want: Vec<u32> = src.iter().map(|h| h.to_f32().to_bits()).collect();
            let got: Vec<u32> = dst.iter().map(|x| x.to_bits()).collect();
            assert_eq!(got, want, "length {n}");
        }
    }
}
