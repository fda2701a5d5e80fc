//! Host-side inputs of the chunk functions: the rotate-half RoPE tables and the additive mask
//! ([`causal_mask`], the one builder, from `crate::attention`), laid out exactly as the `cos`,
//! `sin` and `mask` inputs expect (row-major).

use anemone_checkpoint::DecoderConfig;

pub use crate::attention::causal_mask;

/// Inverse frequencies (see `crate::rope`), in f32 like the reference forward and transformers.
pub fn inv_freq(config: &DecoderConfig) -> Vec<f32> {
    crate::rope::inv_freq(config)
}

/// `(cos, sin)` for the `cos`/`sin` inputs `[1, 1, head_dim, T]`, one column per entry of
/// `positions`: element `[d, t]` is `cos(positions[t] · inv_freq[d mod head_dim/2])` times the
/// RoPE attention factor; with partial rotation, the rows past the rotated ones hold cos 1,
/// sin 0 (the converter reorders Q/K heads to match, `crate::rope::ane_head_order`).
pub fn rope_tables(config: &DecoderConfig, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let freqs = inv_freq(config);
    let scale = crate::rope::attention_factor(config);
    let (d, t) = (config.head_dim, positions.len());
    let mut cos = vec![0f32; d * t];
    let mut sin = vec![0f32; d * t];
    for (col, &p) in positions.iter().enumerate() {
        for i in 0..d / 2 {
            let (c, s) = match freqs.get(i) {
                Some(f) => {
                    let angle = (p as f32 * f) as f64;
                    (angle.cos() as f32 * scale, angle.sin() as f32 * scale)
                }
                None => (1.0, 0.0),
            };
            for row in [i, i + d / 2] {
                cos[row * t + col] = c;
                sin[row * t + col] = s;
            }
        }
    }
    (cos, sin)
}
