//! What the decoder families (Llama, Qwen2, Qwen3) share: the Hugging Face tensor layout
//! (`model.layers.{i}.self_attn.q_proj.weight`, …), the `config.json` and GGUF metadata parsing
//! with per-family rules, and llama.cpp's tensor names. A family file picks its rules; the
//! differences are flags of [`DecoderConfig`] (`attention_bias`, `qk_norm`) and config defaults.

pub mod gguf_config;
pub mod gguf_names;
pub mod hf_config;
mod llama_like;

pub use llama_like::LlamaLike;

use anemone_checkpoint::DecoderConfig;

/// The Hugging Face tensor names of the decoder layout, which the loaders (reference weights,
/// ANE layer weights, LM head, host file) and [`expected_tensors`] share.
pub mod tensor_names {
    pub const EMBED_TOKENS: &str = "model.embed_tokens.weight";
    pub const FINAL_NORM: &str = "model.norm.weight";
    pub const LM_HEAD: &str = "lm_head.weight";

    /// `model.layers.{layer}.{suffix}` (`suffix` like `self_attn.q_proj.weight`).
    pub fn layer(layer: usize, suffix: &str) -> String {
        format!("model.layers.{layer}.{suffix}")
    }
}

use tensor_names::{EMBED_TOKENS, FINAL_NORM, LM_HEAD};

/// Every tensor a decoder config implies, with its Hugging Face name and shape.
pub fn expected_tensors(config: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
    let (h, i, q, kv) = (
        config.hidden_size,
        config.intermediate_size,
        config.q_dim(),
        config.kv_dim(),
    );
    let mut out = vec![
        (EMBED_TOKENS.to_string(), vec![config.vocab_size, h]),
        (FINAL_NORM.to_string(), vec![h]),
    ];
    if !config.tie_word_embeddings {
        out.push((LM_HEAD.to_string(), vec![config.vocab_size, h]));
    }
    for layer in 0..config.num_hidden_layers {
        let p = |s: &str| tensor_names::layer(layer, s);
        out.push((p("input_layernorm.weight"), vec![h]));
        out.push((p("post_attention_layernorm.weight"), vec![h]));
        out.push((p("self_attn.q_proj.weight"), vec![q, h]));
        out.push((p("self_attn.k_proj.weight"), vec![kv, h]));
        out.push((p("self_attn.v_proj.weight"), vec![kv, h]));
        out.push((p("self_attn.o_proj.weight"), vec![h, q]));
        if config.attention_bias {
            out.push((p("self_attn.q_proj.bias"), vec![q]));
            out.push((p("self_attn.k_proj.bias"), vec![kv]));
            out.push((p("self_attn.v_proj.bias"), vec![kv]));
        }
        if config.o_proj_bias {
            out.push((p("self_attn.o_proj.bias"), vec![h]));
        }
        if config.qk_norm {
            out.push((p("self_attn.q_norm.weight"), vec![config.head_dim]));
            out.push((p("self_attn.k_norm.weight"), vec![config.head_dim]));
        }
        out.push((p("mlp.gate_proj.weight"), vec![i, h]));
        out.push((p("mlp.up_proj.weight"), vec![i, h]));
        out.push((p("mlp.down_proj.weight"), vec![h, i]));
    }
    out
}
