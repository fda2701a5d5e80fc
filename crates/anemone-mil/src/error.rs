//! Errors of the MIL crate: every variant names the op, value, function or file it is about.

use std::path::PathBuf;

/// Everything that can go wrong building, verifying, encoding or reading a program.
#[derive(Debug, thiserror::Error)]
pub enum MilError {
    /// An op's operand has a type the op cannot take (wrong dtype, rank, dims).
    #[error("op `{op}` ({op_type}): {detail}")]
    TypeMismatch {
        op: String,
        op_type: &'static str,
        detail: String,
    },
    /// An axis argument lies outside the operand's rank.
    #[error("op `{op}` ({op_type}): axis {axis} out of range for rank {rank}")]
    AxisOutOfRange {
        op: String,
        op_type: &'static str,
        axis: i64,
        rank: usize,
    },
    /// A name is not a MIL identifier (`[A-Za-z_][A-Za-z0-9_]*`).
    #[error("`{name}` is not a valid MIL identifier")]
    InvalidName { name: String },
    /// A value or op name is used twice within one function.
    #[error("function `{function}`: name `{name}` is defined twice")]
    DuplicateName { function: String, name: String },
    /// A value handle does not belong to this function or is used before its definition.
    #[error("function `{function}`: op `{op}` uses value #{var} which is not defined before it")]
    UndefinedValue {
        function: String,
        op: String,
        var: u32,
    },
    /// A state value used by anything other than read_state / write_state.
    #[error("function `{function}`: state `{state}` used by op `{op}` ({op_type}); only read_state/write_state may take a state")]
    StateMisuse {
        function: String,
        state: String,
        op: String,
        op_type: &'static str,
    },
    /// A structural problem of a function or program (outputs, inputs, function names, spec).
    #[error("function `{function}`: {detail}")]
    InvalidFunction { function: String, detail: String },
    /// A program-level problem (function table, default function, spec version).
    #[error("program: {detail}")]
    InvalidProgram { detail: String },
    /// Const data whose byte length does not match its dtype and shape.
    #[error("tensor data: {detail}")]
    InvalidTensorData { detail: String },
    /// A weight.bin problem (bad header, sentinel, bounds, dtype).
    #[error("weight blob {file}: {detail}")]
    Blob { file: String, detail: String },
    /// A model.mlmodel that cannot be understood (not protobuf, not an ML program, bad op).
    #[error("model {file}: {detail}")]
    Model { file: String, detail: String },
    /// An op type this crate does not support, found while reading a model proto.
    #[error("model {file}: function `{function}`: op `{op}` has unsupported type `{op_type}`")]
    UnsupportedOp {
        file: String,
        function: String,
        op: String,
        op_type: String,
    },
    /// A package directory problem (manifest, layout, existing output).
    #[error("package {}: {detail}", path.display())]
    Package { path: PathBuf, detail: String },
    /// An output that cannot be staged or put in place (exists, not ours, busy).
    #[error(transparent)]
    Staging(#[from] crate::staging::StagingError),
    /// An I/O failure on a named path.
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

pub type Result<T, E = MilError> = std::result::Result<T, E>;

pub(crate) fn io_err(path: impl Into<PathBuf>) -> impl FnOnce(std::io::Error) -> MilError {
    let path = path.into();
    move |source| MilError::Io { path, source }
}
