//! Palettization: per group of output channels, a LUT of `2^bits` fp16 values and one index per
//! weight, for `constexpr_lut_to_dense(indices, lut)`.
//!
//! k-means runs on the group's values binned by their fp16 value (the LUT's own precision):
//! one pass builds the bins in sorted order with exact moments `Σw, Σw·x, Σw·x²` of the
//! original values, so cluster costs are exact and only splits inside one fp16 ulp are lost.

use half::f16;
use rayon::prelude::*;

use crate::cluster::{cluster, KmeansAlgorithm, SortedPoints};
use crate::layout::Layout;
use crate::scheme::PaletteMode;
use crate::stats::{ErrorAccumulator, ErrorStats};

pub(crate) struct Palettized {
    /// `groups × 2^bits` LUT entries, each group's ascending.
    pub luts: Vec<f16>,
    /// One index per weight, row-major like the weight.
    pub indices: Vec<u8>,
    pub groups: usize,
    /// Error of `lut[group][index]` against the input.
    pub stats: ErrorStats,
}

/// Order-preserving key of the fp16 rounding of `x` (negative values reversed).
#[inline]
fn f16_key(x: f32) -> usize {
    let b = f16::from_f32(x).to_bits();
    (if b & 0x8000 != 0 { !b } else { b | 0x8000 }) as usize
}

/// Dense per-fp16-value accumulators, reused across groups by one worker.
struct BinScratch {
    w: Vec<f64>,
    wx: Vec<f64>,
    wxx: Vec<f64>,
}

impl BinScratch {
    fn new() -> Self {
        BinScratch {
            w: vec![0.0; 1 << 16],
            wx: vec![0.0; 1 << 16],
            wxx: vec![0.0; 1 << 16],
        }
    }

    /// Bins `values` (shifted by `center` for precision) with weights; returns the sorted bins
    /// and leaves the scratch zeroed.
    fn sorted_points(
        &mut self,
        values: &[f32],
        weights: Option<&[f32]>,
        center: f64,
    ) -> SortedPoints {
        let (mut lo, mut hi) = (usize::MAX, 0);
        for (i, &v) in values.iter().enumerate() {
            let k = f16_key(v);
            let w = weights.map_or(1.0, |ws| ws[i] as f64);
            let x = v as f64 - center;
            self.w[k] += w;
            self.wx[k] += w * x;
            self.wxx[k] += w * x * x;
            lo = lo.min(k);
            hi = hi.max(k);
        }
        let mut moments = Vec::new();
        for k in lo..=hi {
            if self.w[k] > 0.0 {
                moments.push((self.w[k], self.wx[k], self.wxx[k]));
            }
            self.w[k] = 0.0;
            self.wx[k] = 0.0;
            self.wxx[k] = 0.0;
        }
        SortedPoints::from_moments(moments)
    }
}

/// The LUT `2^bits` entries from the group's centroids (ascending), padded by repeating the
/// last so every entry is a value the group uses.
fn lut_from_centroids(centroids: &[f64], center: f64, size: usize) -> Vec<f16> {
    let mut lut: Vec<f16> = centroids
        .iter()
        .map(|c| f16::from_f64(c + center))
        .collect();
    let last = lut.last().copied().unwrap_or(f16::ZERO);
    lut.resize(size, last);
    lut
}

fn uniform_lut(values: &[f32], size: usize) -> Vec<f16> {
    let (lo, hi) = values
        .iter()
        .fold((f32::INFINITY, f32::NEG_INFINITY), |(a, b), &v| {
            (a.min(v), b.max(v))
        });
    let step = (hi as f64 - lo as f64) / (size - 1) as f64;
    (0..size)
        .map(|i| f16::from_f64(lo as f64 + step * i as f64))
        .collect()
}

/// Index of the LUT entry nearest to each value (`lut` ascending), and the error.
fn assign_nearest(values: &[f32], lut: &[f16], out: &mut [u8]) -> ErrorAccumulator {
    let mut acc = ErrorAccumulator::default();
    let lut32: Vec<f32> = lut.iter().map(|v| v.to_f32()).collect();
    let mids: Vec<f32> = lut32.windows(2).map(|p| 0.5 * (p[0] + p[1])).collect();
    for (o, &v) in out.iter_mut().zip(values) {
        let mut j = mids.partition_point(|&m| m < v);
        // midpoints are rounded: settle ties and rounding by the true distance
        if j > 0 && (v - lut32[j - 1]).abs() <= (lut32[j] - v).abs() {
            j -= 1;
        } else if j + 1 < lut32.len() && (lut32[j + 1] - v).abs() < (v - lut32[j]).abs() {
            j += 1;
        }
        *o = j as u8;
        acc.add(v, lut32[j]);
    }
    acc
}

pub(crate) fn palettize(
    w: &[f32],
    importance: Option<&[f32]>,
    layout: &Layout,
    bits: u8,
    mode: PaletteMode,
    group_channels: usize,
    algorithm: KmeansAlgorithm,
) -> Palettized {
    let size = 1usize << bits;
    let group_len = group_channels * layout.row_len();
    let groups = layout.out_channels / group_channels;
    let mut luts = vec![f16::ZERO; groups * size];
    let mut indices = vec![0u8; w.len()];
    let acc = luts
        .par_chunks_mut(size)
        .zip(indices.par_chunks_mut(group_len))
        .enumerate()
        .map_init(BinScratch::new, |scratch, (g, (lut, idx))| {
            let values = &w[g * group_len..(g + 1) * group_len];
            let weights = importance.map(|imp| &imp[g * group_len..(g + 1) * group_len]);
            // a group whose importance is all zero falls back to plain counts
            let weights = weights.filter(|ws| ws.iter().any(|&x| x > 0.0));
            let group_lut = match mode {
                PaletteMode::Uniform => uniform_lut(values, size),
                PaletteMode::Kmeans => {
                    let center =
                        values.iter().map(|&v| v as f64).sum::<f64>() / values.len() as f64;
                    let points = scratch.sorted_points(values, weights, center);
                    let c = cluster(&points, size, algorithm);
                    lut_from_centroids(&c.centroids, center, size)
                }
            };
            lut.copy_from_slice(&group_lut);
            assign_nearest(values, &group_lut, idx)
        })
        .reduce(ErrorAccumulator::default, ErrorAccumulator::merge);
    Palettized {
        luts,
        indices,
        groups,
        stats: acc.finish(),
    }
}
