//! The contract between the shared pipeline and an execution engine.
//!
//! An engine (the MIL executor in `anemone-exec`; a Core ML backend on macOS) implements
//! [`Backend`]: load a `.mlpackage`, make the state its functions declare, predict a function
//! with named [`Tensor`] inputs. The generation pipeline, sessions and the numerics gate in
//! `anemone-runtime` are generic over `B: Backend`, so an engine depends on this crate (and
//! `anemone-mil` for dtypes and [`Precision`]) and on nothing of the interpreter. Where a new
//! backend is registered for the CLI: `docs/ARCHITECTURE.md`.

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
mod fp16;
pub mod npy;
pub mod team;
mod tensor;

pub use anemone_mil::Precision;
pub use backend::{Backend, CheckedOutputs, LoadReport};
pub use fp16::{is_f16_exact, round_f16, round_f16_in_place};
pub use tensor::{Tensor, TensorError, MAX_EXACT_INT};
