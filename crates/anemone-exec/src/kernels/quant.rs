//! Fused kernels for compressed projection weights (`packed.rs`): one row's fp16 values are
//! formed from its stored bytes in registers — 8-bit data widened, 4-bit data / palette indices
//! looked up in a 16-entry table — exactly as [`crate::decompress`] forms them (each step
//! rounded to fp16 where coremltools rounds), then multiplied into the f32 sum.
//!
//! The dot kernels sum in the order of the fp16 dot ([`super::simd::dot_f16_kernel`] on a CPU
//! with AVX2/FMA/F16C): element `32c + 8a + l` goes to accumulator `a`, lane `l`; at the end
//! `(acc0 + acc1) + (acc2 + acc3)`, then the lanes as its horizontal sum adds them. An AVX-512
//! register holds two of those accumulators side by side (lanewise FMAs are the same), so a
//! fused dot returns the bits the fp16 dot returns over the expanded row. A matvec runs four rows
//! a pass (`quant_avx512.rs`), sharing the loads of `x`; each row keeps its own accumulators, so
//! its value does not depend on its neighbours. Rows these kernels do not cover (no AVX-512
//! F/BW/VL/VBMI, a row length not a multiple of 32, blocks not a multiple of 16 columns) take
//! the row-forming path in `packed.rs`. On a CPU with AVX512-FP16, 8-bit rows are formed in
//! fp16 arithmetic, 32 values an instruction (`quant_fp16.rs`, which shows the values equal);
//! elsewhere 8-bit rows and 4-bit shift-scale rows (their blocks' 16-entry tables) whose
//! blocks all pass [`split_level_of`] over their data width's range (checked at load,
//! [`split_levels_of`]) round to fp16 by splitting in f32 operations (`quant_split.rs`), the
//! same values.

use half::f16;
use rayon::prelude::*;

use super::linalg::PARALLEL_WORK;

#[path = "quant_levels.rs"]
mod levels;
pub use levels::{
    split_level, split_level_of, split_levels, split_levels_of, split_product, split_round, splits,
    Bits, Split,
};

/// Rows per task of a wide expansion (`fill_by_rows`).
const ROWS_PER_TASK: usize = 64;

/// Bytes of stored rows per block of a single-token matvec (long blocks keep each core's
/// hardware prefetcher on one stream), fewer when that leaves a thread idle. Equal blocks, not
/// the fp16 matvec's shrinking runs from both ends: these kernels are bound by the core, not
/// the memory, so both threads finish equal blocks together, and runs (more calls, each with
/// its set-up) decoded 2–6% slower.
const BLOCK_BYTES: usize = 256 << 10;

/// Rows per pass of the fused dot (they share the loads of `x`; each row's sum is its own).
const GROUP: usize = 4;

/// How the values of one block are formed from 8-bit or 4-bit integer data `v`:
/// `r16(r16?(v - offset) * scale)` (the inner rounding unless the offset is fp32), or
/// `r16(v * scale)` without an offset.
#[derive(Clone, Copy)]
pub struct ShiftScale<'a> {
    /// Whether the data is signed (int8 / int4).
    pub signed: bool,
    /// The fp16 scales of this row's blocks, as stored (little-endian bit patterns).
    pub scales: &'a [u8],
    /// The offsets of this row's blocks, if any.
    pub offsets: Option<Offsets<'a>>,
    /// `v - offset` is rounded to fp16 (an fp16 or integer offset; an fp32 one promotes).
    pub round_shift: bool,
    /// How every block of this row passes [`split_level_of`] for its data width (the least
    /// level over its blocks, checked by whoever sets it; [`Split::No`] is always safe): 8-bit
    /// rows and 4-bit rows' tables may then be formed by splitting (`quant_split.rs`), the
    /// same values. Ignored in a [`Weight`]'s
    /// `all` row (its rows take theirs from [`Weight::with_split`]).
    pub split: Split,
}

/// The offsets of a row's blocks, one a block.
#[derive(Clone, Copy)]
pub enum Offsets<'a> {
    /// As f32 values.
    F32(&'a [f32]),
    /// As fp16 bit patterns: each offset is exactly this fp16 value (an fp16 or integer offset
    /// of 8 bits or fewer always is), so `r16(v - o)` is the fp16 subtraction.
    F16(&'a [u16]),
}

impl<'a> Offsets<'a> {
    /// Offsets in the block range `r`.
    pub fn get(&self, r: std::ops::Range<usize>) -> Option<Self> {
        Some(match self {
            Offsets::F32(o) => Offsets::F32(o.get(r)?),
            Offsets::F16(o) => Offsets::F16(o.get(r)?),
        })
    }

    fn len(&self) -> usize {
        match self {
            Offsets::F32(o) => o.len(),
            Offsets::F16(o) => o.len(),
        }
    }

    fn is_f16(&self) -> bool {
        matches!(self, Offsets::F16(_))
    }
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
    /// Bytes of codes in the row.
    fn code_bytes(&self) -> usize {
        match self {
            Row::Bytes { codes, .. } | Row::Nibbles { codes, .. } => codes.len(),
        }
    }

    /// Whether `other` is formed by the same kernel as `self` (data kind, signedness, offset
    /// kind, block width), so the two can share a pass.
    fn same_layout(&self, other: &Row) -> bool {
        let how = |a: &ShiftScale, b: &ShiftScale| {
            a.signed == b.signed
                && a.offsets.map(|o| o.is_f16()) == b.offsets.map(|o| o.is_f16())
                && a.round_shift == b.round_shift
        };
        self.per() == other.per()
            && match (self, other) {
                (Row::Bytes { how: a, .. }, Row::Bytes { how: b, .. }) => how(a, b),
                (
                    Row::Nibbles {
                        tables: Tables::Palettes(_),
                        ..
                    },
                    Row::Nibbles {
                        tables: Tables::Palettes(_),
                        ..
                    },
                ) => true,
                (
                    Row::Nibbles {
                        tables: Tables::ShiftScale(a),
                        ..
                    },
                    Row::Nibbles {
                        tables: Tables::ShiftScale(b),
                        ..
                    },
                ) => how(a, b),
                _ => false,
            }
    }

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
                && is_x86_feature_detected!("avx512bw")
                && is_x86_feature_detected!("avx512vl")
                && is_x86_feature_detected!("avx512vbmi")
                && is_x86_feature_detected!("avx2")
                && is_x86_feature_detected!("fma")
                && is_x86_feature_detected!("f16c")
        })
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether the fused kernels run here and form 8-bit and 4-bit rows marked by
/// [`ShiftScale::split`] by splitting (not on a CPU with AVX512-FP16: its fp16 arithmetic forms them faster).
pub fn split_used() -> bool {
    #[cfg(target_arch = "x86_64")]
    return available() && !avx512::fp16::available();
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// Whether `dot` and [`expand`] take `row` (the CPU runs them and the row's shape suits).
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
        avx512::expand(row, out, avx512::fp16::available())
    };
    #[cfg(target_arch = "x86_64")]
    return true;
    #[cfg(not(target_arch = "x86_64"))]
    false
}

/// `dst[i] = dot(row_of(i), x)` for every row, the rows of one weight (one shape and block
/// layout, checked once; per row only that its slices are long enough and its layout that of
/// the first row), spread over the decode team as the fp16 matvec is. `false` (and `dst`
/// unspecified) when the kernels do not cover the weight or a row is not of its layout.
pub fn matvec<'w>(
    dst: &mut [f32],
    x: &[f32],
    row_of: impl Fn(usize) -> Option<Row<'w>> + Sync,
) -> bool {
    matvec_group(&mut [Projection { dst, row_of }], x)
}

/// One weight of a [`matvec_group`]: its output and its rows (`row_of` generic, not `dyn`, so
/// it inlines into the kernel's loop: it runs once per row).
pub struct Projection<'a, F> {
    pub dst: &'a mut [f32],
    pub row_of: F,
}

/// [`matvec`] for every projection of `group` (all of the same `x`), in one parallel region of
/// the decode team (one fork and join for, e.g., a layer's q/k/v): each weight's rows in
/// blocks of `rows_per_block` as its own matvec splits them, each row's value that of its
/// own matvec, whichever thread runs it. `false` (and the outputs unspecified) when one
/// weight is not covered (see [`matvec`]).
pub fn matvec_group<'w, F>(group: &mut [Projection<F>], x: &[f32]) -> bool
where
    F: Fn(usize) -> Option<Row<'w>> + Sync,
{
    run_group(group, x)
}

/// Where the rows of a [`Projection`] come from, and how a block of them reaches the kernels.
trait Rows<'w>: Sync {
    /// Row `i` (`None` past the data).
    fn row(&self, i: usize) -> Option<Row<'w>>;

    /// `dst[r] = dot(row(start + r), x)` for every `r`; `false` when a row is missing or not
    /// of `first`'s layout, length and block count.
    ///
    /// # Safety
    /// [`covers`] holds for `first` (this source's row 0) and `first.len() == x.len()`.
    unsafe fn dots(&self, first: &Row<'w>, start: usize, dst: &mut [f32], x: &[f32]) -> bool;
}

/// Rows from any function: each row checked against the first (layout, length, blocks).
impl<'w, F> Rows<'w> for F
where
    F: Fn(usize) -> Option<Row<'w>> + Sync,
{
    fn row(&self, i: usize) -> Option<Row<'w>> {
        self(i)
    }

    unsafe fn dots(&self, first: &Row<'w>, start: usize, dst: &mut [f32], x: &[f32]) -> bool {
        let (k, blocks) = (x.len(), first.blocks());
        let row = |i: usize| {
            let row = self(i)?;
            (row.len() == k && row.same_layout(first) && row.slices_ok(blocks)).then_some(row)
        };
        // SAFETY: `covers` holds for `first` (the caller's contract), and `row` returns only
        // rows of its layout and length holding its blocks, so it holds for them.
        unsafe { dots_covered(first, row, start, dst, x) }
    }
}

/// Rows of a [`Weight`]: in its layout by construction, found by arithmetic (no per-row
/// checks beyond the range).
impl<'w> Rows<'w> for Weight<'w> {
    fn row(&self, i: usize) -> Option<Row<'w>> {
        Weight::row(self, i)
    }

    unsafe fn dots(&self, first: &Row<'w>, start: usize, dst: &mut [f32], x: &[f32]) -> bool {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: `covers` held for row 0 (the caller's contract), so it holds for every row
        // of the weight (one layout, `k` elements, `k / per` blocks each).
        return unsafe {
            avx512::dots_weight(self, first, start, dst, x, avx512::fp16::available())
        };
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (first, start, dst, x);
            false
        }
    }
}

/// A whole compressed weight as `packed.rs` stores it: `all` is a [`Row`] whose slices hold
/// every row's data — row `i`'s codes at element `i · k`, the parameters of its blocks from
/// block `(i / rows_per) · k / per` on — so a row is found by arithmetic, without a division
/// when `rows_per` is 1.
#[derive(Clone, Copy)]
pub struct Weight<'w> {
    all: Row<'w>,
    k: usize,
    rows_per: usize,
    blocks: usize,
    /// Each row group's [`Split`] level (empty: [`Split::No`] for every row).
    split: &'w [Split],
}

impl<'w> Weight<'w> {
    /// The weight with each row group's split level (`split[g]` of rows `g · rows_per..`),
    /// each the least [`split_level`] over the group's blocks ([`split_levels`]).
    pub fn with_split(self, split: &'w [Split]) -> Self {
        Weight { split, ..self }
    }

    /// `None` when `k` is not a multiple of `all`'s block width or `rows_per` is 0.
    pub fn new(all: Row<'w>, k: usize, rows_per: usize) -> Option<Self> {
        let per = all.per();
        (per != 0 && k.is_multiple_of(per) && rows_per != 0).then_some(Weight {
            all,
            k,
            rows_per,
            blocks: k / per,
            split: &[],
        })
    }

    /// Row `i` (`None` past the data). Every row has `k` elements and exactly `k / per` blocks'
    /// parameters, in `all`'s layout: a row the kernels cover at row 0 they cover at every row.
    #[inline]
    pub fn row(&self, i: usize) -> Option<Row<'w>> {
        let (k, nb) = (self.k, self.blocks);
        let group = if self.rows_per == 1 {
            i
        } else {
            i / self.rows_per
        };
        let g = group * nb;
        let split = self.split.get(group).copied().unwrap_or_default();
        let how = |h: &ShiftScale<'w>| -> Option<ShiftScale<'w>> {
            Some(ShiftScale {
                split,
                scales: h.scales.get(2 * g..2 * (g + nb))?,
                offsets: match h.offsets {
                    Some(o) => Some(o.get(g..g + nb)?),
                    None => None,
                },
                ..*h
            })
        };
        Some(match &self.all {
            Row::Bytes { codes, how: h, per } => Row::Bytes {
                codes: codes.get(i * k..(i + 1) * k)?,
                how: how(h)?,
                per: *per,
            },
            Row::Nibbles { codes, tables, per } if k.is_multiple_of(2) => Row::Nibbles {
                codes: codes.get(i * k / 2..(i + 1) * k / 2)?,
                tables: match tables {
                    Tables::Palettes(p) => Tables::Palettes(p.get(16 * g..16 * (g + nb))?),
                    Tables::ShiftScale(h) => Tables::ShiftScale(how(h)?),
                },
                per: *per,
            },
            Row::Nibbles { .. } => return None,
        })
    }
}

/// [`matvec_group`] of whole weights (`dst` and weight per projection): every row of a
/// [`Weight`] is in its first row's layout, so the per-row checks of [`matvec_group`] are not
/// needed, and the kernels read each row's parts found by arithmetic (no [`Row`] per row).
pub fn matvec_weights(group: &mut [(&mut [f32], Weight)], x: &[f32]) -> bool {
    let mut projections: Vec<_> = group
        .iter_mut()
        .map(|(dst, w)| Projection { dst, row_of: *w })
        .collect();
    run_group(&mut projections, x)
}

/// [`matvec_group`] of projections whose rows come from any [`Rows`].
fn run_group<'w, S: Rows<'w>>(group: &mut [Projection<S>], x: &[f32]) -> bool {
    struct Job<'a, 'w, S> {
        out: crate::team::SharedOut,
        rows: usize,
        per_block: usize,
        first_block: usize,
        first: Row<'w>,
        row_of: &'a S,
    }
    let mut firsts = Vec::with_capacity(group.len());
    for p in group.iter() {
        if p.dst.is_empty() {
            firsts.push(None);
            continue;
        }
        match p.row_of.row(0) {
            Some(first) if covers(&first) && first.len() == x.len() => firsts.push(Some(first)),
            _ => return false,
        }
    }
    let k = x.len();
    let work: usize = group.iter().map(|p| p.dst.len() * k).sum();
    let (team, threads) = super::linalg::region_team(work);
    let mut jobs = Vec::with_capacity(group.len());
    let mut blocks = 0;
    for (p, first) in group.iter_mut().zip(firsts) {
        let Some(first) = first else { continue };
        let rows = p.dst.len();
        let per_block = rows_per_block(rows, first.code_bytes(), threads, BLOCK_BYTES);
        jobs.push(Job {
            out: crate::team::SharedOut::new(p.dst),
            rows,
            per_block,
            first_block: blocks,
            first,
            row_of: &p.row_of,
        });
        blocks += rows.div_ceil(per_block);
    }
    let ok = std::sync::atomic::AtomicBool::new(true);
    let fail = || ok.store(false, std::sync::atomic::Ordering::Relaxed);
    let run_block = |b: usize| {
        let Some(job) = jobs.iter().rev().find(|j| j.first_block <= b) else {
            return;
        };
        let start = (b - job.first_block) * job.per_block;
        // SAFETY: blocks are disjoint row ranges inside the job's `dst`, which outlives the
        // region (`matvec_group` holds its borrow until `for_each_block` returns).
        let chunk = unsafe { job.out.slice(start..(start + job.per_block).min(job.rows)) };
        // SAFETY: `covers` held for the first row, of `x.len()` elements.
        if !unsafe { job.row_of.dots(&job.first, start, chunk, x) } {
            fail();
        }
    };
    crate::team::for_each_block(team.as_deref(), blocks, &run_block);
    ok.into_inner()
}

/// `dst[r] = dot(row_of(start + r), x)` (`GROUP` rows a pass); `false` when a row is missing
/// (or no kernel exists: never, as [`covers`] is false there).
///
/// # Safety
/// [`covers`] holds for `first` and every row `row_of` returns, which share `first`'s layout
/// and have `x.len()` elements.
unsafe fn dots_covered<'w>(
    first: &Row,
    row_of: impl Fn(usize) -> Option<Row<'w>>,
    start: usize,
    dst: &mut [f32],
    x: &[f32],
) -> bool {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: `covers` checked the CPU features and the rows' shapes and slices (the
    // caller's contract); `fp16` only where the CPU has AVX512-FP16.
    return unsafe { avx512::dots(first, row_of, start, dst, x, avx512::fp16::available()) };
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (first, row_of, start, dst, x);
        false
    }
}

/// Rows per block of a matvec of `rows` rows of `row_bytes` stored bytes each on `threads`
/// threads: the rows split evenly into the fewest blocks of at most `block_bytes` (the fused
/// kernels': [`BLOCK_BYTES`]) whose count is a multiple of `threads` (no thread idles while
/// another finishes a long last block), a positive multiple of [`GROUP`] rows.
fn rows_per_block(rows: usize, row_bytes: usize, threads: usize, block_bytes: usize) -> usize {
    let blocks = (rows * row_bytes)
        .div_ceil(block_bytes)
        .next_multiple_of(threads.max(1));
    rows.div_ceil(blocks.max(1))
        .next_multiple_of(GROUP)
        .max(GROUP)
}

/// Runs `kernel(first_row, rows)` over `dst` in blocks of [`rows_per_block`] rows, on the
/// decode team (as the fp16 matvec) when the product is large enough.
pub(crate) fn spread_rows(
    dst: &mut [f32],
    row_bytes: usize,
    k: usize,
    kernel: impl Fn(usize, &mut [f32]) + Sync,
) {
    let kernel = |_, first, rows: &mut [f32]| kernel(first, rows);
    spread_rows_of(&mut [dst], row_bytes, BLOCK_BYTES, k, kernel);
}

/// [`spread_rows`] over several outputs of one input (a layer's q/k/v) in one parallel region,
/// blocks of at most `block_bytes`: `kernel(output, first_row, rows)` for each block of each
/// output's rows (one fork and join instead of one per output).
pub(crate) fn spread_rows_of(
    dsts: &mut [&mut [f32]],
    row_bytes: usize,
    block_bytes: usize,
    k: usize,
    kernel: impl Fn(usize, usize, &mut [f32]) + Sync,
) {
    let work: usize = dsts.iter().map(|d| d.len() * k).sum();
    let (team, threads) = super::linalg::region_team(work);
    // per output: its rows, rows a block, its first block; then its buffer
    let mut blocks = 0;
    let mut jobs = Vec::with_capacity(dsts.len());
    for dst in dsts.iter_mut() {
        let rows = dst.len();
        let per_block = rows_per_block(rows, row_bytes, threads, block_bytes);
        jobs.push((rows, per_block, blocks, crate::team::SharedOut::new(dst)));
        blocks += rows.div_ceil(per_block);
    }
    crate::team::for_each_block(team.as_deref(), blocks, &|b| {
        let Some(m) = jobs.iter().rposition(|job| job.2 <= b) else {
            return;
        };
        let (rows, per_block, first_block, out) = &jobs[m];
        let first = (b - first_block) * per_block;
        // SAFETY: blocks are disjoint row ranges of the outputs, borrowed until the region
        // ends.
        let chunk = unsafe { out.slice(first..(first + per_block).min(*rows)) };
        kernel(m, first, chunk);
    });
}

/// `dst[i] = dot_row(i)` over the rows of `k` elements (each formed as an fp16 row), spread
/// over the decode team as the fp16 matvec is.
pub fn matvec_by_rows(dst: &mut [f32], k: usize, dot_row: impl Fn(usize) -> f32 + Sync) {
    let kernel = |first: usize, chunk: &mut [f32]| {
        for (r, d) in chunk.iter_mut().enumerate() {
            *d = dot_row(first + r);
        }
    };
    spread_rows(dst, 2 * k, k, kernel);
}

/// `dst[i] = dot(row i, x)` over rows formed as fp16 values by `form_rows(i, rows)` (the rows
/// from `i` that fill `rows`, `row_bytes` stored bytes each), four rows a pass through the fp16
/// four-row kernel where the CPU has it (each value [`super::simd::dot_f16_kernel`]'s bit for
/// bit, as [`matvec_by_rows`] gives), spread over the decode team as the fp16 matvec is.
pub fn matvec_by_formed_rows(
    dst: &mut [f32],
    x: &[f32],
    row_bytes: usize,
    form_rows: impl Fn(usize, &mut [f16]) + Sync,
) {
    let k = x.len();
    let (dot1, dot4) = (
        super::simd::dot_f16_kernel(),
        super::simd::dot_f16x4_kernel(),
    );
    let kernel = |first: usize, chunk: &mut [f32]| {
        FORMED.with(|cell| {
            let mut buf = cell.borrow_mut();
            buf.resize(4 * k, f16::ZERO);
            let mut r = 0;
            if let Some(dot4) = dot4 {
                while r + 4 <= chunk.len() {
                    form_rows(first + r, &mut buf);
                    chunk[r..r + 4].copy_from_slice(&dot4(&buf, x));
                    r += 4;
                }
            }
            for (i, d) in chunk.iter_mut().enumerate().skip(r) {
                form_rows(first + i, &mut buf[..k]);
                *d = dot1(&buf[..k], x);
            }
        })
    };
    spread_rows(dst, row_bytes, k, kernel);
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
    /// Four rows formed by [`matvec_by_formed_rows`].
    static FORMED: std::cell::RefCell<Vec<f16>> = const { std::cell::RefCell::new(Vec::new()) };
    /// Per-thread buffer a compressed weight is expanded into for a wide product.
    static EXPANDED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Frees this thread's [`with_filled`] buffer.
pub(crate) fn release_scratch() {
    EXPANDED.with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            *buf = Vec::new();
        }
    });
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
#[path = "quant_avx512.rs"]
mod avx512;
