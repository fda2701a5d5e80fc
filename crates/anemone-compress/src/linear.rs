//! Linear quantization (int8 / int4), one fp16 scale per output channel or per block of input
//! channels, for `constexpr_blockwise_shift_scale(data, scale[, offset])`: symmetric max-abs
//! blocks, and blocks stored on their source's affine grid (see [`crate::grid`]).

use std::sync::Arc;

use half::f16;
use rayon::prelude::*;

use crate::error::{CompressError, Result};
use crate::grid::{self, AffineGrid};
use crate::layout::Layout;
use crate::scheme::{LinearBits, LinearMode};
use crate::stats::{ErrorAccumulator, ErrorStats};

pub(crate) struct LinearQuantized {
    /// Quantized values in `[-qmax, qmax]` as two's-complement bytes, row-major like the weight.
    pub q: Arc<[u8]>,
    /// One scale per (row, block), row-major `[O, I / B]`.
    pub scales: Vec<f16>,
    /// With a grid: one fp16 offset per scale (0 for blocks stored symmetrically).
    pub offsets: Option<Vec<f16>>,
    pub blocks_per_row: usize,
    /// Blocks stored on their own grid.
    pub grid_blocks: usize,
    /// Error of the reconstruction `fp16(q · scale)` against the input.
    pub stats: ErrorStats,
}

/// `x` rounded to the nearest fp16 value (ties to even), as f32, without a library call:
/// for fp16 normals drop 13 mantissa bits with round-to-nearest-even on the f32 bits, for fp16
/// subnormals round to a multiple of 2^-24; beyond 65504 defer to `half` (infinity).
#[inline(always)]
pub(crate) fn round_to_f16(x: f32) -> f32 {
    let a = x.abs();
    if a < F16_MIN_NORMAL {
        const Q: f32 = 16_777_216.0; // 2^24
        (round_ties_even_small(x * Q) / Q).copysign(x)
    } else if a < 65504.0 {
        round_normal_to_f16(x)
    } else {
        f16::from_f32(x).to_f32()
    }
}

/// Smallest positive fp16 normal, 2^-14.
const F16_MIN_NORMAL: f32 = 6.103_515_6e-5;

/// [`round_to_f16`] for 0 and values whose fp16 rounding is a normal number.
#[inline(always)]
fn round_normal_to_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let lsb = (bits >> 13) & 1;
    f32::from_bits((bits + 0x0fff + lsb) & !0x1fff)
}

/// Largest magnitude (weights are finite, checked before), in `LANES` accumulators.
#[inline(always)]
fn max_abs(w: &[f32]) -> f32 {
    let mut m = [0f32; LANES];
    let mut chunks = w.chunks_exact(LANES);
    for c in &mut chunks {
        for l in 0..LANES {
            m[l] = if c[l].abs() > m[l] { c[l].abs() } else { m[l] };
        }
    }
    let tail = chunks.remainder().iter().fold(0f32, |a, v| a.max(v.abs()));
    m.iter().fold(tail, |a, &v| a.max(v))
}

/// Lanes of the vectorized block loop.
const LANES: usize = 8;

/// Quantizes one block whose products `q · step` are all 0 or fp16 normals, in `LANES`
/// independent f32 accumulators (so the loop vectorizes); sums go to f64 once per block.
/// Returns `(Σ(w − ŵ)², Σw², max |w − ŵ|)`.
#[inline(always)]
fn quantize_normal_block(q: &mut [u8], w: &[f32], step: f32, lo: f32, hi: f32) -> (f64, f64, f64) {
    let mut e2 = [0f32; LANES];
    let mut r2 = [0f32; LANES];
    let mut emax = [0f32; LANES];
    let mut lane_chunk = |q: &mut [u8], w: &[f32]| {
        for l in 0..q.len() {
            // |w / s| <= qmax by the choice of s; the clamp only guards rounding
            let qf = round_ties_even_small(w[l] / step).clamp(lo, hi);
            q[l] = qf as i8 as u8;
            let d = w[l] - round_normal_to_f16(qf * step);
            e2[l] += d * d;
            r2[l] += w[l] * w[l];
            emax[l] = emax[l].max(d.abs());
        }
    };
    let mut qc = q.chunks_exact_mut(LANES);
    let mut wc = w.chunks_exact(LANES);
    for (qs, ws) in (&mut qc).zip(&mut wc) {
        lane_chunk(qs, ws);
    }
    lane_chunk(qc.into_remainder(), wc.remainder());
    let sum = |a: [f32; LANES]| a.iter().map(|&v| v as f64).sum::<f64>();
    (
        sum(e2),
        sum(r2),
        emax.iter().fold(0f32, |m, &v| m.max(v)) as f64,
    )
}

/// `x` rounded to the nearest integer, ties to even, for `|x| < 2^22` (adding and removing
/// 1.5·2^23 leaves no fraction bits; avoids a libm call per weight).
#[inline(always)]
fn round_ties_even_small(x: f32) -> f32 {
    const MAGIC: f32 = 12_582_912.0;
    (x + MAGIC) - MAGIC
}

/// The fp16 scale of a block with largest magnitude `max_abs`: the smallest fp16 value
/// `>= max_abs / qmax`, so no value clips and each rounds to within half a step. An all-zero
/// block gets scale 1 (its data are all 0, so the weight decodes to exact zeros).
pub(crate) fn block_scale(max_abs: f32, qmax: i32) -> Option<f16> {
    if max_abs == 0.0 {
        return Some(f16::ONE);
    }
    let exact = max_abs / qmax as f32;
    let mut s = f16::from_f32(exact);
    if s.to_f32() < exact {
        s = f16::from_bits(s.to_bits() + 1);
    }
    if s.is_infinite() {
        return None;
    }
    Some(s)
}

/// Quantizes one block symmetrically (`[-qmax, qmax]`, no offset) into `q_blk`; returns its
/// scale and `(Σ(w − ŵ)², Σw², max |w − ŵ|)`. `block` numbers it in errors. The same code,
/// compiled for AVX2 where the CPU has it (the lanes loops then run 8 wide).
fn symmetric_block(
    tensor: &str,
    block: usize,
    q_blk: &mut [u8],
    w_blk: &[f32],
    qmax: i32,
) -> Result<(f16, (f64, f64, f64))> {
    #[cfg(target_arch = "x86_64")]
    if has_avx2() {
        // SAFETY: the CPU supports AVX2, checked just above
        return unsafe { symmetric_block_avx2(tensor, block, q_blk, w_blk, qmax) };
    }
    symmetric_block_portable(tensor, block, q_blk, w_blk, qmax)
}

#[cfg(target_arch = "x86_64")]
fn has_avx2() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| is_x86_feature_detected!("avx2"))
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
unsafe fn symmetric_block_avx2(
    tensor: &str,
    block: usize,
    q_blk: &mut [u8],
    w_blk: &[f32],
    qmax: i32,
) -> Result<(f16, (f64, f64, f64))> {
    symmetric_block_portable(tensor, block, q_blk, w_blk, qmax)
}

#[inline(always)]
fn symmetric_block_portable(
    tensor: &str,
    block: usize,
    q_blk: &mut [u8],
    w_blk: &[f32],
    qmax: i32,
) -> Result<(f16, (f64, f64, f64))> {
    let max_abs = max_abs(w_blk);
    let scale = block_scale(max_abs, qmax).ok_or_else(|| CompressError::ScaleOverflow {
        tensor: tensor.into(),
        block,
        scale: max_abs / qmax as f32,
    })?;
    let step = scale.to_f32();
    let (lo, hi) = (-qmax as f32, qmax as f32);
    // every product q·step is 0 or an fp16 normal: the branch-free rounding applies and the
    // loop vectorizes
    if step >= F16_MIN_NORMAL && max_abs <= 32768.0 {
        return Ok((scale, quantize_normal_block(q_blk, w_blk, step, lo, hi)));
    }
    let (mut e2, mut r2, mut emax) = (0f64, 0f64, 0f32);
    for (qv, &wv) in q_blk.iter_mut().zip(w_blk) {
        let qf = round_ties_even_small(wv / step).clamp(lo, hi);
        *qv = qf as i8 as u8;
        let d = wv - round_to_f16(qf * step);
        e2 += (d as f64) * (d as f64);
        r2 += (wv as f64) * (wv as f64);
        emax = emax.max(d.abs());
    }
    Ok((scale, (e2, r2, emax as f64)))
}

/// Stores a block that lies on `grid` on that grid: data `j·k + shift` (`k` the grid index),
/// fp16 scale `s ≈ step / j`, an fp16 offset; Core ML reconstructs
/// `fp16(s · fp16(data − offset))`. The step seldom is an fp16 value (a K-quant's step is
/// `d · sc`) and its rounding biases the whole block, so besides `j = 1` the multiplier whose
/// fp16 `step / j` is closest (among those the width allows) is tried, each with the
/// least-squares offset and that offset rounded to an integer (exact `data − offset` for grids
/// through zero: Q5_0/Q8_0/Q6_K); the candidate reconstructing the block best is kept, an
/// integer offset when it comes within [`INTEGER_OFFSET_SLACK`]. `shift` keeps `data − offset`
/// close to `w / s`, where fp16 holds it to the precision of the value itself. Returns `None`
/// (the caller falls back to symmetric) for a constant block or a step without a nearby fp16
/// normal.
fn grid_block(
    q_blk: &mut [u8],
    w_blk: &[f32],
    grid: AffineGrid,
    bits: LinearBits,
    indices: &mut Vec<i32>,
) -> Option<(f16, f16, (f64, f64, f64))> {
    if grid.top == 0 {
        return None;
    }
    let (qmin, qmax) = bits.grid_range();
    let top = grid.top as i32;
    let inv_step = 1.0 / grid.step;
    indices.clear();
    indices.extend(
        w_blk
            .iter()
            .map(|&w| grid::round_near_integer((w as f64 - grid.origin) * inv_step) as i32),
    );
    let n = w_blk.len() as f64;
    let sum_w: f64 = w_blk.iter().map(|&w| w as f64).sum();
    let sum_k: f64 = indices.iter().map(|&k| k as f64).sum();
    let mut best: Option<GridCandidate> = None;
    let mut best_integer: Option<GridCandidate> = None;
    // multipliers tried: 1, and the one whose fp16 scale lands closest to step / j
    let scale_error = |j: i32| {
        let target = grid.step / j as f64;
        let scale = f16::from_f64(target);
        (scale, ((scale.to_f64() - target) / target).abs())
    };
    let closest = (2..=((qmax - qmin) / top))
        .map(|j| (j, scale_error(j).1))
        .filter(|&(_, e)| e < scale_error(1).1)
        .min_by(|a, b| a.1.total_cmp(&b.1))
        .map(|(j, _)| j);
    for j in std::iter::once(1).chain(closest) {
        let (scale, error) = scale_error(j);
        let s = scale.to_f64();
        if !scale.is_normal() || error > 1.0 / 2048.0 {
            continue;
        }
        let shift = (grid::round_near_integer(grid.origin / s) as i32).clamp(qmin, qmax - j * top);
        // the offset minimizing Σ(s·(data − offset) − w)²: the mean of data − w / s
        let least_squares = (j as f64 * sum_k + n * shift as f64 - sum_w / s) / n;
        let scale32 = scale.to_f32();
        for offset in [least_squares, least_squares.round()].map(f16::from_f64) {
            let off = offset.to_f32();
            let (mut e2, mut emax) = (0f64, 0f32);
            for (&w, &k) in w_blk.iter().zip(indices.iter()) {
                let d = w - round_to_f16(scale32 * round_to_f16((j * k + shift) as f32 - off));
                e2 += (d * d) as f64;
                emax = emax.max(d.abs());
            }
            let candidate = (e2, emax, scale, offset, j, shift);
            if best.is_none_or(|(b, ..)| e2 < b) {
                best = Some(candidate);
            }
            let integer = offset.to_f64().fract() == 0.0;
            if integer && best_integer.is_none_or(|(b, ..)| e2 < b) {
                best_integer = Some(candidate);
            }
        }
    }
    let (e2, emax, scale, offset, j, shift) = match (best?, best_integer) {
        (best, Some(integer)) if integer.0 <= best.0 * INTEGER_OFFSET_SLACK => integer,
        (best, _) => best,
    };
    for (qv, &k) in q_blk.iter_mut().zip(indices.iter()) {
        *qv = (j * k + shift) as i8 as u8;
    }
    let r2 = w_blk.iter().map(|&w| w as f64 * w as f64).sum();
    Some((scale, offset, (e2, r2, emax as f64)))
}

/// One way of storing a grid block: (Σ(w − ŵ)², max |w − ŵ|, scale, offset, j, shift).
type GridCandidate = (f64, f32, f16, f16, i32, i32);

/// An integer offset is kept over a fractional one whose squared error is at most this factor
/// smaller. The integer one makes every `data − offset` exact in fp16 and a grid's zero exactly
/// zero; a grid through zero (Q6_K, Q8_0, Q5_0 sources) has its least-squares offset a few 1e-4
/// of a step off the integer, which only nudges the block's smallest differences against the
/// fp16 scale's rounding, but turns the products of data next to the offset into fp16
/// subnormals that round — and one such block keeps the executor's split kernels off its whole
/// row. Measured on Qwen2.5-Coder-0.5B Q4_K_M, int8: the per-tensor relative RMS error of the
/// Q6_K `down_proj`s changes by at most 4e-5 of itself, max error unchanged, gate figures the
/// same to noise; their rows now split (one-thread decode CPU time −13%). Blocks whose
/// fractional offset is genuine (a Q4_K/Q4_1 minimum landing near a level) win by more.
const INTEGER_OFFSET_SLACK: f64 = 1.0 + 1.0 / 16.0;

/// Blocks sampled per tensor to decide whether it has a source grid.
const GRID_SAMPLES: usize = 256;

/// Share of sampled blocks that must lie on a grid for [`LinearMode::Auto`] to choose it.
const GRID_MIN_FIT: f64 = 0.9;

/// Block sizes (input channels) tried for a source grid, coarsest first: the 32-value blocks
/// of Q4_0/Q4_1/Q8_0/Q4_K/Q5_K, then the 16-value sub-blocks of Q6_K/Q3_K/Q2_K.
const GRID_BLOCK_CANDIDATES: [usize; 2] = [32, 16];

/// The layout `mode` resolves to for this weight: `(block_size, grid)`.
pub(crate) fn resolve(
    w: &[f32],
    layout: &Layout,
    bits: LinearBits,
    block_size: Option<usize>,
    mode: LinearMode,
) -> (Option<usize>, bool) {
    if mode == LinearMode::Symmetric {
        return (block_size, false);
    }
    let candidates: Vec<usize> = match block_size {
        Some(b) => vec![b],
        None => GRID_BLOCK_CANDIDATES
            .into_iter()
            .filter(|&b| layout.in_channels.is_multiple_of(b))
            .collect(),
    };
    let fits: Vec<(usize, f64)> = candidates
        .iter()
        .map(|&b| {
            // Auto only needs to know whether the share reaches GRID_MIN_FIT; Grid ranks them
            let give_up = (mode == LinearMode::Auto).then_some(GRID_MIN_FIT);
            let block_len = b * layout.spatial;
            let fit = grid::sampled_fit(w, block_len, bits.grid_levels(), GRID_SAMPLES, give_up);
            (b, fit)
        })
        .collect();
    if let Some(&(b, _)) = fits.iter().find(|(_, fit)| *fit >= GRID_MIN_FIT) {
        return (Some(b), true);
    }
    match mode {
        // Grid was asked for: the best-fitting block size, or the block size asked for
        LinearMode::Grid => {
            let best = fits
                .iter()
                .fold(None::<(usize, f64)>, |a, &(b, f)| match a {
                    Some((_, af)) if af >= f => a,
                    _ => Some((b, f)),
                })
                .map(|(b, _)| b);
            (best.or(block_size), true)
        }
        _ => (block_size, false),
    }
}

/// `len` zero bytes in an `Arc`.
fn zeroed_bytes(len: usize) -> Arc<[u8]> {
    let zeroed = Arc::<[u8]>::new_zeroed_slice(len);
    // SAFETY: every byte is initialized (to zero), and any byte is a valid u8
    unsafe { zeroed.assume_init() }
}

pub(crate) fn quantize(
    tensor: &str,
    w: &[f32],
    layout: &Layout,
    bits: LinearBits,
    block_size: Option<usize>,
    grid: bool,
) -> Result<LinearQuantized> {
    let row_len = layout.row_len();
    let block_channels = block_size.unwrap_or(layout.in_channels);
    let blocks_per_row = layout.in_channels / block_channels;
    let block_len = block_channels * layout.spatial;
    let qmax = bits.qmax();
    // allocated where the MIL tensor will hold it (no copy of the largest buffer afterwards)
    let mut q_shared = zeroed_bytes(w.len());
    let q = Arc::get_mut(&mut q_shared).expect("a fresh Arc has no other owner");
    let mut scales = vec![f16::ZERO; layout.out_channels * blocks_per_row];
    let mut offsets = vec![f16::ZERO; if grid { scales.len() } else { 0 }];
    let mut offset_rows: Vec<&mut [f16]> = if grid {
        offsets.chunks_mut(blocks_per_row).collect()
    } else {
        (0..layout.out_channels)
            .map(|_| Default::default())
            .collect()
    };
    let (acc, grid_blocks) = q
        .par_chunks_mut(row_len)
        .zip(scales.par_chunks_mut(blocks_per_row))
        .zip(offset_rows.par_iter_mut())
        .zip(w.par_chunks(row_len))
        .enumerate()
        .map(
            |(row, (((q_row, s_row), o_row), w_row))| -> Result<(ErrorAccumulator, usize)> {
                let mut acc = ErrorAccumulator::default();
                let mut on_grid = 0;
                let (mut scratch, mut indices) = (Vec::new(), Vec::new());
                for (b, ((q_blk, w_blk), s)) in q_row
                    .chunks_mut(block_len)
                    .zip(w_row.chunks(block_len))
                    .zip(s_row.iter_mut())
                    .enumerate()
                {
                    if grid {
                        let stored = grid::detect(w_blk, bits.grid_levels(), &mut scratch)
                            .and_then(|g| grid_block(q_blk, w_blk, g, bits, &mut indices));
                        if let Some((scale, offset, (e2, r2, emax))) = stored {
                            *s = scale;
                            o_row[b] = offset;
                            acc.add_sums(e2, r2, emax);
                            on_grid += 1;
                            continue;
                        }
                    }
                    let block = row * blocks_per_row + b;
                    let (scale, (e2, r2, emax)) =
                        symmetric_block(tensor, block, q_blk, w_blk, qmax)?;
                    *s = scale;
                    acc.add_sums(e2, r2, emax);
                }
                Ok((acc, on_grid))
            },
        )
        .try_reduce(
            || (ErrorAccumulator::default(), 0),
            |a, b| Ok((a.0.merge(b.0), a.1 + b.1)),
        )?;
    drop(offset_rows);
    Ok(LinearQuantized {
        q: q_shared,
        scales,
        offsets: grid.then_some(offsets),
        blocks_per_row,
        grid_blocks,
        stats: acc.finish(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_to_f16_matches_half_on_a_dense_sweep() {
        // every 97th f32 bit pattern of both signs up to fp16 overflow, plus the boundaries
        let mut checked = 0;
        for bits in (0u32..0x477f_f000)
            .step_by(97)
            .chain([0x3880_0000, 0x387f_ffff, 0x477f_efff])
        {
            for x in [f32::from_bits(bits), -f32::from_bits(bits)] {
                assert_eq!(
                    round_to_f16(x).to_bits(),
                    f16::from_f32(x).to_f32().to_bits(),
                    "x = {x:e} ({bits:#x})"
                );
                checked += 1;
            }
        }
        assert!(checked > 20_000_000);
    }

    #[test]
    fn scale_is_the_smallest_fp16_not_below_the_exact_one() {
        for max_abs in [1e-9f32, 3e-6, 0.0123, 1.0, 127.0, 5000.0] {
            let s = block_scale(max_abs, 127).unwrap();
            let exact = max_abs / 127.0;
            assert!(s.to_f32() >= exact);
            assert!(
                f16::from_bits(s.to_bits() - 1).to_f32() < exact,
                "{max_abs}"
            );
        }
        assert_eq!(block_scale(0.0, 7), Some(f16::ONE));
        assert_eq!(block_scale(1e9, 7), None);
    }
}
