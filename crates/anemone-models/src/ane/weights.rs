//! Weights of one chunk, prepared once in their on-disk form and emitted into every function of
//! the package (identical payloads are written once to `weight.bin`, so `decode` and `prefill`
//! share one copy).
//!
//! The [`WeightCompressor`] hook lets the compression crate replace the dense fp16/fp32 form of
//! a projection by a `constexpr_*` form without touching the graph builders.

use anemone_checkpoint::Checkpoint;
use anemone_mil::{FunctionBuilder, TensorData, Var};

use super::options::Precision;
use super::AneError;
use crate::families::decoder::tensor_names;

/// A weight in the form it is written to the package.
#[derive(Debug, Clone, PartialEq)]
pub enum PreparedWeight {
    /// A plain `const` in the compute dtype.
    Dense(TensorData),
    /// `constexpr_blockwise_shift_scale(data, scale, offset)` (int8/int4 linear quantization).
    BlockwiseShiftScale {
        data: TensorData,
        scale: TensorData,
        offset: Option<TensorData>,
    },
    /// `constexpr_lut_to_dense(indices, lut)` (palettization).
    Lut {
        indices: TensorData,
        lut: TensorData,
    },
}

impl PreparedWeight {
    /// Emits the op producing this weight in `f` under `name`.
    pub fn emit(&self, f: &mut FunctionBuilder, name: &str) -> Result<Var, AneError> {
        let v = match self {
            PreparedWeight::Dense(data) => f.constant(name, data.clone())?,
            PreparedWeight::BlockwiseShiftScale {
                data,
                scale,
                offset,
            } => f.constexpr_blockwise_shift_scale(
                name,
                data.clone(),
                scale.clone(),
                offset.clone(),
            )?,
            PreparedWeight::Lut { indices, lut } => {
                f.constexpr_lut_to_dense(name, indices.clone(), lut.clone())?
            }
        };
        Ok(v)
    }

    /// Bytes of its payloads as stored.
    pub fn stored_bytes(&self) -> usize {
        match self {
            PreparedWeight::Dense(d) => d.bytes().len(),
            PreparedWeight::BlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                data.bytes().len()
                    + scale.bytes().len()
                    + offset.as_ref().map_or(0, |o| o.bytes().len())
            }
            PreparedWeight::Lut { indices, lut } => indices.bytes().len() + lut.bytes().len(),
        }
    }
}

/// Turns a projection's f32 values into its stored form. `tensor` is the Hugging Face name
/// (`model.layers.3.mlp.down_proj.weight`), `shape` the conv shape `[out, in, 1, 1]`.
/// Returning `None` keeps the dense form.
pub trait WeightCompressor: Send + Sync {
    fn compress(
        &self,
        tensor: &str,
        shape: &[usize],
        values: &[f32],
        precision: Precision,
    ) -> Result<Option<PreparedWeight>, AneError>;

    /// What the compressor did (scheme, per-tensor error…), recorded as the manifest's
    /// `compression` entry once every weight went through [`WeightCompressor::compress`].
    fn describe(&self) -> Option<serde_json::Value> {
        None
    }
}

/// The default: every weight dense in the compute precision.
#[derive(Debug, Clone, Copy, Default)]
pub struct Uncompressed;

impl WeightCompressor for Uncompressed {
    fn compress(
        &self,
        _tensor: &str,
        _shape: &[usize],
        _values: &[f32],
        _precision: Precision,
    ) -> Result<Option<PreparedWeight>, AneError> {
        Ok(None)
    }
}

/// Dense data in the compute precision.
pub fn dense(
    shape: Vec<usize>,
    values: &[f32],
    precision: Precision,
) -> Result<TensorData, AneError> {
    Ok(match precision {
        Precision::Fp16 => TensorData::f16_from_f32(shape, values)?,
        Precision::Fp32 => TensorData::from_f32(shape, values)?,
    })
}

/// The weights of one decoder layer, in graph form. Projections are conv kernels `[O, I, 1, 1]`.
#[derive(Debug, Clone)]
pub struct LayerWeights {
    pub index: usize,
    /// `[hidden]` each.
    pub input_norm: TensorData,
    /// The norm before the MLP (Gemma's `pre_feedforward_layernorm`).
    pub post_attention_norm: TensorData,
    /// Gemma's norms of the attention and MLP outputs, times the residual scale.
    pub output_norms: Option<(TensorData, TensorData)>,
    pub q_proj: PreparedWeight,
    pub k_proj: PreparedWeight,
    pub v_proj: PreparedWeight,
    pub o_proj: PreparedWeight,
    /// `(q, k, v)` biases, `[q_dim]`, `[kv_dim]`, `[kv_dim]` (Qwen2).
    pub qkv_bias: Option<(TensorData, TensorData, TensorData)>,
    /// `[hidden]` o_proj bias (Llama/Qwen3 with `attention_bias`).
    pub o_bias: Option<TensorData>,
    /// `(q_norm, k_norm)`, `[head_dim]` each (Qwen3).
    pub qk_norm: Option<(TensorData, TensorData)>,
    pub gate_proj: PreparedWeight,
    pub up_proj: PreparedWeight,
    pub down_proj: PreparedWeight,
}

impl LayerWeights {
    /// Loads layer `index` from the checkpoint, one tensor at a time (each f32 copy is dropped
    /// as soon as its stored form exists).
    pub fn load(
        checkpoint: &Checkpoint,
        index: usize,
        precision: Precision,
        compressor: &dyn WeightCompressor,
    ) -> Result<Self, AneError> {
        let c = &checkpoint.config;
        let (h, q, kv, inter, d) = (
            c.hidden_size,
            c.q_dim(),
            c.kv_dim(),
            c.intermediate_size,
            c.head_dim,
        );
        let name = |s: &str| tensor_names::layer(index, s);
        // partial rotation: Q/K head rows in the order the RoPE tables expect (crate::rope)
        let order = crate::rope::ane_head_order(c);
        let qk_rows = |tensor: &str, values: Vec<f32>, cols: usize| match &order {
            Some(order) if is_qk(tensor) => crate::rope::reorder_head_rows(&values, order, cols),
            _ => values,
        };
        let vector = |tensor: String, n: usize| -> Result<TensorData, AneError> {
            let values = qk_rows(&tensor, load_checked(checkpoint, &tensor, &[n])?, 1);
            dense(vec![n], &values, precision)
        };
        let projection =
            |tensor: String, out: usize, inp: usize| -> Result<PreparedWeight, AneError> {
                let values = qk_rows(
                    &tensor,
                    load_checked(checkpoint, &tensor, &[out, inp])?,
                    inp,
                );
                let shape = [out, inp, 1, 1];
                match compressor.compress(&tensor, &shape, &values, precision)? {
                    Some(w) => Ok(w),
                    None => Ok(PreparedWeight::Dense(dense(
                        shape.to_vec(),
                        &values,
                        precision,
                    )?)),
                }
            };
        let qkv_bias = if c.attention_bias {
            Some((
                vector(name("self_attn.q_proj.bias"), q)?,
                vector(name("self_attn.k_proj.bias"), kv)?,
                vector(name("self_attn.v_proj.bias"), kv)?,
            ))
        } else {
            None
        };
        let qk_norm = if c.qk_norm {
            Some((
                vector(name("self_attn.q_norm.weight"), d)?,
                vector(name("self_attn.k_norm.weight"), d)?,
            ))
        } else {
            None
        };
        let (mlp_norm, output_norms) = match &c.gemma {
            Some(g) => {
                let scaled = |tensor: String| -> Result<TensorData, AneError> {
                    let mut values = load_checked(checkpoint, &tensor, &[h])?;
                    values
                        .iter_mut()
                        .for_each(|v| *v = (*v as f64 * g.residual_scale) as f32);
                    dense(vec![h], &values, precision)
                };
                (
                    vector(name("pre_feedforward_layernorm.weight"), h)?,
                    Some((
                        scaled(name("post_attention_layernorm.weight"))?,
                        scaled(name("post_feedforward_layernorm.weight"))?,
                    )),
                )
            }
            None => (vector(name("post_attention_layernorm.weight"), h)?, None),
        };
        Ok(LayerWeights {
            index,
            input_norm: vector(name("input_layernorm.weight"), h)?,
            post_attention_norm: mlp_norm,
            output_norms,
            q_proj: projection(name("self_attn.q_proj.weight"), q, h)?,
            k_proj: projection(name("self_attn.k_proj.weight"), kv, h)?,
            v_proj: projection(name("self_attn.v_proj.weight"), kv, h)?,
            o_proj: projection(name("self_attn.o_proj.weight"), h, q)?,
            qkv_bias,
            o_bias: if c.o_proj_bias {
                Some(vector(name("self_attn.o_proj.bias"), h)?)
            } else {
                None
            },
            qk_norm,
            gate_proj: projection(name("mlp.gate_proj.weight"), inter, h)?,
            up_proj: projection(name("mlp.up_proj.weight"), inter, h)?,
            down_proj: projection(name("mlp.down_proj.weight"), h, inter)?,
        })
    }
}

/// Whether `tensor` is one whose rows are Q or K head dimensions (projection weight or bias,
/// per-head norm).
fn is_qk(tensor: &str) -> bool {
    [
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.q_proj.bias",
        "self_attn.k_proj.bias",
        "self_attn.q_norm.weight",
        "self_attn.k_norm.weight",
    ]
    .iter()
    .any(|s| tensor.ends_with(s))
}

/// Loads a tensor and checks its shape against what the config implies.
pub fn load_checked(
    checkpoint: &Checkpoint,
    tensor: &str,
    shape: &[usize],
) -> Result<Vec<f32>, AneError> {
    if let Some(info) = checkpoint.tensors.info(tensor) {
        if info.shape != shape {
            return Err(AneError::TensorShape {
                tensor: tensor.to_string(),
                expected: shape.to_vec(),
                found: info.shape,
            });
        }
    }
    let values = checkpoint.load_f32(tensor)?;
    let numel: usize = shape.iter().product();
    if values.len() != numel {
        return Err(AneError::TensorShape {
            tensor: tensor.to_string(),
            expected: shape.to_vec(),
            found: vec![values.len()],
        });
    }
    Ok(values)
}

/// Bytes one layer's weights take at `precision`, dense (for `--chunk-size-mb` planning).
pub fn layer_weight_bytes(c: &anemone_checkpoint::DecoderConfig, precision: Precision) -> usize {
    let (h, q, kv, inter, d) = (
        c.hidden_size,
        c.q_dim(),
        c.kv_dim(),
        c.intermediate_size,
        c.head_dim,
    );
    let mut params = h * (q + 2 * kv) + q * h + 3 * h * inter + 2 * h;
    if c.attention_bias {
        params += q + 2 * kv;
    }
    if c.o_proj_bias {
        params += h;
    }
    if c.qk_norm {
        params += 2 * d;
    }
    if c.gemma.is_some() {
        params += 2 * h;
    }
    params * precision.bytes_per_weight()
}
