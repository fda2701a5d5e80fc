//! How a weight `[O, I, k…]` is cut: rows are output channels, each row `I · Πk` contiguous
//! values (row-major), input channel `c` of a row covering `k`-spatial values.

use crate::error::{CompressError, Result};

#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Layout {
    pub shape: Vec<usize>,
    pub out_channels: usize,
    pub in_channels: usize,
    /// Values per input channel (product of the trailing kernel dims; 1 for `[O, I]`).
    pub spatial: usize,
}

impl Layout {
    pub fn new(tensor: &str, shape: &[usize], len: usize, scheme: &str) -> Result<Layout> {
        if shape.len() < 2 || shape.contains(&0) {
            return Err(CompressError::ShapeMismatch {
                tensor: tensor.into(),
                shape: shape.to_vec(),
                scheme: scheme.into(),
                detail: "weights must be [O, I, …] with rank >= 2 and no zero dims".into(),
            });
        }
        let numel = shape.iter().try_fold(1usize, |a, &d| a.checked_mul(d));
        if numel != Some(len) {
            return Err(CompressError::LengthMismatch {
                tensor: tensor.into(),
                what: "weights",
                shape: shape.to_vec(),
                got: len,
                want: numel.unwrap_or(usize::MAX),
            });
        }
        Ok(Layout {
            shape: shape.to_vec(),
            out_channels: shape[0],
            in_channels: shape[1],
            spatial: shape[2..].iter().product(),
        })
    }

    /// Values per output channel.
    pub fn row_len(&self) -> usize {
        self.in_channels * self.spatial
    }
}

/// Rejects NaN and infinities (they have no quantized value and would poison a whole block).
pub(crate) fn check_finite(tensor: &str, what: &'static str, values: &[f32]) -> Result<()> {
    use rayon::prelude::*;
    const CHUNK: usize = 1 << 16;
    let first_bad = values
        .par_chunks(CHUNK)
        .enumerate()
        .filter_map(|(c, chunk)| {
            // a branch-free scan per chunk; locate the element only if there is one
            let any = chunk.iter().fold(false, |a, v| a | !v.is_finite());
            any.then(|| c * CHUNK + chunk.iter().position(|v| !v.is_finite()).unwrap_or(0))
        })
        .min();
    match first_bad {
        Some(index) => Err(CompressError::NonFinite {
            tensor: tensor.into(),
            what,
            index,
            value: values[index],
            extra: "",
        }),
        None => Ok(()),
    }
}
