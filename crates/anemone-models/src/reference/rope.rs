//! Rotary position embedding in the Hugging Face "rotate half" convention: the pair rotated by
//! frequency `i` is `(x[i], x[i + r/2])` over the first `r` (rotary) dimensions of a head, not
//! adjacent elements; dimensions past `r` pass through (partial rotation, Phi-3).

use anemone_checkpoint::RopeFactors;

/// The RoPE of every layer: one for all, or Gemma's global and local (sliding) bases; with
/// LongRoPE, the global base with each factor set.
pub struct Ropes {
    global: Rope,
    global_long: Option<Rope>,
    local: Option<Rope>,
}

impl Ropes {
    pub fn new(config: &anemone_checkpoint::DecoderConfig) -> Self {
        Self {
            global: Rope::new(config, RopeFactors::Short),
            global_long: config
                .long_rope
                .as_ref()
                .map(|_| Rope::new(config, RopeFactors::Long)),
            local: config
                .gemma
                .as_ref()
                .map(|g| Rope::plain(config.head_dim, g.rope_local_theta)),
        }
    }

    /// The global base's RoPE with LongRoPE's `factors` (the one RoPE without LongRoPE).
    pub fn global(&self, factors: RopeFactors) -> &Rope {
        match (factors, &self.global_long) {
            (RopeFactors::Long, Some(long)) => long,
            (RopeFactors::Long, None) | (RopeFactors::Short, _) => &self.global,
        }
    }

    /// The local base's RoPE (Gemma's sliding layers), if the model has one.
    pub fn local(&self) -> Option<&Rope> {
        self.local.as_ref()
    }
}

/// Inverse frequencies (`crate::rope::inv_freq`: plain or LongRoPE) and the factor cos and sin
/// are multiplied by, computed in f32 like transformers.
pub struct Rope {
    inv_freq: Vec<f32>,
    scale: f32,
}

impl Rope {
    pub fn new(config: &anemone_checkpoint::DecoderConfig, factors: RopeFactors) -> Self {
        Self {
            inv_freq: crate::rope::inv_freq(config, factors),
            scale: crate::rope::attention_factor(config),
        }
    }

    /// Plain RoPE over whole heads of `head_dim` with base `theta` (encoders, tests).
    pub fn plain(head_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Self {
            inv_freq,
            scale: 1.0,
        }
    }

    /// `(cos, sin)` of each frequency's angle at `position` (times the attention factor), each
    /// `[r/2]`.
    pub fn cos_sin(&self, position: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|f| {
                let angle = (position as f32 * f) as f64;
                (
                    angle.cos() as f32 * self.scale,
                    angle.sin() as f32 * self.scale,
                )
            })
            .unzip()
    }

    /// Rotates the first `2 · cos.len()` dimensions of every `head_dim`-sized head of `x` in
    /// place by the given angles; the rest of each head passes through.
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = cos.len();
        for head in x.chunks_exact_mut(head_dim) {
            let (lo, hi) = head[..2 * half].split_at_mut(half);
            for i in 0..half {
                let (a, b) = (lo[i], hi[i]);
                lo[i] = a * cos[i] - b * sin[i];
                hi[i] = b * cos[i] + a * sin[i];
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotation_preserves_norm_and_is_identity_at_zero() {
        let rope = Rope::plain(8, 10000.0);
        let orig: Vec<f32> = (0..16).map(|i| i as f32 * 0.3 - 2.0).collect();
        let mut x = orig.clone();
        let (c, s) = rope.cos_sin(0);
        Rope::apply(&mut x, 8, &c, &s);
        assert_eq!(x, orig);
        let (c, s) = rope.cos_sin(37);
        Rope::apply(&mut x, 8, &c, &s);
        for h in 0..2 {
            let n0: f32 = orig[h * 8..h * 8 + 8].iter().map(|v| v * v).sum();
            let n1: f32 = x[h * 8..h * 8 + 8].iter().map(|v| v * v).sum();
            assert!((n0 - n1).abs() < 1e-4);
        }
    }

    #[test]
    fn pairs_are_half_a_head_apart() {
        // Frequency 0 rotates (x[0], x[d/2]) by `position` radians.
        let rope = Rope::plain(4, 10000.0);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        let (c, s) = rope.cos_sin(1);
        Rope::apply(&mut x, 4, &c, &s);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6);
        assert!((x[2] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], 0.0);
    }
}
