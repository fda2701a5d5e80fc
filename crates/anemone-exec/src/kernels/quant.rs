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

    /// Whether the fused kernels cover this row's shape (divisions: checked once per weight).
    fn shape_ok(&self) -> bool {
        let (k, per) = (self.len(), self.per());
        k != 0
            && k.is_multiple_of(32)
            && per != 0
            && per.is_multiple_of(16)
            && k.is_multiple_of(per)
    }

    /// Whether the per-block slices hold `blocks` blocks (comparisons only: checked per row).
    fn slices_ok(&self, blocks: usize) -> bool {
        let how_ok = |h: &ShiftScale| {
            h.scales.len() >= 2 * blocks && h.offsets.is_none_or(|o| o.len() >= blocks)
        };
        match self {
            Row::Bytes { how, .. } => how_ok(how),
            Row::Nibbles {
                tables: Tables::Palettes(p),
                ..
            } => p.len() >= 16 * blocks,
            Row::Nibbles {
                tables: Tables::ShiftScale(h),
                ..
            } => how_ok(h),
        }
    }

    /// Whether the fused kernels cover this row (and its per-block slices are long enough).
    fn covered(&self) -> bool {
        self.shape_ok() && self.slices_ok(self.blocks())
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
                && is_x86_feature_detected!("avx512vbmi")
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

/// `dst[i] = dot(row_of(i), x)` for every row, the rows of one weight (one shape and block
/// layout, checked once; per row only that its slices are long enough), spread over the thread
/// pool as the fp16 matvec is. `false` (and `dst` unspecified) when the kernels do not cover
/// the weight or a row is not of its layout.
pub fn matvec<'w>(
    dst: &mut [f32],
    x: &[f32],
    row_of: impl Fn(usize) -> Option<Row<'w>> + Sync,
) -> bool {
    let Some(first) = row_of(0) else {
        return dst.is_empty();
    };
    if !covers(&first) || first.len() != x.len() {
        return false;
    }
    let (k, per, blocks) = (first.len(), first.per(), first.blocks());
    let ok = std::sync::atomic::AtomicBool::new(true);
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, d) in chunk.iter_mut().enumerate() {
            match row_of(t * ROWS_PER_TASK + r) {
                Some(row) if row.len() == k && row.per() == per && row.slices_ok(blocks) => {
                    #[cfg(target_arch = "x86_64")]
                    {
                        // SAFETY: `covers` checked the CPU features and the layout (shared by
                        // every row); this row's codes hold k elements and its per-block
                        // slices `blocks` blocks; x holds k values.
                        *d = unsafe { avx512::dot(&row, x) };
                    }
                    #[cfg(not(target_arch = "x86_64"))]
                    {
                        *d = f32::NAN;
                    }
                }
                _ => ok.store(false, std::sync::atomic::Ordering::Relaxed),
            }
        }
    };
    spread_rows(dst, k, kernel);
    ok.into_inner()
}

/// Runs `kernel(task, rows)` over `dst` in tasks of [`ROWS_PER_TASK`] rows, on the decode
/// team (as the fp16 matvec) when the product is large enough.
fn spread_rows(dst: &mut [f32], k: usize, kernel: impl Fn((usize, &mut [f32])) + Sync) {
    let rows = dst.len();
    let team = if rows * k >= PARALLEL_WORK {
        crate::team::current()
    } else {
        None
    };
    let out = crate::team::SharedOut::new(dst);
    crate::team::for_each_block(team.as_deref(), rows.div_ceil(ROWS_PER_TASK), &|t| {
        let first = t * ROWS_PER_TASK;
        // SAFETY: tasks are disjoint row ranges of `dst`, borrowed until the region ends.
        let chunk = unsafe { out.slice(first..(first + ROWS_PER_TASK).min(rows)) };
        kernel((t, chunk));
    });
}

/// `dst[i] = dot_row(i)` over the rows, spread over the decode team as the fp16 matvec is.
pub fn matvec_by_rows(dst: &mut [f32], k: usize, dot_row: impl Fn(usize) -> f32 + Sync) {
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, d) in chunk.iter_mut().enumerate() {
            *d = dot_row(t * ROWS_PER_TASK + r);
        }
    };
    spread_rows(dst, k, kernel);
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

    /// How a block's offset enters: none, rounded to fp16 after the subtraction, or fp32
    /// (promoting, not rounded).
    const NO_OFFSET: u8 = 0;
    const ROUNDED: u8 = 1;
    const PROMOTES: u8 = 2;

    fn offset_kind(how: &ShiftScale) -> u8 {
        match (how.offsets, how.round_shift) {
            (None, _) => NO_OFFSET,
            (Some(_), true) => ROUNDED,
            (Some(_), false) => PROMOTES,
        }
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

    #[inline]
    #[target_feature(enable = "avx512f,f16c")]
    fn params(how: &ShiftScale, b: usize) -> Params {
        let bits = u16::from_le_bytes([how.scales[2 * b], how.scales[2 * b + 1]]);
        let s = _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(bits as i32)));
        Params {
            s: _mm512_set1_ps(s),
            o: match how.offsets {
                Some(o) => _mm512_set1_ps(o[b]),
                None => _mm512_setzero_ps(),
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

    /// The values of 16 bytes at `p` (a block with parameters `pb`).
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
                let p = params(how, b);
                match offset_kind(how) {
                    NO_OFFSET => shift_scale::<NO_OFFSET>(codes, p),
                    ROUNDED => shift_scale::<ROUNDED>(codes, p),
                    _ => shift_scale::<PROMOTES>(codes, p),
                }
            }
        }
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

    /// Runs `$body` with `$w0`, `$w1` the values of elements `$j..$j + 16` and
    /// `$j + 16..$j + 32`, for `$j` = 0, 32, … over the row (`row.covered()`: blocks of a
    /// multiple of 16 columns, so a block starts only at `$j` or, unless `$whole` — blocks of a
    /// multiple of 32 — at `$j + 16`). `$vals(p, params)` forms 16 byte values. A macro so the
    /// body is compiled with the caller's target features.
    macro_rules! bytes32 {
        ($codes:expr, $how:expr, $per:expr, $whole:expr, $vals:expr,
         |$j:ident, $w0:ident, $w1:ident| $body:block) => {{
            let (codes, how, per) = ($codes, $how, $per);
            let (mut next, mut b) = (0usize, 0usize);
            let mut pb = params(how, 0);
            let p = codes.as_ptr();
            let mut $j = 0usize;
            while $j < codes.len() {
                if $j == next {
                    pb = params(how, b);
                    b += 1;
                    next += per;
                }
                let $w0 = $vals(p.add($j), pb);
                if !$whole && $j + 16 == next {
                    pb = params(how, b);
                    b += 1;
                    next += per;
                }
                let $w1 = $vals(p.add($j + 16), pb);
                $body
                $j += 32;
            }
        }};
    }

    macro_rules! nibbles32 {
        ($codes:expr, $tables:expr, $per:expr, $whole:expr,
         |$j:ident, $w0:ident, $w1:ident| $body:block) => {{
            let (codes, tables, per) = ($codes, $tables, $per);
            let (mut next, mut b) = (0usize, 0usize);
            let mut t = _mm512_setzero_ps();
            let p = codes.as_ptr();
            let mut $j = 0usize;
            while $j < codes.len() * 2 {
                if $j == next {
                    t = table(tables, b);
                    b += 1;
                    next += per;
                }
                let $w0 = _mm512_permutexvar_ps(nibble_indices(p.add($j / 2)), t);
                if !$whole && $j + 16 == next {
                    t = table(tables, b);
                    b += 1;
                    next += per;
                }
                let $w1 = _mm512_permutexvar_ps(nibble_indices(p.add($j / 2 + 8)), t);
                $body
                $j += 32;
            }
        }};
    }

    /// The fp16 dot's final sum of its accumulators (`a01` = accumulators 0 and 1 side by side,
    /// `a23` = 2 and 3): `(acc0 + acc1) + (acc2 + acc3)`, then its lane order.
    #[inline]
    #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
    fn finish(a01: __m512, a23: __m512) -> f32 {
        let pair = |v: __m512| {
            _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            )
        };
        let sum = _mm256_add_ps(pair(a01), pair(a23));
        let mut l = [0.0f32; 8];
        // SAFETY: `l` holds 8 values.
        unsafe { _mm256_storeu_ps(l.as_mut_ptr(), sum) };
        (l[0] + l[4]) + (l[1] + l[5]) + ((l[2] + l[6]) + (l[3] + l[7]))
    }

    macro_rules! byte_kernels {
        ($dot:ident, $expand:ident) => {
            #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
            unsafe fn $dot<const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
                codes: &[u8],
                how: &ShiftScale,
                per: usize,
                x: &[f32],
            ) -> f32 {
                let (mut a01, mut a23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
                let px = x.as_ptr();
                let vals = |p, pb| byte_values::<SIGNED, OFF>(p, pb);
                bytes32!(codes, how, per, WHOLE, vals, |j, w0, w1| {
                    a01 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px.add(j)), a01);
                    a23 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(j + 16)), a23);
                });
                finish(a01, a23)
            }

            #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
            unsafe fn $expand<const SIGNED: bool, const OFF: u8, const WHOLE: bool>(
                codes: &[u8],
                how: &ShiftScale,
                per: usize,
                out: &mut [f32],
            ) {
                let po = out.as_mut_ptr();
                let vals = |p, pb| byte_values::<SIGNED, OFF>(p, pb);
                bytes32!(codes, how, per, WHOLE, vals, |j, w0, w1| {
                    _mm512_storeu_ps(po.add(j), w0);
                    _mm512_storeu_ps(po.add(j + 16), w1);
                });
            }
        };
    }

    byte_kernels!(dot_bytes, expand_bytes);

    #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
    unsafe fn dot_nibbles<const WHOLE: bool>(
        codes: &[u8],
        tables: &Tables,
        per: usize,
        x: &[f32],
    ) -> f32 {
        let (mut a01, mut a23) = (_mm512_setzero_ps(), _mm512_setzero_ps());
        let px = x.as_ptr();
        nibbles32!(codes, tables, per, WHOLE, |j, w0, w1| {
            a01 = _mm512_fmadd_ps(w0, _mm512_loadu_ps(px.add(j)), a01);
            a23 = _mm512_fmadd_ps(w1, _mm512_loadu_ps(px.add(j + 16)), a23);
        });
        finish(a01, a23)
    }

    #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
    unsafe fn expand_nibbles<const WHOLE: bool>(
        codes: &[u8],
        tables: &Tables,
        per: usize,
        out: &mut [f32],
    ) {
        let po = out.as_mut_ptr();
        nibbles32!(codes, tables, per, WHOLE, |j, w0, w1| {
            _mm512_storeu_ps(po.add(j), w0);
            _mm512_storeu_ps(po.add(j + 16), w1);
        });
    }

    /// Calls `$f::<SIGNED, OFF, WHOLE>($args)` for the row's byte layout.
    macro_rules! by_layout {
        ($f:ident, $how:expr, $per:expr, ($($a:expr),*)) => {{
            let whole = $per.is_multiple_of(32);
            match ($how.signed, offset_kind($how), whole) {
                (true, NO_OFFSET, true) => $f::<true, NO_OFFSET, true>($($a),*),
                (true, NO_OFFSET, false) => $f::<true, NO_OFFSET, false>($($a),*),
                (true, ROUNDED, true) => $f::<true, ROUNDED, true>($($a),*),
                (true, ROUNDED, false) => $f::<true, ROUNDED, false>($($a),*),
                (true, _, true) => $f::<true, PROMOTES, true>($($a),*),
                (true, _, false) => $f::<true, PROMOTES, false>($($a),*),
                (false, NO_OFFSET, true) => $f::<false, NO_OFFSET, true>($($a),*),
                (false, NO_OFFSET, false) => $f::<false, NO_OFFSET, false>($($a),*),
                (false, ROUNDED, true) => $f::<false, ROUNDED, true>($($a),*),
                (false, ROUNDED, false) => $f::<false, ROUNDED, false>($($a),*),
                (false, _, true) => $f::<false, PROMOTES, true>($($a),*),
                (false, _, false) => $f::<false, PROMOTES, false>($($a),*),
            }
        }};
    }

    /// # Safety
    /// `row.covered()`, `x.len() == row.len()`, and the CPU has AVX-512F/VBMI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
    pub unsafe fn dot(row: &Row, x: &[f32]) -> f32 {
        match row {
            Row::Bytes { codes, how, per } => {
                by_layout!(dot_bytes, how, *per, (codes, how, *per, x))
            }
            Row::Nibbles { codes, tables, per } => match per.is_multiple_of(32) {
                true => dot_nibbles::<true>(codes, tables, *per, x),
                false => dot_nibbles::<false>(codes, tables, *per, x),
            },
        }
    }

    /// # Safety
    /// `row.covered()`, `out.len() == row.len()`, and the CPU has AVX-512F/VBMI, AVX2, FMA and F16C.
    #[target_feature(enable = "avx512f,avx512vbmi,avx2,fma,f16c")]
    pub unsafe fn expand(row: &Row, out: &mut [f32]) {
        match row {
            Row::Bytes { codes, how, per } => {
                by_layout!(expand_bytes, how, *per, (codes, how, *per, out))
            }
            Row::Nibbles { codes, tables, per } => match per.is_multiple_of(32) {
                true => expand_nibbles::<true>(codes, tables, *per, out),
                false => expand_nibbles::<false>(codes, tables, *per, out),
            },
        }
    }
}
