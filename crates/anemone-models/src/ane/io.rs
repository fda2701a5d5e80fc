//! Host-side inputs of the chunk functions: the rotate-half RoPE tables and the additive mask
//! ([`causal_mask`], the one builder, from `crate::attention`), laid out exactly as the `cos`,
//! `sin` and `mask` inputs expect (row-major).

use anemone_checkpoint::DecoderConfig;

use super::decoder::names;
pub use crate::attention::causal_mask;
use crate::attention::sliding_mask;

/// Inverse frequencies (see `crate::rope`), in f32 like the reference forward and transformers.
pub fn inv_freq(config: &DecoderConfig) -> Vec<f32> {
    crate::rope::inv_freq(config)
}

/// Plain inverse frequencies `1 / theta^(2i/d)` (Gemma's local base).
fn inv_freq_of(d: usize, theta: f64) -> Vec<f32> {
    (0..d / 2)
        .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / d as f32))
        .collect()
}

/// `(cos, sin)` for the `cos`/`sin` inputs `[1, 1, head_dim, T]`, one column per entry of
/// `positions`: element `[d, t]` is `cos(positions[t] · inv_freq[d mod head_dim/2])` times the
/// RoPE attention factor; with partial rotation, the rows past the rotated ones hold cos 1,
/// sin 0 (the converter reorders Q/K heads to match, `crate::rope::ane_head_order`).
pub fn rope_tables(config: &DecoderConfig, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    tables(
        config.head_dim,
        &inv_freq(config),
        crate::rope::attention_factor(config),
        positions,
    )
}

/// Every host-built input of a chunk function with `t` tokens written at `first..` except
/// `hidden_states` and `position`: `(name, shape, values)` for `cos`, `sin`, `mask` and, for a
/// model with sliding-window layers (Gemma), `cos_local`, `sin_local`, `mask_local`.
pub fn chunk_inputs(
    config: &DecoderConfig,
    context: usize,
    first: usize,
    t: usize,
    mask_value: f32,
) -> Vec<(&'static str, Vec<usize>, Vec<f32>)> {
    let positions: Vec<usize> = (first..first + t).collect();
    let d = config.head_dim;
    let (cos, sin) = rope_tables(config, &positions);
    let mut out = vec![
        (names::COS, vec![1, 1, d, t], cos),
        (names::SIN, vec![1, 1, d, t], sin),
        (
            names::MASK,
            vec![1, 1, t, context],
            causal_mask(context, first, t, mask_value),
        ),
    ];
    if let Some(g) = &config.gemma {
        let (cos, sin) = tables(d, &inv_freq_of(d, g.rope_local_theta), 1.0, &positions);
        out.push((names::COS_LOCAL, vec![1, 1, d, t], cos));
        out.push((names::SIN_LOCAL, vec![1, 1, d, t], sin));
        out.push((
            names::MASK_LOCAL,
            vec![1, 1, t, context],
            sliding_mask(context, first, t, g.sliding_window, mask_value),
        ));
    }
    out
}

/// Rows `i` and `i + d/2` of column `t` hold the angle of frequency `i` at `positions[t]`
/// (times `scale`); rows of frequencies past `freqs` (not rotated) hold cos 1, sin 0.
fn tables(d: usize, freqs: &[f32], scale: f32, positions: &[usize]) -> (Vec<f32>, Vec<f32>) {
    let t = positions.len();
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
