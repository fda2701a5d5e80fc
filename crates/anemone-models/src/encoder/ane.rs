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
//! - outputs: `hidden_states_out [1, hidden, 1, T]`, the last layer's output (pooled into the
//!   embedding on the host in fp32), and for a model with a classification head
//!   `logits [1, labels, 1, 1]`: the head runs in the package as 1×1 convs on the pooled state
//!   (BERT: first token → pooler conv → tanh → classifier conv; RoBERTa alike; ModernBERT:
//!   first token or masked mean → dense conv → GELU → LayerNorm → classifier conv).
//!
//! Layer `i`'s output op is named `l{i}_out` and the embedding LayerNorm `embed_norm`, so an op
//! observer can compare every layer with the reference.
//!
//! ModernBERT ([`super::EncoderLayout::PreLnRope`]): LayerNorms before attention and the MLP,
//! queries and keys rotated per head (`x·cos + rotate_half(x)·sin`, the cos/sin tables of the
//! bucket's positions are constants, one pair per RoPE base), local layers add a constant
//! finite window mask (−1e4 beyond `local_window`) to the padding mask, a GeGLU MLP
//! (`gelu(Wi_in·x) · (Wi_gate·x)`), and a final LayerNorm whose output is `hidden_states_out`.

use anemone_mil::{DType, FunctionBuilder, GeluMode, Program, SpecVersion, TensorType, Var};

use super::reference::{EncoderWeights, Head, Linear, Norm};
use super::{AttentionSpan, EncoderConfig, HeadPooling};
use crate::ane::norm::rms_norm;
use crate::ane::rope::RopeTables;
use crate::ane::weights::dense;
use crate::ane::{
    AneError, FunctionSignature, NormForm, Precision, PreparedWeight, TensorSignature,
    WeightCompressor,
};

pub mod names {
    pub const EMBEDDINGS: &str = "embeddings";
    pub const MASK: &str = "mask";
    pub const HIDDEN_OUT: &str = "hidden_states_out";
    pub const LOGITS: &str = "logits";
    pub const EMBED_NORM: &str = "embed_norm";

    /// The function of bucket `t`.
    pub fn function(t: usize) -> String {
        format!("len_{t}")
    }

    /// The output op of layer `i`.
    pub fn layer_out(i: usize) -> String {
        format!("l{i}_out")
    }

    /// The ops an observer collects for per-layer comparison, in trace order (the embedding
    /// norm, then every layer output that is not `hidden_states_out` itself).
    pub fn observed(config: &super::EncoderConfig) -> Vec<String> {
        let layers = if config.has_final_norm() {
            config.num_hidden_layers
        } else {
            config.num_hidden_layers.saturating_sub(1)
        };
        std::iter::once(EMBED_NORM.to_string())
            .chain((0..layers).map(layer_out))
            .collect()
    }
}

/// The signature of the function of bucket `t`.
/// `with_head`: the function also outputs the classification head's `logits`.
pub fn bucket_signature(
    config: &EncoderConfig,
    precision: Precision,
    t: usize,
    with_head: bool,
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
        outputs: std::iter::once(TensorSignature::new(
            names::HIDDEN_OUT,
            dt,
            vec![1, h, 1, t],
            "last layer's hidden states (pooled on the host)",
        ))
        .chain((with_head && !config.labels.is_empty()).then(|| {
            TensorSignature::new(
                names::LOGITS,
                dt,
                vec![1, config.labels.len(), 1, 1],
                "classification logits (head in the package; softmax/sigmoid on the host)",
            )
        }))
        .collect(),
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
    attn_norm: Option<NormWeights>,
    intermediate: Projection,
    gate: Option<Projection>,
    output: Projection,
    out_norm: NormWeights,
}

/// The encoder body's weights in graph form, prepared once for every bucket.
pub struct EncoderGraphWeights {
    embed_norm: NormWeights,
    layers: Vec<LayerGraph>,
    final_norm: Option<NormWeights>,
    head: Option<HeadGraph>,
}

/// A classification head as graph weights (never compressed: it is small and decides labels).
enum HeadGraph {
    /// BERT pooler / RoBERTa `classifier.dense`: first token → conv → tanh → conv.
    Tanh { dense: Projection, out: Projection },
    /// ModernBERT: pool → conv → GELU → LayerNorm → conv.
    ModernBert {
        pooling: HeadPooling,
        dense: Projection,
        norm: NormWeights,
        eps: f32,
        out: Projection,
    },
}

impl HeadGraph {
    fn prepare(head: &Head, precision: Precision) -> Result<Self, AneError> {
        let none = crate::ane::Uncompressed;
        let proj = |name: &str, l: &Linear| Projection::new(name, l, precision, &none);
        Ok(match head {
            Head::BertPooler { pooler, classifier } => HeadGraph::Tanh {
                dense: proj("head.dense.weight", pooler)?,
                out: proj("head.out.weight", classifier)?,
            },
            Head::Roberta { dense, out_proj } => HeadGraph::Tanh {
                dense: proj("head.dense.weight", dense)?,
                out: proj("head.out.weight", out_proj)?,
            },
            Head::ModernBert {
                pooling,
                dense,
                norm,
                eps,
                classifier,
            } => HeadGraph::ModernBert {
                pooling: *pooling,
                dense: proj("head.dense.weight", dense)?,
                norm: NormWeights::new(norm, precision)?,
                eps: *eps as f32,
                out: proj("head.out.weight", classifier)?,
            },
        })
    }

    /// `logits [1, labels, 1, 1]` from the final states `x [1, H, 1, T]` and the padding mask.
    fn emit(
        &self,
        f: &mut FunctionBuilder,
        x: Var,
        mask: Var,
        hidden: usize,
    ) -> Result<Var, AneError> {
        let h = hidden as i64;
        let first = |f: &mut FunctionBuilder| -> Result<Var, AneError> {
            Ok(f.slice_by_index("head_first_token", x, &[0, 0, 0, 0], &[1, h, 1, 1], None)?)
        };
        match self {
            HeadGraph::Tanh { dense, out } => {
                let pooled = first(f)?;
                let d = dense.emit(f, "head_dense", pooled)?;
                let a = f.tanh("head_tanh", d)?;
                out.emit(f, names::LOGITS, a)
            }
            HeadGraph::ModernBert {
                pooling,
                dense,
                norm,
                eps,
                out,
            } => {
                let pooled = match pooling {
                    HeadPooling::Cls => first(f)?,
                    HeadPooling::Mean => {
                        // keep = 1 + mask / 1e4 (1 for tokens, 0 for padding); weights
                        // keep / Σkeep stay ≤ 1, so the weighted sum cannot overflow fp16.
                        let dtype = f.tensor_type(x)?.dtype;
                        let inv = f.scalar(
                            "head_mask_scale",
                            dtype,
                            -1.0 / crate::ane::options::MASK_NEG,
                        )?;
                        let one = f.scalar("head_one", dtype, 1.0)?;
                        let scaled = f.mul("head_mask_scaled", mask, inv)?;
                        let keep = f.add("head_keep", scaled, one)?;
                        let count = f.reduce_sum("head_count", keep, &[-1], true)?;
                        let weights = f.real_div("head_weights", keep, count)?;
                        let weighted = f.mul("head_weighted", x, weights)?;
                        f.reduce_sum("head_mean", weighted, &[-1], true)?
                    }
                };
                let d = dense.emit(f, "head_dense", pooled)?;
                let a = f.gelu("head_gelu", d, GeluMode::Exact)?;
                let n = norm.emit(f, "head_norm", a, *eps)?;
                out.emit(f, names::LOGITS, n)
            }
        }
    }
}

impl EncoderGraphWeights {
    /// `head_in_package`: the classification head (if any) becomes the `logits` output.
    pub fn prepare(
        config: &EncoderConfig,
        w: &EncoderWeights,
        precision: Precision,
        compressor: &dyn WeightCompressor,
        head_in_package: bool,
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
                attn_norm: l
                    .attn_norm
                    .as_ref()
                    .map(|n| NormWeights::new(n, precision))
                    .transpose()?,
                intermediate: proj("intermediate.dense", &l.intermediate)?,
                gate: l
                    .gate
                    .as_ref()
                    .map(|g| proj("intermediate.gate", g))
                    .transpose()?,
                output: proj("output.dense", &l.output)?,
                out_norm: NormWeights::new(&l.out_norm, precision)?,
            });
        }
        Ok(EncoderGraphWeights {
            embed_norm: NormWeights::new(&w.embed_norm, precision)?,
            layers,
            final_norm: w
                .final_norm
                .as_ref()
                .map(|n| NormWeights::new(n, precision))
                .transpose()?,
            head: w
                .head
                .as_ref()
                .filter(|_| head_in_package)
                .map(|h| HeadGraph::prepare(h, precision))
                .transpose()?,
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
    let sig = bucket_signature(config, precision, t, weights.head.is_some());
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
    let dtype = precision.dtype();
    let mut x = weights
        .embed_norm
        .emit(&mut f, names::EMBED_NORM, emb, eps)?;
    let rope = match config.rope() {
        Some(r) => Some(RopeGraph::new(&mut f, config, r, precision, mask, t)?),
        None => None,
    };
    let last = weights.layers.len().saturating_sub(1);
    for (i, layer) in weights.layers.iter().enumerate() {
        let out_name = if i == last && weights.final_norm.is_none() {
            names::HIDDEN_OUT.to_string()
        } else {
            names::layer_out(i)
        };
        let attention = match (&rope, config.rope()) {
            (Some(g), Some(r)) => match r.layer_spans.get(i) {
                Some(AttentionSpan::Local) => Attention {
                    mask: g.local_mask,
                    rope: Some(&g.local),
                },
                Some(AttentionSpan::Global) | None => Attention {
                    mask,
                    rope: Some(&g.global),
                },
            },
            _ => Attention { mask, rope: None },
        };
        let io = LayerIo {
            dtype,
            index: i,
            t,
            attention,
        };
        x = if rope.is_some() {
            pre_ln_layer(&mut f, config, layer, x, &io, &out_name)?
        } else {
            encoder_layer(&mut f, config, layer, x, &io, &out_name)?
        };
    }
    if let Some(norm) = &weights.final_norm {
        x = norm.emit(&mut f, names::HIDDEN_OUT, x, eps)?;
    }
    f.output(x)?;
    if let Some(head) = &weights.head {
        let logits = head.emit(&mut f, x, mask, config.hidden_size)?;
        f.output(logits)?;
    }
    Ok(f.finish()?)
}

/// A RoPE table pair as graph constants `[1, 1, D, T]`.
fn constant_rope_tables(
    f: &mut FunctionBuilder,
    name: &str,
    head_dim: usize,
    theta: f64,
    precision: Precision,
    t: usize,
) -> Result<RopeTables, AneError> {
    let rope = crate::reference::rope::Rope::plain(head_dim, theta);
    let half = head_dim / 2;
    let mut cos = vec![0f32; head_dim * t];
    let mut sin = vec![0f32; head_dim * t];
    for p in 0..t {
        let (c, s) = rope.cos_sin(p);
        for i in 0..half {
            for row in [i, i + half] {
                cos[row * t + p] = c[i];
                sin[row * t + p] = s[i];
            }
        }
    }
    let shape = vec![1, 1, head_dim, t];
    Ok(RopeTables {
        cos: f.constant(
            &format!("{name}_cos"),
            dense(shape.clone(), &cos, precision)?,
        )?,
        sin: f.constant(&format!("{name}_sin"), dense(shape, &sin, precision)?)?,
        half,
    })
}

/// ModernBERT's per-bucket constants: a RoPE table per base and the local layers' mask
/// (padding mask + window mask, `[1, 1, T, T]`).
struct RopeGraph {
    global: RopeTables,
    local: RopeTables,
    local_mask: Var,
}

impl RopeGraph {
    fn new(
        f: &mut FunctionBuilder,
        config: &EncoderConfig,
        r: &super::RopeLayout,
        precision: Precision,
        mask: Var,
        t: usize,
    ) -> Result<Self, AneError> {
        let d = config.head_dim;
        let global = constant_rope_tables(f, "rope_global", d, r.global_rope_theta, precision, t)?;
        let local = constant_rope_tables(f, "rope_local", d, r.local_rope_theta, precision, t)?;
        let window: Vec<f32> = (0..t * t)
            .map(|k| {
                if (k / t).abs_diff(k % t) > r.local_window {
                    crate::ane::options::MASK_NEG
                } else {
                    0.0
                }
            })
            .collect();
        let window = f.constant("local_window", dense(vec![1, 1, t, t], &window, precision)?)?;
        let local_mask = f.add("local_mask", window, mask)?;
        Ok(RopeGraph {
            global,
            local,
            local_mask,
        })
    }
}

/// What one layer's attention uses: its additive mask and its RoPE table.
#[derive(Clone, Copy)]
struct Attention<'a> {
    mask: Var,
    rope: Option<&'a RopeTables>,
}

struct LayerIo<'a> {
    dtype: DType,
    index: usize,
    t: usize,
    attention: Attention<'a>,
}

/// Per-head attention of `x` through the output projection.
fn attention(
    f: &mut FunctionBuilder,
    config: &EncoderConfig,
    w: &LayerGraph,
    x: Var,
    io: &LayerIo<'_>,
) -> Result<Var, AneError> {
    let p = format!("l{}", io.index);
    let (heads, d, t) = (config.num_attention_heads, config.head_dim, io.t);
    let (heads_i, d_i, t_i, h_i) = (heads as i64, d as i64, t as i64, config.hidden_size as i64);
    let q = w.query.emit(f, &format!("{p}_query"), x)?;
    let k = w.key.emit(f, &format!("{p}_key"), x)?;
    let v = w.value.emit(f, &format!("{p}_value"), x)?;
    let scale = f.scalar(
        &format!("{p}_attn_scale"),
        io.dtype,
        1.0 / (d as f32).sqrt(),
    )?;
    let q = f.mul(&format!("{p}_query_scaled"), q, scale)?;
    let mut q = f.reshape(&format!("{p}_q_heads"), q, &[heads_i, 1, d_i, t_i])?;
    let mut k = f.reshape(&format!("{p}_k_heads"), k, &[heads_i, 1, d_i, t_i])?;
    let v = f.reshape(&format!("{p}_v_heads"), v, &[heads_i, 1, d_i, t_i])?;
    if let Some(rope) = io.attention.rope {
        q = rope.apply(f, &format!("{p}_q_rope"), q)?;
        k = rope.apply(f, &format!("{p}_k_rope"), k)?;
    }
    let qs = f.split(&format!("{p}_q_split"), q, &vec![1; heads], 0)?;
    let ks = f.split(&format!("{p}_k_split"), k, &vec![1; heads], 0)?;
    let vs = f.split(&format!("{p}_v_split"), v, &vec![1; heads], 0)?;
    let mut outputs = Vec::with_capacity(heads);
    for head in 0..heads {
        let hp = format!("{p}_h{head}");
        // [1,1,D,T]ᵀ·[1,1,D,T] → [1,1,T(query),T(key)]
        let scores = f.matmul(&format!("{hp}_scores"), qs[head], ks[head], true, false)?;
        let masked = f.add(&format!("{hp}_masked"), scores, io.attention.mask)?;
        let row_max = f.reduce_max(&format!("{hp}_row_max"), masked, &[-1], true)?;
        let shifted = f.sub(&format!("{hp}_shifted"), masked, row_max)?;
        let probs = f.softmax(&format!("{hp}_probs"), shifted, -1)?;
        // [1,1,D,T(key)]·[1,1,T(query),T(key)]ᵀ → [1,1,D,T(query)]
        outputs.push(f.matmul(&format!("{hp}_attn"), vs[head], probs, false, true)?);
    }
    let attn = f.concat(&format!("{p}_attn_heads"), &outputs, 0)?;
    let attn = f.reshape(&format!("{p}_attn"), attn, &[1, h_i, 1, t_i])?;
    w.attn_out.emit(f, &format!("{p}_attn_out"), attn)
}

/// The MLP: `output(gelu(intermediate(x)))`, or GeGLU with the gate projection.
fn mlp(f: &mut FunctionBuilder, w: &LayerGraph, p: &str, x: Var) -> Result<Var, AneError> {
    let inter = w.intermediate.emit(f, &format!("{p}_intermediate"), x)?;
    let mut act = f.gelu(&format!("{p}_gelu"), inter, GeluMode::Exact)?;
    if let Some(gate) = &w.gate {
        let g = gate.emit(f, &format!("{p}_gate"), x)?;
        act = f.mul(&format!("{p}_geglu"), act, g)?;
    }
    w.output.emit(f, &format!("{p}_output"), act)
}

/// A pre-LN layer (ModernBERT): `x + attn(norm(x))`, then `x + mlp(norm(x))`.
fn pre_ln_layer(
    f: &mut FunctionBuilder,
    config: &EncoderConfig,
    w: &LayerGraph,
    x: Var,
    io: &LayerIo<'_>,
    out_name: &str,
) -> Result<Var, AneError> {
    let p = format!("l{}", io.index);
    let eps = config.layer_norm_eps as f32;
    let normed = match &w.attn_norm {
        Some(norm) => norm.emit(f, &format!("{p}_attn_norm"), x, eps)?,
        None => x,
    };
    let o = attention(f, config, w, normed, io)?;
    let x = f.add(&format!("{p}_attn_residual"), x, o)?;
    let normed = w.out_norm.emit(f, &format!("{p}_mlp_norm"), x, eps)?;
    let out = mlp(f, w, &p, normed)?;
    Ok(f.add(out_name, x, out)?)
}

/// A post-LN layer (BERT): `norm(x + attn(x))`, then `norm(x + mlp(x))`.
fn encoder_layer(
    f: &mut FunctionBuilder,
    config: &EncoderConfig,
    w: &LayerGraph,
    x: Var,
    io: &LayerIo<'_>,
    out_name: &str,
) -> Result<Var, AneError> {
    let p = format!("l{}", io.index);
    let eps = config.layer_norm_eps as f32;
    let o = attention(f, config, w, x, io)?;
    let mut x = f.add(&format!("{p}_attn_residual"), x, o)?;
    if let Some(norm) = &w.attn_norm {
        x = norm.emit(f, &format!("{p}_attn_norm"), x, eps)?;
    }
    let out = mlp(f, w, &p, x)?;
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
