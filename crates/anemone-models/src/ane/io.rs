//! Host-side inputs of the chunk functions: the rotate-half RoPE tables and the additive mask
//! ([`causal_mask`], the one builder, from `crate::attention`), laid out exactly as the `cos`,
//! `sin` and `mask` inputs expect (row-major).

use anemone_checkpoint::DecoderConfig;

pub use crate::attention::causal_mask;

/// Inverse frequencies `1 / theta^(2i/d)`, in f32 like the reference forward and transformers.
pub fn inv_freq(config: &DecoderConfig) -> Vec<f32> {
    let d = config.head_dim;
    (0..d / 2)
        .map(|i| 1.0 / (config.rope_theta as f32).powf((2 * i) as f32 / d as f32))
        .collect()
}

/// `(cos, sin)` for the `cos`/`sin` inputs `[1, 1, head_dim, T]`, one column per entry of
/// `positions`: element `[d, t]` is `cos(positions[t] · inv_freq[d mod head_dim/2])`.
pub fn rope_tables(config: &DecoderConfig, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let freqs = inv_freq(config);
    let (d, t) = (config.head_dim, positions.len());
    let mut cos = vec![0f32; d * t];
    let mut sin = vec![0f32; d * t];
    for (col, &p) in positions.iter().enumerate() {
        for (i, f) in freqs.iter().enumerate() {
            let angle = (p as f32 * f) as f64;
            let (c, s) = (angle.cos() as f32, angle.sin() as f32);
            for row in [i, i + d / 2] {
                cos[row * t + col] = c;
                sin[row * t + col] = s;
            }
        }
    }
    (cos, sin)
}
