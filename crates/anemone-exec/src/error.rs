//! Errors of the executor: every variant names the package, function, op or value it is about.

use std::path::PathBuf;

use anemone_mil::MilError;

/// Everything that can go wrong loading or running a package.
#[derive(Debug, thiserror::Error)]
pub enum ExecError {
    /// The package could not be read (manifest, proto, weight.bin).
    #[error("package {}: {source}", path.display())]
    Load {
        path: PathBuf,
        #[source]
        source: MilError,
    },
    /// A constant or constexpr could not be decoded while preparing a function.
    #[error("package {}: function `{function}`: op `{op}` ({op_type}): {detail}", path.display())]
    Prepare {
        path: PathBuf,
        function: String,
        op: String,
        op_type: &'static str,
        detail: String,
    },
    /// The package has no function of that name.
    #[error("package {}: no function `{function}` (functions: {available})", path.display())]
    UnknownFunction {
        path: PathBuf,
        function: String,
        available: String,
    },
    /// A tensor input of the function's signature was not supplied.
    #[error("package {}: function `{function}`: missing input `{input}` ({expected})", path.display())]
    MissingInput {
        path: PathBuf,
        function: String,
        input: String,
        expected: String,
    },
    /// An input was supplied that the function does not declare.
    #[error("package {}: function `{function}`: unexpected input `{input}` (inputs: {declared})", path.display())]
    UnexpectedInput {
        path: PathBuf,
        function: String,
        input: String,
        declared: String,
    },
    /// An input's dtype or shape differs from the function signature, or its values do not
    /// fit the declared dtype.
    #[error("package {}: function `{function}`: input `{input}`: {detail}", path.display())]
    InputMismatch {
        path: PathBuf,
        function: String,
        input: String,
        detail: String,
    },
    /// A state the function declares is absent from the state passed to predict, or has
    /// another shape.
    #[error("package {}: function `{function}`: state `{state}`: {detail}", path.display())]
    StateMismatch {
        path: PathBuf,
        function: String,
        state: String,
        detail: String,
    },
    /// An op failed while running (out-of-range slice_update position, inconsistent shapes).
    #[error("package {}: function `{function}`: op `{op}` ({op_type}): {detail}", path.display())]
    Op {
        path: PathBuf,
        function: String,
        op: String,
        op_type: &'static str,
        detail: String,
    },
    /// A [`crate::Tensor`] built with data that does not match its shape or dtype.
    #[error(transparent)]
    InvalidTensor(#[from] anemone_backend::TensorError),
}

pub type Result<T, E = ExecError> = std::result::Result<T, E>;
