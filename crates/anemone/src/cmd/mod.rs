//! One module per verb.

pub mod compress_opts;
pub mod convert;
pub mod gate;
pub mod generate;
pub mod inspect;
