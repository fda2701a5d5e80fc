//! Palettized weights (`constexpr_lut_to_dense`: packed indices of 1–8 bits, fp16 palettes of
//! 2^bits entries) formed as fp16 rows: each element is its palette entry, exactly the expanded
//! constant's value. With AVX-512 VBMI, 64 indices a step: the 8 indices of 8 elements are
//! `bits` whole bytes (LSB-first), spread to one qword each by a byte permute and cut out by a
//! multishift; the palette, padded to 256 entries, is looked up a byte plane at a time (low and
//! high bytes of the entries, 128 entries a two-register byte permute, bit 7 picking the half),
//! the planes' bytes then interleaved into fp16 words and stored a 128-bit lane at a time. The
//! shuffle port bounds it (a two-register byte permute takes it two cycles on the x86 machine
//! measured, and the fp16 dot's conversions share that port while its FMAs need the other;
//! work that may run on either port is kept few, as the scheduler puts some of it there), so
//! the one-token matvec of 8-bit indices ([`matvec8`]) looks up the next four rows while it
//! dots four, the two kinds of work side by side in one loop; `examples/lut_bench.rs` times the
//! look-up and the matvecs. Elsewhere, and for a run that does not start on a byte, one index
//! at a time.

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

/// `dst = W · x` (one token) for 8-bit indices `indices` (row-major, rows of `x.len()`) under
/// palettes `table` (256 fp16 entries for each `rows_per_palette` rows, in order): four rows
/// a pass, the next pass's rows looked up while this pass's are dotted, so the look-up's byte
/// permutes and the dot's conversions and FMAs share the cycles (formed into a buffer first
/// and then dotted, each phase waits on one port). Each value is bit for bit
/// [`super::quant::matvec_by_formed_rows`]'s over [`form`]'s rows: the same fp16 values into
/// the same accumulator lanes of the four-row fp16 dot in the same order. `false` (nothing
/// written) where it does not apply: no AVX-512 VBMI, `x.len()` not a positive multiple of
/// 32, or `indices` / `table` too short.
pub fn matvec8(
    dst: &mut [f32],
    x: &[f32],
    indices: &[u8],
    table: &[f16],
    rows_per_palette: usize,
) -> bool {
    let weight = Lut8 {
        indices,
        table,
        rows_per_palette,
    };
    matvec8_group(&mut [(dst, weight)], x)
}

/// Bytes of indices in a block of [`matvec8`]'s rows: unbounded, so each weight's rows are cut
/// into one block a thread. A block's first pass is looked up before the pipeline starts and
/// its last pass looks nothing up ahead, so blocks are few: one a thread decoded Qwen2.5's
/// LUT-8 bundle 2% faster than the fused kernels' 256 KiB blocks (measured; SmolLM2's level).
#[cfg(target_arch = "x86_64")]
const BLOCK_BYTES: usize = usize::MAX;

/// An 8-bit palettized weight as [`matvec8`] reads it.
#[derive(Clone, Copy)]
pub struct Lut8<'w> {
    pub indices: &'w [u8],
    pub table: &'w [f16],
    pub rows_per_palette: usize,
}

/// [`matvec8`] of several weights of one input `x` (a layer's q/k/v) in one parallel region,
/// each output exactly its own [`matvec8`]'s. `false` (nothing written) unless [`matvec8`]
/// applies to every weight.
pub fn matvec8_group(group: &mut [(&mut [f32], Lut8)], x: &[f32]) -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        let k = x.len();
        let fits = |rows: usize, w: &Lut8| {
            k > 0
                && k.is_multiple_of(32)
                && w.rows_per_palette > 0
                && w.indices.len() >= rows * k
                && w.table.len() >= rows.div_ceil(w.rows_per_palette) * 256
        };
        if !group.iter().all(|(dst, w)| fits(dst.len(), w)) || !avx512::pipelines() {
            return false;
        }
        let weights: Vec<Lut8> = group.iter().map(|(_, w)| *w).collect();
        let mut dsts: Vec<&mut [f32]> = group.iter_mut().map(|(dst, _)| &mut **dst).collect();
        let kernel = |m: usize, first: usize, chunk: &mut [f32]| {
            let w = &weights[m];
            // SAFETY: the features were detected; `first..first + chunk.len()` are rows of
            // output `m`, whose indices and palettes lie inside its weight's (checked above).
            unsafe { avx512::matvec8_rows(chunk, first, x, w.indices, w.table, w.rows_per_palette) }
        };
        super::quant::spread_rows_of(&mut dsts, k, BLOCK_BYTES, k, kernel);
        true
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (group, x);
        false
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

        /// The entries of 64 byte indices below `64 · GROUPS` (1, 2 or 4), written as the fp16
        /// values of 64 elements at `out`: one permute a plane for 6-bit indices, a
        /// two-register one for 7-bit ones, two merged by the mask of bit 7 for 8-bit ones;
        /// then the planes' bytes interleaved into words (elements `16 q .. 16 q + 8` and
        /// `16 q + 8 .. 16 q + 16` of each 128-bit lane `q`) and stored a lane at a time
        /// (a lane's store takes no shuffle).
        ///
        /// # Safety
        /// `out` points at 64 writable values.
        #[inline]
        #[target_feature(enable = "avx512f,avx512bw,avx512vbmi")]
        unsafe fn look_up_into<const GROUPS: usize>(&self, v: __m512i, out: *mut f16) {
            let plane = |p: &[__m512i; 4]| match GROUPS {
                1 => _mm512_permutexvar_epi8(v, p[0]),
                2 => _mm512_permutex2var_epi8(p[0], v, p[1]),
                _ => {
                    // bit 7 set: the high half's entry, in place of the index byte; then the
                    // low half's for the bytes still holding their index (no blend)
                    let high = _mm512_movepi8_mask(v);
                    let some = _mm512_mask2_permutex2var_epi8(p[2], v, high, p[3]);
                    _mm512_mask2_permutex2var_epi8(p[0], some, not(high), p[1])
                }
            };
            let (lo, hi) = (plane(&self.lo), plane(&self.hi));
            let (first, second) = (_mm512_unpacklo_epi8(lo, hi), _mm512_unpackhi_epi8(lo, hi));
            // Written out: from intrinsics LLVM merges the eight stores back into two, by two
            // two-register permutes (two shuffle-port cycles each).
            // SAFETY: 64 values (128 bytes) at `out`, the caller's contract; AVX-512F enabled.
            unsafe {
                std::arch::asm!(
                    "vmovdqu xmmword ptr [{out}], {first:x}",
                    "vmovdqu xmmword ptr [{out} + 16], {second:x}",
                    "vextracti32x4 xmmword ptr [{out} + 32], {first}, 1",
                    "vextracti32x4 xmmword ptr [{out} + 48], {second}, 1",
                    "vextracti32x4 xmmword ptr [{out} + 64], {first}, 2",
                    "vextracti32x4 xmmword ptr [{out} + 80], {second}, 2",
                    "vextracti32x4 xmmword ptr [{out} + 96], {first}, 3",
                    "vextracti32x4 xmmword ptr [{out} + 112], {second}, 3",
                    out = in(reg) out,
                    first = in(zmm_reg) first,
                    second = in(zmm_reg) second,
                    options(nostack, preserves_flags),
                )
            }
        }
    }

    /// [`available`] and what the fp16 dot of [`matvec8_rows`] needs.
    pub(super) fn pipelines() -> bool {
        available()
            && is_x86_feature_detected!("avx2")
            && is_x86_feature_detected!("fma")
            && is_x86_feature_detected!("f16c")
    }

    type Buffer<T> = std::cell::RefCell<Vec<T>>;

    std::thread_local! {
        /// Two passes' four rows (the pass being dotted and the next one being formed), and
        /// a copy of `x`.
        static PASSES: (Buffer<f16>, Buffer<f32>) = const {
            (std::cell::RefCell::new(Vec::new()), std::cell::RefCell::new(Vec::new()))
        };
    }

    /// `len` elements of `buf` from a 64-byte boundary: the dot's 64-byte loads of `x` and
    /// 32-byte loads of the rows then never straddle a cache line (with `x` as the caller's
    /// buffer, 16-byte aligned, the LUT-8 decode was 10% slower; measured).
    fn aligned<T: Copy + Default>(buf: &mut Vec<T>, len: usize) -> &mut [T] {
        buf.resize(len + 64 / std::mem::size_of::<T>(), T::default());
        let skew = buf.as_ptr().align_offset(64);
        &mut buf[skew..skew + len]
    }

    /// The rows `first..first + dst.len()` of [`super::matvec8`].
    ///
    /// # Safety
    /// AVX-512F/BW/VBMI, AVX2, FMA, F16C present; the rows' indices and palettes lie inside
    /// `indices` / `table`; `x_in.len()` is a positive multiple of 32.
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma,f16c")]
    pub(super) unsafe fn matvec8_rows(
        dst: &mut [f32],
        first: usize,
        x_in: &[f32],
        indices: &[u8],
        table: &[f16],
        rows_per_palette: usize,
    ) {
        let k = x_in.len();
        let group = |row: usize| row / rows_per_palette;
        let palette = |row: usize| &table[256 * group(row)..256 * (group(row) + 1)];
        // rows `row..row + 4` formed by the look-up of one call a palette
        let form_four = |row: usize, out: &mut [f16]| {
            let mut r = row;
            while r < row + 4 {
                let end = ((group(r) + 1) * rows_per_palette).min(row + 4);
                super::form(
                    indices,
                    8,
                    r * k,
                    palette(r),
                    &mut out[(r - row) * k..(end - row) * k],
                );
                r = end;
            }
        };
        let passes = dst.len() / 4;
        PASSES.with(|cell| {
            let (mut buf, mut x_buf) = (cell.0.borrow_mut(), cell.1.borrow_mut());
            let (rows, x) = (aligned(&mut buf, 8 * k), aligned(&mut x_buf, k));
            x.copy_from_slice(x_in);
            let x = &*x;
            let (mut cur, mut next) = rows.split_at_mut(4 * k);
            if passes > 0 {
                form_four(first, cur);
            }
            let (mut planes, mut planes_group) = (Planes::of(&[]), usize::MAX);
            for p in 0..passes {
                let row = first + 4 * p;
                let sums = if p + 1 < passes && group(row + 4) == group(row + 7) {
                    if group(row + 4) != planes_group {
                        planes_group = group(row + 4);
                        planes = Planes::of(palette(row + 4));
                    }
                    let src = indices.as_ptr().add((row + 4) * k);
                    dot4_forming::<true>(cur, x, &planes, src, next.as_mut_ptr())
                } else {
                    if p + 1 < passes {
                        form_four(row + 4, next);
                    }
                    dot4_forming::<false>(cur, x, &planes, std::ptr::null(), std::ptr::null_mut())
                };
                dst[4 * p..4 * p + 4].copy_from_slice(&sums);
                std::mem::swap(&mut cur, &mut next);
            }
            let dot1 = crate::kernels::simd::dot_f16_kernel();
            for (i, d) in dst.iter_mut().enumerate().skip(4 * passes) {
                let row = &mut next[..k];
                super::form(indices, 8, (first + i) * k, palette(first + i), row);
                *d = dot1(row, x);
            }
        })
    }

    /// The dots of the four formed rows `formed` (row `r` at `r · k`, `k = x.len()`) with `x`,
    /// bit for bit `simd::avx512::dot_f16_rows::<4>` (element `i + l` of a 32-element step
    /// into lane `l` of a row's first accumulator, `i + 16 + l` into its second; no tail, as
    /// `k` is a multiple of 32; the same reduction); with `FORM`, meanwhile the `4 k`
    /// indices at `src` looked up into `out`, two 64-element steps a dot step.
    ///
    /// # Safety
    /// The CPU has the features of [`matvec8_rows`]; `formed` holds `4 k` values; with `FORM`,
    /// `src` and `out` point at `4 k` indices and values.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw,avx512vbmi,avx2,fma,f16c")]
    unsafe fn dot4_forming<const FORM: bool>(
        formed: &[f16],
        x: &[f32],
        planes: &Planes,
        src: *const u8,
        out: *mut f16,
    ) -> [f32; 4] {
        let k = x.len();
        let (pw, px) = (formed.as_ptr(), x.as_ptr());
        let mut a01 = [_mm512_setzero_ps(); 4];
        let mut a23 = [_mm512_setzero_ps(); 4];
        let mut i = 0;
        while i < k {
            if FORM {
                // the indices a pass on, asked for ahead (the prefetcher stops at pages)
                let e = 4 * i;
                for step in [e, e + 64] {
                    _mm_prefetch::<_MM_HINT_T0>(src.wrapping_add(step + 8192) as *const i8);
                    let v = _mm512_loadu_si512(src.add(step) as *const __m512i);
                    planes.look_up_into::<4>(v, out.add(step));
                }
            }
            let x0 = _mm512_loadu_ps(px.add(i));
            let x1 = _mm512_loadu_ps(px.add(i + 16));
            for r in 0..4 {
                let at = pw.add(r * k + i);
                let w0 = _mm512_cvtph_ps(_mm256_loadu_si256(at as *const __m256i));
                let w1 = _mm512_cvtph_ps(_mm256_loadu_si256(at.add(16) as *const __m256i));
                a01[r] = _mm512_fmadd_ps(w0, x0, a01[r]);
                a23[r] = _mm512_fmadd_ps(w1, x1, a23[r]);
            }
            i += 32;
        }
        std::array::from_fn(|r| crate::kernels::simd::avx512::reduce(a01[r], a23[r]))
    }

    /// `!mask` by a mask-register op: written as `!mask`, LLVM compares the bytes again
    /// instead, on the shuffle port the look-up is bound by.
    #[inline]
    #[target_feature(enable = "avx512f,avx512bw")]
    fn not(mask: __mmask64) -> __mmask64 {
        let inverted: __mmask64;
        // SAFETY: one mask-register instruction of the enabled AVX-512BW; no memory, no flags
        unsafe {
            std::arch::asm!(
                "knotq {inverted}, {mask}",
                inverted = out(kreg) inverted,
                mask = in(kreg) mask,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
        inverted
    }

    /// Byte `b` of a step's permutes: `EVEN`/`ODD` pick the low/high bytes of 64 fp16
    /// entries; for `bits`-wide indices, `SPREAD[bits]` puts the `bits` bytes of elements
    /// `8 g .. 8 g + 8` in qword `g`, and `SHIFTS[bits]` has byte `j` of each qword start at
    /// bit `j · bits`.
    const EVEN: [u8; 64] = every_other(0);
    const ODD: [u8; 64] = every_other(1);
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
            planes.look_up_into::<GROUPS>(v, dst.add(e));
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

    /// `lut::matvec8` over (rows, k, rows a palette): each value bit for bit the fp16 matvec
    /// of the rows its indices stand for, alone and on teams of 1–3 threads.
    #[test]
    fn matvec8_is_the_fp16_matvec_of_its_rows() {
        use crate::kernels::linalg;
        use crate::team::{self, Team};
        use std::sync::Arc;
        // one row; palettes of one row; runs that straddle palettes (6 and 7 rows); a tail
        // after the four-row passes; SmolLM2's and Qwen2.5's widths; enough work to spread; none
        let shapes = [
            (1usize, 32usize, 1usize),
            (9, 64, 1),
            (37, 96, 6),
            (23, 160, 7),
            (103, 128, 103),
            (64, 576, 32),
            (13, 4864, 4),
            (600, 576, 8),
            (300, 896, 32),
            (0, 64, 4),
        ];
        let mut rng = Rng(0x5EED_0F08);
        for (rows, k, per) in shapes {
            let palettes = rows.div_ceil(per);
            let table: Vec<f16> = (0..256 * palettes)
                .map(|_| f16::from_bits(rng.next() as u16 & 0x7BFF))
                .collect();
            let indices: Vec<u8> = (0..rows * k).map(|_| rng.next() as u8).collect();
            let halves: Vec<f16> = (0..rows * k)
                .map(|e| table[256 * (e / k / per) + indices[e] as usize])
                .collect();
            let x = rng.floats(k, 2.0);
            let mut want = vec![0.0f32; rows];
            linalg::matvec_f16(&mut want, &halves, &x).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            for threads in [0, 1, 2, 3] {
                let mut got = vec![f32::NAN; rows];
                let taken = if threads == 0 {
                    matvec8(&mut got, &x, &indices, &table, per)
                } else {
                    let team = Arc::new(Team::new(threads).unwrap());
                    team::with_team(&team, || matvec8(&mut got, &x, &indices, &table, per))
                };
                if !taken {
                    #[cfg(target_arch = "x86_64")]
                    assert!(!avx512::pipelines(), "declined {rows}×{k} on a VBMI CPU");
                    continue;
                }
                assert_eq!(
                    bits(&got),
                    bits(&want),
                    "{rows}×{k}, {per} rows a palette, team {threads}"
                );
            }
        }
        // declined: rows of a length not a multiple of 32, too few indices, too few palettes
        let (x, mut out) = (vec![1.0f32; 48], vec![0.0f32; 4]);
        assert!(!matvec8(&mut out, &x, &[0; 4 * 48], &[f16::ZERO; 256], 4));
        let x = vec![1.0f32; 64];
        assert!(!matvec8(
            &mut out,
            &x,
            &[0; 4 * 64 - 1],
            &[f16::ZERO; 256],
            4
        ));
        assert!(!matvec8(&mut out, &x, &[0; 4 * 64], &[f16::ZERO; 256], 2));
    }
}
