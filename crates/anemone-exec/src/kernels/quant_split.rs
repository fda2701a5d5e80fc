//! 8-bit rows and 4-bit shift-scale rows formed by splitting (rows marked
//! [`ShiftScale::split`]): each fp16 rounding of the f32 kernels of `quant_avx512.rs` done in
//! three f32 operations on either FP port instead of a `vcvtps2ph` + `vcvtph2ps` round trip
//! (4 uops, 2 of them on port 5, where the widening of the codes, or the table lookups,
//! already run), for a CPU without AVX512-FP16. The same bits. A 4-bit row's block table
//! `r16(r16(v − o) · s)` over its 16 codes is formed so ([`dot_int4`]), its block parameters
//! read as memory-broadcast operands (no per-block lane permute); the lookups and sums are
//! `quant_avx512.rs`'s. The load-time rule is the 8-bit one over the 4-bit data range
//! (`quant::split_level_of`).
//!
//! Why the values are the same ([`super::super::split_product`], [`super::super::split_round`]
//! are the scalar forms, checked against `f16::from_f32` by the tests and over every pair by
//! `examples/split_exhaustive.rs`): the f32 kernels form `r16(f32(v) · s)` or
//! `r16(r16(f32(v) − o) · s)`. Veltkamp's splitting of an f32 value `d` with `C = 2^13 + 1`,
//! `γ = fl(C · d)`, `γ − fl(γ − d)`, is `d` rounded to nearest even at 11 significant bits;
//! that is fp16's rounding `r16` when the result is zero or an fp16 normal below 65520, or
//! already an fp16 value (a subnormal product of integer data and an fp16 scale, a multiple of
//! 2^-24), which [`super::super::splits`] proved at load for every block of the row. For the product,
//! `t · s` (`t` an fp16 value) is exact in f32, so `fl(C · (t · s)) = fl(t · (C · s))` with
//! `C · s` exact (formed once per block), and `fl(γ − t · s)` is one fused multiply-add:
//! 3 operations from `t`. For `v − o` the f32 difference is rounded (as by the f32 kernels;
//! `quant_fp16.rs` shows this rounding never changes `r16` of it), then split.
//!
//! Accumulation is that of the f32 kernels (`dot_rows`): the same values, the same FMAs.

use std::arch::x86_64::*;

use super::super::levels::SPLITTER;
use super::super::{Offsets, Row, ShiftScale, Split, Tables};
use super::{dot_rows, nibble_indices, run_lane, Kernel, Parts, Run, NO_OFFSET, ROUNDED};

/// An integer offset `o` with `v − o` exact in fp16 ([`Split::Exact`]): subtracted, not rounded.
const EXACT: u8 = 3;

/// The shift-scale parameters of a row the split kernels take: 8-bit data or 4-bit data
/// (int4 / uint4 tables), fp16 or no offsets, rounded after the subtraction.
#[inline]
fn taken<'a>(row: &'a Row) -> Option<&'a ShiftScale<'a>> {
    let how = match row {
        Row::Bytes { how, .. }
        | Row::Nibbles {
            tables: Tables::ShiftScale(how),
            ..
        } => how,
        Row::Nibbles { .. } => return None,
    };
    (how.round_shift && how.offsets.is_none_or(|o| matches!(o, Offsets::F16(_)))).then_some(how)
}

/// A row's split level: [`Split::No`] unless it is a row the split kernels take (8-bit or
/// 4-bit data whose offsets, if any, are fp16 values rounding after the subtraction).
#[inline]
pub(super) fn level(row: &Row) -> Split {
    taken(row).map_or(Split::No, |how| how.split)
}

/// The kernel of [`kernels`] for rows of least level `level` (`None` for `Split::No`).
#[inline]
pub(super) fn pick<const R: usize>(level: Split, k: Option<[Kernel<R>; 2]>) -> Option<Kernel<R>> {
    match level {
        Split::No => None,
        Split::Rounds => k.map(|k| k[0]),
        Split::Exact => k.map(|k| k[1]),
    }
}

/// Calls `$f::<R, SIGNED, OFF, WHOLE>` for the split layouts: `[Split::Rounds, Split::Exact]`.
macro_rules! split_layouts {
    ($f:ident, $r:ident, $how:expr, $whole:expr) => {
        match ($how.signed, $how.offsets.is_some(), $whole) {
            (true, false, true) => [$f::<$r, true, NO_OFFSET, true>; 2],
            (true, false, false) => [$f::<$r, true, NO_OFFSET, false>; 2],
            (false, false, true) => [$f::<$r, false, NO_OFFSET, true>; 2],
            (false, false, false) => [$f::<$r, false, NO_OFFSET, false>; 2],
            (true, true, true) => [$f::<$r, true, ROUNDED, true>, $f::<$r, true, EXACT, true>],
            (true, true, false) => [$f::<$r, true, ROUNDED, false>, $f::<$r, true, EXACT, false>],
            (false, true, true) => [$f::<$r, false, ROUNDED, true>, $f::<$r, false, EXACT, true>],
            (false, true, false) => [
                $f::<$r, false, ROUNDED, false>,
                $f::<$r, false, EXACT, false>,
            ],
        }
    };
}

/// The split kernels of `row`'s layout, `[Split::Rounds, Split::Exact]`, for rows the split
/// kernels take ([`level`]: 8-bit or 4-bit data, fp16 or no offsets rounded after the
/// subtraction); else `None`.
pub(super) fn kernels<const R: usize>(row: &Row) -> Option<[Kernel<R>; 2]> {
    let how = taken(row)?;
    let whole = row.per().is_multiple_of(32);
    Some(match row {
        Row::Bytes { .. } => split_layouts!(dot_bytes, R, how, whole),
        Row::Nibbles { .. } => split_layouts!(dot_int4, R, how, whole),
    })
}

/// A block's parameters, broadcast: scale `s`, `C · s` (exact), fp16 offset `o` widened.
#[derive(Clone, Copy)]
struct Block {
    s: __m512,
    sc: __m512,
    o: __m512,
}

/// Block `i` of a row's [`Run`], broadcast (memory-broadcast operands: no lane permute).
#[inline]
#[target_feature(enable = "avx512f")]
fn block(run: &Run, i: usize) -> Block {
    Block {
        s: _mm512_set1_ps(run.s[i]),
        sc: _mm512_set1_ps(run.sc[i]),
        o: _mm512_set1_ps(run.o[i]),
    }
}

/// `r16(t · s)` for fp16 values `t` whose products with the block's scale pass `splits`.
#[inline]
#[target_feature(enable = "avx512f,fma")]
fn product(t: __m512, p: &Block) -> __m512 {
    let g = _mm512_mul_ps(t, p.sc);
    // fl(γ − t·s): t·s exact, so the fused −(t·s) + γ rounds once, as the f32 subtraction
    let d = _mm512_fnmadd_ps(t, p.s, g);
    _mm512_sub_ps(g, d)
}

/// `r16(d)` for f32 differences `d` that are zero or round to fp16 normals below 65520.
#[inline]
#[target_feature(enable = "avx512f")]
fn round(d: __m512) -> __m512 {
    let g = _mm512_mul_ps(d, _mm512_set1_ps(SPLITTER));
    _mm512_sub_ps(g, _mm512_sub_ps(g, d))
}

/// `r16(v − o)` of data values `v` with the block's offset, as the f32 kernels form it: `v`
/// without an offset, the exact difference of an integer one within 2048 (`Split::Exact`), else
/// the difference rounded by splitting.
#[inline]
#[target_feature(enable = "avx512f")]
fn shifted<const OFF: u8>(v: __m512, q: &Block) -> __m512 {
    match OFF {
        NO_OFFSET => v,
        EXACT => _mm512_sub_ps(v, q.o),
        _ => round(_mm512_sub_ps(v, q.o)),
    }
}

/// `dot_rows` with each block's parameters read from the rows' [`Run`]s (as memory-broadcast
/// operands) and turned into what a chunk needs by `per_block` (the parameters themselves, or
/// a 4-bit row's table).
///
/// # Safety
/// As `dot_rows`, and every row's scales (and fp16 offsets unless `OFF == NO_OFFSET`) hold
/// `x.len() / per` blocks.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
unsafe fn split_rows<
    P: Copy,
    const R: usize,
    const OFF: u8,
    const WHOLE: bool,
    const BYTES32: usize,
>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
    per_block: impl Fn(Block) -> P,
    vals: impl Fn(usize, &P, usize) -> __m512,
) -> [f32; R] {
    let (k, mut runs) = (x.len(), [Run::ZERO; R]);
    let blocks = k / per;
    dot_rows::<P, R, WHOLE, BYTES32>(
        p,
        k,
        per,
        x,
        |b| {
            // SAFETY: every row's scales (and fp16 offsets unless NO_OFFSET) hold `blocks`
            // blocks and `b < blocks`, blocks asked for in order (`walk`)
            let lane = unsafe { run_lane::<R, OFF>(p, blocks, b, &mut runs) };
            std::array::from_fn(|r| per_block(block(&runs[r], lane)))
        },
        vals,
    )
}

/// The dots of `R` rows with `x` (`k = x.len()` columns, blocks of `per`), each row's values
/// those of `quant_avx512.rs`'s `dot_bytes`, summed as it sums them.
///
/// # Safety
/// As `dot` of `quant_avx512.rs` for rows of 8-bit data of one layout, with fp16 offsets
/// (non-null `offsets16`) unless `OFF == NO_OFFSET`. For the values to be those of the f32
/// kernels, every row's level ([`level`]) must be `Split::Exact` for `OFF == EXACT`, else not
/// `Split::No`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn dot_bytes<
    const R: usize,
    const SIGNED: bool,
    const OFF: u8,
    const WHOLE: bool,
>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    split_rows::<Block, R, OFF, WHOLE, 32>(
        p,
        x,
        per,
        |q| q,
        |r, q, j| {
            // SAFETY: row `r` has `k` codes and `j + 16 <= k` (`walk`).
            let raw = unsafe { _mm_loadu_si128(p[r].codes.add(j) as *const __m128i) };
            let ints = if SIGNED {
                _mm512_cvtepi8_epi32(raw)
            } else {
                _mm512_cvtepu8_epi32(raw)
            };
            product(shifted::<OFF>(_mm512_cvtepi32_ps(ints), q), q)
        },
    )
}

/// The 16 data values a 4-bit code indexes (int4: codes 8..=15 are −8..=−1), as f32.
#[inline]
#[target_feature(enable = "avx512f")]
fn int4_codes<const SIGNED: bool>() -> __m512 {
    if SIGNED {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0, -2.0, -1.0,
        )
    } else {
        _mm512_setr_ps(
            0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0, 14.0, 15.0,
        )
    }
}

/// The dots of `R` rows of 4-bit data with `x` (`k = x.len()` columns, blocks of `per`), each
/// block's 16-entry table that of `quant_avx512.rs`'s `dot_int4` (`r16(r16(v − o) · s)`, or
/// `r16(v · s)`) formed by splitting, looked up and summed as it sums them.
///
/// # Safety
/// As `dot` of `quant_avx512.rs` for rows of 4-bit shift-scale data of one layout, with fp16
/// offsets (non-null `offsets16`) unless `OFF == NO_OFFSET`. For the values to be those of
/// the f32 kernels, every row's level ([`level`]) must be `Split::Exact` for `OFF == EXACT`,
/// else not `Split::No`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx2,fma,f16c")]
pub(super) unsafe fn dot_int4<
    const R: usize,
    const SIGNED: bool,
    const OFF: u8,
    const WHOLE: bool,
>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    let codes = int4_codes::<SIGNED>();
    split_rows::<__m512, R, OFF, WHOLE, 16>(
        p,
        x,
        per,
        |q| product(shifted::<OFF>(codes, &q), &q),
        // SAFETY: row `r` has `k / 2` code bytes and `j + 16 <= k` (`walk`): 8 bytes at `j / 2`
        |r, t, j| _mm512_permutexvar_ps(unsafe { nibble_indices(p[r].codes.add(j / 2)) }, *t),
    )
}
