//! Fused kernels for compressed projection weights (`packed.rs`): one row's fp16 values are
//! formed from its stored bytes in registers — 8-bit data widened, 4-bit data / palette indices
//! looked up in a 16-entry table — exactly as [`crate::decompress`] forms them (each step
//! rounded to fp16 where coremltools rounds), then multiplied into the f32 sum.
//!
//! The dot kernels sum in the order of the fp16 dot ([`super::simd::dot_f16_kernel`] on a CPU
//! with AVX2/FMA/F16C): element `32c + 8a + l` goes to accumulator `a`, lane `l`; at the end
//! `(acc0 + acc1) + (acc2 + acc3)`, then the lanes as its horizontal sum adds them. An AVX-512
//! register holds two of those accumulators side by side (lanewise FMAs are the same), so a
//! fused dot returns the bits the fp16 dot returns over the expanded row. Rows these kernels do
//! not cover (no AVX-512, a row length not a multiple of 32, blocks not a multiple of 16
//! columns) take the row-forming path in `packed.rs`.

use half::f16;
use rayon::prelude::*;

/// Rows per parallel task of a matvec and the work above which it is spread over the pool
/// (those of [`super::linalg::matvec_f16`]).
const ROWS_PER_TASK: usize = 64;
const PARALLEL_WORK: usize = 1 << 18;

/// How the values of one block are formed from 8-bit or 4-bit integer data `v`:
/// `r16(r16?(v - offset) * scale)` (the inner rounding unless the offset is fp32), or
/// `r16(v * scale)` without an offset.
#[derive(Clone, Copy)]
pub struct ShiftScale<'a> {
    /// Whether the data is signed (int8 / int4).
    pub signed: bool,
    /// The fp16 scales of this row's blocks, as stored (little-endian bit patterns).
    pub scales: &'a [u8],
    /// The offsets of this row's blocks, if any, as f32.
    pub offsets: Option<&'a [f32]>,
    /// `v - offset` is rounded to fp16 (an fp16 or integer offset; an fp32 one promotes).
    pub round_shift: bool,
}

/// The 16-entry table of each block of a 4-bit row.
#[derive(Clone, Copy)]
pub enum Tables<'a> {
    /// fp16 palettes of 16 entries, one per block of this row.
    Palettes(&'a [f16]),
    /// int4 / uint4 data: the table of a block is its 16 possible values.
    ShiftScale(ShiftScale<'a>),
}

/// One compressed row: its codes and how they become values; blocks of `per` columns.
#[derive(Clone, Copy)]
pub enum Row<'a> {
    /// One byte per element (int8 / uint8 shift-scale).
    Bytes {
        codes: &'a [u8],
        how: ShiftScale<'a>,
        per: usize,
    },
    /// Two elements per byte, low nibble first (uint4 palette indices, int4 / uint4 data).
    Nibbles {
        codes: &'a [u8],
        tables: Tables<'a>,
        per: usize,
    },
}

impl Row<'_> {
    /// Elements in the row.
    fn len(&self) -> usize {
        match self {
            Row::Bytes { codes, .. } => codes.len(),
            Row::Nibbles { codes, .. } => codes.len() * 2,
        }
    }

    fn per(&self) -> usize {
        match self {
            Row::Bytes { per, .. } | Row::Nibbles { per, .. } => *per,
        }
    }

    /// Blocks of the row (the per-block slices must hold at least this many).
    fn blocks(&self) -> usize {
        self.len() / self.per().max(1)
    }

    /// Whether the fused kernels cover this row (and its per-block slices are long enough).
    fn covered(&self) -> bool {
        let (k, per) = (self.len(), self.per());
        if k == 0 || k % 32 != 0 || per == 0 || per % 16 != 0 || k % per != 0 {
            return false;
        }
        let b = self.blocks();
        let how_ok =
            |h: &ShiftScale| h.scales.len() >= 2 * b && h.offsets.is_none_or(|o| o.len() >= b);
        match self {
            Row::Bytes { how, .. } => how_ok(how),
            Row::Nibbles {
                tables: Tables::Palettes(p),
                ..
            } => p.len() >= 16 * b,
            Row::Nibbles {
                tables: Tables::ShiftScale(h),
                ..
            } => how_ok(h),
        }
    }
}

/// Whether this CPU runs the fused kernels, in the order of the fp16 dot it runs.
pub fn available() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use std::sync::OnceLock;
        static HAS: OnceLock<bool> = OnceLock::new();
        *HAS.get_or_init(|| {
            is_x86_feature_detected!("avx512f")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether [`dot`] and [`expand`] take `row` (the CPU runs them and the row's shape suits).
pub fn covers(row: &Row) -> bool {
    available() && row.covered()
}

/// `dot(fp16 values of row, x)`, bit for bit the fp16 dot of the expanded row; `None` when
/// [`covers`] is false.
pub fn dot(row: &Row, x: &[f32]) -> Option<f32> {
    if !covers(row) || x.len() != row.len() {
        return None;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `covers` checked the CPU features and that the row's codes and per-block slices
    // hold `row.len()` elements; x has as many.
    return Some(unsafe { avx512::dot(row, x) });
    #[cfg(not(target_arch = "x86_64"))]
    None
}

/// Writes the row's values (fp16 values as f32) into `out`; `false` (nothing written) when
/// [`covers`] is false.
pub fn expand(row: &Row, out: &mut [f32]) -> bool {
    if !covers(row) || out.len() != row.len() {
        return false;
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: as in `dot`, with `out` of the row's length.
    unsafe {
        avx512::expand(row, out)
    };
    #[cfg(target_arch = "x86_64")]
    return true;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `dst[i] = dot_row(i)` over the rows, spread over the thread pool as the fp16 matvec is.
pub fn matvec_by_rows(dst: &mut [f32], k: usize, dot_row: impl Fn(usize) -> f32 + Sync) {
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, d) in chunk.iter_mut().enumerate() {
            *d = dot_row(t * ROWS_PER_TASK + r);
        }
    };
    if dst.len() * k >= PARALLEL_WORK {
        dst.par_chunks_mut(ROWS_PER_TASK)
            .enumerate()
            .for_each(kernel);
    } else {
        dst.chunks_mut(ROWS_PER_TASK).enumerate().for_each(kernel);
    }
}

/// Fills `buf` (`rows × k`) by `fill_row(i, row_i)`, rows spread over the thread pool.
pub fn fill_by_rows(buf: &mut [f32], k: usize, fill_row: impl Fn(usize, &mut [f32]) + Sync) {
    if k == 0 {
        return;
    }
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, out) in chunk.chunks_mut(k).enumerate() {
            fill_row(t * ROWS_PER_TASK + r, out);
        }
    };
    if buf.len() >= PARALLEL_WORK {
        buf.par_chunks_mut(ROWS_PER_TASK * k)
            .enumerate()
            .for_each(kernel);
    } else {
        buf.chunks_mut(ROWS_PER_TASK * k)
            .enumerate()
            .for_each(kernel);
    }
}

std::thread_local! {
    /// Per-thread buffer a compressed weight is expanded into for a wide product.
    static EXPANDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `len` values written by `fill` into a buffer reused across calls on this thread
/// (a compressed weight expanded for a wide product, never kept resident).
pub fn with_filled<R>(len: usize, fill: impl Fn(&mut [f32]), f: impl FnOnce(&[f32]) -> R) -> R {
    EXPANDED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(len, 0.0);
            fill(&mut buf);
            f(&buf)
        }
        Err(_) => {
            let mut buf = vec![0.0; len];
            fill(&mut buf);
            f(&buf)
        }
    })
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;

    use super::{Row, ShiftScale, Tables};

    /// fp16 rounding of 16 values (nearest even, as `f16::from_f32`).
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    fn r16(v: __m512) -> __m512 {
        _mm512_cvtph_ps(_mm512_cvtps_ph::<
            { _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC },
        >(v))
    }

    /// The fp16 scale of block `b`, as f32.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    fn scale_of(scales: &[u8], b: usize) -> __m512 {
        let bits = u16::from_le_bytes([scales[2 * b], scales[2 * b + 1]]);
        _mm512_set1_ps(_mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32))))
    }

    /// `decompress`'s arithmetic on 16 data values `v` of block `b`.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    fn shift_scale(v: __m512, how: &ShiftScale, b: usize) -> __m512 {
        let s = scale_of(how.scales, b);
        match how.offsets {
            None => r16(_mm512_mul_ps(v, s)),
            Some(o) => {
                let d = _mm512_sub_ps(v, _mm512_set1_ps(o[b]));
                let d = if how.round_shift { r16(d) } else { d };
                r16(_mm512_mul_ps(d, s))
            }
        }
    }

    /// The values of 16 bytes at `p` (block `b`).
    ///
    /// # Safety
    /// 16 bytes must be readable at `p`.
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn byte_values(p: *const u8, how: &ShiftScale, b: usize) -> __m512 {
        let raw = _mm_loadu_si128(p as *const __m128i);
        let ints = if how.signed {
            _mm512_cvtepi8_epi32(raw)
        } else {
            _mm512_cvtepu8_epi32(raw)
        };
        shift_scale(_mm512_cvtepi32_ps(ints), how, b)
    }

    /// The 16-entry table of block `b` as f32.
    ///
    /// # Safety
    /// Block `b`'s palette must exist (checked by `Row::covered`).
    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    unsafe fn table(tables: &Tables, b: usize) -> __m512 {
        match tables {
            Tables::Palettes(p) => {
                _mm512_cvtph_ps(_mm256_loadu_si256(p.as_ptr().add(16 * b) as *const __m256i))
            }
            Tables::ShiftScale(how) => {
                // nibble c stands for c (uint4) or c sign-extended (int4)
                let codes = if how.signed {
                    _mm512_setr_ps(
                        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, -8.0, -7.0, -6.0, -5.0, -4.0, -3.0,
                        -2.0, -1.0,
                    )
                } else {
                    _mm512_setr_ps(
                        0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0, 10.0, 11.0, 12.0, 13.0,
                        14.0, 15.0,
                    )
                };
                shift_scale(codes, how, b)
            }
        }
    }

    /// The 32 nibble indices of 16 bytes at `p`, in element order, as two vectors of 16.
    ///
    /// # Safety
    /// 16 bytes must be readable at `p`.
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn nibbles(p: *const u8) -> (__m512i, __m512i) {
        let raw = _mm_loadu_si128(p as *const __m128i);
        let mask = _mm_set1_epi8(15);
        let lo = _mm_and_si128(raw, mask);
        let hi = _mm_and_si128(_mm_srli_epi16::<4>(raw), mask);
        (
            _mm512_cvtepu8_epi32(_mm_unpacklo_epi8(lo, hi)),
            _mm512_cvtepu8_epi32(_mm_unpackhi_epi8(lo, hi)),
        )
    }

    /// Calls `sink(j, values of elements j..j + 16)` for j = 0, 16, … over the row.
    ///
    /// # Safety
    /// `row.covered()`.
    #[inline(always)]
    unsafe fn each16(row: &Row, mut sink: impl FnMut(usize, __m512)) {
        match *row {
            Row::Bytes { codes, how, per } => {
                let mut j = 0;
                while j < codes.len() {
                    sink(j, byte_values(codes.as_ptr().add(j), &how, j / per));
                    j += 16;
                }
            }
            Row::Nibbles { codes, tables, per } => {
                let k = codes.len() * 2;
                let mut cur = usize::MAX;
                let mut t = _mm512_setzero_ps();
                let mut j = 0;
                while j < k {
                    let (i0, i1) = nibbles(codes.as_ptr().add(j / 2));
                    for (h, idx) in [(0, i0), (16, i1)] {
                        let b = (j + h) / per;
                        if b != cur {
                            t = table(&tables, b);
                            cur = b;
                        }
                        sink(j + h, _mm512_permutexvar_ps(idx, t));
                    }
                    j += 32;
                }
            }
        }
    }

    /// # Safety
    /// `row.covered()`, `x.len() == row.len()`, and the CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn dot(row: &Row, x: &[f32]) -> f32 {
        // acc01 holds the fp16 dot's accumulators 0 and 1 side by side, acc23 2 and 3
        let mut acc = [_mm512_setzero_ps(); 2];
        let px = x.as_ptr();
        each16(row, |j, w| {
            let a = &mut acc[(j / 16) % 2];
            *a = _mm512_fmadd_ps(w, _mm512_loadu_ps(px.add(j)), *a);
        });
        let pair = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        let sum = _mm256_add_ps(pair(acc[0]), pair(acc[1]));
        let mut l = [0.0f32; 8];
        _mm256_storeu_ps(l.as_mut_ptr(), sum);
        (l[0] + l[4]) + (l[1] + l[5]) + ((l[2] + l[6]) + (l[3] + l[7]))
    }

    /// # Safety
    /// `row.covered()`, `out.len() == row.len()`, and the CPU has AVX-512F and F16C.
    #[target_feature(enable = "avx512f,avx2,fma,f16c")]
    pub unsafe fn expand(row: &Row, out: &mut [f32]) {
        let po = out.as_mut_ptr();
        each16(row, |j, w| _mm512_storeu_ps(po.add(j), w));
    }
}
