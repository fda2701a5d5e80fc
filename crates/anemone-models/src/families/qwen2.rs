//! Qwen2 (and Qwen2.5): the Llama decoder with Q/K/V projection biases (always, without a config
//! field; never an o_proj bias). llama.cpp stores its Q/K projections in Hugging Face order.

use super::decoder::gguf_names::QkRows;
use super::decoder::hf_config::{AttentionBias, HeadDimDefault};
use super::decoder::LlamaLike;

pub static QWEN2: LlamaLike = LlamaLike {
    name: "qwen2",
    hf_model_types: &["qwen2"],
    gguf_architecture: "qwen2",
    head_dim: HeadDimDefault::HiddenOverHeads,
    attention_bias: AttentionBias::AlwaysQkv,
    qk_norm: false,
    gguf_qk_rows: QkRows::AsHuggingFace,
};
