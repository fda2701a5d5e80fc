//! Errors of checkpoint import; every variant names the file, tensor or field it is about.

use std::path::PathBuf;

pub type Result<T, E = CheckpointError> = std::result::Result<T, E>;

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: no such file or directory")]
    NotFound { path: PathBuf },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path}: invalid JSON: {source}")]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{path}: missing required file {what}")]
    MissingFile { path: PathBuf, what: String },
    #[error("{path}: field `{field}`: {problem}")]
    BadField {
        path: PathBuf,
        field: String,
        problem: String,
    },
    /// `known` lists the names the registry of families accepts for this source.
    #[error("unsupported architecture `{arch}` (supported: {known})")]
    UnknownArchitecture { arch: String, known: String },
    #[error(transparent)]
    Config(#[from] crate::config::InvalidConfig),
    #[error("{path}: corrupt {format} file: {problem}")]
    Corrupt {
        path: PathBuf,
        format: &'static str,
        problem: String,
    },
    #[error("{path}: tensor `{tensor}` uses unsupported type {dtype}")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error("tensor `{name}` is missing from the checkpoint")]
    MissingTensor { name: String },
    #[error("tensor `{name}` has shape {found:?}, the config implies {expected:?}")]
    ShapeMismatch {
        name: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("tensor `{name}` is stored twice: in {first} and in {second}")]
    DuplicateTensor {
        name: String,
        first: PathBuf,
        second: PathBuf,
    },
    #[error("tokenizer: {problem}")]
    Tokenizer { problem: String },
    /// A feature the checkpoint uses that anemone does not implement (rope scaling, a tensor no
    /// supported architecture has, …); importing it anyway would give wrong outputs.
    #[error("{path}: {what} is not supported")]
    Unsupported { path: PathBuf, what: String },
    /// A LoRA adapter that does not fit its base (or is malformed).
    #[error("{path}: LoRA adapter: {problem}")]
    Lora { path: PathBuf, problem: String },
}
