//! Llama (and Llama-architecture models such as SmolLM2): RMSNorm, rotate-half RoPE, grouped K/V
//! heads, SiLU-gated MLP, no biases. llama.cpp stores its Q/K projections with the rows of each
//! head interleaved, which loading undoes.

use super::decoder::gguf_names::QkRows;
use super::decoder::hf_config::{AttentionBias, HeadDimDefault};
use super::decoder::LlamaLike;

pub static LLAMA: LlamaLike = LlamaLike {
    name: "llama",
    hf_model_types: &["llama"],
    gguf_architecture: "llama",
    head_dim: HeadDimDefault::HiddenOverHeads,
    attention_bias: AttentionBias::Field,
    qk_norm: false,
    gguf_qk_rows: QkRows::Interleaved,
};
