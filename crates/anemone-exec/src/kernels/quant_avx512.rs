//! The AVX-512 kernels of [`super`] (`quant.rs`): `R` rows of one weight per pass, sharing the
//! loads of `x`; each row keeps its own two accumulators and the fp16 dot's order, so a row's
//! value never depends on which rows share its pass.
//!
//! Invariants: element `32c + 16h + 8a + l` of a row goes to accumulator register `h` (a 16-lane
//! register holding the fp16 dot's accumulators `2h` and `2h + 1` side by side), lane `8a + l`,
//! by one fused multiply-add per 16 elements in column order; [`finish`] sums them as the fp16
//! dot's end does. A block's parameters (scale, offset, or its 16-entry table) are formed once
//! per block and row, before its columns.

use std::arch::x86_64::*;

use super::{Offsets, Row, ShiftScale, Tables};

/// How a block's offset enters: none, rounded to fp16 after the subtraction, or fp32
/// (promoting, not rounded).
pub(super) const NO_OFFSET: u8 = 0;
pub(super) const ROUNDED: u8 = 1;
pub(super) const PROMOTES: u8 = 2;

pub(super) fn offset_kind(how: &ShiftScale) -> u8 {
    match (how.offsets, how.round_shift) {
        (None, _) => NO_OFFSET,
        (Some(_), true) => ROUNDED,
        (Some(_), false) => PROMOTES,
    }
}

/// Passes ahead whose data a pass prefetches (a weight streamed from memory: 2 beat 1 and 4).
const AHEAD: usize = 2;

/// Prefetches (into L1) the codes [`AHEAD`] passes of `R` rows on that match bytes
/// `at..at + bytes` of this pass's rows: a pass's rows are consecutive rows of one weight (a
/// `Weight`'s; the usual case), their codes one run of `R · row_bytes` bytes from `first`,
/// read at the same pace. Only a hint: where rows are not consecutive, or past the data,
/// it fetches useless lines (a prefetch never faults; the address is never dereferenced).
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_codes<const R: usize>(first: *const u8, row_bytes: usize, at: usize, bytes: usize) {
    let base = first.wrapping_add(AHEAD * R * row_bytes + R * at);
    let mut o = 0;
    while o < R * bytes {
        // a prefetch does not access memory architecturally and never faults
        _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(o) as *const i8);
        o += 64;
    }
}

/// Prefetches the per-block parameters (scales, offsets, palettes) [`AHEAD`] passes of `R`
/// rows of `blocks` blocks on, assuming (a hint, as [`prefetch_codes`]) consecutive rows of
/// one weight whose parameters follow each other row by row.
#[inline]
#[target_feature(enable = "avx512f")]
fn prefetch_params<const R: usize>(p: &Parts, blocks: usize) {
    let ahead = |ptr: *const u8, per_block: usize| {
        if ptr.is_null() {
            return;
        }
        let n = R * blocks * per_block;
        let base = ptr.wrapping_add(AHEAD * n);
        let mut o = 0;
        while o < n {
            _mm_prefetch::<_MM_HINT_T0>(base.wrapping_add(o) as *const i8);
            o += 64;
        }
    };
    ahead(p.scales, 2);
    ahead(p.offsets as *const u8, 4);
    ahead(p.offsets16 as *const u8, 2);
    ahead(p.palettes as *const u8, 32);
}

/// fp16 rounding of 16 values (nearest even, as `f16::from_f32`).
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn r16(v: __m512) -> __m512 {
    _mm512_cvtph_ps(_mm512_cvtps_ph::<
        { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
    >(v))
}

/// A block's scale and offset, broadcast.
#[derive(Clone, Copy)]
struct Params {
    s: __m512,
    o: __m512,
}

/// The raw parts of one row (pointers into the slices of a [`Row`] the caller checked).
#[derive(Clone, Copy)]
struct Parts {
    codes: *const u8,
    scales: *const u8,
    /// f32 offsets, or null.
    offsets: *const f32,
    /// fp16 offsets (bit patterns), or null.
    offsets16: *const u16,
    palettes: *const u16,
}

fn parts(row: &Row) -> Parts {
    let mut p = Parts {
        codes: std::ptr::null(),
        scales: std::ptr::null(),
        offsets: std::ptr::null(),
        offsets16: std::ptr::null(),
        palettes: std::ptr::null(),
    };
    let mut how = |h: &ShiftScale| {
        p.scales = h.scales.as_ptr();
        match h.offsets {
            Some(Offsets::F32(o)) => p.offsets = o.as_ptr(),
            Some(Offsets::F16(o)) => p.offsets16 = o.as_ptr(),
            None => {}
        }
    };
    match row {
        Row::Bytes { codes, how: h, .. } => {
            how(h);
            p.codes = codes.as_ptr();
        }
        Row::Nibbles { codes, tables, .. } => {
            match tables {
                Tables::Palettes(t) => p.palettes = t.as_ptr() as *const u16,
                Tables::ShiftScale(h) => how(h),
            }
            p.codes = codes.as_ptr();
        }
    }
    p
}

/// The widened fp16 scales of `R` rows for block `b` (of `blocks`), broadcast: every 16th block
/// loads and widens the next 16 scales of each row into `run` (a masked load past the last
/// block), the others pick lane `b % 16` of them. Blocks must be asked for in order from 0.
///
/// # Safety
/// Every row's scales hold `blocks` blocks and `b < blocks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn scales<const R: usize>(
    p: &[Parts; R],
    blocks: usize,
    b: usize,
    run: &mut [__m512; R],
) -> [__m512; R] {
    if b.is_multiple_of(16) {
        let left = (blocks - b).min(16);
        let mask = (((1u32 << left) - 1) & 0xFFFF) as __mmask16;
        for r in 0..R {
            let bits = _mm256_maskz_loadu_epi16(mask, p[r].scales.add(2 * b) as *const i16);
            run[r] = _mm512_cvtph_ps(bits);
        }
    }
    let lane = _mm512_set1_epi32((b % 16) as i32);
    let mut s = [_mm512_setzero_ps(); R];
    for r in 0..R {
        s[r] = _mm512_permutexvar_ps(lane, run[r]);
    }
    s
}

/// A row's parameters of its next 16 blocks (from every 16th block on), widened: scales `s`,
/// `C · s` (`C` the split kernels' [`super::levels::SPLITTER`]: exact, 11 + 14 bits) and
/// offsets `o`, read per block as memory-broadcast operands (no lane permute on port 5).
#[derive(Clone, Copy)]
#[repr(C, align(64))]
struct Run {
    s: [f32; 16],
    sc: [f32; 16],
    o: [f32; 16],
}

impl Run {
    const ZERO: Run = Run {
        s: [0.0; 16],
        sc: [0.0; 16],
        o: [0.0; 16],
    };

    /// Block `i`'s scale and offset, broadcast.
    #[inline]
    #[target_feature(enable = "avx512f")]
    fn params(&self, i: usize) -> Params {
        Params {
            s: _mm512_set1_ps(self.s[i]),
            o: _mm512_set1_ps(self.o[i]),
        }
    }
}

/// Block `b`'s lane in each row's [`Run`], refilling the runs at every 16th block with the
/// parameters of blocks `b..b + 16` (fewer at the end): scales widened, `C · s`, offsets
/// (fp16 ones widened exactly) unless `OFF == NO_OFFSET`. Blocks must be asked for in order
/// from 0.
///
/// # Safety
/// Every row's scales (and offsets, f32 or fp16, whichever is not null, unless
/// `OFF == NO_OFFSET`) hold `blocks` blocks and `b < blocks`: the masked loads read only
/// blocks `b..b + 16` that exist.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,f16c")]
unsafe fn run_lane<const R: usize, const OFF: u8>(
    p: &[Parts; R],
    blocks: usize,
    b: usize,
    runs: &mut [Run; R],
) -> usize {
    let lane = b % 16;
    if lane != 0 {
        return lane;
    }
    let left = (blocks - b).min(16);
    let mask = (((1u32 << left) - 1) & 0xFFFF) as __mmask16;
    let c = _mm512_set1_ps(super::levels::SPLITTER);
    for (r, run) in runs.iter_mut().enumerate() {
        let s = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
            mask,
            p[r].scales.add(2 * b) as *const i16,
        ));
        _mm512_store_ps(run.s.as_mut_ptr(), s);
        _mm512_store_ps(run.sc.as_mut_ptr(), _mm512_mul_ps(s, c));
        if OFF != NO_OFFSET {
            let o = if p[r].offsets16.is_null() {
                _mm512_maskz_loadu_ps(mask, p[r].offsets.add(b))
            } else {
                _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(
                    mask,
                    p[r].offsets16.add(b) as *const i16,
                ))
            };
            _mm512_store_ps(run.o.as_mut_ptr(), o);
        }
    }
    0
}

/// Block `b`'s parameters of a row: its widened scale `s` (from [`scales`]), its offset.
///
/// # Safety
/// For `OFF != NO_OFFSET`, the row's offsets (f32 or fp16, whichever is not null) hold
/// block `b`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,f16c")]
unsafe fn params<const OFF: u8>(p: &Parts, b: usize, s: __m512) -> Params {
    Params {
        s,
        o: if OFF == NO_OFFSET {
            _mm512_setzero_ps()
        } else if p.offsets16.is_null() {
            _mm512_set1_ps(*p.offsets.add(b))
        } else {
            // an fp16 offset widened exactly, broadcast
            _mm512_cvtph_ps(_mm256_set1_epi16(*p.offsets16.add(b) as i16))
        },
    }
}

/// `decompress`'s arithmetic on 16 data values `v` of a block.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
fn shift_scale<const OFF: u8>(v: __m512, p: Params) -> __m512 {
    match OFF {
        NO_OFFSET => r16(_mm512_mul_ps(v, p.s)),
        ROUNDED => r16(_mm512_mul_ps(r16(_mm512_sub_ps(v, p.o)), p.s)),
        _ => r16(_mm512_mul_ps(_mm512_sub_ps(v, p.o), p.s)),
    }
}

/// The values of the 16 bytes at `p` (a block with parameters `pb`).
///
/// # Safety
/// 16 bytes must be readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn byte_values<const SIGNED: bool, const OFF: u8>(p: *const u8, pb: Params) -> __m512 {
    let raw = _mm_loadu_si128(p as *const __m128i);
    let ints = if SIGNED {
        _mm512_cvtepi8_epi32(raw)
    } else {
        _mm512_cvtepu8_epi32(raw)
    };
    shift_scale::<OFF>(_mm512_cvtepi32_ps(ints), pb)
}

/// The 16-entry table of a block of an int4 / uint4 row (parameters `pb`): nibble `c` stands
/// for `c` (uint4) or `c` sign-extended (int4), formed as [`shift_scale`] forms data values.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn int4_table<const SIGNED: bool, const OFF: u8>(pb: Params) -> __m512 {
    let codes = if SIGNED {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
        )
    } else {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    };
    shift_scale::<OFF>(codes, pb)
}

/// The fp16 palette of block `b` as f32.
///
/// # Safety
/// The row's palettes hold block `b`.
#[inline]
#[target_feature(enable = "avx512f,f16c")]
unsafe fn palette(p: &Parts, b: usize) -> __m512 {
    _mm512_cvtph_ps(_mm256_loadu_si256(p.palettes.add(16 * b) as *const __m256i))
}

/// The nibbles of the 8 bytes at `p` (16 elements, low nibble first) as 16 table indices:
/// the 8 bytes broadcast to every qword, byte 0 of dword `l` taken from bit `4 l` of them
/// (a table lookup reads only the low 4 bits of an index).
///
/// # Safety
/// 8 bytes must be readable at `p`.
#[inline]
#[target_feature(enable = "avx512f,avx512vbmi")]
unsafe fn nibble_indices(p: *const u8) -> __m512i {
    let v = _mm512_set1_epi64((p as *const i64).read_unaligned());
    // per qword q: byte 0 ← bits 8q.., byte 4 ← bits 8q + 4.. (elements 2q and 2q + 1)
    let ctrl = _mm512_set_epi64(
        0x0000_003C_0000_0038,
        0x0000_0034_0000_0030,
        0x0000_002C_0000_0028,
        0x0000_0024_0000_0020,
        0x0000_001C_0000_0018,
        0x0000_0014_0000_0010,
        0x0000_000C_0000_0008,
        0x0000_0004_0000_0000,
    );
    _mm512_multishift_epi64_epi8(ctrl, v)
}

/// The fp16 dot's final sum of its accumulators (`a01` = accumulators 0 and 1 side by side,
/// `a23` = 2 and 3): `(acc0 + acc1) + (acc2 + acc3)`, then its lane order — the fp16 four-row
/// dot's own ([`crate::kernels::simd`]).
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
fn finish(a01: __m512, a23: __m512) -> f32 {
    crate::kernels::simd::avx512::reduce(a01, a23)
}

/// Walks `k` columns in blocks of `per`: `block(b)` once per block, before its columns, and
/// `chunk(j, high, p)` for every 16 columns `j..j + 16` in order (`high`: `j` is 16 mod 32, a
/// literal at each call so the caller's accumulator choice is static). `WHOLE`: `per` is a
/// multiple of 32 (else of 16, so a block may start at `j` or `j + 16`). Generic over closures,
/// inlined into its caller, so the closures compile with the caller's target features.
///
/// # Safety
/// `k` is a multiple of 32 and `per` a non-zero multiple of 16 (of 32 if `WHOLE`) dividing it.
#[inline]
#[target_feature(enable = "avx512f")]
unsafe fn walk<P: Copy, const WHOLE: bool>(
    k: usize,
    per: usize,
    mut block: impl FnMut(usize) -> P,
    mut chunk: impl FnMut(usize, bool, &P),
) {
    let mut j = 0usize;
    if WHOLE {
        let mut b = 0usize;
        while j < k {
            let p = block(b);
            let end = j + per;
            while j < end {
                chunk(j, false, &p);
                chunk(j + 16, true, &p);
                j += 32;
            }
            b += 1;
        }
    } else if k > 0 {
        let (mut p, mut b, mut next) = (block(0), 1usize, per);
        while j < k {
            if j == next {
                p = block(b);
                b += 1;
                next += per;
            }
            chunk(j, false, &p);
            if j + 16 == next {
                p = block(b);
                b += 1;
                next += per;
            }
            chunk(j + 16, true, &p);
            j += 32;
        }
    }
}

/// The dots of `R` rows with `x`: `block(b)` forms every row's parameters of block `b`,
/// `vals(r, p, j)` the 16 values of row `r` at column `j`. The codes of `parts`
/// (`BYTES32` bytes per 32 columns) and their parameters are prefetched [`AHEAD`] passes on.
///
/// # Safety
/// As [`walk`], and `x` holds `k` values.
#[inline]
#[target_feature(enable = "avx512f,avx2,fma,f16c")]
unsafe fn dot_rows<P: Copy, const R: usize, const WHOLE: bool, const BYTES32: usize>(
    parts: &[Parts; R],
    k: usize,
    per: usize,
    x: &[f32],
    block: impl FnMut(usize) -> [P; R],
    vals: impl Fn(usize, &P, usize) -> __m512,
) -> [f32; R] {
    let mut a01 = [_mm512_setzero_ps(); R];
    let mut a23 = [_mm512_setzero_ps(); R];
    let px = x.as_ptr();
    let (first, row_bytes) = (parts[0].codes, k / 32 * BYTES32);
    prefetch_params::<R>(&parts[0], k / per);
    walk::<[P; R], WHOLE>(k, per, block, |j, high, p| {
        if !high {
            prefetch_codes::<R>(first, row_bytes, j / 32 * BYTES32, BYTES32);
        }
        let xv = _mm512_loadu_ps(px.add(j));
        for r in 0..R {
            let w = vals(r, &p[r], j);
            if high {
                a23[r] = _mm512_fmadd_ps(w, xv, a23[r]);
            } else {
                a01[r] = _mm512_fmadd_ps(w, xv, a01[r]);
            }
        }
    });
    let mut sums = [0.0f32; R];
    for r in 0..R {
        sums[r] = finish(a01[r], a23[r]);
    }
    sums
}

/// `$f::<R, SIGNED, OFF, WHOLE>` for a shift-scale layout, as a function pointer of type `$ty`.
macro_rules! layout_fn {
    ($f:ident, $r:ident, $how:expr, $whole:expr, $ty:ty) => {{
        let k: $ty = match ($how.signed, offset_kind($how), $whole) {
            (true, NO_OFFSET, true) => $f::<$r, true, NO_OFFSET, true>,
            (true, NO_OFFSET, false) => $f::<$r, true, NO_OFFSET, false>,
            (true, ROUNDED, true) => $f::<$r, true, ROUNDED, true>,
            (true, ROUNDED, false) => $f::<$r, true, ROUNDED, false>,
            (true, _, true) => $f::<$r, true, PROMOTES, true>,
            (true, _, false) => $f::<$r, true, PROMOTES, false>,
            (false, NO_OFFSET, true) => $f::<$r, false, NO_OFFSET, true>,
            (false, NO_OFFSET, false) => $f::<$r, false, NO_OFFSET, false>,
            (false, ROUNDED, true) => $f::<$r, false, ROUNDED, true>,
            (false, ROUNDED, false) => $f::<$r, false, ROUNDED, false>,
            (false, _, true) => $f::<$r, false, PROMOTES, true>,
            (false, _, false) => $f::<$r, false, PROMOTES, false>,
        };
        k
    }};
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn dot_bytes<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    let k = x.len();
    let (mut runs, blocks) = ([Run::ZERO; R], k / per);
    dot_rows::<Params, R, WHOLE, 32>(
        p,
        k,
        per,
        x,
        |b| {
            let lane = run_lane::<R, OFF>(p, blocks, b, &mut runs);
            std::array::from_fn(|r| runs[r].params(lane))
        },
        |r, pb, j| byte_values::<SIGNED, OFF>(p[r].codes.add(j), *pb),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn dot_int4<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    let k = x.len();
    let (mut runs, blocks) = ([Run::ZERO; R], k / per);
    dot_rows::<__m512, R, WHOLE, 16>(
        p,
        k,
        per,
        x,
        |b| {
            let lane = run_lane::<R, OFF>(p, blocks, b, &mut runs);
            std::array::from_fn(|r| int4_table::<SIGNED, OFF>(runs[r].params(lane)))
        },
        |r, t, j| _mm512_permutexvar_ps(nibble_indices(p[r].codes.add(j / 2)), *t),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn dot_palettes<const R: usize, const WHOLE: bool>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    dot_rows::<__m512, R, WHOLE, 16>(
        p,
        x.len(),
        per,
        x,
        |b| std::array::from_fn(|r| palette(&p[r], b)),
        |r, t, j| _mm512_permutexvar_ps(nibble_indices(p[r].codes.add(j / 2)), *t),
    )
}

/// The dots of `rows` with `x`.
///
/// # Safety
/// Every row is `covered()`, of one layout ([`super::Row::same_layout`]) and of `x.len()`
/// elements, the CPU has AVX-512F/BW/VL/VBMI, AVX2, FMA and F16C, and AVX512-FP16 if `fp16`
/// (8-bit rows then take `quant_fp16.rs`, the same values and sums).
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn dot<const R: usize>(rows: &[Row; R], x: &[f32], fp16: bool) -> [f32; R] {
    let p: [Parts; R] = std::array::from_fn(|r| parts(&rows[r]));
    let per = rows[0].per();
    let whole = per.is_multiple_of(32);
    match &rows[0] {
        Row::Bytes { how, .. } => {
            if fp16 && fp16::takes(how) {
                // SAFETY: the caller's contract, and `fp16` only where the CPU has AVX512-FP16.
                if let Some(d) = fp16::dot(rows, &p, x) {
                    return d;
                }
            }
            layout_fn!(dot_bytes, R, how, whole, Kernel<R>)(&p, x, per)
        }
        Row::Nibbles {
            tables: Tables::ShiftScale(how),
            ..
        } => {
            if fp16 && fp16::takes(how) {
                // SAFETY: as above.
                if let Some(d) = fp16::dot(rows, &p, x) {
                    return d;
                }
            }
            layout_fn!(dot_int4, R, how, whole, Kernel<R>)(&p, x, per)
        }
        Row::Nibbles {
            tables: Tables::Palettes(_),
            ..
        } => match whole {
            true => dot_palettes::<R, true>(&p, x, per),
            false => dot_palettes::<R, false>(&p, x, per),
        },
    }
}

/// A kernel of `R` rows of one layout: `(parts, x, per) -> dots`.
type Kernel<const R: usize> = unsafe fn(&[Parts; R], &[f32], usize) -> [f32; R];

/// The kernel [`dot`] runs for rows of `row`'s layout, where it is one function of the layout
/// alone (no fallback decided by the values: everywhere but some 8-bit and 4-bit layouts on a
/// CPU with AVX512-FP16); else `None`.
fn kernel<const R: usize>(row: &Row, fp16: bool) -> Option<Kernel<R>> {
    let whole = row.per().is_multiple_of(32);
    let f16_offsets = |how: &ShiftScale| how.offsets.is_none_or(|o| o.is_f16());
    Some(match row {
        Row::Bytes { how, .. } if fp16 && whole && f16_offsets(how) => {
            match (how.signed, how.offsets.is_some()) {
                (true, false) => fp16::dot_bytes_at::<R, true, NO_OFFSET>,
                (true, true) => fp16::dot_bytes_at::<R, true, ROUNDED>,
                (false, false) => fp16::dot_bytes_at::<R, false, NO_OFFSET>,
                (false, true) => fp16::dot_bytes_at::<R, false, ROUNDED>,
            }
        }
        Row::Nibbles {
            tables: Tables::ShiftScale(how),
            ..
        } if fp16 && f16_offsets(how) => match (how.signed, how.offsets.is_some(), whole) {
            (true, false, true) => fp16::dot_int4::<R, true, NO_OFFSET, true>,
            (true, false, false) => fp16::dot_int4::<R, true, NO_OFFSET, false>,
            (true, true, true) => fp16::dot_int4::<R, true, ROUNDED, true>,
            (true, true, false) => fp16::dot_int4::<R, true, ROUNDED, false>,
            (false, false, true) => fp16::dot_int4::<R, false, NO_OFFSET, true>,
            (false, false, false) => fp16::dot_int4::<R, false, NO_OFFSET, false>,
            (false, true, true) => fp16::dot_int4::<R, false, ROUNDED, true>,
            (false, true, false) => fp16::dot_int4::<R, false, ROUNDED, false>,
        },
        Row::Bytes { how, .. } if !fp16 => layout_fn!(dot_bytes, R, how, whole, Kernel<R>),
        Row::Nibbles {
            tables: Tables::ShiftScale(how),
            ..
        } if !fp16 => layout_fn!(dot_int4, R, how, whole, Kernel<R>),
        Row::Nibbles {
            tables: Tables::Palettes(_),
            ..
        } => match whole {
            true => dot_palettes::<R, true>,
            false => dot_palettes::<R, false>,
        },
        _ => return None,
    })
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn expand_rows<P: Copy, const WHOLE: bool>(
    k: usize,
    per: usize,
    out: &mut [f32],
    block: impl FnMut(usize) -> P,
    vals: impl Fn(&P, usize) -> __m512,
) {
    let po = out.as_mut_ptr();
    walk::<P, WHOLE>(k, per, block, |j, _, p| {
        _mm512_storeu_ps(po.add(j), vals(p, j))
    });
}

/// An expansion of one row of a layout: `(parts, k, per, out)`.
type Expand = unsafe fn(&Parts, usize, usize, &mut [f32]);

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn expand_bytes<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &Parts,
    k: usize,
    per: usize,
    out: &mut [f32],
) {
    let (mut run, blocks) = ([_mm512_setzero_ps(); 1], k / per);
    expand_rows::<Params, WHOLE>(
        k,
        per,
        out,
        |b| params::<OFF>(p, b, scales(&[*p], blocks, b, &mut run)[0]),
        |pb, j| byte_values::<SIGNED, OFF>(p.codes.add(j), *pb),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn expand_int4<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &Parts,
    k: usize,
    per: usize,
    out: &mut [f32],
) {
    let (mut run, blocks) = ([_mm512_setzero_ps(); 1], k / per);
    expand_rows::<__m512, WHOLE>(
        k,
        per,
        out,
        |b| int4_table::<SIGNED, OFF>(params::<OFF>(p, b, scales(&[*p], blocks, b, &mut run)[0])),
        |t, j| _mm512_permutexvar_ps(nibble_indices(p.codes.add(j / 2)), *t),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn expand_palettes<const WHOLE: bool>(p: &Parts, k: usize, per: usize, out: &mut [f32]) {
    expand_rows::<__m512, WHOLE>(
        k,
        per,
        out,
        |b| palette(p, b),
        |t, j| _mm512_permutexvar_ps(nibble_indices(p.codes.add(j / 2)), *t),
    )
}

/// Writes the row's values (fp16 values as f32) into `out`.
///
/// # Safety
/// `row.covered()`, `out.len() == row.len()`, the CPU has AVX-512F/BW/VL/VBMI, AVX2, FMA and
/// F16C, and AVX512-FP16 if `fp16`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub unsafe fn expand(row: &Row, out: &mut [f32], fp16: bool) {
    let p = parts(row);
    let (k, per) = (out.len(), row.per());
    let whole = per.is_multiple_of(32);
    const ONE: usize = 1;
    match row {
        Row::Bytes { how, .. } => {
            // SAFETY: the caller's contract, and `fp16` only where the CPU has AVX512-FP16.
            if fp16 && fp16::takes(how) && fp16::expand(row, &p, out) {
                return;
            }
            layout_fn!(expand_bytes, ONE, how, whole, Expand)(&p, k, per, out)
        }
        Row::Nibbles {
            tables: Tables::ShiftScale(how),
            ..
        } => layout_fn!(expand_int4, ONE, how, whole, Expand)(&p, k, per, out),
        Row::Nibbles {
            tables: Tables::Palettes(_),
            ..
        } => match whole {
            true => expand_palettes::<true>(&p, k, per, out),
            false => expand_palettes::<false>(&p, k, per, out),
        },
    }
}

#[path = "quant_fp16.rs"]
pub(super) mod fp16;

#[path = "quant_split.rs"]
mod split;

#[path = "quant_rows.rs"]
mod rows;
pub use rows::{dots, dots_weight};
