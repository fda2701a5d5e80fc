//! Wide products `dst [m × n] (+)= a [m × k] · b [k × n]` on AVX-512 that give the values of
//! `gemm` 0.18 bit for bit, with vectors twice as wide as the AVX2 kernels `gemm` runs on stable
//! Rust.
//!
//! What `gemm::gemm` computes, as `linalg::matmul_on` calls it (row-major `dst`,
//! `alpha = beta = 1`, no conjugation), read from gemm 0.18.2 / gemm-common 0.18.2 /
//! gemm-f32 0.18.2:
//! - `dst` is row-major, so `gemm` transposes the problem: it computes `dstᵀ = bᵀ·aᵀ`, with
//!   `m' = n`, `n' = m`, `lhs' = bᵀ` (column stride `b.rs`), `rhs' = aᵀ` (row stride `a.cs`);
//! - it then takes a special path for `k ≤ 2` (outer products), `m' ≤ 1` or `n' ≤ 1`
//!   (matrix-vector), or `lhs'_cs == 1 && rhs'_rs == 1 && m'·n' ≤ 256` (horizontal kernels);
//!   [`applies`] admits none of those shapes (`m, n ≥ 2`, `k ≥ 3`, not `b.rs == 1 && m·n ≤ 256`);
//! - otherwise every output element is summed along k in consecutive blocks of `kc` (the last
//!   one shorter): `kc = min(k, 512)` when `m ≤ 64 && n ≤ 64`, else gemm-common's
//!   `kernel_params(m', n', k, MR, NR, 4).kc` with the FMA microkernel's `MR` (16) and `NR` (6)
//!   — [`block_len`] calls that very function;
//! - within a block, the microkernel starts its accumulator at `+0.0` and adds one fused
//!   multiply-add per depth, in order: `s = fma(b[d][t], a[i][d], s)` (each FMA rounds once,
//!   so the width of the vector that carries it does not matter);
//! - block `s_0` is stored as `1·s_0` (exact) when not accumulating, else added to `dst`; every
//!   later block is added as `fma(1, s_b, dst)`, i.e. `dst + s_b` rounded once.
//!
//! [`matmul`] does exactly that per element, 16 tokens (columns of `b`) a vector: tiles of up
//! to 64 columns × 6 rows of `a`, fp16 rows of `a` widened (exactly) six at a time; row groups
//! outermost, or blocks of `kc` depths outermost where `b` would not stay in the L2 cache
//! (each element's blocks still arrive in order: the same values). Whether it agrees with the
//! `gemm` of this build on this CPU is checked once per process on data ([`available`]); when
//! it does not (or without AVX-512F), callers keep `gemm`.

use std::sync::OnceLock;

use half::f16;

use super::linalg::MatRef;

/// The left operand `a [m × k]` of a product: rows with unit column stride.
#[derive(Clone, Copy)]
pub enum Lhs<'a> {
    /// Row `i` at `data[i * rs..i * rs + k]`.
    F32 { data: &'a [f32], rs: usize },
    /// Row-major fp16 `[m × k]`, widened exactly to f32.
    F16(&'a [f16]),
}

/// Rows of `a` per tile (a register block is 6 rows × 4 vectors of 16 columns).
#[cfg(target_arch = "x86_64")]
const TILE_ROWS: usize = 6;
/// Columns of `b` per tile.
#[cfg(target_arch = "x86_64")]
const TILE_COLS: usize = 64;

/// Whether [`matmul`] gives `gemm`'s values for this product: the shape takes `gemm`'s blocked
/// path (module docs), both operands have unit column stride, and [`available`].
pub fn applies(m: usize, n: usize, k: usize, a_cs: usize, b: &MatRef) -> bool {
    m >= 2
        && n >= 2
        && k >= 3
        && a_cs == 1
        && b.cs == 1
        && !(b.rs == 1 && m * n <= 256)
        && available()
}

/// `gemm`'s block length along k for an `m × n × k` product on its blocked path.
#[cfg(target_arch = "x86_64")]
pub fn block_len(m: usize, n: usize, k: usize) -> usize {
    use gemm_f32::microkernel::fma::f32::{MR_DIV_N, NR};
    // the f32 FMA kernels' vector holds 8 lanes (gemm-f32's `N` for `fma`, not exported)
    const MR: usize = MR_DIV_N * 8;
    if m <= 64 && n <= 64 {
        k.min(512)
    } else {
        // gemm calls it on the transposed problem (m' = n, n' = m)
        gemm_common::cache::kernel_params(n, m, k, MR, NR, std::mem::size_of::<f32>()).kc
    }
}

/// Whether this CPU runs [`matmul`] (AVX-512F and FMA) and it equals `gemm` bit for bit here,
/// checked once per process on products that cross block boundaries, with and without
/// accumulation, on both block rules and with row and column tails.
pub fn available() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(target_arch = "x86_64")]
        if is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma") {
            return [(70, 37, 1100), (40, 33, 1030), (13, 80, 9)]
                .iter()
                .all(|&(m, n, k)| matches_gemm(m, n, k));
        }
        false
    })
}

/// One product computed both ways (both accumulation modes), compared bit for bit.
#[cfg(target_arch = "x86_64")]
fn matches_gemm(m: usize, n: usize, k: usize) -> bool {
    // values of many magnitudes, so that any other order or rounding shows
    let value = |i: usize| {
        let h = (i as u32).wrapping_mul(2654435761);
        ((h >> 9) % 4001) as f32 / 977.0 - 2.0 + ((h >> 5) % 7) as f32 * 1e-3
    };
    let a: Vec<f32> = (0..m * k).map(|i| value(i + 1)).collect();
    let b: Vec<f32> = (0..k * n).map(|i| value(3 * i + 7)).collect();
    let start: Vec<f32> = (0..m * n).map(|i| value(5 * i + 2) * 50.0).collect();
    let (am, bm) = (MatRef::row_major(&a, m, k), MatRef::row_major(&b, k, n));
    [false, true].into_iter().all(|accumulate| {
        let mut want = start.clone();
        let mut got = start.clone();
        super::linalg::gemm_product(&mut want, am, bm, accumulate, false);
        // SAFETY: avx512f and fma were detected (the only caller checks).
        unsafe {
            product(
                &mut got,
                Lhs::F32 { data: &a, rs: k },
                m,
                k,
                bm,
                accumulate,
                false,
            )
        };
        want.iter()
            .zip(&got)
            .all(|(x, y)| x.to_bits() == y.to_bits())
    })
}

/// `dst = a · b` (`dst += a · b` when `accumulate`) with `gemm`'s values; `parallel` spreads
/// the rows of `a` over this thread's [`crate::team`] (the values do not depend on it).
/// Call only where [`applies`] holds.
pub fn matmul(
    dst: &mut [f32],
    a: Lhs,
    m: usize,
    k: usize,
    b: MatRef,
    accumulate: bool,
    parallel: bool,
) -> Result<(), String> {
    let n = b.cols;
    let a_fits = match a {
        Lhs::F32 { data, rs } => m == 0 || (m - 1) * rs + k <= data.len(),
        Lhs::F16(w) => w.len() == m * k,
    };
    let b_fits = k == 0 || n == 0 || (k - 1) * b.rs + n <= b.data.len();
    if !a_fits || !b_fits || b.rows != k || b.cs != 1 || dst.len() != m * n {
        return Err(format!(
            "AVX-512 product: {m}×{k} · {}×{} (row stride {}, column stride {}) into {} values",
            b.rows,
            b.cols,
            b.rs,
            b.cs,
            dst.len()
        ));
    }
    if !applies(m, n, k, 1, &b) {
        return Err(format!(
            "AVX-512 product: {m}×{k}·{k}×{n} is not for this kernel"
        ));
    }
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `applies` checked AVX-512F and FMA; the operands were checked above.
    unsafe {
        product(dst, a, m, k, b, accumulate, parallel)
    };
    // elsewhere `applies` is false: nothing reaches here
    #[cfg(not(target_arch = "x86_64"))]
    let _ = (accumulate, parallel);
    Ok(())
}

#[cfg(target_arch = "x86_64")]
std::thread_local! {
    /// Per-thread buffer for six fp16 rows widened to f32.
    static ROWS: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Frees this thread's widened-rows buffer.
pub(crate) fn release_scratch() {
    #[cfg(target_arch = "x86_64")]
    ROWS.with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            *buf = Vec::new();
        }
    });
}

/// [`matmul`] after its checks.
///
/// # Safety
/// AVX-512F and FMA are available; `a` holds `m` rows of `k`, `b` is `k × n` with unit column
/// stride inside its slice, `dst` holds `m · n` values.
#[cfg(target_arch = "x86_64")]
unsafe fn product(
    dst: &mut [f32],
    a: Lhs,
    m: usize,
    k: usize,
    b: MatRef,
    accumulate: bool,
    parallel: bool,
) {
    let n = b.cols;
    let kc = block_len(m, n, k);
    let team = if parallel {
        crate::team::current()
    } else {
        None
    };
    let threads = team.as_ref().map_or(1, |t| t.threads());
    // blocks of whole tiles, about four per thread so a late thread costs little
    let rows_per_block = if threads > 1 {
        m.div_ceil(4 * threads)
            .next_multiple_of(TILE_ROWS)
            .clamp(TILE_ROWS, 16 * TILE_ROWS)
    } else {
        m
    };
    let blocks = m.div_ceil(rows_per_block);
    let depth_outer = k > kc && 4 * k * n > b_panel_budget();
    let out = crate::team::SharedOut::new(dst);
    let run_block = |blk: usize| {
        let r0 = blk * rows_per_block;
        let r1 = (r0 + rows_per_block).min(m);
        // SAFETY: blocks are disjoint row ranges of `dst`, which outlives the region.
        let d = unsafe { out.slice(r0 * n..r1 * n) };
        ROWS.with(|cell| {
            let mut own = Vec::new();
            let mut guard = cell.try_borrow_mut();
            let scratch = match guard.as_mut() {
                Ok(buf) => &mut **buf,
                // re-entered on this thread: a buffer of its own
                Err(_) => &mut own,
            };
            // SAFETY: the caller's contract; rows r0..r1 of `a` and `dst`.
            unsafe {
                if depth_outer {
                    rows_depth_outer(d, a, r0, r1, k, b, kc, accumulate, scratch)
                } else {
                    rows(d, a, m, r0, r1, k, b, kc, accumulate, scratch)
                }
            };
        });
    };
    crate::team::for_each_block(team.as_deref(), blocks, &run_block);
}

/// Rows `r0..r1` of the product into `d`, tile by tile; while a tile runs, the next six rows
/// of `a` (of `m`) are prefetched, so that streaming the weight overlaps the arithmetic.
///
/// # Safety
/// As [`product`]; `d` holds `(r1 - r0) · n` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows(
    d: &mut [f32],
    a: Lhs,
    m: usize,
    r0: usize,
    r1: usize,
    k: usize,
    b: MatRef,
    kc: usize,
    accumulate: bool,
    scratch: &mut Vec<f32>,
) {
    let n = b.cols;
    let mut g0 = r0;
    while g0 < r1 {
        let nr = TILE_ROWS.min(r1 - g0);
        let (w, w_rs) = match a {
            Lhs::F32 { data, rs } => (data.as_ptr().add(g0 * rs), rs),
            Lhs::F16(w16) => {
                scratch.resize(nr * k, 0.0);
                super::gemm_f16::widen(&w16[g0 * k..(g0 + nr) * k], scratch);
                (scratch.as_ptr(), k)
            }
        };
        // the bytes of the next rows (inside the operand)
        let next = (g0 + nr).min(m);
        let next_rows = TILE_ROWS.min(m - next);
        let (pf, pf_bytes) = match a {
            Lhs::F32 { data, rs } => {
                let start = (next * rs).min(data.len());
                let end = (start + next_rows * rs).min(data.len());
                (data.as_ptr().add(start) as *const u8, 4 * (end - start))
            }
            Lhs::F16(w16) => (w16.as_ptr().add(next * k) as *const u8, 2 * next_rows * k),
        };
        let row_tiles = TileArgs {
            w,
            w_rs,
            x: b.data.as_ptr(),
            x_rs: b.rs,
            dst: d.as_mut_ptr().add((g0 - r0) * n),
            dst_rs: n,
            mask: !0,
            k,
            kc,
            accumulate,
            pf,
            pf_lines: pf_bytes / 64,
            pf_rows: 1,
            pf_stride: 0,
        };
        across_columns(row_tiles, n, nr);
        g0 += nr;
    }
}

/// Bytes of `b` beyond which [`rows`] would stream it from beyond the L2 cache once per row
/// group, so [`rows_depth_outer`] takes over: half this core's L2 (the weight rows and `dst` pass through it too). Qwen2.5's down projection (k =
/// 4864, 1.2 MiB of `b` for 64 tokens) took 19% less time so on one thread (session 16,
/// `prefill_product_speed`, best of 3 interleaved: 7371 → 5994 µs fp16, 6733 → 5814 f32);
/// panels that fit gained nothing measurable.
#[cfg(target_arch = "x86_64")]
fn b_panel_budget() -> usize {
    gemm_common::cache::CACHE_INFO[1].cache_bytes / 2
}

/// Rows `r0..r1` of the product into `d`, one block of `kc` depths at a time over every row
/// group: that block of `b` (`kc × n`) stays in cache while the rows pass over it, where
/// [`rows`] streams all of `b` once per row group. Each output element still gets its blocks
/// in order, each summed from +0 and added once (module docs): the values do not depend on
/// the loop order.
///
/// # Safety
/// As [`product`]; `d` holds `(r1 - r0) · n` values.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn rows_depth_outer(
    d: &mut [f32],
    a: Lhs,
    r0: usize,
    r1: usize,
    k: usize,
    b: MatRef,
    kc: usize,
    accumulate: bool,
    scratch: &mut Vec<f32>,
) {
    let n = b.cols;
    let mut d0 = 0;
    while d0 < k {
        let depth = kc.min(k - d0);
        let mut g0 = r0;
        while g0 < r1 {
            let nr = TILE_ROWS.min(r1 - g0);
            let (w, w_rs) = match a {
                Lhs::F32 { data, rs } => (data.as_ptr().add(g0 * rs + d0), rs),
                Lhs::F16(w16) => {
                    scratch.resize(nr * depth, 0.0);
                    for (j, row) in scratch.chunks_exact_mut(depth).enumerate() {
                        let start = (g0 + j) * k + d0;
                        super::gemm_f16::widen(&w16[start..start + depth], row);
                    }
                    (scratch.as_ptr(), depth)
                }
            };
            // the next row group's part of this depth block (or the next block's first group)
            let (next, next_d0) = if g0 + nr < r1 {
                (g0 + nr, d0)
            } else {
                (r0, d0 + depth)
            };
            let next_rows = TILE_ROWS.min(r1 - next);
            let next_depth = kc.min(k.saturating_sub(next_d0));
            let (pf, pf_stride, bytes) = match a {
                Lhs::F32 { data, rs } => (
                    data.as_ptr().add(next * rs + next_d0.min(k)) as *const u8,
                    4 * rs,
                    4 * next_depth,
                ),
                Lhs::F16(w16) => (
                    w16.as_ptr().add(next * k + next_d0.min(k)) as *const u8,
                    2 * k,
                    2 * next_depth,
                ),
            };
            let (pf_lines, pf_rows) = if next_depth == 0 {
                (0, 1)
            } else {
                (bytes.div_ceil(64), next_rows)
            };
            let row_tiles = TileArgs {
                w,
                w_rs,
                x: b.data.as_ptr().add(d0 * b.rs),
                x_rs: b.rs,
                dst: d.as_mut_ptr().add((g0 - r0) * n),
                dst_rs: n,
                mask: !0,
                k: depth,
                kc: depth,
                accumulate: accumulate || d0 > 0,
                pf,
                pf_lines,
                pf_rows,
                pf_stride,
            };
            across_columns(row_tiles, n, nr);
            g0 += nr;
        }
        d0 += depth;
    }
}

/// Runs the tiles of `nr` rows across the `n` columns of `b`, 64 at a time: `row_tiles` with
/// `x` and `dst` at column 0; its prefetch goes with the first tile (once per row group).
///
/// # Safety
/// As [`tile`], for every tile.
#[cfg(target_arch = "x86_64")]
unsafe fn across_columns(row_tiles: TileArgs, n: usize, nr: usize) {
    let mut t0 = 0;
    while t0 < n {
        let nt = TILE_COLS.min(n - t0);
        let mv = nt.div_ceil(16);
        let tail = nt - 16 * (mv - 1);
        let args = TileArgs {
            x: row_tiles.x.add(t0),
            dst: row_tiles.dst.add(t0),
            mask: if tail == 16 { !0 } else { (1 << tail) - 1 },
            pf_lines: if t0 == 0 { row_tiles.pf_lines } else { 0 },
            ..row_tiles
        };
        TILES[mv - 1][nr - 1](&args);
        t0 += nt;
    }
}

/// One tile's operands: `NR` rows of `a` (row `j` at `w + j·w_rs`) × `MV` vectors of 16
/// columns of `b` (row `d` at `x + d·x_rs`; `mask` selects the lanes of the last vector) into
/// `dst` (row `j` at `dst + j·dst_rs`); `pf_lines` cache lines from `pf` to prefetch meanwhile.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy)]
struct TileArgs {
    w: *const f32,
    w_rs: usize,
    x: *const f32,
    x_rs: usize,
    dst: *mut f32,
    dst_rs: usize,
    mask: u16,
    k: usize,
    kc: usize,
    accumulate: bool,
    pf: *const u8,
    pf_lines: usize,
    /// `pf_lines` is per row: so many rows `pf_stride` bytes apart (1: one contiguous range).
    pf_rows: usize,
    pf_stride: usize,
}

#[cfg(target_arch = "x86_64")]
type TileFn = unsafe fn(&TileArgs);

#[cfg(target_arch = "x86_64")]
macro_rules! tiles {
    ($($mv:literal),*) => {
        [$([
            tile::<$mv, 1>,
            tile::<$mv, 2>,
            tile::<$mv, 3>,
            tile::<$mv, 4>,
            tile::<$mv, 5>,
            tile::<$mv, 6>,
        ]),*]
    };
}

/// `TILES[mv - 1][nr - 1]`: the tile of `nr` rows × `mv` vectors of columns.
#[cfg(target_arch = "x86_64")]
static TILES: [[TileFn; TILE_ROWS]; TILE_COLS / 16] = tiles!(1, 2, 3, 4);

/// One tile ([`TileArgs`]), summed in `gemm`'s blocks of `kc` (module docs).
///
/// # Safety
/// AVX-512F and FMA are available; every row and column addressed (the masked lanes excepted)
/// lies inside its buffer.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,fma")]
unsafe fn tile<const MV: usize, const NR: usize>(t: &TileArgs) {
    use std::arch::x86_64::*;
    let TileArgs {
        w,
        w_rs,
        x,
        x_rs,
        dst,
        dst_rs,
        mask,
        k,
        kc,
        accumulate,
        pf,
        pf_lines,
        pf_rows,
        pf_stride,
    } = *t;
    let lanes = |v: usize| if v + 1 == MV { mask } else { !0 };
    // line `min((d · pf_step) >> 16, last)` at depth d: the lines spread evenly over the first
    // half of the k depths, so that the last ones arrive well before the next tile
    let pf_total = pf_lines * pf_rows;
    let pf_step = (pf_total << 17) / k;
    let pf_last = pf_total.saturating_sub(1);
    let pf_address = |line: usize| {
        if pf_rows <= 1 || pf_lines == 0 {
            pf.wrapping_add(line * 64)
        } else {
            let row = line / pf_lines;
            pf.wrapping_add(row * pf_stride + (line - row * pf_lines) * 64)
        }
    };
    let mut add = accumulate;
    let mut d0 = 0;
    while d0 < k {
        let d1 = (d0 + kc).min(k);
        // one block: every accumulator from +0, one FMA per depth in order
        let mut acc = [[_mm512_setzero_ps(); MV]; NR];
        for d in d0..d1 {
            // a hint only: it never faults and changes no value
            let line = ((d * pf_step) >> 16).min(pf_last);
            _mm_prefetch::<_MM_HINT_T1>(pf_address(line) as *const i8);
            let xr = x.add(d * x_rs);
            let mut xv = [_mm512_setzero_ps(); MV];
            for (v, xv) in xv.iter_mut().enumerate() {
                // masked lanes read nothing (no fault) and are never stored
                *xv = _mm512_maskz_loadu_ps(lanes(v), xr.add(16 * v));
            }
            for (j, acc) in acc.iter_mut().enumerate() {
                let wv = _mm512_set1_ps(*w.add(j * w_rs + d));
                for (acc, &xv) in acc.iter_mut().zip(&xv) {
                    *acc = _mm512_fmadd_ps(xv, wv, *acc);
                }
            }
        }
        // the block into dst: stored (first block, not accumulating) or added
        for (j, acc) in acc.iter().enumerate() {
            for (v, &s) in acc.iter().enumerate() {
                let p = dst.add(j * dst_rs + 16 * v);
                let s = if add {
                    _mm512_add_ps(_mm512_maskz_loadu_ps(lanes(v), p), s)
                } else {
                    s
                };
                _mm512_mask_storeu_ps(p, lanes(v), s);
            }
        }
        add = true;
        d0 = d1;
    }
}

#[cfg(all(test, target_arch = "x86_64"))]
#[path = "gemm_avx512_tests.rs"]
mod tests;
