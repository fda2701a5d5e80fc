//! CPU interpreter of MIL programs as written to disk, in fp32 or fp16-faithful arithmetic;
//! [`ExecutorBackend`] runs it behind the backend contract of `anemone-backend`.
//!
//! ```no_run
//! use std::collections::HashMap;
//! use anemone_exec::{LoadedPackage, Precision, Tensor};
//!
//! # fn main() -> Result<(), anemone_exec::ExecError> {
//! let package = LoadedPackage::load("chunk-00.mlpackage".as_ref(), Precision::Fp16)?;
//! let mut state = package.new_state("decode")?; // zeros, one tensor per declared state
//! let mut inputs = HashMap::new();
//! inputs.insert("x".to_string(), Tensor::f16(vec![1, 64, 1, 1], vec![0.5; 64])?);
//! inputs.insert("pos".to_string(), Tensor::i32(vec![1], &[0])?);
//! let outputs = package.predict("decode", &inputs, &mut state)?;
//! println!("{}", outputs["y"]);
//! # Ok(()) }
//! ```
//!
//! Loading decodes every const and constexpr once into f32 buffers (identical payloads shared
//! by all functions); running interprets the remaining ops in order. In [`Precision::Fp16`]
//! every op output declared fp16 is rounded to fp16 as the ANE stores it, while sums inside
//! an op (conv, matmul, norms) accumulate in f32.

// Library code reports failures as errors; tests may unwrap (docs/ARCHITECTURE.md, "Lint gates").
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::panic,
        clippy::todo,
        clippy::unimplemented,
        clippy::dbg_macro
    )
)]

mod backend;
pub mod decompress;
mod error;
mod interp;
pub mod kernels;
mod package;

pub use error::{ExecError, Result};
pub use interp::OpOutput;
pub use kernels::Accumulation;
pub use package::{LoadedPackage, Port, Signature, State};
// The tensor and precision of the backend contract, re-exported for users of the executor alone.
pub use anemone_backend::{round_f16, round_f16_in_place, Precision, Tensor, MAX_EXACT_INT};
pub use backend::{Arithmetic, ExecutorBackend};
