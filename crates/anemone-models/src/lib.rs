//! Per-architecture model code: the model families (config mapping and tensor names, one file
//! each, and the registry that opens checkpoints through them), the fp32 reference forward (plain
//! layout, the oracle), the ANE graph builders, and the bundle (manifest, writer, reader) they are
//! converted into.

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

pub mod ane;
pub mod attention;
pub mod bundle;
pub mod encoder;
pub mod families;
pub mod reference;
pub mod rope;

pub use families::{open_checkpoint, validate_checkpoint};
