//! Reconstruction error of a compressed weight against the original.

use rayon::prelude::*;

/// How far the reconstructed weight is from the original, measured over all elements.
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct ErrorStats {
    /// `‖w − ŵ‖₂ / ‖w‖₂` (0 when both are zero; infinite for a zero original and a non-zero
    /// reconstruction).
    pub relative_rms: f64,
    /// `max |w − ŵ|`.
    pub max_abs: f64,
}

impl ErrorStats {
    /// The error of `reconstructed` against `original`; `None` if their lengths differ.
    pub fn measure(original: &[f32], reconstructed: &[f32]) -> Option<ErrorStats> {
        if original.len() != reconstructed.len() {
            return None;
        }
        let acc = original
            .par_chunks(1 << 16)
            .zip(reconstructed.par_chunks(1 << 16))
            .map(|(a, b)| {
                let mut acc = ErrorAccumulator::default();
                for (&x, &y) in a.iter().zip(b) {
                    acc.add(x, y);
                }
                acc
            })
            .reduce(ErrorAccumulator::default, ErrorAccumulator::merge);
        Some(acc.finish())
    }
}

/// Running sums for [`ErrorStats`], merged across workers.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct ErrorAccumulator {
    err2: f64,
    ref2: f64,
    max_abs: f64,
}

impl ErrorAccumulator {
    #[inline]
    pub fn add(&mut self, original: f32, reconstructed: f32) {
        let d = (original as f64 - reconstructed as f64).abs();
        self.err2 += d * d;
        self.ref2 += original as f64 * original as f64;
        self.max_abs = self.max_abs.max(d);
    }

    /// Adds sums gathered elsewhere: `Σ(w − ŵ)²`, `Σw²` and `max |w − ŵ|`.
    pub fn add_sums(&mut self, err2: f64, ref2: f64, max_abs: f64) {
        self.err2 += err2;
        self.ref2 += ref2;
        self.max_abs = self.max_abs.max(max_abs);
    }

    pub fn merge(self, o: ErrorAccumulator) -> ErrorAccumulator {
        ErrorAccumulator {
            err2: self.err2 + o.err2,
            ref2: self.ref2 + o.ref2,
            max_abs: self.max_abs.max(o.max_abs),
        }
    }

    pub fn finish(self) -> ErrorStats {
        let relative_rms = if self.err2 == 0.0 {
            0.0
        } else {
            (self.err2 / self.ref2).sqrt()
        };
        ErrorStats {
            relative_rms,
            max_abs: self.max_abs,
        }
    }
}
