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
//! Loading decodes every const and constexpr once (identical payloads shared by all functions);
//! running interprets the remaining ops in order.
//!
//! The numerics contract of [`Precision::Fp16`] (what the gate measures; unchanged by how the
//! executor stores weights):
//! - every op output declared fp16, every state write and every fp16 input is rounded to fp16
//!   (nearest even) as the ANE stores it; pure data movement is not re-rounded;
//! - sums inside an op (conv, linear, matmul, softmax, layer_norm, reduce) accumulate in f32;
//!   products are of the f32 values of fp16 operands (widening is exact);
//! - fp16 projection weights (1×1 conv, linear) are held as fp16 only: single-token steps read
//!   them through an fp16×f32 dot ([`kernels::linalg::matvec_f16`]), wider steps widen them
//!   panel by panel into reused per-thread f32 buffers and run `gemm` per panel
//!   ([`kernels::gemm_f16`]), so results are bit for bit those of one `gemm` call on an f32 copy
//!   of the weights. The same holds for fp16 `constexpr_blockwise_shift_scale` (integer data)
//!   and `constexpr_lut_to_dense` projection weights, kept compressed: rows are formed as the
//!   fp16 values [`decompress`] would produce (`packed.rs`), on CPUs with AVX-512 by fused
//!   kernels ([`kernels::quant`]) that form them in registers and sum in the order of the fp16
//!   dot (8-bit data whose blocks hold 16 codes of one progression re-held as 4-bit codes,
//!   every code's value checked the same bits at load: `narrow.rs`); wide steps expand them
//!   into a reused f32 buffer. f32 projection weights are read in place from the package's
//!   bytes (`f32_weight.rs`: the decoded constant's values, no copy). Other constants are held
//!   as f32;
//! - a prefill window's per-head attention runs over the filled KV slots only when the skipped
//!   ones provably contribute exact zeros ([`kernels::attention`]): the same values as over all;
//! - a decode step's per-head attention runs as one kernel per head ([`kernels::attend_one`]):
//!   the six ops' element operations, sum orders and roundings, the scores summed in the order
//!   of `gemm`'s single-row product (checked once against `gemm` on the running CPU; otherwise
//!   the ops run one by one). It reads only the written columns of a KV state (every state
//!   keeps a bound past which it holds ±0, raised by each write) when the skipped columns
//!   provably change no bit (checked per head on the mask and the kept values; else all are
//!   read);
//! - a decoder layer's max-scaled RMSNorm (12 ops) and RoPE (6 ops) chains run as one step each
//!   ([`kernels::chains`]) under f32 accumulation: every intermediate is rounded where its op's
//!   output is, each element operation is the op's own, and the norm's sum folds in the order of
//!   the generic reduce (an observed run, and `fp16-acc`, run the ops one by one).
//!
//! [`Accumulation::Fp16Blocks`] (`--precision fp16-acc`) keeps the rounding above and makes
//! every sum inside an op accumulate in fp16 blocks ([`kernels::fp16acc`]): the pessimistic
//! bracket of the Neural Engine's undocumented accumulator.

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
mod f32_weight;
mod interp;
pub mod kernels;
mod narrow;
mod package;
mod packed;
mod plan;
mod state;
/// The decode team (in `anemone-backend`, shared with the fp32 reference and the host LM head).
pub use anemone_backend::team;

pub use error::{ExecError, Result};
pub use interp::OpOutput;
pub use kernels::Accumulation;
pub use package::{LoadedPackage, Port, Signature};
pub use state::State;
// The tensor and precision of the backend contract, re-exported for users of the executor alone.
pub use anemone_backend::{round_f16, round_f16_in_place, Precision, Tensor, MAX_EXACT_INT};
pub use backend::{Arithmetic, ExecutorBackend};
