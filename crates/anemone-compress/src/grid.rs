//! Affine grids in weight blocks. A block-quantized source (GGUF Q4_0/Q4_1/Q5_x/Q8_0, the
//! K-quants' 16- or 32-value sub-blocks) dequantizes every block to `origin + step · k` with
//! integer `k` in a short range. When that range fits the target width, the block can be
//! stored on its own grid — `scale = step`, an fp16 offset — and reconstructs to fp16
//! precision instead of picking up a second quantization error.

/// `origin + step · k`, `k` in `0..=top`, holding every value of a block.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct AffineGrid {
    pub origin: f64,
    pub step: f64,
    /// Largest grid index used (the block's maximum); 0 for a constant block.
    pub top: u32,
}

/// How far `(v − origin) / step` may sit from an integer for `v` to count as on the grid, in
/// steps. f32 dequantization noise is ~1e-7 of |v|, far below; a value truly off the grid is
/// off by a sizeable fraction of a step.
const ON_GRID_TOLERANCE: f64 = 2e-3;

/// Gaps below this fraction of a block's range are treated as repeats of one value (f32 noise).
const DISTINCT_FRACTION: f64 = 1e-4;

/// Subdivisions of the smallest gap tried as the step: a grid whose occupied levels are
/// e.g. {0, 2, 5} shows a smallest gap of 2 steps.
const MAX_GAP_SUBDIVISION: u32 = 4;

/// `x` rounded to an integer (ties to even) for `|x| < 2^51`, without a libm call: adding and
/// removing 1.5·2^52 leaves no fraction bits. Beyond that the result is only near `x`; grid
/// indices are far smaller, and a huge span fails the level count either way.
#[inline(always)]
pub(crate) fn round_near_integer(x: f64) -> f64 {
    const MAGIC: f64 = 6_755_399_441_055_744.0;
    (x + MAGIC) - MAGIC
}

/// The coarsest affine grid with at most `levels` levels that holds every value of `block`,
/// or `None`. `scratch` is reused across calls to sort the block.
pub(crate) fn detect(block: &[f32], levels: u32, scratch: &mut Vec<i32>) -> Option<AffineGrid> {
    let (mut lo, mut hi) = (f32::INFINITY, f32::NEG_INFINITY);
    for &v in block {
        lo = lo.min(v);
        hi = hi.max(v);
    }
    if block.is_empty() {
        return None;
    }
    let origin = lo as f64;
    let range = hi as f64 - origin;
    if range == 0.0 {
        return Some(AffineGrid {
            origin,
            step: 0.0,
            top: 0,
        });
    }
    // sort integer keys ordered like the (finite) floats: cheaper than comparing floats
    let to_key = |v: f32| {
        let bits = v.to_bits() as i32;
        bits ^ ((bits >> 31) & 0x7fff_ffff)
    };
    let from_key = |k: i32| f32::from_bits((k ^ ((k >> 31) & 0x7fff_ffff)) as u32);
    scratch.clear();
    scratch.extend(block.iter().map(|&v| to_key(v)));
    scratch.sort_unstable();
    let distinct = range * DISTINCT_FRACTION;
    let smallest_gap = scratch
        .windows(2)
        .map(|w| from_key(w[1]) as f64 - from_key(w[0]) as f64)
        .filter(|&g| g > distinct)
        .fold(f64::INFINITY, f64::min);
    for subdivision in 1..=MAX_GAP_SUBDIVISION {
        let step = smallest_gap / subdivision as f64;
        let span = range / step;
        let top = round_near_integer(span);
        if top > (levels - 1) as f64 {
            return None;
        }
        if (span - top).abs() > ON_GRID_TOLERANCE {
            continue;
        }
        let inv_step = 1.0 / step;
        let on_grid = block.iter().all(|&v| {
            let k = (v as f64 - origin) * inv_step;
            (k - round_near_integer(k)).abs() <= ON_GRID_TOLERANCE
        });
        if on_grid {
            // least-squares step through the fitted indices (f32 noise averages out)
            let (mut kk, mut kv) = (0f64, 0f64);
            for &v in block {
                let k = round_near_integer((v as f64 - origin) * inv_step);
                kk += k * k;
                kv += k * (v as f64 - origin);
            }
            return Some(AffineGrid {
                origin,
                step: kv / kk,
                top: top as u32,
            });
        }
    }
    None
}

/// Share of blocks (of `block_len` values, at most `samples` spread evenly over `weights`) that
/// lie on an affine grid of at most `levels` levels. With `give_up_below`, sampling stops (and
/// returns the share so far, below it) once that share can no longer be reached: a weight
/// without grids costs a few detections, not `samples`.
pub(crate) fn sampled_fit(
    weights: &[f32],
    block_len: usize,
    levels: u32,
    samples: usize,
    give_up_below: Option<f64>,
) -> f64 {
    let blocks = weights.len() / block_len;
    if blocks == 0 {
        return 0.0;
    }
    let taken = blocks.min(samples);
    let allowed_misses = give_up_below.map_or(taken, |share| {
        taken - (share * taken as f64).ceil().min(taken as f64) as usize
    });
    let mut scratch = Vec::with_capacity(block_len);
    let (mut fit, mut missed) = (0, 0);
    for i in 0..taken {
        let b = i * blocks / taken;
        let block = &weights[b * block_len..(b + 1) * block_len];
        if detect(block, levels, &mut scratch).is_some() {
            fit += 1;
        } else {
            missed += 1;
            if missed > allowed_misses {
                return fit as f64 / taken as f64;
            }
        }
    }
    fit as f64 / taken as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn grid_block(origin: f32, step: f32, ks: &[u32]) -> Vec<f32> {
        ks.iter().map(|&k| origin + step * k as f32).collect()
    }

    #[test]
    fn finds_a_q4_1_style_grid_even_with_missing_levels() {
        let mut scratch = Vec::new();
        // levels {0, 2, 5, 15}: smallest gap is 2 steps, the grid step is found by subdivision
        let block = grid_block(-0.0371, 0.00493, &[0, 2, 5, 15, 2, 0, 5, 15]);
        let g = detect(&block, 16, &mut scratch).unwrap();
        assert_eq!(g.top, 15);
        assert!((g.step - 0.00493).abs() < 1e-8, "{g:?}");
        assert!((g.origin - -0.0371).abs() < 1e-8, "{g:?}");
    }

    #[test]
    fn rejects_off_grid_and_too_wide_blocks() {
        let mut scratch = Vec::new();
        let mut block = grid_block(0.1, 0.01, &[0, 1, 3, 7]);
        block.push(0.1 + 0.01 * 2.37);
        assert_eq!(detect(&block, 256, &mut scratch), None);
        // 17 levels do not fit 16
        let wide = grid_block(0.0, 0.5, &[0, 16, 3]);
        assert_eq!(detect(&wide, 16, &mut scratch), None);
        assert!(detect(&wide, 17, &mut scratch).is_some());
        // Gaussian values are no grid
        let gauss: Vec<f32> = (0..32)
            .map(|i| ((i * 7919 % 101) as f32 * 0.37).sin())
            .collect();
        assert_eq!(detect(&gauss, 256, &mut scratch), None);
    }

    #[test]
    fn constant_blocks_are_a_one_level_grid() {
        let mut scratch = Vec::new();
        let g = detect(&[0.25; 8], 16, &mut scratch).unwrap();
        assert_eq!((g.top, g.step, g.origin), (0, 0.0, 0.25));
    }

    #[test]
    fn sampled_fit_counts_grid_blocks() {
        let mut w = grid_block(-1.0, 0.125, &[0, 3, 5, 9, 1, 2, 7, 8]);
        w.extend((0..8).map(|i| (i as f32 * 1.7).sin()));
        assert_eq!(sampled_fit(&w, 8, 16, 100, None), 0.5);
        assert_eq!(sampled_fit(&w, 8, 16, 1, None), 1.0);
        // 0.9 cannot be reached once the second block misses
        assert_eq!(sampled_fit(&w, 8, 16, 100, Some(0.9)), 0.5);
        let mut noise: Vec<f32> = (0..800).map(|i| (i as f32 * 1.7).sin()).collect();
        noise[..8].copy_from_slice(&w[..8]);
        assert!(sampled_fit(&noise, 8, 16, 100, Some(0.9)) < 0.9);
    }
}
