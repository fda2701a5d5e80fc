//! The decoder configuration shared by Llama, Qwen2 and Qwen3, and the tensors it implies.

use serde::{Deserialize, Serialize};

/// The decoder families anemone supports. They differ only in the flags of [`DecoderConfig`]:
/// Qwen2 adds Q/K/V biases, Qwen3 adds per-head RMS norms on Q and K and an explicit `head_dim`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Architecture {
    Llama,
    Qwen2,
    Qwen3,
}

impl Architecture {
    pub fn parse(name: &str) -> Option<Self> {
        match name.to_ascii_lowercase().as_str() {
            "llama" | "llamaforcausallm" | "mistral" | "mistralforcausallm" => Some(Self::Llama),
            "qwen2" | "qwen2forcausallm" => Some(Self::Qwen2),
            "qwen3" | "qwen3forcausallm" => Some(Self::Qwen3),
            _ => None,
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            Self::Llama => "llama",
            Self::Qwen2 => "qwen2",
            Self::Qwen3 => "qwen3",
        }
    }
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

    /// Every tensor this config implies, with its Hugging Face name and shape.
    pub fn expected_tensors(&self) -> Vec<(String, Vec<usize>)> {
        let (h, i, q, kv) = (
            self.hidden_size,
            self.intermediate_size,
            self.q_dim(),
            self.kv_dim(),
        );
        let mut out = vec![
            (
                "model.embed_tokens.weight".to_string(),
                vec![self.vocab_size, h],
            ),
            ("model.norm.weight".to_string(), vec![h]),
        ];
        if !self.tie_word_embeddings {
            out.push(("lm_head.weight".to_string(), vec![self.vocab_size, h]));
        }
        for layer in 0..self.num_hidden_layers {
            let p = |s: &str| format!("model.layers.{layer}.{s}");
            out.push((p("input_layernorm.weight"), vec![h]));
            out.push((p("post_attention_layernorm.weight"), vec![h]));
            out.push((p("self_attn.q_proj.weight"), vec![q, h]));
            out.push((p("self_attn.k_proj.weight"), vec![kv, h]));
            out.push((p("self_attn.v_proj.weight"), vec![kv, h]));
            out.push((p("self_attn.o_proj.weight"), vec![h, q]));
            if self.attention_bias {
                out.push((p("self_attn.q_proj.bias"), vec![q]));
                out.push((p("self_attn.k_proj.bias"), vec![kv]));
                out.push((p("self_attn.v_proj.bias"), vec![kv]));
            }
            if self.qk_norm {
                out.push((p("self_attn.q_norm.weight"), vec![self.head_dim]));
                out.push((p("self_attn.k_norm.weight"), vec![self.head_dim]));
            }
            out.push((p("mlp.gate_proj.weight"), vec![i, h]));
            out.push((p("mlp.up_proj.weight"), vec![i, h]));
            out.push((p("mlp.down_proj.weight"), vec![h, i]));
        }
        out
    }
}
