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
    if a < 6.103_515_6e-5 {
        const Q: f32 = 16_777_216.0; // 2^24
        (round_ties_even_small(x * Q) / Q).copysign(x)
    } else if a < 65504.0 {
        let bits = x.to_bits();
        let lsb = (bits >> 13) & 1;
        f32::from_bits((bits + 0x0fff + lsb) & !0x1fff)
    } else {
        f16::from_f32(x).to_f32()
    }
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
                    let max_abs = w_blk.iter().fold(0f32, |m, v| m.max(v.abs()));
                    *s =
                        block_scale(max_abs, qmax).ok_or_else(|| CompressError::ScaleOverflow {
                            tensor: tensor.into(),
                            block: row * blocks_per_row + b,
                            scale: max_abs / qmax as f32,
                        })?;
                    let step = s.to_f32();
                    for (qv, &wv) in q_blk.iter_mut().zip(w_blk) {
                        // |wv / s| <= qmax by the choice of s; the clamp only guards rounding.
                        let qf = round_ties_even_small(wv / step).clamp(-qmax as f32, qmax as f32);
                        *qv = qf as i8 as u8;
                        acc.add(wv, round_to_f16(qf * step));
                    }
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
