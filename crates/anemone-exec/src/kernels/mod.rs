//! Numeric kernels on flat row-major f32 buffers; shapes were checked by the program's type
//! inference when it was decoded, so kernels index without re-validating operands.

pub mod elementwise;
pub mod linalg;
pub mod norm;
pub mod shape;
pub mod simd;
