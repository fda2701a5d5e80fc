//! The f32 weights of a decoder, loaded from a [`Checkpoint`] under Hugging Face names.
//!
//! Q/K/V projections are stored fused as one `[q_dim + 2·kv_dim, hidden]` matrix (rows of Q, then
//! K, then V) and gate/up as one `[2·intermediate, hidden]` matrix, so each is one pass over the
//! weights; the math is exactly the separate projections'. The matrices live in one [`Arena`],
//! each loaded in place.

use super::arena::{Arena, Layout, Span};
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
    pub qkv: Span,
    /// `[q_dim + 2·kv_dim]` when the architecture has attention biases.
    pub qkv_bias: Option<Vec<f32>>,
    /// `(q_norm, k_norm)`, each `[head_dim]`, for Qwen3-style per-head QK RMSNorm.
    pub qk_norm: Option<(Vec<f32>, Vec<f32>)>,
    /// `[hidden, q_dim]`.
    pub o_proj: Span,
    /// `[hidden]` when the architecture has an output-projection bias.
    pub o_bias: Option<Vec<f32>>,
    /// `[2·intermediate, hidden]`: gate rows, then up rows.
    pub gate_up: Span,
    /// `[hidden, intermediate]`.
    pub down: Span,
}

/// The weights: the matrices in one [`Arena`] (addressed by [`Span`]s), the vectors on the heap.
pub struct Weights {
    arena: Arena,
    /// `[vocab, hidden]`.
    pub embed_tokens: Span,
    /// `[vocab, hidden]`; `None` when tied to `embed_tokens`.
    pub lm_head: Option<Span>,
    pub final_norm: Vec<f32>,
    pub layers: Vec<LayerWeights>,
}

impl Weights {
    /// The values of a matrix of these weights.
    pub fn get(&self, span: Span) -> &[f32] {
        self.arena.get(span)
    }

    /// `[vocab, hidden]`: the LM head, or the embeddings it is tied to.
    pub fn lm_head(&self) -> Span {
        self.lm_head.unwrap_or(self.embed_tokens)
    }

    /// Loads and shape-checks every tensor `config` implies, the matrices straight into the
    /// arena (fused ones part by part: Q, K, V rows; gate, up rows), in huge pages if
    /// `huge_pages` ([`super::ReferenceOptions::huge_pages`]).
    pub fn load(checkpoint: &Checkpoint, huge_pages: bool) -> Result<Self, ForwardError> {
        let config = &checkpoint.config;
        let load = |name: String, shape: &[usize]| load_checked(checkpoint, &name, shape);
        let (h, q, kv, inter, d) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
            config.head_dim,
        );
        // every matrix: its span and the tensors that fill it, in order, with their shapes
        let mut layout = Layout::default();
        let mut parts: Vec<(Span, Vec<Part>)> = Vec::new();
        let mut matrix = |tensors: Vec<Part>| {
            let span = layout.span(tensors.iter().map(|(_, [r, c])| r * c).sum());
            parts.push((span, tensors));
            span
        };
        let embed_tokens = matrix(vec![(EMBED_TOKENS.into(), [config.vocab_size, h])]);
        let lm_head = (!config.tie_word_embeddings)
            .then(|| matrix(vec![(LM_HEAD.into(), [config.vocab_size, h])]));
        let mut layer_spans = Vec::with_capacity(config.num_hidden_layers);
        for i in 0..config.num_hidden_layers {
            let name = |s: &str| tensor_names::layer(i, s);
            layer_spans.push([
                matrix(vec![
                    (name("self_attn.q_proj.weight"), [q, h]),
                    (name("self_attn.k_proj.weight"), [kv, h]),
                    (name("self_attn.v_proj.weight"), [kv, h]),
                ]),
                matrix(vec![(name("self_attn.o_proj.weight"), [h, q])]),
                matrix(vec![
                    (name("mlp.gate_proj.weight"), [inter, h]),
                    (name("mlp.up_proj.weight"), [inter, h]),
                ]),
                matrix(vec![(name("mlp.down_proj.weight"), [h, inter])]),
            ]);
        }
        let mut arena = Arena::new(&layout, huge_pages);
        for (span, tensors) in &parts {
            let mut rest = arena.get_mut(*span);
            for (tensor, shape) in tensors {
                let (part, tail) = rest.split_at_mut(shape[0] * shape[1]);
                load_checked_into(checkpoint, tensor, shape, part)?;
                rest = tail;
            }
        }

        let final_norm = load(FINAL_NORM.into(), &[h])?;
        let mut layers = Vec::with_capacity(config.num_hidden_layers);
        for (i, [qkv, o_proj, gate_up, down]) in layer_spans.into_iter().enumerate() {
            let name = |s: &str| tensor_names::layer(i, s);
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
            layers.push(LayerWeights {
                input_norm: load(name("input_layernorm.weight"), &[h])?,
                post_attention_norm: mlp_norm,
                output_norms,
                qkv,
                qkv_bias,
                qk_norm,
                o_proj,
                o_bias: if config.o_proj_bias {
                    Some(load(name("self_attn.o_proj.bias"), &[h])?)
                } else {
                    None
                },
                gate_up,
                down,
            });
        }
        Ok(Self {
            arena,
            embed_tokens,
            lm_head,
            final_norm,
            layers,
        })
    }
}

/// One tensor of a (possibly fused) matrix: its name and `[rows, columns]`.
type Part = (String, [usize; 2]);

/// The tensor's shape as the checkpoint records it, if it records one, must be `shape`.
fn check_shape(checkpoint: &Checkpoint, name: &str, shape: &[usize]) -> Result<(), ForwardError> {
    match checkpoint.tensors.info(name) {
        Some(info) if info.shape != shape => Err(ForwardError::TensorShape {
            tensor: name.to_string(),
            expected: shape.to_vec(),
            found: info.shape,
        }),
        _ => Ok(()),
    }
}

/// Loads a matrix into its place in the arena (`out` holds exactly `shape`'s elements).
fn load_checked_into(
    checkpoint: &Checkpoint,
    name: &str,
    shape: &[usize],
    out: &mut [f32],
) -> Result<(), ForwardError> {
    check_shape(checkpoint, name, shape)?;
    // a store that yields another length than `out` holds reports it (`check_len`)
    Ok(checkpoint.load_f32_into(name, out)?)
}

fn load_checked(
    checkpoint: &Checkpoint,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>, ForwardError> {
    check_shape(checkpoint, name, shape)?;
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
