//! 8-bit rows formed by splitting (rows marked [`ShiftScale::split`]): each fp16 rounding of
//! the f32 kernels of `quant_avx512.rs` done in three f32 operations on either FP port
//! instead of a `vcvtps2ph` + `vcvtph2ps` round trip (4 uops, 2 of them on port 5, where the
//! widening of the codes already runs), for a CPU without AVX512-FP16. The same bits.
//!
//! Why the values are the same ([`super::super::split_product`], [`super::super::split_round`]
//! are the scalar forms, checked against `f16::from_f32` by the tests and over every pair by
//! `examples/split_exhaustive.rs`): the f32 kernels form `r16(f32(v) · s)` or
//! `r16(r16(f32(v) − o) · s)`. Veltkamp's splitting of an f32 value `d` with `C = 2^13 + 1`,
//! `γ = fl(C · d)`, `γ − fl(γ − d)`, is `d` rounded to nearest even at 11 significant bits;
//! that is fp16's rounding `r16` when the result is zero or an fp16 normal below 65520, which
//! [`super::super::splits`] proved at load for every block of the row. For the product,
//! `t · s` (`t` an fp16 value) is exact in f32, so `fl(C · (t · s)) = fl(t · (C · s))` with
//! `C · s` exact (formed once per block), and `fl(γ − t · s)` is one fused multiply-add:
//! 3 operations from `t`. For `v − o` the f32 difference is rounded (as by the f32 kernels;
//! `quant_fp16.rs` shows this rounding never changes `r16` of it), then split.
//!
//! Accumulation is that of the f32 kernels (`dot_rows`): the same values, the same FMAs.

use std::arch::x86_64::*;

use super::super::{Offsets, Row, Split, SPLITTER};
use super::{dot_rows, scales, Kernel, Parts, NO_OFFSET, ROUNDED};

/// An integer offset `o` with `v − o` exact in fp16 ([`Split::Exact`]): subtracted, not rounded.
const EXACT: u8 = 3;

/// A row's split level: [`Split::No`] unless it is 8-bit data whose offsets (if any) are
/// fp16 values rounding after the subtraction, the rows the split kernels take.
#[inline]
pub(super) fn level(row: &Row) -> Split {
    match row {
        Row::Bytes { how, .. }
            if how.round_shift && how.offsets.is_none_or(|o| matches!(o, Offsets::F16(_))) =>
        {
            how.split
        }
        _ => Split::No,
    }
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

/// The split kernels of `row`'s layout, `[Split::Rounds, Split::Exact]`, for rows the split
/// kernels take (8-bit data, fp16 or no offsets rounded after the subtraction); else `None`.
pub(super) fn kernels<const R: usize>(row: &Row) -> Option<[Kernel<R>; 2]> {
    let Row::Bytes { how, per, .. } = row else {
        return None;
    };
    if !how.round_shift || how.offsets.is_some_and(|o| !matches!(o, Offsets::F16(_))) {
        return None;
    }
    let whole = per.is_multiple_of(32);
    Some(match (how.signed, how.offsets.is_some(), whole) {
        (true, false, true) => [dot_bytes::<R, true, NO_OFFSET, true>; 2],
        (true, false, false) => [dot_bytes::<R, true, NO_OFFSET, false>; 2],
        (false, false, true) => [dot_bytes::<R, false, NO_OFFSET, true>; 2],
        (false, false, false) => [dot_bytes::<R, false, NO_OFFSET, false>; 2],
        (true, true, true) => [
            dot_bytes::<R, true, ROUNDED, true>,
            dot_bytes::<R, true, EXACT, true>,
        ],
        (true, true, false) => [
            dot_bytes::<R, true, ROUNDED, false>,
            dot_bytes::<R, true, EXACT, false>,
        ],
        (false, true, true) => [
            dot_bytes::<R, false, ROUNDED, true>,
            dot_bytes::<R, false, EXACT, true>,
        ],
        (false, true, false) => [
            dot_bytes::<R, false, ROUNDED, false>,
            dot_bytes::<R, false, EXACT, false>,
        ],
    })
}

/// A block's parameters, broadcast: scale `s`, `C · s` (exact), fp16 offset `o` widened.
#[derive(Clone, Copy)]
struct Block {
    s: __m512,
    sc: __m512,
    o: __m512,
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
    let k = x.len();
    let (mut run, blocks) = ([_mm512_setzero_ps(); R], k / per);
    // `C · s` and the widened offsets of the next 16 blocks of each row, loaded with the
    // scales' run (every 16th block), a lane picked per block
    let (mut sc_run, mut o_run) = ([_mm512_setzero_ps(); R], [_mm512_setzero_ps(); R]);
    let c = _mm512_set1_ps(SPLITTER);
    dot_rows::<Block, R, WHOLE, 32>(
        p,
        k,
        per,
        x,
        |b| {
            // SAFETY: every row's scales (and fp16 offsets unless NO_OFFSET) hold `blocks`
            // blocks, `b < blocks`, blocks asked for in order (`walk`).
            let s = unsafe { scales(p, blocks, b, &mut run) };
            if b.is_multiple_of(16) {
                let left = (blocks - b).min(16);
                let mask = (((1u32 << left) - 1) & 0xFFFF) as __mmask16;
                for r in 0..R {
                    sc_run[r] = _mm512_mul_ps(run[r], c);
                    if OFF != NO_OFFSET {
                        // SAFETY: as above: offsets `b..b + left` of the row exist (a
                        // masked load reads no others); fp16 widened exactly
                        let bits = unsafe {
                            _mm256_maskz_loadu_epi16(mask, p[r].offsets16.add(b) as *const i16)
                        };
                        o_run[r] = _mm512_cvtph_ps(bits);
                    }
                }
            }
            let lane = _mm512_set1_epi32((b % 16) as i32);
            std::array::from_fn(|r| Block {
                s: s[r],
                sc: _mm512_permutexvar_ps(lane, sc_run[r]),
                o: if OFF != NO_OFFSET {
                    _mm512_permutexvar_ps(lane, o_run[r])
                } else {
                    _mm512_setzero_ps()
                },
            })
        },
        |r, q, j| {
            // SAFETY: row `r` has `k` codes and `j + 16 <= k` (`walk`).
            let raw = unsafe { _mm_loadu_si128(p[r].codes.add(j) as *const __m128i) };
            let ints = if SIGNED {
                _mm512_cvtepi8_epi32(raw)
            } else {
                _mm512_cvtepu8_epi32(raw)
            };
            let v = _mm512_cvtepi32_ps(ints);
            let t = match OFF {
                NO_OFFSET => v,
                // exact: an integer difference of at most 2048 (`Split::Exact`)
                EXACT => _mm512_sub_ps(v, q.o),
                _ => round(_mm512_sub_ps(v, q.o)),
            };
            product(t, q)
        },
    )
}
