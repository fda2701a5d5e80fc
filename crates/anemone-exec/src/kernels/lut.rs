//! Palettized weights (`constexpr_lut_to_dense`: packed indices of 1–8 bits, fp16 palettes of
//! 2^bits entries) formed as fp16 rows: each element is its palette entry, exactly the expanded
//! constant's value. With AVX-512 VBMI, 64 indices a step: the 8 indices of 8 elements are
//! `bits` whole bytes (LSB-first), spread to one qword each by a byte permute and cut out by a
//! multishift; the palette, padded to 256 entries, is looked up a byte plane at a time (low and
//! high bytes of the entries, 128 entries a two-register byte permute, bit 7 picking the half),
//! the indices paired first so the two planes' bytes make fp16 words by shifts and blends. The
//! shuffle port bounds it (a two-register byte permute takes it two cycles on the x86 machine
//! measured); `examples/lut_bench.rs` times the look-up and the matvec over formed rows. Elsewhere,
//! and for a run that does not start on a byte, one index at a time.

use half::f16;

/// Index `e` of the packed `bits`-wide indices `bytes` (little-endian bit order: element `e`
/// occupies bits `e·bits .. (e + 1)·bits` of the byte stream).
#[inline]
pub fn index_at(bytes: &[u8], bits: usize, e: usize) -> usize {
    let bit = e * bits;
    let lo = bytes[bit / 8] as u32;
    let hi = if bit % 8 + bits > 8 {
        bytes[bit / 8 + 1] as u32
    } else {
        0
    };
    (((lo | (hi << 8)) >> (bit % 8)) & ((1u32 << bits) - 1)) as usize
}

/// `out[n] = palette[index first + n]` of the packed `bits`-wide indices `bytes`
/// (`1 ≤ bits ≤ 8`, `palette.len() == 2^bits`, the indices of elements
/// `first..first + out.len()` inside `bytes`).
pub fn form(bytes: &[u8], bits: usize, first: usize, palette: &[f16], out: &mut [f16]) {
    debug_assert!((1..=8).contains(&bits) && palette.len() == 1 << bits);
    #[cfg(target_arch = "x86_64")]
    let done = if avx512::available() && (first * bits).is_multiple_of(8) && out.len() >= 64 {
        // SAFETY: the features were detected; the run starts on a byte and its indices lie
        // inside `bytes` (the caller's contract), the palette has 2^bits entries, at most
        // 64 · GROUPS.
        unsafe {
            match bits {
                ..=6 => avx512::form_steps::<1>(bytes, bits, first, palette, out),
                7 => avx512::form_steps::<2>(bytes, bits, first, palette, out),
                _ => avx512::form_steps::<4>(bytes, bits, first, palette, out),
            }
        }
    } else {
        0
    };
    #[cfg(not(target_arch = "x86_64"))]
    let done = 0;
    for (n, o) in out.iter_mut().enumerate().skip(done) {
        *o = palette[index_at(bytes, bits, first + n)];
    }
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use half::f16;

    pub(super) fn available() -> bool {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vbmi")
        })
    }

    /// A 256-entry fp16 palette as byte planes: `lo[j]` / `hi[j]` hold the low / high bytes
    /// of entries `64 j .. 64 j + 64`.
    struct Planes {
        lo: [__m512i; 4],
        hi: [__m512i; 4],
    }

    impl Planes {
        /// The planes of `palette` (at most 256 entries; those past its end are zero, never
        /// looked up by indices narrower than 8 bits).
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        fn of(palette: &[f16]) -> Self {
            let (even, odd) = (constant(&EVEN), constant(&ODD));
            let (t, len) = (palette.as_ptr() as *const i8, 2 * palette.len().min(256));
            let mut planes = Planes {
                lo: [_mm512_setzero_si512(); 4],
                hi: [_mm512_setzero_si512(); 4],
            };
            // the bytes `from..from + 64` of the palette that exist
            let load = |from: usize| {
                let n = len.saturating_sub(from).min(64);
                let mask: __mmask64 = if n == 64 { !0 } else { (1u64 << n) - 1 };
                // SAFETY: only the palette's own bytes are read (masked past its end)
                unsafe { _mm512_maskz_loadu_epi8(mask, t.wrapping_add(from)) }
            };
            for j in 0..4 {
                // entries 64 j .. 64 j + 32 and 64 j + 32 .. 64 j + 64
                let (a, b) = (load(128 * j), load(128 * j + 64));
                // byte 2 e (e < 32) of a, byte 2 e − 64 of b (bit 6 of the index)
                planes.lo[j] = _mm512_permutex2var_epi8(a, even, b);
                planes.hi[j] = _mm512_permutex2var_epi8(a, odd, b);
            }
            planes
        }

        /// The entries of 64 byte indices below `64 · GROUPS` (1, 2 or 4), as the fp16 bit
        /// patterns of elements 0–31 and 32–63: one permute a plane for 6-bit indices, a
        /// two-register one for 7-bit ones, two and a blend on bit 7 for 8-bit ones. The
        /// indices are first paired (byte `2 j` element `j`, byte `2 j + 1` element `32 + j`),
        /// so the planes' bytes make words by a shift and a blend, off the shuffle port.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        fn look_up<const GROUPS: usize>(&self, v: __m512i) -> (__m512i, __m512i) {
            let v = _mm512_permutexvar_epi8(constant(&PAIRS), v);
            let plane = |p: &[__m512i; 4]| match GROUPS {
                1 => _mm512_permutexvar_epi8(v, p[0]),
                2 => _mm512_permutex2var_epi8(p[0], v, p[1]),
                _ => {
                    let low_half = _mm512_permutex2var_epi8(p[0], v, p[1]);
                    let high_half = _mm512_permutex2var_epi8(p[2], v, p[3]);
                    _mm512_mask_blend_epi8(_mm512_movepi8_mask(v), low_half, high_half)
                }
            };
            let (lo, hi) = (plane(&self.lo), plane(&self.hi));
            // odd bytes: the high byte of each word
            const ODD_BYTES: __mmask64 = 0xAAAA_AAAA_AAAA_AAAA;
            (
                // word j: (lo, hi) of byte 2 j, element j
                _mm512_mask_blend_epi8(ODD_BYTES, lo, _mm512_slli_epi16::<8>(hi)),
                // word j: (lo, hi) of byte 2 j + 1, element 32 + j
                _mm512_mask_blend_epi8(ODD_BYTES, _mm512_srli_epi16::<8>(lo), hi),
            )
        }
    }

    /// Byte `b` of a step's permutes: `EVEN`/`ODD` pick the low/high bytes of 64 fp16
    /// entries; for `bits`-wide indices, `SPREAD[bits]` puts the `bits` bytes of elements
    /// `8 g .. 8 g + 8` in qword `g`, and `SHIFTS[bits]` has byte `j` of each qword start at
    /// bit `j · bits`.
    const EVEN: [u8; 64] = every_other(0);
    const ODD: [u8; 64] = every_other(1);
    /// Byte `2 j` of `PAIRS` is element `j`, byte `2 j + 1` element `32 + j`.
    const PAIRS: [u8; 64] = pairs();
    const SPREAD: [[u8; 64]; 9] = spreads_and_shifts().0;
    const SHIFTS: [[u8; 64]; 9] = spreads_and_shifts().1;

    /// `[2 b + from]`: bytes `from, from + 2, …`.
    const fn every_other(from: usize) -> [u8; 64] {
        let mut out = [0u8; 64];
        let mut b = 0;
        while b < 64 {
            out[b] = (2 * b + from) as u8;
            b += 1;
        }
        out
    }

    const fn pairs() -> [u8; 64] {
        let mut out = [0u8; 64];
        let mut b = 0;
        while b < 64 {
            out[b] = (b / 2 + 32 * (b % 2)) as u8;
            b += 1;
        }
        out
    }

    /// For each width `bits`: the `SPREAD` bytes (byte `j < bits` of qword `g` is byte
    /// `g · bits + j` of the step, the rest repeating its last byte) and the `SHIFTS` bytes
    /// (byte `j` of every qword is `j · bits`, where index `j` starts).
    const fn spreads_and_shifts() -> ([[u8; 64]; 9], [[u8; 64]; 9]) {
        let (mut spread, mut shifts) = ([[0u8; 64]; 9], [[0u8; 64]; 9]);
        let mut bits = 1;
        while bits <= 8 {
            let mut b = 0;
            while b < 64 {
                let j = if b % 8 < bits { b % 8 } else { bits - 1 };
                spread[bits][b] = ((b / 8) * bits + j) as u8;
                shifts[bits][b] = ((b % 8) * bits) as u8;
                b += 1;
            }
            bits += 1;
        }
        (spread, shifts)
    }

    #[inline]
    #[target_feature(enable = "avx512f")]
    fn constant(bytes: &[u8; 64]) -> __m512i {
        // SAFETY: 64 bytes
        unsafe { _mm512_loadu_si512(bytes.as_ptr() as *const __m512i) }
    }

    /// Forms the whole 64-element steps of [`super::form`] for indices below `64 · GROUPS`
    /// ([`Planes::look_up`]); returns how many elements it formed.
    ///
    /// # Safety
    /// AVX-512F/BW/VBMI present; `first · bits` is a multiple of 8; the indices of elements
    /// `first..first + out.len()` lie inside `bytes`; `palette.len() == 2^bits ≤ 64 · GROUPS`.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
    pub(super) unsafe fn form_steps<const GROUPS: usize>(
        bytes: &[u8],
        bits: usize,
        first: usize,
        palette: &[f16],
        out: &mut [f16],
    ) -> usize {
        let planes = Planes::of(palette);
        // the 8 indices of 8 elements are `bits` bytes: qword g gets bytes g·bits.., and its
        // byte j bits j·bits.. (only the low `bits` of each are kept)
        let (spread, shifts) = (constant(&SPREAD[bits]), constant(&SHIFTS[bits]));
        let keep = _mm512_set1_epi8(((1u32 << bits) - 1) as u8 as i8);
        let step_bytes = 8 * bits;
        let load_mask: __mmask64 = if step_bytes == 64 {
            !0
        } else {
            (1u64 << step_bytes) - 1
        };
        let (src, dst) = (bytes.as_ptr().add(first * bits / 8), out.as_mut_ptr());
        // a few KiB on (a matvec's next passes over rows of this run's length), asked for
        // ahead: the hardware prefetcher does not cross pages. A step reads at most 64 bytes,
        // so one hint a step touches every line.
        let ahead = (4 * (out.len() * bits).div_ceil(8)).min(4096);
        let mut e = 0;
        while e + 64 <= out.len() {
            let at = src.add(e / 8 * bits);
            _mm_prefetch::<_MM_HINT_T0>(at.wrapping_add(ahead) as *const i8);
            let raw = _mm512_maskz_loadu_epi8(load_mask, at as *const i8);
            let v = if bits == 8 {
                raw
            } else {
                let placed = _mm512_permutexvar_epi8(spread, raw);
                _mm512_and_si512(_mm512_multishift_epi64_epi8(shifts, placed), keep)
            };
            let (low, high) = planes.look_up::<GROUPS>(v);
            _mm512_storeu_si512(dst.add(e) as *mut __m512i, low);
            _mm512_storeu_si512(dst.add(e + 32) as *mut __m512i, high);
            e += 64;
        }
        e
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anemone_testkit::Rng;

    /// Packs `indices` LSB-first, `bits` each.
    fn pack(indices: &[usize], bits: usize) -> Vec<u8> {
        let mut bytes = vec![0u8; (indices.len() * bits).div_ceil(8) + 1];
        for (e, &i) in indices.iter().enumerate() {
            for b in 0..bits {
                if i >> b & 1 == 1 {
                    let bit = e * bits + b;
                    bytes[bit / 8] |= 1 << (bit % 8);
                }
            }
        }
        bytes
    }

    #[test]
    fn formed_rows_are_the_palette_entries_of_every_index_width_and_offset() {
        for bits in [1, 2, 3, 4, 6, 8] {
            let entries = 1usize << bits;
            let mut rng = Rng(0x1D_5EED + bits as u64);
            // finite fp16 bit patterns (compared as bits below)
            let palette: Vec<f16> = (0..entries)
                .map(|_| f16::from_bits(rng.next() as u16 & 0x7BFF))
                .collect();
            let indices: Vec<usize> = (0..700).map(|_| rng.next() as usize % entries).collect();
            let bytes = pack(&indices, bits);
            for (first, len) in [(0, 640), (8, 600), (64, 131), (1, 200), (5, 63), (3, 0)] {
                let mut out = vec![f16::ZERO; len];
                form(&bytes, bits, first, &palette, &mut out);
                for (n, o) in out.iter().enumerate() {
                    let want = palette[indices[first + n]];
                    assert_eq!(
                        o.to_bits(),
                        want.to_bits(),
                        "bits {bits}, run from {first}: element {} is {o}, its entry {want}",
                        first + n
                    );
                }
            }
        }
    }
}
