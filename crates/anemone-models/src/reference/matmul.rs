//! The prefill matrix product `y = x·wᵀ` (`x: [rows, n_in]`, `w: [n_out, n_in]`, row-major) as
//! register-blocked AVX-512 dot products, on the current rayon pool.
//!
//! Invariant (the values do not depend on the tiling, the tasks or the copy of `x`): every output
//! inside the region of whole 4-row and 4-column blocks (`s < rows / 4 · 4`, `o < n_out / 4 · 4`)
//! is one 16-lane accumulator — lane `l` sums `x[s][k]·w[o][k]` (fused) for `k ≡ l (mod 16)` in
//! increasing `k`, the tail of a row masked to zero — reduced by `_mm512_reduce_add_ps`; every
//! output outside it (the last `rows % 4` rows, the last `n_out % 4` columns) is
//! [`super::kernels::dot`]. Tiles of any shape inside the region compute exactly those sums.

#![cfg(target_arch = "x86_64")]

use super::kernels::dot;
use super::scratch::AlignedBuf;
use rayon::prelude::*;
use std::arch::x86_64::*;

/// AVX-512F and VL: the kernels keep up to 29 accumulators and operands in zmm0–zmm31, and the
/// final reductions' 128/256-bit steps must be able to address zmm16–31 (without VL they
/// cannot, and the compiler spills the accumulators).
pub(super) fn has_avx512() -> bool {
    use std::sync::OnceLock;
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512vl"))
}

/// Register tile: rows of x by weight rows, one accumulator each (6 × 4 accumulators, 4 weight
/// vectors and one x vector: 29 of the 32 zmm registers).
const TILE_ROWS: usize = 6;
const TILE_COLUMNS: usize = 4;
/// Output columns (weight rows) per task: whole tiles, 56 KiB of a 896-wide weight (tasks
/// small enough that two threads finish a 896-column product within a few percent of each other).
const COLUMNS_PER_TASK: usize = 4 * TILE_COLUMNS;
/// Values of `k` per pass over the rows: a 4-row weight tile of 1024 is 16 KiB of L1.
const CHUNK: usize = 1024;

/// x with every row on a 64-byte boundary (a load of 16 values that straddles two cache lines
/// costs two): borrowed when it already is (the forward's activations are [`AlignedBuf`]s),
/// else copied with the row stride rounded up to 16.
enum AlignedRows<'a> {
    Borrowed(&'a [f32]),
    Copied(AlignedBuf),
}

impl<'a> AlignedRows<'a> {
    fn new(x: &'a [f32], rows: usize, n_in: usize) -> (Self, usize) {
        if (x.as_ptr() as usize).is_multiple_of(64) && n_in.is_multiple_of(16) {
            return (Self::Borrowed(x), n_in);
        }
        let (copy, stride) = AlignedBuf::rows_from(x, rows, n_in);
        (Self::Copied(copy), stride)
    }

    fn as_ptr(&self) -> *const f32 {
        match self {
            Self::Borrowed(x) => x.as_ptr(),
            Self::Copied(copy) => copy.as_ptr(),
        }
    }
}

/// `y = x·wᵀ` with the values described in the module doc. The caller has checked the extents
/// (`x: rows·n_in`, `w: n_out·n_in`, `y: rows·n_out`) and [`has_avx512`].
pub(super) fn matmul_t_avx512(
    x: &[f32],
    w: &[f32],
    y: &mut [f32],
    rows: usize,
    n_in: usize,
    n_out: usize,
) {
    debug_assert!(x.len() == rows * n_in && w.len() == n_out * n_in && y.len() == rows * n_out);
    if n_in == 0 {
        // empty sums (the tiles below run no step at all)
        y.fill(0.0);
        return;
    }
    let out = y.as_mut_ptr();
    let (aligned, stride) = AlignedRows::new(x, rows, n_in);
    let tasks = n_out.div_ceil(COLUMNS_PER_TASK);
    let block_rows = rows / 4 * 4;
    let block_columns = n_out / 4 * 4;
    let g = Geometry {
        x: aligned.as_ptr(),
        stride,
        w: w.as_ptr(),
        n_in,
        out,
        n_out,
        rows: block_rows,
    };
    (0..tasks).into_par_iter().for_each(|task| {
        let first = task * COLUMNS_PER_TASK;
        let last = (first + COLUMNS_PER_TASK).min(n_out);
        let tiled_end = last.min(block_columns);
        let mut partial = Vec::new();
        // SAFETY: AVX-512F/VL are present (the caller checked); the tiles read rows
        // 0..block_rows of the aligned x (`stride` apart) and rows first..tiled_end of w, and
        // write only y[s·n_out + o] for o in first..tiled_end.
        unsafe {
            let mut o = first;
            while o + TILE_COLUMNS <= tiled_end {
                columns::<TILE_COLUMNS>(g, o, &mut partial);
                o += TILE_COLUMNS;
            }
            // the region's last columns of this task (fewer than a tile)
            while o < tiled_end {
                match tiled_end - o {
                    1 => columns::<1>(g, o, &mut partial),
                    2 | 3 => columns::<2>(g, o, &mut partial),
                    _ => columns::<4>(g, o, &mut partial),
                }
                o += match tiled_end - o {
                    1 => 1,
                    2 | 3 => 2,
                    _ => 4,
                };
            }
        }
        for o in first..last {
            let wo = &w[o * n_in..(o + 1) * n_in];
            let dot_rows = if o < block_columns { block_rows } else { 0 };
            for s in dot_rows..rows {
                // SAFETY: o < n_out and s < rows; this task alone writes column o.
                unsafe { *g.out.add(s * n_out + o) = dot(&x[s * n_in..(s + 1) * n_in], wo) };
            }
        }
    });
    drop(aligned);
}

/// Where a task's tiles read and write.
#[derive(Clone, Copy)]
struct Geometry {
    /// Row s of x at `x + s·stride`, 64-byte aligned.
    x: *const f32,
    stride: usize,
    /// Row o of w at `w + o·n_in`.
    w: *const f32,
    n_in: usize,
    /// Output (s, o) at `out + s·n_out + o`.
    out: *mut f32,
    n_out: usize,
    /// Rows of the tiled region (a multiple of 4).
    rows: usize,
}
// SAFETY: the tasks read x and w only, and write disjoint columns of the output, while the
// buffers outlive the parallel region.
unsafe impl Send for Geometry {}
unsafe impl Sync for Geometry {}

/// Every tiled row of the `C` weight rows from `o`: 6-row tiles, then 4-, 2- and 1-row ones;
/// in chunks of at most [`CHUNK`] values of `k` (all rows of a chunk before the next), so that
/// the tile's weight rows stay in L1 while the x rows stream from L2. Between chunks each
/// output's 16-lane accumulator waits in `partial` (a store and a load, which keep its bits).
///
/// # Safety
/// AVX-512F/VL present; `g` describes valid buffers holding rows `0..g.rows` and `o..o + C`.
#[target_feature(enable = "avx512f,avx512vl")]
unsafe fn columns<const C: usize>(g: Geometry, o: usize, partial: &mut Vec<__m512>) {
    let chunks = g.n_in.div_ceil(CHUNK).max(1);
    // chunk boundaries on whole 16-lane steps
    let chunk = g.n_in.div_ceil(chunks).next_multiple_of(16);
    if chunks > 1 {
        partial.resize(g.rows * C, _mm512_setzero_ps());
    }
    let acc = partial.as_mut_ptr();
    let mut k0 = 0;
    while k0 < g.n_in {
        let k = k0..(k0 + chunk).min(g.n_in);
        let mut s = 0;
        // the first C row tiles each pull one weight row of the next column tile into L2, a
        // line per step, while they stream this tile's (the x rows they stream evict L1)
        let mut next = o + C;
        while s + TILE_ROWS <= g.rows {
            if next < (o + 2 * C).min(g.n_out) {
                let prefetch = g.w.add(next * g.n_in);
                tile::<TILE_ROWS, C, true>(g, s, o, k.clone(), acc, prefetch);
                next += 1;
            } else {
                tile::<TILE_ROWS, C, false>(g, s, o, k.clone(), acc, g.w);
            }
            s += TILE_ROWS;
        }
        while s + 4 <= g.rows {
            tile::<4, C, false>(g, s, o, k.clone(), acc, g.w);
            s += 4;
        }
        while s + 2 <= g.rows {
            tile::<2, C, false>(g, s, o, k.clone(), acc, g.w);
            s += 2;
        }
        while s < g.rows {
            tile::<1, C, false>(g, s, o, k.clone(), acc, g.w);
            s += 1;
        }
        k0 = k.end;
    }
}

/// Steps `k` of outputs `y[s0..s0+R][o0..o0+C]`, one 16-lane accumulator each (see the module
/// doc): starting from zero when `k` starts at 0, else from `partial[s·C + j]`; written to y
/// (reduced) when `k` ends at `n_in`, else back to `partial`. With `PREFETCH`, the `k` values
/// from `prefetch` are also asked into L2.
///
/// # Safety
/// AVX-512F/VL present; rows `s0..s0+R` of x and `o0..o0+C` of w exist in `g`; `k` is in
/// `0..n_in` and starts on a multiple of 16; `partial` holds `g.rows · C` accumulators unless `k`
/// is all of `0..n_in`; with `PREFETCH`, `prefetch` is a row of w.
#[target_feature(enable = "avx512f,avx512vl")]
#[allow(clippy::needless_range_loop)]
#[inline]
unsafe fn tile<const R: usize, const C: usize, const PREFETCH: bool>(
    g: Geometry,
    s0: usize,
    o0: usize,
    k: std::ops::Range<usize>,
    partial: *mut __m512,
    prefetch: *const f32,
) {
    let n_in = g.n_in;
    let full = n_in / 16 * 16;
    let tail_mask: __mmask16 = ((1u32 << (n_in % 16)) - 1) as __mmask16;
    let xr: [*const f32; R] = std::array::from_fn(|i| g.x.add((s0 + i) * g.stride));
    let wr: [*const f32; C] = std::array::from_fn(|j| g.w.add((o0 + j) * n_in));
    let saved = |i: usize, j: usize| partial.add((s0 + i) * C + j);
    let mut acc = [[_mm512_setzero_ps(); C]; R];
    if k.start > 0 {
        for i in 0..R {
            for j in 0..C {
                acc[i][j] = *saved(i, j);
            }
        }
    }
    let mut kk = k.start;
    let end = k.end.min(full);
    while kk < end {
        if PREFETCH {
            _mm_prefetch::<_MM_HINT_T1>(prefetch.add(kk) as *const i8);
        }
        let wv: [__m512; C] = std::array::from_fn(|j| _mm512_loadu_ps(wr[j].add(kk)));
        for i in 0..R {
            let xv = _mm512_load_ps(xr[i].add(kk));
            for j in 0..C {
                acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
            }
        }
        kk += 16;
    }
    if k.end < n_in {
        for i in 0..R {
            for j in 0..C {
                *saved(i, j) = acc[i][j];
            }
        }
        return;
    }
    if full < n_in {
        let wv: [__m512; C] =
            std::array::from_fn(|j| _mm512_maskz_loadu_ps(tail_mask, wr[j].add(full)));
        for i in 0..R {
            let xv = _mm512_maskz_loadu_ps(tail_mask, xr[i].add(full));
            for j in 0..C {
                acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
            }
        }
    }
    for i in 0..R {
        let out = g.out.add((s0 + i) * g.n_out + o0);
        if C == 4 {
            _mm_storeu_ps(out, reduce4(acc[i][0], acc[i][1], acc[i][2], acc[i][3]));
        } else {
            for j in 0..C {
                *out.add(j) = _mm512_reduce_add_ps(acc[i][j]);
            }
        }
    }
}

/// `[_mm512_reduce_add_ps(a), …(b), …(c), …(d)]`, bit for bit: the same tree of additions —
/// lane `i` plus lane `i + 8`, then the 128-bit halves of that (`i` plus `i + 4`), then `i`
/// plus `i + 2`, then lane 0 plus lane 1 — on the four registers at once (one 512-bit add per
/// level instead of four narrower ones).
#[target_feature(enable = "avx512f,avx512vl")]
#[inline]
unsafe fn reduce4(a: __m512, b: __m512, c: __m512, d: __m512) -> __m128 {
    // [a₀₋₇ + a₈₋₁₅ | b₀₋₇ + b₈₋₁₅]
    let ab = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(a, b),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(a, b),
    );
    let cd = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b01_00_01_00>(c, d),
        _mm512_shuffle_f32x4::<0b11_10_11_10>(c, d),
    );
    // one 128-bit block per register: its lanes 0–3 plus lanes 4–7
    let u = _mm512_add_ps(
        _mm512_shuffle_f32x4::<0b10_00_10_00>(ab, cd),
        _mm512_shuffle_f32x4::<0b11_01_11_01>(ab, cd),
    );
    // per block: [u₀ + u₂, u₁ + u₃, …]
    let v = _mm512_add_ps(u, _mm512_permute_ps::<0b01_00_11_10>(u));
    // per block: lane 0 = v₀ + v₁
    let r = _mm512_add_ps(v, _mm512_permute_ps::<0b10_11_00_01>(v));
    _mm512_castps512_ps128(_mm512_permutexvar_ps(
        _mm512_setr_epi32(0, 4, 8, 12, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0),
        r,
    ))
}

#[cfg(test)]
#[path = "matmul_tests.rs"]
mod tests;
