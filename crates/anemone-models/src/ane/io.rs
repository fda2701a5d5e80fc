//! Host-side inputs of the chunk functions: the rotate-half RoPE tables and the additive mask
//! ([`causal_mask`], the one builder, from `crate::attention`), laid out exactly as the `cos`,
//! `sin` and `mask` inputs expect (row-major).

use anemone_checkpoint::DecoderConfig;

use super::decoder::names;
use super::kv::{KvLayout, LayerGroup};
pub use crate::attention::causal_mask;
use crate::attention::{ring_mask, sliding_mask};

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

/// One host-built input of a chunk function.
#[derive(Debug, Clone, PartialEq)]
pub struct ChunkInput {
    pub name: &'static str,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
    /// An int32 input (a write slot); else a float input of the bundle precision.
    pub int32: bool,
}

/// Every host-built input of a chunk function with `t` tokens at positions `first..` except
/// `hidden_states`: `cos`, `sin`, `mask` and `position`, and for Gemma `cos_local`, `sin_local`,
/// `mask_local` (and `position_local` when its sliding layers keep a ring). Masks and slots
/// follow `layout` (see [`KvLayout`]).
pub fn chunk_inputs(
    config: &DecoderConfig,
    layout: &KvLayout,
    first: usize,
    t: usize,
    mask_value: f32,
) -> Vec<ChunkInput> {
    let positions: Vec<usize> = (first..first + t).collect();
    let d = config.head_dim;
    let float = |name, shape, values| ChunkInput {
        name,
        shape,
        values,
        int32: false,
    };
    let slot = |name, group| ChunkInput {
        name,
        shape: vec![1],
        values: vec![layout.slot(group, first) as f32],
        int32: true,
    };
    let mask = |group: LayerGroup| {
        let slots = layout.slots(group);
        match (layout.window, layout.is_ring(group)) {
            (Some(w), true) => ring_mask(slots, first, t, w, mask_value),
            (Some(w), false) if group == LayerGroup::Local || !layout.local_group => {
                sliding_mask(slots, first, t, w, mask_value)
            }
            _ => causal_mask(slots, first, t, mask_value),
        }
    };
    let (cos, sin) = rope_tables(config, &positions);
    let main = LayerGroup::Main;
    let mut out = vec![
        float(names::COS, vec![1, 1, d, t], cos),
        float(names::SIN, vec![1, 1, d, t], sin),
        float(names::MASK, vec![1, 1, t, layout.slots(main)], mask(main)),
        slot(names::POSITION, main),
    ];
    if let Some(g) = &config.gemma {
        let local = LayerGroup::Local;
        let (cos, sin) = tables(d, &inv_freq_of(d, g.rope_local_theta), 1.0, &positions);
        out.push(float(names::COS_LOCAL, vec![1, 1, d, t], cos));
        out.push(float(names::SIN_LOCAL, vec![1, 1, d, t], sin));
        out.push(float(
            names::MASK_LOCAL,
            vec![1, 1, t, layout.slots(local)],
            mask(local),
        ));
        if layout.own_states(local) {
            out.push(slot(names::POSITION_LOCAL, local));
        }
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
