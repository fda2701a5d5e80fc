//! Symmetric linear quantization (int8 / int4), one fp16 scale per output channel or per block
//! of input channels, for `constexpr_blockwise_shift_scale(data, scale)`.

use half::f16;
use rayon::prelude::*;

use crate::error::{CompressError, Result};
use crate::layout::Layout;
use crate::scheme::LinearBits;
use crate::stats::{ErrorAccumulator, ErrorStats};

pub(crate) struct LinearQuantized {
    /// Quantized values in `[-qmax, qmax]` as two's-complement bytes, row-major like the weight.
    pub q: Vec<u8>,
    /// One scale per (row, block), row-major `[O, I / B]`.
    pub scales: Vec<f16>,
    pub blocks_per_row: usize,
    /// Error of the reconstruction `fp16(q · scale)` against the input.
    pub stats: ErrorStats,
}

/// `x` rounded to the nearest fp16 value (ties to even), as f32, without a library call:
/// for fp16 normals drop 13 mantissa bits with round-to-nearest-even on the f32 bits, for fp16
/// subnormals round to a multiple of 2^-24; beyond 65504 defer to `half` (infinity).
#[inline]
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
#[inline]
fn round_normal_to_f16(x: f32) -> f32 {
    let bits = x.to_bits();
    let lsb = (bits >> 13) & 1;
    f32::from_bits((bits + 0x0fff + lsb) & !0x1fff)
}

/// Largest magnitude (weights are finite, checked before), in `LANES` accumulators.
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
#[inline]
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

pub(crate) fn quantize(
    tensor: &str,
    w: &[f32],
    layout: &Layout,
    bits: LinearBits,
    block_size: Option<usize>,
) -> Result<LinearQuantized> {
    let row_len = layout.row_len();
    let block_channels = block_size.unwrap_or(layout.in_channels);
    let blocks_per_row = layout.in_channels / block_channels;
    let block_len = block_channels * layout.spatial;
    let qmax = bits.qmax();
    let mut q = vec![0u8; w.len()];
    let mut scales = vec![f16::ZERO; layout.out_channels * blocks_per_row];
    let acc = q
        .par_chunks_mut(row_len)
        .zip(scales.par_chunks_mut(blocks_per_row))
        .zip(w.par_chunks(row_len))
        .enumerate()
        .map(
            |(row, ((q_row, s_row), w_row))| -> Result<ErrorAccumulator> {
                let mut acc = ErrorAccumulator::default();
                for (b, ((q_blk, w_blk), s)) in q_row
                    .chunks_mut(block_len)
                    .zip(w_row.chunks(block_len))
                    .zip(s_row.iter_mut())
                    .enumerate()
                {
                    let max_abs = max_abs(w_blk);
                    *s =
                        block_scale(max_abs, qmax).ok_or_else(|| CompressError::ScaleOverflow {
                            tensor: tensor.into(),
                            block: row * blocks_per_row + b,
                            scale: max_abs / qmax as f32,
                        })?;
                    let step = s.to_f32();
                    let (lo, hi) = (-qmax as f32, qmax as f32);
                    // every product q·step is 0 or an fp16 normal: the branch-free rounding
                    // applies and the loop vectorizes
                    let normal = step >= F16_MIN_NORMAL && max_abs <= 32768.0;
                    if normal {
                        let (e2, r2, emax) = quantize_normal_block(q_blk, w_blk, step, lo, hi);
                        acc.add_sums(e2, r2, emax);
                        continue;
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
                    acc.add_sums(e2, r2, emax as f64);
                }
                Ok(acc)
            },
        )
        .try_reduce(ErrorAccumulator::default, |a, b| Ok(a.merge(b)))?;
    Ok(LinearQuantized {
        q,
        scales,
        blocks_per_row,
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
