//! Per-architecture model code: the fp32 reference forward (plain layout, the oracle) and the ANE
//! graph builders.

pub mod ane;
pub mod bundle;
pub mod reference;
