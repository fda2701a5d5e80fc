//! The chunk plan: which consecutive layers go into which package.

use std::ops::Range;

use anemone_checkpoint::DecoderConfig;
use serde::{Deserialize, Serialize};

use super::options::Precision;
use super::weights::layer_weight_bytes;
use super::AneError;

/// How layers are grouped into chunks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ChunkSizing {
    /// A fixed number of layers per chunk (the last chunk may hold fewer).
    LayersPerChunk(usize),
    /// As many layers as fit in this many MiB of weights (at least one).
    MaxMegabytes(usize),
}

impl Default for ChunkSizing {
    fn default() -> Self {
        ChunkSizing::LayersPerChunk(1)
    }
}

/// Splits `config`'s layers into chunks.
pub fn plan_chunks(
    config: &DecoderConfig,
    sizing: ChunkSizing,
    precision: Precision,
) -> Result<Vec<Range<usize>>, AneError> {
    let n = config.num_hidden_layers;
    let per = match sizing {
        ChunkSizing::LayersPerChunk(0) => {
            return Err(AneError::Option {
                option: "layers-per-chunk",
                problem: "must be at least 1".into(),
            })
        }
        ChunkSizing::LayersPerChunk(k) => k,
        ChunkSizing::MaxMegabytes(0) => {
            return Err(AneError::Option {
                option: "chunk-size-mb",
                problem: "must be at least 1".into(),
            })
        }
        ChunkSizing::MaxMegabytes(mb) => {
            let layer = layer_weight_bytes(config, precision).max(1);
            (mb * (1 << 20) / layer).max(1)
        }
    };
    Ok((0..n).step_by(per).map(|s| s..(s + per).min(n)).collect())
}
