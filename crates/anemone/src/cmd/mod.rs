//! One module per verb.

pub mod convert;
pub mod gate;
pub mod generate;
pub mod inspect;
