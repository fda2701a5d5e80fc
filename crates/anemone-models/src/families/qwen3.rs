//! Qwen3: the Llama decoder with a per-head RMSNorm of Q and K before RoPE and an explicit
//! `head_dim` (128 when config.json omits it, as transformers' Qwen3Config defaults it). llama.cpp
//! stores its Q/K projections in Hugging Face order.

use super::decoder::gguf_names::QkRows;
use super::decoder::hf_config::{AttentionBias, HeadDimDefault};
use super::decoder::LlamaLike;

pub static QWEN3: LlamaLike = LlamaLike {
    name: "qwen3",
    hf_model_types: &["qwen3"],
    gguf_architecture: "qwen3",
    head_dim: HeadDimDefault::Fixed(128),
    attention_bias: AttentionBias::Field,
    qk_norm: true,
    gguf_qk_rows: QkRows::AsHuggingFace,
};
