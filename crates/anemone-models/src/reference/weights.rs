//! The f32 weights of a decoder, loaded from a [`Checkpoint`] under Hugging Face names.
//!
//! Q/K/V projections are stored fused as one `[q_dim + 2·kv_dim, hidden]` matrix (rows of Q, then
//! K, then V) and gate/up as one `[2·intermediate, hidden]` matrix, so each is one pass over the
//! weights; the math is exactly the separate projections'.

use super::ForwardError;
use crate::families::decoder::tensor_names::{self, EMBED_TOKENS, FINAL_NORM, LM_HEAD};
use anemone_checkpoint::{Checkpoint, DecoderConfig};

pub struct LayerWeights {
    pub input_norm: Vec<f32>,
    /// The norm before the MLP (`post_attention_layernorm`; Gemma's `pre_feedforward_layernorm`).
    pub post_attention_norm: Vec<f32>,
    /// Gemma's norms of the attention and MLP outputs (`post_attention_layernorm`,
    /// `post_feedforward_layernorm`), applied before each is added to the residual stream.
    pub output_norms: Option<(Vec<f32>, Vec<f32>)>,
    /// `[q_dim + 2·kv_dim, hidden]`.
    pub qkv: Vec<f32>,
    /// `[q_dim + 2·kv_dim]` when the architecture has attention biases.
    pub qkv_bias: Option<Vec<f32>>,
    /// `(q_norm, k_norm)`, each `[head_dim]`, for Qwen3-style per-head QK RMSNorm.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `[hidden, q_dim]`.
    pub o_proj: Vec<f32>,
    /// `[hidden]` when the architecture has an output-projection bias.
    pub o_bias: Option<Vec<f32>>,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: Vec<f32>,
    /// `[hidden, intermediate]`.
    pub down: Vec<f32>,
}

pub struct Weights {
    /// `[vocab, hidden]`.
    pub embed_tokens: Vec<f32>,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Vec<f32>>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    pub fn lm_head(&self) -> &[f32] {
        self.lm_head.as_deref().unwrap_or(&self.embed_tokens)
    }

    /// Loads and shape-checks every tensor `config` implies.
    pub fn load(checkpoint: &Checkpoint) -> Result<Self, ForwardError> {
        let config = &checkpoint.config;
        let load = |name: String, shape: &[usize]| load_checked(checkpoint, &name, shape);
        let (h, q, kv, inter, d) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
            config.head_dim,
        );
        let embed_tokens = load(EMBED_TOKENS.into(), &[config.vocab_size, h])?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(load(LM_HEAD.into(), &[config.vocab_size, h])?)
        };
        let final_norm = load(FINAL_NORM.into(), &[h])?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let name = |s: &str| tensor_names::layer(i, s);
            let mut qkv = load(name("self_attn.q_proj.weight"), &[q, h])?;
            qkv.extend(load(name("self_attn.k_proj.weight"), &[kv, h])?);
            qkv.extend(load(name("self_attn.v_proj.weight"), &[kv, h])?);
            let qkv_bias = if config.attention_bias {
                let mut b = load(name("self_attn.q_proj.bias"), &[q])?;
                b.extend(load(name("self_attn.k_proj.bias"), &[kv])?);
                b.extend(load(name("self_attn.v_proj.bias"), &[kv])?);
                Some(b)
            } else {
                None
            };
            let qk_norm = if config.qk_norm {
                Some((
                    load(name("self_attn.q_norm.weight"), &[d])?,
                    load(name("self_attn.k_norm.weight"), &[d])?,
                ))
            } else {
                None
            };
            let (mlp_norm, output_norms) = match &config.gemma {
                Some(g) => {
                    // the block outputs join the residual stream at its scale
                    let scaled = |tensor: String| -> Result<Vec<f32>, ForwardError> {
                        let mut values = load(tensor, &[h])?;
                        values
                            .iter_mut()
                            .for_each(|v| *v = (*v as f64 * g.residual_scale) as f32);
                        Ok(values)
                    };
                    (
                        load(name("pre_feedforward_layernorm.weight"), &[h])?,
                        Some((
                            scaled(name("post_attention_layernorm.weight"))?,
                            scaled(name("post_feedforward_layernorm.weight"))?,
                        )),
                    )
                }
                None => (load(name("post_attention_layernorm.weight"), &[h])?, None),
            };
            let mut gate_up = load(name("mlp.gate_proj.weight"), &[inter, h])?;
            gate_up.extend(load(name("mlp.up_proj.weight"), &[inter, h])?);
            layers.push(LayerWeights {
                input_norm: load(name("input_layernorm.weight"), &[h])?,
                post_attention_norm: mlp_norm,
                output_norms,
                qkv,
                qkv_bias,
                qk_norm,
                o_proj: load(name("self_attn.o_proj.weight"), &[h, q])?,
                o_bias: if config.o_proj_bias {
                    Some(load(name("self_attn.o_proj.bias"), &[h])?)
                } else {
                    None
                },
                gate_up,
                down: load(name("mlp.down_proj.weight"), &[h, inter])?,
            });
        }
        Ok(Self {
            embed_tokens,
            lm_head,
            final_norm,
            layers,
        })
    }
}

fn load_checked(
    checkpoint: &Checkpoint,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>, ForwardError> {
    if let Some(info) = checkpoint.tensors.info(name) {
        if info.shape != shape {
            return Err(ForwardError::TensorShape {
                tensor: name.to_string(),
                expected: shape.to_vec(),
                found: info.shape,
            });
        }
    }
    let data = checkpoint.load_f32(name)?;
    let numel: usize = shape.iter().product();
    if data.len() != numel {
        return Err(ForwardError::TensorLength {
            tensor: name.to_string(),
            expected: numel,
            found: data.len(),
        });
    }
    Ok(data)
}

/// Checks the config's internal consistency ([`DecoderConfig::validate`]) before any weight is
/// read.
pub fn check_config(config: &DecoderConfig) -> Result<(), ForwardError> {
    config
        .validate()
        .map_err(|e| ForwardError::Config { problem: e.problem })
}
