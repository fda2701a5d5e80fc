//! A Llama-like decoder family described by data: RMSNorm, rotate-half RoPE, grouped K/V heads, a
//! SiLU-gated MLP, and the few rules in which Llama, Qwen2 and Qwen3 differ. A family of this
//! shape is one `static` of [`LlamaLike`] in its own file; a family that departs from it
//! implements [`Family`] itself.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::{DecoderConfig, Result};

use super::gguf_config::{self, GgufRules};
use super::gguf_names::{self, QkRows};
use super::hf_config::{self, AttentionBias, HeadDimDefault, HfRules};
use crate::families::{Family, ModelKind};

/// What distinguishes one Llama-like family from another.
#[derive(Debug, Clone, Copy)]
pub struct LlamaLike {
    /// The name configs and bundle manifests record.
    pub name: &'static str,
    /// `model_type` values of `config.json`.
    pub hf_model_types: &'static [&'static str],
    /// GGUF `general.architecture`, also the prefix of its hyperparameter keys.
    pub gguf_architecture: &'static str,
    /// `head_dim` when `config.json` omits it.
    pub head_dim: HeadDimDefault,
    pub attention_bias: AttentionBias,
    /// Per-head RMSNorm of Q and K before RoPE (always present in the family).
    pub qk_norm: bool,
    /// How llama.cpp stores the rows of the Q/K projections.
    pub gguf_qk_rows: QkRows,
}

impl Family for LlamaLike {
    fn name(&self) -> &'static str {
        self.name
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Decoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        self.hf_model_types
    }

    fn gguf_architecture(&self) -> &'static str {
        self.gguf_architecture
    }

    fn config_from_hf(&self, fields: &JsonFields) -> Result<DecoderConfig> {
        let rules = HfRules {
            architecture: self.name,
            head_dim: self.head_dim,
            attention_bias: self.attention_bias,
            qk_norm: self.qk_norm,
        };
        hf_config::parse(fields, &rules)
    }

    fn config_from_gguf(
        &self,
        file: &GgufFile,
        tokenizer: Option<&GgufTokenizer>,
    ) -> Result<DecoderConfig> {
        let rules = GgufRules {
            architecture: self.name,
            key_prefix: self.gguf_architecture,
            qk_norm: self.qk_norm,
            partial_rotary: false,
            min_tensors_per_layer: gguf_config::MIN_TENSORS_PER_LAYER,
        };
        gguf_config::parse(file, &rules, tokenizer)
    }

    fn expected_tensors(&self, config: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
        super::expected_tensors(config)
    }

    fn tensor_from_gguf(
        &self,
        file: &GgufFile,
        desc: &TensorDesc,
        config: &DecoderConfig,
    ) -> Result<(String, RowPermutation)> {
        gguf_names::map_tensor(file, desc, config, self.gguf_qk_rows)
    }
}
