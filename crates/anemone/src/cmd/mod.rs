//! One module per verb.

pub mod convert;
pub mod generate;
pub mod inspect;
