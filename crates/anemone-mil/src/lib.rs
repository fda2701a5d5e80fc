//! Core ML ML Program model: typed ops as a closed enum, a shape-checking builder, protobuf and
//! weight.bin reading and writing, .mlpackage read/write and a MIL text printer.
//!
//! ```
//! use anemone_mil::{DType, FunctionBuilder, Program, SpecVersion, TensorData, TensorType, WriteOptions};
//!
//! # fn main() -> Result<(), anemone_mil::MilError> {
//! let mut f = FunctionBuilder::new("decode");
//! let x = f.input("x", TensorType::new(DType::F16, [1, 64, 1, 1]))?;
//! let cache = f.state("k_cache", TensorType::new(DType::F16, [1, 64, 1, 32]))?;
//! let pos = f.input("pos", TensorType::new(DType::I32, [1]))?;
//! let w = f.constant("w_q", TensorData::f16_from_f32(vec![64, 64, 1, 1], &vec![0.01; 64 * 64])?)?;
//! let q = f.conv1x1("q_proj", x, w, None)?; // [1, 64, 1, 1], checked as it is added
//! // write q into the cache at `pos`: begin = [0, 0, 0, pos], end = begin + [1, 64, 1, 1]
//! let zeros = f.const_i32("zeros", &[3], &[0, 0, 0])?;
//! let begin = f.concat("kv_begin", &[zeros, pos], 0)?;
//! let extent = f.const_i32("kv_extent", &[4], &[1, 64, 1, 1])?;
//! let end = f.add("kv_end", begin, extent)?;
//! let old = f.read_state("k_old", cache)?;
//! let new = f.slice_update("k_new", old, q, begin, end)?;
//! f.write_state("k_write", cache, new)?;
//! let y = f.silu("y", q)?;
//! f.output(y)?;
//!
//! let mut program = Program::new(SpecVersion::V9); // opset CoreML8
//! program.add_function(f.finish()?)?; // the verifier runs here and before every write
//! print!("{}", anemone_mil::print_program(&program));
//! # let dir = tempfile::tempdir().unwrap();
//! # let path = dir.path().join("model.mlpackage");
//! anemone_mil::write_package(&program, &path, &WriteOptions::default())?; // refuses to overwrite
//! let back = anemone_mil::read_package(&path)?; // what the executor runs
//! assert_eq!(back, program);
//! # Ok(()) }
//! ```
//!
//! Several functions added to one [`Program`] share weights: identical const data is written
//! once to `weight.bin` and referenced by offset from every function that uses it.
//!
//! Layout (after naga): `ir` holds the types, constant data, programs, the closed [`Op`] enum,
//! the op signature table ([`OpKind::signature`]: every op's MIL type name and argument names,
//! the one place they are spelled) and the identifier rules; `valid` is the verifier with the
//! type and shape inference it shares with `builder` ([`FunctionBuilder`]); `read` turns
//! protobuf + weight.bin into IR ([`read_model_proto`]) and `write` turns IR into protobuf +
//! weight.bin ([`write_model_proto`]), both over the `blob` (weight.bin) and `proto` (element
//! type codes) helpers; `package` reads and writes the `.mlpackage` layout and `print` renders
//! MIL text. Imports only point down that list: `valid` never sees the writer, `read` and
//! `write` never see each other, and every public item is re-exported at the crate root.

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

mod blob;
mod builder;
mod error;
pub mod huge_pages;
mod ir;
mod package;
mod print;
mod proto;
mod read;
pub mod staging;
mod valid;
mod write;

pub use blob::{blob_dtype_code, BlobFile, BlobRecord, BlobWriter};
pub use builder::FunctionBuilder;
pub use error::{MilError, Result};
pub use ir::bytes::SharedBytes;
pub use ir::identifier::is_valid_identifier;
pub use ir::op::{BinaryOp, ConvParams, GeluMode, Op, ReduceOp, UnaryOp};
pub use ir::program::{Function, Operation, Program, ValueInfo, Var};
pub use ir::signature::{arg, param_const_name, OpKind, Presence, Signature, Slot};
pub use ir::tensor::TensorData;
pub use ir::types::{DType, Precision, SpecVersion, TensorType, ValueType};
pub use package::{
    is_package_dir, read_package, read_package_interface, write_package, PackageSummary,
    WriteOptions,
};
pub use print::{print_function, print_program};
pub use read::{read_model_interface, read_model_proto, FunctionInterface};
pub use valid::infer::broadcast_shapes;
pub use valid::{verify_function, verify_program};
pub use write::{write_model_proto, ModelBytes};
