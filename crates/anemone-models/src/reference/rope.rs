//! Rotary position embedding in the Hugging Face "rotate half" convention: the pair rotated by
//! frequency `i` is `(x[i], x[i + d/2])`, not adjacent elements.

/// The RoPE of every layer: one base for all, or Gemma's global and local (sliding) bases.
pub struct Ropes {
    global: Rope,
    local: Option<Rope>,
}

impl Ropes {
    pub fn new(config: &anemone_checkpoint::DecoderConfig) -> Self {
        Self {
            global: Rope::new(config.head_dim, config.rope_theta),
            local: config
                .gemma
                .as_ref()
                .map(|g| Rope::new(config.head_dim, g.rope_local_theta)),
        }
    }

    pub fn global(&self) -> &Rope {
        &self.global
    }

    /// The local base's RoPE (Gemma's sliding layers), if the model has one.
    pub fn local(&self) -> Option<&Rope> {
        self.local.as_ref()
    }
}

/// Inverse frequencies `1 / theta^(2i/d)` for `i < d/2`, computed in f32 like transformers.
pub struct Rope {
    inv_freq: Vec<f32>,
}

impl Rope {
    pub fn new(head_dim: usize, theta: f64) -> Self {
        let inv_freq = (0..head_dim / 2)
            .map(|i| 1.0 / (theta as f32).powf((2 * i) as f32 / head_dim as f32))
            .collect();
        Self { inv_freq }
    }

    /// `(cos, sin)` of each frequency's angle at `position`, each `[d/2]`.
    pub fn cos_sin(&self, position: usize) -> (Vec<f32>, Vec<f32>) {
        self.inv_freq
            .iter()
            .map(|f| {
                let angle = (position as f32 * f) as f64;
                (angle.cos() as f32, angle.sin() as f32)
            })
            .unzip()
    }

    /// Rotates every `head_dim`-sized head of `x` in place by the given angles.
    pub fn apply(x: &mut [f32], head_dim: usize, cos: &[f32], sin: &[f32]) {
        let half = head_dim / 2;
        for head in x.chunks_exact_mut(head_dim) {
            let (lo, hi) = head.split_at_mut(half);
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
        let rope = Rope::new(8, 10000.0);
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
        let rope = Rope::new(4, 10000.0);
        let mut x = vec![1.0, 0.0, 0.0, 0.0];
        let (c, s) = rope.cos_sin(1);
        Rope::apply(&mut x, 4, &c, &s);
        assert!((x[0] - 1f32.cos()).abs() < 1e-6);
        assert!((x[2] - 1f32.sin()).abs() < 1e-6);
        assert_eq!(x[1], 0.0);
    }
}
