//! The RoPE frequencies of a decoder config, shared by the reference forward and the ANE tables:
//! plain `1 / theta^(2i/d)`, LongRoPE's per-frequency factors and attention factor (Phi-3), and
//! partial rotation (only the first `rotary_dim` dimensions of a head rotate).
//!
//! The reference rotates the pairs `(i, i + rotary_dim/2)` of the first `rotary_dim` dimensions
//! directly. The ANE graph always rotates `(i, i + head_dim/2)` over the whole head; for partial
//! rotation the converter reorders the rows of every Q and K head ([`ane_head_order`]) so that the
//! rotated pairs land on those positions and the passed-through dimensions pair up with each other
//! under a table entry of cos 1, sin 0. Q and K are reordered alike, so `q·k` — all attention reads
//! of them — is unchanged.

use anemone_checkpoint::{DecoderConfig, RopeFactors};

/// Inverse frequencies, `rotary_dim / 2` of them, in f32 like transformers; `factors` picks
/// LongRoPE's set (see [`RopeFactors`]; ignored without LongRoPE).
pub fn inv_freq(config: &DecoderConfig, factors: RopeFactors) -> Vec<f32> {
    let dim = config.rotary_dim();
    let theta = config.rope_theta as f32;
    (0..dim / 2)
        .map(|i| {
            let base = theta.powf((2 * i) as f32 / dim as f32);
            match &config.long_rope {
                None => 1.0 / base,
                Some(long) => 1.0 / (long.factors(factors)[i] as f32 * base),
            }
        })
        .collect()
}

/// What cos and sin are multiplied by (LongRoPE's attention factor; 1 otherwise).
pub fn attention_factor(config: &DecoderConfig) -> f32 {
    config
        .long_rope
        .as_ref()
        .map_or(1.0, |l| l.attention_factor as f32)
}

/// For partial rotation: `order[j]` is the Hugging Face dimension stored at position `j` of a
/// converted Q/K head (see the module docs); `None` when the whole head rotates.
pub fn ane_head_order(config: &DecoderConfig) -> Option<Vec<usize>> {
    let (d, r) = (config.head_dim, config.rotary_dim());
    if r == d {
        return None;
    }
    let (rh, ph) = (r / 2, (d - r) / 2);
    let mut order = Vec::with_capacity(d);
    order.extend(0..rh);
    order.extend(r..r + ph);
    order.extend(rh..r);
    order.extend(r + ph..d);
    Some(order)
}

/// Reorders the rows of a `[heads · head_dim, cols]` matrix (or a `[heads · head_dim]` vector
/// with `cols = 1`) head by head: new row `j` of a head is old row `order[j]`.
pub fn reorder_head_rows(values: &[f32], order: &[usize], cols: usize) -> Vec<f32> {
    let d = order.len();
    let mut out = Vec::with_capacity(values.len());
    for head in values.chunks_exact(d * cols) {
        for &src in order {
            out.extend_from_slice(&head[src * cols..(src + 1) * cols]);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn head_order_pairs_rotated_dims_half_a_head_apart() {
        // head 8, rotary 4: rotated pairs (0,2), (1,3); passed 4..8
        let order = [0, 1, 4, 5, 2, 3, 6, 7];
        for (j, &src) in order.iter().enumerate().take(2) {
            assert_eq!(order[j + 4], src + 2, "pair of {src}");
        }
        let rows: Vec<f32> = (0..16).map(|v| v as f32).collect(); // 2 heads × 8, cols 1
        let out = reorder_head_rows(&rows, &order, 1);
        assert_eq!(&out[..8], &[0., 1., 4., 5., 2., 3., 6., 7.]);
        assert_eq!(&out[8..], &[8., 9., 12., 13., 10., 11., 14., 15.]);
    }
}
