//! Qwen2 (and Qwen2.5): the Llama decoder with Q/K/V projection biases (always, without a config
//! field; never an o_proj bias). llama.cpp stores its Q/K projections in Hugging Face order.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::{DecoderConfig, Result};

use super::decoder::gguf_config::{self, GgufRules};
use super::decoder::gguf_names::{self, QkRows};
use super::decoder::hf_config::{self, AttentionBias, HeadDimDefault, HfRules};
use super::{decoder, Family, ModelKind};

const NAME: &str = "qwen2";

#[derive(Debug, Clone, Copy)]
pub struct Qwen2;

impl Family for Qwen2 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Decoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["qwen2"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "qwen2"
    }

    fn config_from_hf(&self, fields: &JsonFields) -> Result<DecoderConfig> {
        let rules = HfRules {
            architecture: NAME,
            head_dim: HeadDimDefault::HiddenOverHeads,
            attention_bias: AttentionBias::AlwaysQkv,
            qk_norm: false,
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
            qk_norm: false,
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
