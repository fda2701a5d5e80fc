//! The decoder configuration shared by the decoder families (Llama, Qwen2, Qwen3), and the one
//! check of its internal consistency every consumer relies on.
//!
//! Which families exist, how each maps `config.json` / GGUF metadata onto this struct and which
//! tensors it implies is the business of `anemone_models::families` (see docs/ARCHITECTURE.md).

use serde::{Deserialize, Serialize};

/// The name of the model family a config belongs to (`llama`, `qwen2`, `qwen3`), as bundle
/// manifests record it. The families themselves, and so the list of known names, live in
/// `anemone_models::families`; a name read back from a manifest is checked against that list.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Architecture(String);

impl Architecture {
    pub fn new(name: impl Into<String>) -> Self {
        Self(name.into())
    }

    pub fn name(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for Architecture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// A config whose numbers contradict each other (zero sizes, head counts that do not divide, an
/// odd head size, a non-positive RoPE base).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("decoder config: {problem}")]
pub struct InvalidConfig {
    pub problem: String,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct DecoderConfig {
    pub architecture: Architecture,
    pub hidden_size: usize,
    pub intermediate_size: usize,
    pub num_hidden_layers: usize,
    pub num_attention_heads: usize,
    pub num_key_value_heads: usize,
    /// Per-head dimension; `hidden_size / num_attention_heads` unless the checkpoint says otherwise.
    pub head_dim: usize,
    pub vocab_size: usize,
    pub rope_theta: f64,
    pub rms_norm_eps: f64,
    pub tie_word_embeddings: bool,
    /// Q, K and V projections carry a bias (Qwen2; Llama/Qwen3 with `attention_bias: true`).
    pub attention_bias: bool,
    /// The output projection carries a bias (Llama/Qwen3 with `attention_bias: true`).
    #[serde(default)]
    pub o_proj_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3).
    pub qk_norm: bool,
    pub max_position_embeddings: usize,
    /// Dimensions of each head RoPE rotates when it rotates only the first ones (Phi-3's
    /// `partial_rotary_factor`: `head_dim · factor`); `None`: all of them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub partial_rotary_dim: Option<usize>,
    /// LongRoPE (`rope_scaling` type `longrope` / `su`, Phi-3) frequency scaling.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub long_rope: Option<LongRope>,
    pub bos_token_id: Option<u32>,
    /// Token ids that end generation (from generation_config.json, config.json or GGUF metadata).
    pub eos_token_ids: Vec<u32>,
    /// Gemma 3's departures from the Llama layer; `None` for every other family (and absent
    /// from their manifests).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gemma: Option<GemmaConfig>,
    /// Every layer sees only the last `attention_window` positions, its own included (Phi-3's
    /// and Mistral's `sliding_window`); `None`: every earlier position (Gemma's per-layer
    /// windows are in [`GemmaConfig`]).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub attention_window: Option<usize>,
}

/// What a Gemma 3 decoder adds to the Llama layer. Its RMSNorm weights are stored as the
/// multiplier itself (`1 + w` of transformers' parameter; GGUF files store them so already), so
/// the norm blocks are the shared ones.
///
/// - the token embedding is multiplied by `√hidden_size` (then by `residual_scale`);
/// - attention scores are scaled by `query_pre_attn_scalar^-½` instead of `head_dim^-½`;
/// - each block's output is RMS-normed (`post_attention_layernorm`, `post_feedforward_layernorm`)
///   before it is added to the residual stream; the MLP has its own pre-norm
///   (`pre_feedforward_layernorm`) and is GeGLU with tanh-approximated GELU;
/// - sliding (local) layers see only the last `sliding_window` positions (the query's included)
///   and rotate with `rope_local_theta`; global layers see every position and rotate with
///   `rope_theta`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GemmaConfig {
    pub query_pre_attn_scalar: f64,
    pub sliding_window: usize,
    /// One entry per layer: `true` for a sliding-window (local) layer.
    pub sliding_layers: Vec<bool>,
    pub rope_local_theta: f64,
    /// The factor the residual stream is carried at (1 in a checkpoint). A converter may choose
    /// a smaller one so that fp16 holds the stream; the embedding scale and the post-norm weights
    /// carry it and the pre-norms (and their epsilon) undo it, so the logits are unchanged in
    /// exact arithmetic.
    #[serde(default = "one")]
    pub residual_scale: f64,
}

fn one() -> f64 {
    1.0
}

/// LongRoPE as transformers computes it: inverse frequency `i` is
/// `1 / (factor[i] · theta^(2i/rotary_dim))` with the long factors when the sequence may run past
/// `original_max_position_embeddings`, the short ones otherwise, and cos/sin are multiplied by
/// `attention_factor`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LongRope {
    pub short_factor: Vec<f64>,
    pub long_factor: Vec<f64>,
    pub original_max_position_embeddings: usize,
    /// Resolved at import (`attention_factor`, else `√(1 + ln(s) / ln(original))` with
    /// `s = max_position_embeddings / original`, 1 when `s ≤ 1`).
    pub attention_factor: f64,
    /// Which factors apply: chosen by the context a consumer runs with
    /// ([`DecoderConfig::for_context`]); at import, by `max_position_embeddings`.
    pub use_long: bool,
}

impl DecoderConfig {
    /// Dimensions RoPE rotates in each head.
    pub fn rotary_dim(&self) -> usize {
        self.partial_rotary_dim.unwrap_or(self.head_dim)
    }

    /// This config for a consumer holding `context` tokens: LongRoPE's long factors when the
    /// context runs past the original training length, as transformers picks them by sequence
    /// length. Nothing else changes.
    pub fn for_context(&self, context: usize) -> Self {
        let mut config = self.clone();
        if let Some(long) = &mut config.long_rope {
            long.use_long = context > long.original_max_position_embeddings;
        }
        config
    }

    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
    }

    /// What the token embedding is multiplied by before the first layer (1 but for Gemma).
    pub fn embedding_scale(&self) -> f32 {
        match &self.gemma {
            // transformers: torch.tensor(hidden_size ** 0.5) in f32
            Some(g) => ((self.hidden_size as f64).sqrt() as f32) * g.residual_scale as f32,
            None => 1.0,
        }
    }

    /// The factor of the attention scores (`1/√head_dim`, or Gemma's `query_pre_attn_scalar^-½`).
    pub fn attention_scale(&self) -> f32 {
        match &self.gemma {
            Some(g) => g.query_pre_attn_scalar.powf(-0.5) as f32,
            None => 1.0 / (self.head_dim as f32).sqrt(),
        }
    }

    /// The sliding window of `layer` (`None`: it sees every earlier position).
    pub fn sliding_window(&self, layer: usize) -> Option<usize> {
        let Some(g) = self.gemma.as_ref() else {
            return self.attention_window;
        };
        g.sliding_layers
            .get(layer)
            .copied()
            .unwrap_or(false)
            .then_some(g.sliding_window)
    }

    /// The window of the model's sliding layers, if any layer slides (one window per model).
    pub fn window(&self) -> Option<usize> {
        match &self.gemma {
            Some(g) => g
                .sliding_layers
                .iter()
                .any(|&s| s)
                .then_some(g.sliding_window),
            None => self.attention_window,
        }
    }

    /// The RoPE base of `layer`.
    pub fn rope_theta_of(&self, layer: usize) -> f64 {
        match (&self.gemma, self.sliding_window(layer)) {
            (Some(g), Some(_)) => g.rope_local_theta,
            _ => self.rope_theta,
        }
    }

    /// The epsilon of the norms reading the residual stream (scaled with it, see
    /// [`GemmaConfig::residual_scale`]).
    pub fn residual_norm_eps(&self) -> f64 {
        match &self.gemma {
            Some(g) => self.rms_norm_eps * g.residual_scale * g.residual_scale,
            None => self.rms_norm_eps,
        }
    }

    /// Query heads per shared K/V head.
    pub fn gqa_group(&self) -> usize {
        self.num_attention_heads / self.num_key_value_heads
    }

    /// The internal consistency every consumer (checkpoint import, reference forward, converter)
    /// relies on: positive sizes, K/V heads dividing the query heads, an even head size (RoPE
    /// rotates halves) and a positive finite RoPE base.
    pub fn validate(&self) -> Result<(), InvalidConfig> {
        let bad = |problem: String| Err(InvalidConfig { problem });
        if self.num_attention_heads == 0 || self.num_key_value_heads == 0 {
            return bad("attention and key/value head counts must be positive".into());
        }
        if !self
            .num_attention_heads
            .is_multiple_of(self.num_key_value_heads)
        {
            return bad(format!(
                "num_attention_heads {} is not a multiple of num_key_value_heads {}",
                self.num_attention_heads, self.num_key_value_heads
            ));
        }
        if self.head_dim == 0 || !self.head_dim.is_multiple_of(2) {
            return bad(format!(
                "head_dim {} must be positive and even (RoPE rotates halves)",
                self.head_dim
            ));
        }
        if self.num_hidden_layers == 0 {
            return bad("the model has no layers".into());
        }
        if self.hidden_size == 0 || self.vocab_size == 0 || self.intermediate_size == 0 {
            return bad("hidden_size, intermediate_size and vocab_size must be positive".into());
        }
        if !(self.rope_theta.is_finite() && self.rope_theta > 0.0) {
            return bad(format!("rope_theta {} must be positive", self.rope_theta));
        }
        let rotary = self.rotary_dim();
        if rotary == 0 || !rotary.is_multiple_of(2) || rotary > self.head_dim {
            return bad(format!(
                "rotary dimension {rotary} must be positive, even and at most head_dim {}",
                self.head_dim
            ));
        }
        if let Some(long) = &self.long_rope {
            for (name, factors) in [("short", &long.short_factor), ("long", &long.long_factor)] {
                if factors.len() != rotary / 2 {
                    return bad(format!(
                        "LongRoPE {name}_factor has {} entries, the rotary dimension {rotary} \
                         needs {}",
                        factors.len(),
                        rotary / 2
                    ));
                }
                if let Some(f) = factors.iter().find(|f| !(f.is_finite() && **f > 0.0)) {
                    return bad(format!(
                        "LongRoPE {name}_factor holds {f}; factors must be positive"
                    ));
                }
            }
            if long.original_max_position_embeddings == 0
                || !(long.attention_factor.is_finite() && long.attention_factor > 0.0)
            {
                return bad(
                    "LongRoPE needs a positive original_max_position_embeddings and attention factor"
                        .into(),
                );
            }
        }
        if self.attention_window == Some(0) {
            return bad("the attention window (sliding_window) must be positive".into());
        }
        if self.gemma.is_some() && self.attention_window.is_some() {
            return bad(
                "a Gemma config carries its windows per layer, not attention_window".into(),
            );
        }
        if let Some(g) = &self.gemma {
            if g.sliding_layers.len() != self.num_hidden_layers {
                return bad(format!(
                    "{} sliding/global layer types for {} layers",
                    g.sliding_layers.len(),
                    self.num_hidden_layers
                ));
            }
            if g.sliding_window == 0 {
                return bad("sliding_window must be positive".into());
            }
            if !(g.rope_local_theta.is_finite() && g.rope_local_theta > 0.0) {
                return bad(format!(
                    "local rope_theta {} must be positive",
                    g.rope_local_theta
                ));
            }
            if !(g.query_pre_attn_scalar.is_finite() && g.query_pre_attn_scalar > 0.0) {
                return bad(format!(
                    "query_pre_attn_scalar {} must be positive",
                    g.query_pre_attn_scalar
                ));
            }
            if !(g.residual_scale.is_finite() && g.residual_scale > 0.0) {
                return bad(format!(
                    "residual_scale {} must be positive",
                    g.residual_scale
                ));
            }
        }
        Ok(())
    }
}
