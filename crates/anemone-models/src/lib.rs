//! Per-architecture model code: the fp32 reference forward (plain layout, the oracle), the ANE
//! graph builders, and the bundle (manifest, writer, reader) they are converted into.

pub mod ane;
pub mod bundle;
pub mod reference;
