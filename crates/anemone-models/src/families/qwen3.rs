//! Qwen3: the Llama decoder with a per-head RMSNorm of Q and K before RoPE and an explicit
//! `head_dim` (128 when config.json omits it, as transformers' Qwen3Config defaults it). llama.cpp
//! stores its Q/K projections in Hugging Face order.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::{DecoderConfig, Result};

use super::decoder::gguf_config::{self, GgufRules};
use super::decoder::gguf_names::{self, QkRows};
use super::decoder::hf_config::{self, AttentionBias, HeadDimDefault, HfRules};
use super::{decoder, Family, ModelKind};

const NAME: &str = "qwen3";
/// transformers' Qwen3Config defaults head_dim to 128 rather than hidden / heads.
const DEFAULT_HEAD_DIM: usize = 128;

#[derive(Debug, Clone, Copy)]
pub struct Qwen3;

impl Family for Qwen3 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Decoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["qwen3"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "qwen3"
    }

    fn config_from_hf(&self, fields: &JsonFields) -> Result<DecoderConfig> {
        let rules = HfRules {
            architecture: NAME,
            head_dim: HeadDimDefault::Fixed(DEFAULT_HEAD_DIM),
            attention_bias: AttentionBias::RefuseField,
            qk_norm: true,
        };
        hf_config::parse(fields, &rules)
    }

    fn config_from_gguf(
        &self,
        file: &GgufFile,
        tokenizer: Option<&GgufTokenizer>,
    ) -> Result<DecoderConfig> {
        let rules = GgufRules {
            architecture: NAME,
            key_prefix: self.gguf_architecture(),
            qk_norm: true,
        };
        gguf_config::parse(file, &rules, tokenizer)
    }

    fn expected_tensors(&self, config: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
        decoder::expected_tensors(config)
    }

    fn tensor_from_gguf(
        &self,
        file: &GgufFile,
        desc: &TensorDesc,
        config: &DecoderConfig,
    ) -> Result<(String, RowPermutation)> {
        gguf_names::map_tensor(file, desc, config, QkRows::AsHuggingFace)
    }
}
