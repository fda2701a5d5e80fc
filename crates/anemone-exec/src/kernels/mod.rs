//! Numeric kernels on flat row-major f32 buffers; shapes were checked by the program's type
//! inference when it was decoded, so kernels index without re-validating operands.

pub mod attend_one;
pub mod attention;
pub mod chains;
pub mod elementwise;
pub mod exp_table;
pub mod expf_avx512;
pub mod fp16acc;
pub mod gemm_avx512;
pub mod gemm_f16;
pub mod kv_elem;
pub mod linalg;
pub mod lut;
pub mod norm;
pub mod quant;
pub mod shape;
pub mod simd;
pub mod spread;

/// Frees this thread's scratch buffers of wide (multi-token) products: weights widened or
/// expanded to f32, rows formed for them. They are kept across calls so a prefill allocates
/// them once; a decode step never uses them, so after a prefill they would only stay resident.
pub fn release_scratch() {
    linalg::release_scratch();
    quant::release_scratch();
    gemm_avx512::release_scratch();
}

/// How the sums inside an op (matmul/conv/linear dot products, softmax, layer_norm, reduce)
/// accumulate. Rounding at op boundaries is the precision's business and is the same in both.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Accumulation {
    /// In f32 (the default; the contract of [`anemone_mil::Precision::Fp16`]).
    #[default]
    F32,
    /// In fp16, in blocks as an fp16 accumulator would ([`fp16acc`]): the pessimistic bracket
    /// of the Neural Engine.
    Fp16Blocks,
}
