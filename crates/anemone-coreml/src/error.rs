//! Errors of the Core ML backend; every one names the package it is about.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CoreMlError {
    #[error("{}: Core ML is unavailable: {reason}", package.display())]
    Unavailable { package: PathBuf, reason: String },
    #[error(
        "{}: needs macOS {}.{} or later for {what}; this is macOS {found}",
        package.display(), needed.0, needed.1
    )]
    OsTooOld {
        package: PathBuf,
        what: &'static str,
        needed: (u32, u32),
        found: String,
    },
    #[error("{}: Core ML could not compile the package: {message}", package.display())]
    Compile { package: PathBuf, message: String },
    #[error("{}: Core ML could not load the compiled model {}: {message}", package.display(), compiled.display())]
    Load {
        package: PathBuf,
        compiled: PathBuf,
        message: String,
    },
    #[error("{}: function `{function}`: prediction failed: {message}", package.display())]
    Predict {
        package: PathBuf,
        function: String,
        message: String,
    },
    #[error("{}: function `{function}`: input `{input}`: {problem}", package.display())]
    Input {
        package: PathBuf,
        function: String,
        input: String,
        problem: String,
    },
    #[error("{}: function `{function}`: output `{output}` is missing", package.display())]
    OutputMissing {
        package: PathBuf,
        function: String,
        output: String,
    },
    #[error(
        "{}: function `{function}`: output `{output}` has shape {found:?}, expected {expected:?}",
        package.display()
    )]
    OutputShape {
        package: PathBuf,
        function: String,
        output: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{}: compiled-model cache {}: {source}", package.display(), path.display())]
    Cache {
        package: PathBuf,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: reading the package: {source}", package.display())]
    Read {
        package: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("activation buffer {dtype} {shape:?}: {message}")]
    Buffer {
        dtype: String,
        shape: Vec<usize>,
        message: String,
    },
    #[error("{}: compute plan: {message}", package.display())]
    Plan { package: PathBuf, message: String },
}
