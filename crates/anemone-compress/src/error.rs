//! Errors of the compression crate: each names the tensor, scheme or config it is about.

use std::path::PathBuf;

/// Everything that can go wrong compressing a weight or reading a compression config.
#[derive(Debug, thiserror::Error)]
pub enum CompressError {
    /// The scheme cannot be applied to this weight's shape (rank, divisibility).
    #[error("tensor `{tensor}` {shape:?}: scheme `{scheme}` does not fit: {detail}")]
    ShapeMismatch {
        tensor: String,
        shape: Vec<usize>,
        scheme: String,
        detail: String,
    },
    /// The weight buffer does not hold `prod(shape)` values, or importance does not match.
    #[error("tensor `{tensor}`: {what} holds {got} values, shape {shape:?} needs {want}")]
    LengthMismatch {
        tensor: String,
        what: &'static str,
        shape: Vec<usize>,
        got: usize,
        want: usize,
    },
    /// A weight (or importance) is NaN or infinite; such a tensor cannot be quantized.
    #[error("tensor `{tensor}`: {what} element {index} is {value} (must be finite{extra})")]
    NonFinite {
        tensor: String,
        what: &'static str,
        index: usize,
        value: f32,
        extra: &'static str,
    },
    /// A per-block scale does not fit fp16 (|w| above 65504 × qmax).
    #[error("tensor `{tensor}`: block {block} needs scale {scale}, beyond fp16 range")]
    ScaleOverflow {
        tensor: String,
        block: usize,
        scale: f32,
    },
    /// A scheme string or config entry could not be parsed.
    #[error("invalid compression scheme `{text}`: {detail}")]
    InvalidScheme { text: String, detail: String },
    /// A compression config file could not be read or parsed.
    #[error("compression config {}: {detail}", path.display())]
    Config { path: PathBuf, detail: String },
    /// Building the constexpr op failed (names, MIL payload checks).
    #[error("tensor `{tensor}`: emitting the constexpr op failed: {source}")]
    Mil {
        tensor: String,
        #[source]
        source: anemone_mil::MilError,
    },
}

pub type Result<T, E = CompressError> = std::result::Result<T, E>;
