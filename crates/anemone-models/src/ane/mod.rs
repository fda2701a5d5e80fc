//! ANE graph builders: a decoder chunk (consecutive layers, stateful, `decode` + `prefill`
//! functions sharing weights) and the LM-head package, in the BC1S layout with 1×1-conv
//! projections, per-head attention, explicit max-subtracted softmax, finite masks, fp16 state
//! (docs/ARCHITECTURE.md, "What the Neural Engine accepts"); plus the host-side inputs they
//! expect and a static ANE-legality lint.

pub mod decoder;
pub mod io;
pub mod kv;
pub mod lint;
pub mod lm_head;
pub mod norm;
pub mod options;
pub mod plan;
pub mod rope;
pub mod signature;
pub mod weights;

pub use decoder::{build_chunk_program, chunk_signature, names, state_shapes};
pub use kv::{KvLayout, LayerGroup};
pub use lint::{lint_program, Finding, Severity};
pub use options::{ChunkOptions, LmHeadPlacement, NormForm, Precision, StateLayout};
pub use plan::{plan_chunks, ChunkSizing};
pub use signature::{FunctionSignature, TensorSignature};
pub use weights::{LayerWeights, PreparedWeight, Uncompressed, WeightCompressor};

use anemone_checkpoint::CheckpointError;
use anemone_mil::MilError;

/// Errors of the graph builders; each names the option, tensor or op it is about.
#[derive(Debug, thiserror::Error)]
pub enum AneError {
    #[error("--{option}: {problem}")]
    Option {
        option: &'static str,
        problem: String,
    },
    #[error("tensor `{tensor}` has shape {found:?}, the config implies {expected:?}")]
    TensorShape {
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("unsupported model: {problem}")]
    Unsupported { problem: String },
    #[error(transparent)]
    Config(#[from] anemone_checkpoint::InvalidConfig),
    /// A [`WeightCompressor`] could not compress a weight.
    #[error("compressing tensor `{tensor}`: {source}")]
    Compression {
        tensor: String,
        #[source]
        source: Box<dyn std::error::Error + Send + Sync>,
    },
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error(transparent)]
    Mil(#[from] MilError),
}
