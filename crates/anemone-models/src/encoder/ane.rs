//! The encoder body as one ML Program with one function per length bucket (`len_32`,
//! `len_128`, …) sharing its weights.
//!
//! Layout `[1, C, 1, T]` throughout; projections are 1×1 convs with bias; attention is split per
//! head (`[1, 1, D, T]` each) with two matmuls and an explicit max-subtracted softmax over the
//! keys; padding is an additive finite mask (0 visible, −1e4 padding) over the key axis;
//! LayerNorm runs over channels as `rms_norm(x − mean(x))·γ + β` in the max-scaled form (nothing
//! squared exceeds 1, so fp16 cannot overflow); the MLP uses the exact (erf) GELU.
//!
//! Per function (T = bucket length):
//! - inputs: `embeddings [1, hidden, 1, T]` — word + position + token-type embeddings summed on
//!   the host (padding slots zero), before the embedding LayerNorm; `mask [1, 1, 1, T]`;
//! - output: `hidden_states_out [1, hidden, 1, T]`, the last layer's output (pooling and any
//!   classification head run on the host in fp32).
//!
//! Layer `i`'s output op is named `l{i}_out` and the embedding LayerNorm `embed_norm`, so an op
//! observer can compare every layer with the reference.

use anemone_mil::{DType, FunctionBuilder, GeluMode, Program, SpecVersion, TensorType, Var};

use super::reference::{EncoderWeights, Linear, Norm};
use super::EncoderConfig;
use crate::ane::norm::rms_norm;
use crate::ane::weights::dense;
use crate::ane::{
    AneError, FunctionSignature, NormForm, Precision, PreparedWeight, TensorSignature,
    WeightCompressor,
};

pub mod names {
    pub const EMBEDDINGS: &str = "embeddings";
    pub const MASK: &str = "mask";
    pub const HIDDEN_OUT: &str = "hidden_states_out";
    pub const EMBED_NORM: &str = "embed_norm";

    /// The function of bucket `t`.
    pub fn function(t: usize) -> String {
        format!("len_{t}")
    }

    /// The output op of layer `i`.
    pub fn layer_out(i: usize) -> String {
        format!("l{i}_out")
    }
}

/// The signature of the function of bucket `t`.
pub fn bucket_signature(
    config: &EncoderConfig,
    precision: Precision,
    t: usize,
) -> FunctionSignature {
    let dt = precision.dtype();
    let h = config.hidden_size;
    FunctionSignature {
        name: names::function(t),
        inputs: vec![
            TensorSignature::new(
                names::EMBEDDINGS,
                dt,
                vec![1, h, 1, t],
                "word + position + token-type embeddings (host), zero in padding slots",
            ),
            TensorSignature::new(
                names::MASK,
                dt,
                vec![1, 1, 1, t],
                "additive key mask: 0 for the input's tokens, -1e4 for padding",
            ),
        ],
        outputs: vec![TensorSignature::new(
            names::HIDDEN_OUT,
            dt,
            vec![1, h, 1, t],
            "last layer's hidden states (pooled on the host)",
        )],
        states: Vec::new(),
    }
}

/// A projection in graph form: conv kernel `[out, in, 1, 1]` (possibly compressed) and bias.
struct Projection {
    weight: PreparedWeight,
    bias: anemone_mil::TensorData,
}

impl Projection {
    fn new(
        name: &str,
        l: &Linear,
        precision: Precision,
        compressor: &dyn WeightCompressor,
    ) -> Result<Self, AneError> {
        let shape = vec![l.n_out, l.n_in, 1, 1];
        let weight = match compressor.compress(name, &shape, &l.w, precision)? {
            Some(w) => w,
            None => PreparedWeight::Dense(dense(shape, &l.w, precision)?),
        };
        Ok(Projection {
            weight,
            bias: dense(vec![l.n_out], &l.b, precision)?,
        })
    }

    fn emit(&self, f: &mut FunctionBuilder, name: &str, x: Var) -> Result<Var, AneError> {
        let w = self.weight.emit(f, &format!("{name}_weight"))?;
        let b = f.constant(&format!("{name}_bias"), self.bias.clone())?;
        Ok(f.conv1x1(name, x, w, Some(b))?)
    }
}

struct NormWeights {
    gamma: anemone_mil::TensorData,
    beta: anemone_mil::TensorData,
}

impl NormWeights {
    fn new(n: &Norm, precision: Precision) -> Result<Self, AneError> {
        Ok(NormWeights {
            gamma: dense(vec![n.w.len()], &n.w, precision)?,
            beta: dense(vec![1, n.b.len(), 1, 1], &n.b, precision)?,
        })
    }

    /// LayerNorm over channels: `rms_norm(x − mean(x))·γ + β`, max-scaled.
    fn emit(&self, f: &mut FunctionBuilder, name: &str, x: Var, eps: f32) -> Result<Var, AneError> {
        let mean = f.reduce_mean(&format!("{name}_mean"), x, &[1], true)?;
        let centered = f.sub(&format!("{name}_centered"), x, mean)?;
        let scaled = rms_norm(
            f,
            &format!("{name}_rms"),
            centered,
            1,
            &self.gamma,
            eps,
            NormForm::MaxScaled,
        )?;
        let beta = f.constant(&format!("{name}_beta"), self.beta.clone())?;
        Ok(f.add(name, scaled, beta)?)
    }
}

struct LayerGraph {
    query: Projection,
    key: Projection,
    value: Projection,
    attn_out: Projection,
    attn_norm: NormWeights,
    intermediate: Projection,
    output: Projection,
    out_norm: NormWeights,
}

/// The encoder body's weights in graph form, prepared once for every bucket.
pub struct EncoderGraphWeights {
    embed_norm: NormWeights,
    layers: Vec<LayerGraph>,
}

impl EncoderGraphWeights {
    pub fn prepare(
        config: &EncoderConfig,
        w: &EncoderWeights,
        precision: Precision,
        compressor: &dyn WeightCompressor,
    ) -> Result<Self, AneError> {
        let mut layers = Vec::with_capacity(w.layers.len());
        for (i, l) in w.layers.iter().enumerate() {
            let p = config.tensor(&format!("encoder.layer.{i}"));
            let proj = |name: &str, lin: &Linear| {
                Projection::new(&format!("{p}.{name}.weight"), lin, precision, compressor)
            };
            layers.push(LayerGraph {
                query: proj("attention.self.query", &l.query)?,
                key: proj("attention.self.key", &l.key)?,
                value: proj("attention.self.value", &l.value)?,
                attn_out: proj("attention.output.dense", &l.attn_out)?,
                attn_norm: NormWeights::new(&l.attn_norm, precision)?,
                intermediate: proj("intermediate.dense", &l.intermediate)?,
                output: proj("output.dense", &l.output)?,
                out_norm: NormWeights::new(&l.out_norm, precision)?,
            });
        }
        Ok(EncoderGraphWeights {
            embed_norm: NormWeights::new(&w.embed_norm, precision)?,
            layers,
        })
    }
}

/// The program: one function per bucket in `lengths`, the first one the default.
pub fn build_encoder_program(
    config: &EncoderConfig,
    weights: &EncoderGraphWeights,
    precision: Precision,
    lengths: &[usize],
) -> Result<Program, AneError> {
    let mut program = Program::new(SpecVersion::V9);
    for &t in lengths {
        program.add_function(build_bucket_function(config, weights, precision, t)?)?;
    }
    let buckets = lengths
        .iter()
        .map(|t| t.to_string())
        .collect::<Vec<_>>()
        .join(",");
    for (k, v) in [
        ("anemone.kind", "encoder".to_string()),
        ("anemone.architecture", config.architecture.clone()),
        ("anemone.model_type", config.model_type.clone()),
        ("anemone.layer_count", config.num_hidden_layers.to_string()),
        ("anemone.buckets", buckets),
        ("anemone.precision", precision.name().to_string()),
    ] {
        program.metadata.insert(k.to_string(), v);
    }
    Ok(program)
}

fn build_bucket_function(
    config: &EncoderConfig,
    weights: &EncoderGraphWeights,
    precision: Precision,
    t: usize,
) -> Result<anemone_mil::Function, AneError> {
    let sig = bucket_signature(config, precision, t);
    let mut f = FunctionBuilder::new(&sig.name);
    let mut inputs = Vec::new();
    for input in &sig.inputs {
        inputs.push(f.input(
            &input.name,
            TensorType::new(input.dtype, input.shape.clone()),
        )?);
    }
    let (emb, mask) = (inputs[0], inputs[1]);
    let eps = config.layer_norm_eps as f32;
    let mut x = weights
        .embed_norm
        .emit(&mut f, names::EMBED_NORM, emb, eps)?;
    let last = weights.layers.len().saturating_sub(1);
    for (i, layer) in weights.layers.iter().enumerate() {
        let out_name = if i == last {
            names::HIDDEN_OUT.to_string()
        } else {
            names::layer_out(i)
        };
        x = encoder_layer(
            &mut f,
            config,
            precision.dtype(),
            layer,
            i,
            x,
            mask,
            t,
            &out_name,
        )?;
    }
    f.output(x)?;
    Ok(f.finish()?)
}

#[allow(clippy::too_many_arguments)]
fn encoder_layer(
    f: &mut FunctionBuilder,
    config: &EncoderConfig,
    dtype: DType,
    w: &LayerGraph,
    index: usize,
    x: Var,
    mask: Var,
    t: usize,
    out_name: &str,
) -> Result<Var, AneError> {
    let p = format!("l{index}");
    let eps = config.layer_norm_eps as f32;
    let (heads, d) = (config.num_attention_heads, config.head_dim);
    let (heads_i, d_i, t_i, h_i) = (heads as i64, d as i64, t as i64, config.hidden_size as i64);
    let q = w.query.emit(f, &format!("{p}_query"), x)?;
    let k = w.key.emit(f, &format!("{p}_key"), x)?;
    let v = w.value.emit(f, &format!("{p}_value"), x)?;
    let scale = f.scalar(&format!("{p}_attn_scale"), dtype, 1.0 / (d as f32).sqrt())?;
    let q = f.mul(&format!("{p}_query_scaled"), q, scale)?;
    let q = f.reshape(&format!("{p}_q_heads"), q, &[heads_i, 1, d_i, t_i])?;
    let k = f.reshape(&format!("{p}_k_heads"), k, &[heads_i, 1, d_i, t_i])?;
    let v = f.reshape(&format!("{p}_v_heads"), v, &[heads_i, 1, d_i, t_i])?;
    let qs = f.split(&format!("{p}_q_split"), q, &vec![1; heads], 0)?;
    let ks = f.split(&format!("{p}_k_split"), k, &vec![1; heads], 0)?;
    let vs = f.split(&format!("{p}_v_split"), v, &vec![1; heads], 0)?;
    let mut outputs = Vec::with_capacity(heads);
    for head in 0..heads {
        let hp = format!("{p}_h{head}");
        // [1,1,D,T]ᵀ·[1,1,D,T] → [1,1,T(query),T(key)]
        let scores = f.matmul(&format!("{hp}_scores"), qs[head], ks[head], true, false)?;
        let masked = f.add(&format!("{hp}_masked"), scores, mask)?;
        let row_max = f.reduce_max(&format!("{hp}_row_max"), masked, &[-1], true)?;
        let shifted = f.sub(&format!("{hp}_shifted"), masked, row_max)?;
        let probs = f.softmax(&format!("{hp}_probs"), shifted, -1)?;
        // [1,1,D,T(key)]·[1,1,T(query),T(key)]ᵀ → [1,1,D,T(query)]
        outputs.push(f.matmul(&format!("{hp}_attn"), vs[head], probs, false, true)?);
    }
    let attn = f.concat(&format!("{p}_attn_heads"), &outputs, 0)?;
    let attn = f.reshape(&format!("{p}_attn"), attn, &[1, h_i, 1, t_i])?;
    let o = w.attn_out.emit(f, &format!("{p}_attn_out"), attn)?;
    let x = f.add(&format!("{p}_attn_residual"), x, o)?;
    let x = w.attn_norm.emit(f, &format!("{p}_attn_norm"), x, eps)?;
    let inter = w.intermediate.emit(f, &format!("{p}_intermediate"), x)?;
    let act = f.gelu(&format!("{p}_gelu"), inter, GeluMode::Exact)?;
    let out = w.output.emit(f, &format!("{p}_output"), act)?;
    let y = f.add(&format!("{p}_mlp_residual"), x, out)?;
    w.out_norm.emit(f, out_name, y, eps)
}

/// The host side of one input: its embeddings (`[hidden, T]` channel-major, zero padding) and
/// mask (`[T]`), for a bucket of `t` slots.
pub fn host_inputs(
    config: &EncoderConfig,
    embedded: &[f32],
    tokens: usize,
    t: usize,
) -> (Vec<f32>, Vec<f32>) {
    let h = config.hidden_size;
    let mut x = vec![0f32; h * t];
    for p in 0..tokens {
        for c in 0..h {
            x[c * t + p] = embedded[p * h + c];
        }
    }
    let mask = (0..t)
        .map(|p| {
            if p < tokens {
                0.0
            } else {
                crate::ane::options::MASK_NEG
            }
        })
        .collect();
    (x, mask)
}

/// `[1, hidden, 1, T]` (channel-major) → the input's own tokens as `[tokens, hidden]` rows.
pub fn hidden_rows(hidden: usize, t: usize, tokens: usize, out: &[f32]) -> Vec<f32> {
    let mut rows = vec![0f32; tokens * hidden];
    for p in 0..tokens {
        for c in 0..hidden {
            rows[p * hidden + c] = out[c * t + p];
        }
    }
    rows
}
