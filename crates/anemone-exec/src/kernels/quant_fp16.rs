//! 8-bit rows dequantized in fp16 arithmetic (AVX512-FP16), 32 values per instruction, for a
//! CPU that has it; the same bits as the f32 kernels of `quant_avx512.rs`.
//!
//! Why the values are the same: the f32 kernels form `r16(f32(v) · s)` (no offset) or
//! `r16(r16(f32(v) − o) · s)` (an offset rounded after the subtraction), `v` an 8-bit integer,
//! `s` an fp16 scale, `o` an offset that is an fp16 value, `r16` rounding to nearest even.
//! - `f32(v)` and the `vcvtw2ph` of the sign- or zero-extended `v` are exact (|v| ≤ 255).
//! - `f32(a) · f32(s)` with `a`, `s` fp16 values is exact in f32: 11 × 11 significand bits fit
//!   in 24, and the exponents (2^-48 ..= 2^32) are normal f32 ones. So `r16` of it is the
//!   single correct rounding of the exact product, which `vmulph` returns (embedded rounding
//!   to nearest even; AVX512-FP16 arithmetic keeps fp16 subnormals regardless of FTZ/DAZ).
//! - `f32(v) − f32(o)` is not always exact in f32 (a tiny `o` beside a large `v`), but its
//!   f32 rounding never moves it across or onto an fp16 rounding boundary: an inexact f32
//!   difference needs `|o| < 2^(e−13)` with `2^e ≤ |v| < 2^(e+1)`, so the difference lies
//!   within `2^(e−13)` of the integer `v`, while the nearest fp16 midpoint is at least
//!   `2^(e−12)` away, far beyond the f32 error (`2^(e−24)`). So `r16` of the f32 difference
//!   is the correct rounding of the exact one, which `vsubph` returns. (Checked exhaustively
//!   over all `v` and all fp16 `o` by the tests.)
//! - NaN and infinity propagate alike (quieted payloads, the default NaN `0xFE00`).
//!
//! An offset not exactly an fp16 value (possible only for an integer offset type wider than
//! fp16's integers) makes a pass report `None`; its caller runs the f32 kernel instead.
//! Accumulation is that of the f32 kernels: columns `j..j+16` of a 32-column run go to
//! accumulator `a01`, `j+16..j+32` to `a23`, by one f32 FMA per 16 columns in column order.

use std::arch::asm;
use std::arch::x86_64::*;

use super::super::{Row, ShiftScale, Tables};
use super::{
    dot_rows, finish, nibble_indices, offset_kind, prefetch_codes, prefetch_params, Parts,
    NO_OFFSET, PROMOTES, ROUNDED,
};

/// Whether this CPU runs these kernels (on top of the f32 kernels' features).
pub(crate) fn available() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512fp16"))
}

/// Whether the kernels take rows of this layout (an fp32 offset promotes: not fp16 arithmetic).
pub(crate) fn takes(how: &ShiftScale) -> bool {
    offset_kind(how) != PROMOTES
}

/// A block's parameters as 32 fp16 lanes (lanes 0..16 for the run's first 16 columns, 16..32
/// for the next 16: they differ when a block boundary falls in the middle of a run).
#[derive(Clone, Copy)]
struct Half16 {
    s: __m512i,
    o: __m512i,
}

/// `r16(v · s)` / `r16(r16(v − o) · s)` of 32 16-bit integers `ints`, as fp16 bits.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
fn dequantize<const OFF: u8>(ints: __m512i, p: Half16) -> __m512i {
    let t: __m512i;
    if OFF == NO_OFFSET {
        // SAFETY: register-only AVX512-FP16 arithmetic (the CPU has it: this function's
        // target features, checked by `available` before any caller runs); `t` is a separate
        // output register (`out`, not `lateout`), so writing it never clobbers `s`. Every
        // instruction has embedded rounding, which suppresses exceptions: no MXCSR flag (nor
        // EFLAGS) changes, as `preserves_flags` promises.
        unsafe {
            asm!(
                "vcvtw2ph {t}, {i}, {{rn-sae}}",
                "vmulph {t}, {t}, {s}, {{rn-sae}}",
                i = in(zmm_reg) ints,
                s = in(zmm_reg) p.s,
                t = out(zmm_reg) t,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
    } else {
        // SAFETY: as above; `t` is distinct from `i`, `o` and `s`.
        unsafe {
            asm!(
                "vcvtw2ph {t}, {i}, {{rn-sae}}",
                "vsubph {t}, {t}, {o}, {{rn-sae}}",
                "vmulph {t}, {t}, {s}, {{rn-sae}}",
                i = in(zmm_reg) ints,
                o = in(zmm_reg) p.o,
                s = in(zmm_reg) p.s,
                t = out(zmm_reg) t,
                options(pure, nomem, nostack, preserves_flags),
            )
        };
    }
    t
}

/// [`dequantize`] with the block's scale `s` and offset `o` read as fp16 values from memory
/// and broadcast by the instructions themselves (an embedded broadcast excludes embedded
/// rounding: these round as MXCSR says, to nearest even — Rust's floating-point environment,
/// which safe code never changes; AVX512-FP16 ignores MXCSR's DAZ/FTZ). The same bits.
///
/// # Safety
/// `s`, and `o` for `OFF != NO_OFFSET`, point at readable 2-byte fp16 values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
unsafe fn dequantize_at<const OFF: u8>(ints: __m512i, s: *const u16, o: *const u16) -> __m512i {
    let t: __m512i;
    if OFF == NO_OFFSET {
        // SAFETY: AVX512-FP16 arithmetic (this function's target features, which its callers
        // checked) reading 2 bytes at `s` (the caller's contract); `t` is a separate output
        // register. MXCSR's exception flags may change (masked): no `preserves_flags`.
        unsafe {
            asm!(
                "vcvtw2ph {t}, {i}, {{rn-sae}}",
                "vmulph {t}, {t}, word ptr [{s}]{{1to32}}",
                i = in(zmm_reg) ints,
                s = in(reg) s,
                t = out(zmm_reg) t,
                options(pure, readonly, nostack),
            )
        };
    } else {
        // SAFETY: as above, reading 2 bytes at `o` and at `s`.
        unsafe {
            asm!(
                "vcvtw2ph {t}, {i}, {{rn-sae}}",
                "vsubph {t}, {t}, word ptr [{o}]{{1to32}}",
                "vmulph {t}, {t}, word ptr [{s}]{{1to32}}",
                i = in(zmm_reg) ints,
                o = in(reg) o,
                s = in(reg) s,
                t = out(zmm_reg) t,
                options(pure, readonly, nostack),
            )
        };
    }
    t
}

/// The 16 codes of a 4-bit block as fp16 bit patterns: `0..16` (uint4) or `0..8, -8..0`
/// (int4, nibble `c` sign-extended).
const fn codes16(signed: bool) -> [u16; 16] {
    let mut c = [0u16; 16];
    let mut i = 0;
    while i < 16 {
        let v = if signed && i >= 8 {
            i as i32 - 16
        } else {
            i as i32
        };
        c[i] = half::f16::from_f32_const(v as f32).to_bits();
        i += 1;
    }
    c
}
const CODES_I4: [u16; 16] = codes16(true);
const CODES_U4: [u16; 16] = codes16(false);

/// The 16-entry table of a block of an int4 / uint4 row, as f32: `r16(c · s)` or
/// `r16(r16(c − o) · s)` for its 16 codes `c` in fp16 arithmetic, the scale and offset read
/// from memory (as `quant_avx512::int4_table` forms them in f32: `c` is an integer of 4 bits,
/// so the argument for 8-bit data above holds).
///
/// # Safety
/// `s`, and `o` for `OFF != NO_OFFSET`, point at readable 2-byte fp16 values.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,f16c")]
unsafe fn int4_table<const SIGNED: bool, const OFF: u8>(s: *const u16, o: *const u16) -> __m512 {
    let codes = if SIGNED { &CODES_I4 } else { &CODES_U4 };
    let c = _mm256_loadu_si256(codes.as_ptr() as *const __m256i);
    let t: __m256i;
    if OFF == NO_OFFSET {
        // SAFETY: as in `dequantize_at`.
        unsafe {
            asm!(
                "vmulph {t}, {c}, word ptr [{s}]{{1to16}}",
                c = in(ymm_reg) c,
                s = in(reg) s,
                t = out(ymm_reg) t,
                options(pure, readonly, nostack),
            )
        };
    } else {
        // SAFETY: as in `dequantize_at`.
        unsafe {
            asm!(
                "vsubph {t}, {c}, word ptr [{o}]{{1to16}}",
                "vmulph {t}, {t}, word ptr [{s}]{{1to16}}",
                c = in(ymm_reg) c,
                o = in(reg) o,
                s = in(reg) s,
                t = out(ymm_reg) t,
                options(pure, readonly, nostack),
            )
        };
    }
    _mm512_cvtph_ps(t)
}

/// The 32 values of the bytes at `c` as f32: columns `j..j+16` and `j+16..j+32`.
///
/// # Safety
/// 32 bytes must be readable at `c`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512fp16")]
unsafe fn values<const SIGNED: bool, const OFF: u8>(c: *const u8, p: Half16) -> (__m512, __m512) {
    let raw = _mm256_loadu_si256(c as *const __m256i);
    let ints = if SIGNED {
        _mm512_cvtepi8_epi16(raw)
    } else {
        _mm512_cvtepu8_epi16(raw)
    };
    let h = dequantize::<OFF>(ints, p);
    (
        _mm512_cvtph_ps(_mm512_castsi512_si256(h)),
        _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h)),
    )
}

/// The parameters of up to 16 consecutive blocks of a row as fp16 lanes 0..16 (the upper
/// lanes unspecified): its scales as stored, its offsets converted to fp16.
#[derive(Clone, Copy)]
struct Run {
    s: __m512i,
    o: __m512i,
}

/// Blocks `b..b + 16` (those below `blocks`) of a row, and whether each of their offsets is an
/// fp16 value (converts to fp16 and back to the same bits; always, without an offset or with
/// fp16 offsets).
///
/// # Safety
/// The row's scales (and offsets, f32 or fp16, for `OFF != NO_OFFSET`) hold `blocks` blocks;
/// `b < blocks`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn run<const OFF: u8>(p: &Parts, b: usize, blocks: usize) -> (Run, bool) {
    let left = (blocks - b).min(16);
    let mask = (((1u32 << left) - 1) & 0xFFFF) as __mmask16;
    let s = _mm512_castsi256_si512(_mm256_maskz_loadu_epi16(
        mask,
        p.scales.add(2 * b) as *const i16,
    ));
    if OFF == NO_OFFSET {
        let o = _mm512_setzero_si512();
        return (Run { s, o }, true);
    }
    if !p.offsets16.is_null() {
        let o = _mm256_maskz_loadu_epi16(mask, p.offsets16.add(b) as *const i16);
        return (
            Run {
                s,
                o: _mm512_castsi256_si512(o),
            },
            true,
        );
    }
    // lanes past the last block load as 0.0 and convert back to it
    let of = _mm512_maskz_loadu_ps(mask, p.offsets.add(b));
    let oh = _mm512_cvtps_ph::<{ _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC }>(of);
    let back = _mm512_cvtph_ps(oh);
    let same = _mm512_cmpeq_epi32_mask(_mm512_castps_si512(back), _mm512_castps_si512(of));
    let o = _mm512_castsi256_si512(oh);
    (Run { s, o }, same == 0xFFFF)
}

/// Block `b`'s parameters, broadcast to all 32 lanes, from the run holding it (loaded by
/// [`run`] at `b - b % 16`).
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn pick<const OFF: u8>(r: &Run, b: usize) -> Half16 {
    let at = _mm512_set1_epi16((b % 16) as i16);
    Half16 {
        s: _mm512_permutexvar_epi16(at, r.s),
        o: if OFF == NO_OFFSET {
            r.o
        } else {
            _mm512_permutexvar_epi16(at, r.o)
        },
    }
}

/// The parameters of `R` rows block by block (asked for in order from 0), a run of 16 blocks
/// loaded at every 16th; `exact` turns false at an offset that is not an fp16 value.
///
/// # Safety
/// As [`run`], for every row, with `b < blocks` at each call.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl")]
unsafe fn block<const R: usize, const OFF: u8>(
    p: &[Parts; R],
    blocks: usize,
    runs: &mut [Run; R],
    exact: &mut bool,
    b: usize,
) -> [Half16; R] {
    if b.is_multiple_of(16) {
        for r in 0..R {
            let (run, e) = run::<OFF>(&p[r], b, blocks);
            runs[r] = run;
            *exact &= e;
        }
    }
    std::array::from_fn(|r| pick::<OFF>(&runs[r], b))
}

/// Lanes 0..16 of `lo`, 16..32 of `hi`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
fn join(lo: Half16, hi: Half16) -> Half16 {
    const HIGH: __mmask32 = 0xFFFF_0000;
    Half16 {
        s: _mm512_mask_blend_epi16(HIGH, lo.s, hi.s),
        o: _mm512_mask_blend_epi16(HIGH, lo.o, hi.o),
    }
}

/// Walks `k` columns 32 at a time: `chunk(j, p)` for the run `j..j + 32` with the parameters
/// of its two halves (from `block(b)`, called once per block in order). `WHOLE`: `per` is a
/// multiple of 32 (one block per run); else a multiple of 16 (a run may straddle two blocks).
///
/// # Safety
/// `k` is a multiple of 32 and `per` a non-zero multiple of 16 (of 32 if `WHOLE`) dividing it.
#[inline]
#[target_feature(enable = "avx512f,avx512bw")]
unsafe fn walk32<const R: usize, const WHOLE: bool>(
    k: usize,
    per: usize,
    mut block: impl FnMut(usize) -> [Half16; R],
    mut chunk: impl FnMut(usize, &[Half16; R]),
) {
    let mut j = 0usize;
    if WHOLE {
        let mut b = 0usize;
        while j < k {
            let p = block(b);
            let end = j + per;
            while j < end {
                chunk(j, &p);
                j += 32;
            }
            b += 1;
        }
    } else if k > 0 {
        let (mut cur, mut b, mut next) = (block(0), 1usize, per);
        while j < k {
            if j + 16 == next {
                let lo = cur;
                cur = block(b);
                b += 1;
                next += per;
                let p: [Half16; R] = std::array::from_fn(|r| join(lo[r], cur[r]));
                chunk(j, &p);
            } else {
                chunk(j, &cur);
            }
            j += 32;
            if j == next && j < k {
                cur = block(b);
                b += 1;
                next += per;
            }
        }
    }
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,avx2,fma,f16c")]
unsafe fn dot_bytes<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> Option<[f32; R]> {
    let mut a01 = [_mm512_setzero_ps(); R];
    let mut a23 = [_mm512_setzero_ps(); R];
    let (mut exact, blocks) = (true, x.len() / per);
    let zero = _mm512_setzero_si512();
    let mut runs = [Run { s: zero, o: zero }; R];
    let px = x.as_ptr();
    prefetch_params::<R>(&p[0], blocks);
    walk32::<R, WHOLE>(
        x.len(),
        per,
        |b| block::<R, OFF>(p, blocks, &mut runs, &mut exact, b),
        |j, h| {
            prefetch_codes::<R>(p[0].codes, x.len(), j, 32);
            let (x0, x1) = (_mm512_loadu_ps(px.add(j)), _mm512_loadu_ps(px.add(j + 16)));
            for r in 0..R {
                let (w0, w1) = values::<SIGNED, OFF>(p[r].codes.add(j), h[r]);
                a01[r] = _mm512_fmadd_ps(w0, x0, a01[r]);
                a23[r] = _mm512_fmadd_ps(w1, x1, a23[r]);
            }
        },
    );
    exact.then(|| std::array::from_fn(|r| finish(a01[r], a23[r])))
}

/// [`dot_bytes`] for blocks of whole runs (`per` a multiple of 32) whose offsets, if any, are
/// fp16 values in memory: each block's scale and offset broadcast from memory by the
/// arithmetic itself ([`dequantize_at`]); the same values and sums.
///
/// # Safety
/// As [`dot_bytes`], `per` a multiple of 32, and for `OFF != NO_OFFSET` every row's fp16
/// offsets (`offsets16`) hold its blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,avx2,fma,f16c")]
pub(super) unsafe fn dot_bytes_at<const R: usize, const SIGNED: bool, const OFF: u8>(
    p: &[Parts; R],
    x: &[f32],
    per: usize,
) -> [f32; R] {
    let k = x.len();
    let mut a01 = [_mm512_setzero_ps(); R];
    let mut a23 = [_mm512_setzero_ps(); R];
    let px = x.as_ptr();
    prefetch_params::<R>(&p[0], k / per);
    let (mut j, mut b) = (0usize, 0usize);
    while j < k {
        let s: [*const u16; R] = std::array::from_fn(|r| (p[r].scales as *const u16).add(b));
        let o: [*const u16; R] = std::array::from_fn(|r| p[r].offsets16.wrapping_add(b));
        let end = j + per;
        while j < end {
            prefetch_codes::<R>(p[0].codes, k, j, 32);
            let (x0, x1) = (_mm512_loadu_ps(px.add(j)), _mm512_loadu_ps(px.add(j + 16)));
            for r in 0..R {
                let raw = _mm256_loadu_si256(p[r].codes.add(j) as *const __m256i);
                let ints = if SIGNED {
                    _mm512_cvtepi8_epi16(raw)
                } else {
                    _mm512_cvtepu8_epi16(raw)
                };
                let h = dequantize_at::<OFF>(ints, s[r], o[r]);
                let w0 = _mm512_cvtph_ps(_mm512_castsi512_si256(h));
                let w1 = _mm512_cvtph_ps(_mm512_extracti64x4_epi64::<1>(h));
                a01[r] = _mm512_fmadd_ps(w0, x0, a01[r]);
                a23[r] = _mm512_fmadd_ps(w1, x1, a23[r]);
            }
            j += 32;
        }
        b += 1;
    }
    std::array::from_fn(|r| finish(a01[r], a23[r]))
}

/// The dots of int4 / uint4 rows, their tables formed in fp16 arithmetic ([`int4_table`]),
/// the rest as `quant_avx512::dot_int4`.
///
/// # Safety
/// As `quant_avx512::dot_int4`, and for `OFF != NO_OFFSET` every row's fp16 offsets hold its
/// blocks.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vbmi,avx512fp16,avx2,fma,f16c")]
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
    dot_rows::<__m512, R, WHOLE, 16>(
        p,
        x.len(),
        per,
        x,
        |b| {
            std::array::from_fn(|r| {
                int4_table::<SIGNED, OFF>(
                    (p[r].scales as *const u16).add(b),
                    p[r].offsets16.wrapping_add(b),
                )
            })
        },
        |r, t, j| _mm512_permutexvar_ps(nibble_indices(p[r].codes.add(j / 2)), *t),
    )
}

#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,avx2,fma,f16c")]
unsafe fn expand_bytes<const R: usize, const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
    p: &Parts,
    out: &mut [f32],
    per: usize,
) -> bool {
    let (mut exact, blocks) = (true, out.len() / per);
    let zero = _mm512_setzero_si512();
    let mut runs = [Run { s: zero, o: zero }; 1];
    let po = out.as_mut_ptr();
    walk32::<1, WHOLE>(
        out.len(),
        per,
        |b| block::<1, OFF>(&[*p], blocks, &mut runs, &mut exact, b),
        |j, h| {
            let (w0, w1) = values::<SIGNED, OFF>(p.codes.add(j), h[0]);
            _mm512_storeu_ps(po.add(j), w0);
            _mm512_storeu_ps(po.add(j + 16), w1);
        },
    );
    exact
}

/// Calls `$f::<R, SIGNED, OFF, WHOLE>($args)` for a layout these kernels take.
macro_rules! by_layout16 {
    ($f:ident, $r:ident, $how:expr, $whole:expr, ($($a:expr),*)) => {{
        match ($how.signed, offset_kind($how) == ROUNDED, $whole) {
            (true, false, true) => $f::<$r, true, NO_OFFSET, true>($($a),*),
            (true, false, false) => $f::<$r, true, NO_OFFSET, false>($($a),*),
            (true, true, true) => $f::<$r, true, ROUNDED, true>($($a),*),
            (true, true, false) => $f::<$r, true, ROUNDED, false>($($a),*),
            (false, false, true) => $f::<$r, false, NO_OFFSET, true>($($a),*),
            (false, false, false) => $f::<$r, false, NO_OFFSET, false>($($a),*),
            (false, true, true) => $f::<$r, false, ROUNDED, true>($($a),*),
            (false, true, false) => $f::<$r, false, ROUNDED, false>($($a),*),
        }
    }};
}

/// The dots of 8-bit rows, or of int4 / uint4 rows with fp16 offsets or none, with `x`;
/// `None` when an offset is not an fp16 value or the rows are of another kind (nothing else
/// differs: the caller runs the f32 kernel).
///
/// # Safety
/// As `quant_avx512::dot`, [`takes`] is true of the rows' shift-scale, the CPU has
/// AVX512-FP16 ([`available`]), and `p` are the rows' parts.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,avx2,fma,f16c")]
pub(super) unsafe fn dot<const R: usize>(
    rows: &[Row; R],
    p: &[Parts; R],
    x: &[f32],
) -> Option<[f32; R]> {
    match &rows[0] {
        Row::Bytes { how, per, .. } => {
            let whole = per.is_multiple_of(32);
            if whole && (how.offsets.is_none() || !p[0].offsets16.is_null()) {
                // SAFETY: the caller's contract; fp16 offsets where there are offsets (the
                // rows share the first row's layout: `same_layout`).
                return Some(match (how.signed, how.offsets.is_some()) {
                    (true, false) => dot_bytes_at::<R, true, NO_OFFSET>(p, x, *per),
                    (true, true) => dot_bytes_at::<R, true, ROUNDED>(p, x, *per),
                    (false, false) => dot_bytes_at::<R, false, NO_OFFSET>(p, x, *per),
                    (false, true) => dot_bytes_at::<R, false, ROUNDED>(p, x, *per),
                });
            }
            by_layout16!(dot_bytes, R, how, whole, (p, x, *per))
        }
        Row::Nibbles {
            tables: Tables::ShiftScale(how),
            per,
            ..
        } if how.offsets.is_none() || !p[0].offsets16.is_null() => {
            let whole = per.is_multiple_of(32);
            // SAFETY: the caller's contract; fp16 offsets where there are offsets.
            Some(by_layout16!(dot_int4, R, how, whole, (p, x, *per)))
        }
        _ => None,
    }
}

/// Writes an 8-bit row's values into `out`; `false` when an offset is not an fp16 value
/// (`out` then unspecified).
///
/// # Safety
/// As `quant_avx512::expand`, the row is `Row::Bytes` with [`takes`] true and the CPU has
/// AVX512-FP16.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512fp16,avx2,fma,f16c")]
pub(super) unsafe fn expand(row: &Row, p: &Parts, out: &mut [f32]) -> bool {
    let Row::Bytes { how, per, .. } = row else {
        return false;
    };
    let whole = per.is_multiple_of(32);
    const ONE: usize = 1;
    by_layout16!(expand_bytes, ONE, how, whole, (p, out, *per))
}

#[cfg(test)]
#[path = "quant_fp16_tests.rs"]
mod tests;
