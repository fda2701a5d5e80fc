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
    /// Q, K and V projections carry a bias (Qwen2).
    pub attention_bias: bool,
    /// Per-head RMSNorm of Q and K before RoPE (Qwen3).
    pub qk_norm: bool,
    pub max_position_embeddings: usize,
    pub bos_token_id: Option<u32>,
    /// Token ids that end generation (from generation_config.json, config.json or GGUF metadata).
    pub eos_token_ids: Vec<u32>,
}

impl DecoderConfig {
    pub fn q_dim(&self) -> usize {
        self.num_attention_heads * self.head_dim
    }

    pub fn kv_dim(&self) -> usize {
        self.num_key_value_heads * self.head_dim
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
        Ok(())
    }
}
