//! One module per verb.

pub mod generate;
