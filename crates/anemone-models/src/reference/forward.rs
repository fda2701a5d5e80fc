//! One forward pass over new tokens: embeddings, then per layer
//! `x += o_proj(attention(rope(q), rope(k), v))` and `x += down(silu(gate) · up)` on RMS-normed
//! inputs, then the final norm and the LM head. Gemma (`config.gemma`) scales the embedding,
//! norms each block's output before adding it, uses a tanh-GELU gate and per-layer windows and
//! RoPE bases.

use super::arena::Span;
use super::attend::{attend, AttentionShape};
use super::cache::KvCache;
use super::kernels::{axpy, gelu_tanh, matmul_t, rms_norm_into, rms_norm_rows, silu};
use super::matvec::matvec;
use super::rope::{Rope, Ropes};
use super::scratch::AlignedBuf;
use super::weights::{LayerWeights, Weights};
use super::LogitsFor;
use anemone_backend::team::Team;
use anemone_checkpoint::DecoderConfig;
use rayon::prelude::*;

/// Logits and residual stream of a traced forward.
#[derive(Debug, Clone)]
pub struct Trace {
    /// `[new positions, vocab]`, row-major.
    pub logits: Vec<f32>,
    /// `num_hidden_layers + 1` entries, each `[new positions, hidden]`: entry 0 is the token
    /// embeddings, entry `i` the residual stream after layer `i - 1` (before the final norm).
    pub hidden_states: Vec<Vec<f32>>,
}

/// What a forward reads: the config, the weights and the team of the one-token matvecs.
#[derive(Clone, Copy)]
pub struct Model<'a> {
    pub config: &'a DecoderConfig,
    pub weights: &'a Weights,
    pub team: &'a Team,
}

impl Model<'_> {
    /// `y = x·wᵀ` for `x: [rows, n_in]` and the matrix `w: [n_out, n_in]`: one row goes through
    /// the team's [`matvec`], several through [`matmul_t`] (on the current rayon pool). Either
    /// way `y[0, o]` of a single row is `dot(w[o], x)`, so the two paths agree.
    fn project(&self, x: &[f32], w: Span, y: &mut [f32], rows: usize, n_in: usize, n_out: usize) {
        let w = self.weights.get(w);
        if rows == 1 {
            matvec(Some(self.team), w, x, y);
        } else {
            matmul_t(x, w, y, rows, n_in, n_out);
        }
    }
}

/// Runs the new `ids` (already validated against vocab and context) through the model.
pub fn run(
    model: Model<'_>,
    rope: &Ropes,
    cache: &mut KvCache,
    ids: &[u32],
    which: LogitsFor,
    mut trace: Option<&mut Vec<Vec<f32>>>,
) -> Vec<f32> {
    let Model {
        config, weights, ..
    } = model;
    let h = config.hidden_size;
    let s = ids.len();
    let eps = config.rms_norm_eps as f32;
    let first_position = cache.len();

    let embed_tokens = weights.get(weights.embed_tokens);
    let mut x = Vec::with_capacity(s * h);
    for &id in ids {
        let row = id as usize * h;
        x.extend_from_slice(&embed_tokens[row..row + h]);
    }
    let embedding_scale = config.embedding_scale();
    if embedding_scale != 1.0 {
        x.iter_mut().for_each(|v| *v *= embedding_scale);
    }
    if let Some(t) = trace.as_deref_mut() {
        t.push(x.clone());
    }

    let angles_of = |r: &Rope| -> Vec<(Vec<f32>, Vec<f32>)> {
        (0..s).map(|i| r.cos_sin(first_position + i)).collect()
    };
    // LongRoPE: this call's factors, by its last position (transformers' per-call seq_len)
    let angles = angles_of(rope.global(config.rope_factors(first_position + s)));
    let local_angles = rope.local().map(angles_of);
    let mut scratch = Scratch::new(config, s);
    for (index, layer) in weights.layers.iter().enumerate() {
        let layer_angles = match (config.sliding_window(index), &local_angles) {
            (Some(_), Some(local)) => local,
            _ => &angles,
        };
        attention_block(
            model,
            layer,
            index,
            cache,
            layer_angles,
            &mut x,
            eps,
            &mut scratch,
        );
        mlp_block(model, layer, &mut x, eps, &mut scratch);
        if let Some(t) = trace.as_deref_mut() {
            t.push(x.clone());
        }
    }
    cache.commit(s);

    let vocab = config.vocab_size;
    let eps = config.residual_norm_eps() as f32;
    match which {
        LogitsFor::LastPosition => {
            let mut last = vec![0f32; h];
            rms_norm_into(&x[(s - 1) * h..], &weights.final_norm, eps, &mut last);
            let mut logits = vec![0f32; vocab];
            model.project(&last, weights.lm_head(), &mut logits, 1, h, vocab);
            logits
        }
        LogitsFor::AllPositions => {
            rms_norm_rows(&mut x, &weights.final_norm, eps);
            let mut logits = vec![0f32; s * vocab];
            model.project(&x, weights.lm_head(), &mut logits, s, h, vocab);
            logits
        }
    }
}

/// The activations of one forward call, reused by every layer (each use overwrites all of
/// its buffer). The inputs of the matrix products are 64-byte aligned (see [`AlignedBuf`]).
struct Scratch {
    /// `[s, hidden]`: a block's normed input.
    normed: AlignedBuf,
    /// `[s, q_dim + 2·kv_dim]`.
    qkv: Vec<f32>,
    /// `[s, q_dim]`.
    attended: AlignedBuf,
    /// `[s, hidden]`: a block's output before it joins the residual stream.
    projected: Vec<f32>,
    /// `[s, 2·intermediate]`.
    gate_up: Vec<f32>,
    /// `[s, intermediate]`.
    act: AlignedBuf,
}

impl Scratch {
    fn new(config: &DecoderConfig, s: usize) -> Self {
        let (h, q_dim, kv_dim) = (config.hidden_size, config.q_dim(), config.kv_dim());
        let inter = config.intermediate_size;
        Self {
            normed: AlignedBuf::zeroed(s * h),
            qkv: vec![0.0; s * (q_dim + 2 * kv_dim)],
            attended: AlignedBuf::zeroed(s * q_dim),
            projected: vec![0.0; s * h],
            gate_up: vec![0.0; s * 2 * inter],
            act: AlignedBuf::zeroed(s * inter),
        }
    }
}

#[allow(clippy::too_many_arguments)]
fn attention_block(
    model: Model<'_>,
    layer: &LayerWeights,
    layer_index: usize,
    cache: &mut KvCache,
    angles: &[(Vec<f32>, Vec<f32>)],
    x: &mut [f32],
    eps: f32,
    scratch: &mut Scratch,
) {
    let config = model.config;
    let (h, d) = (config.hidden_size, config.head_dim);
    let (q_dim, kv_dim) = (config.q_dim(), config.kv_dim());
    let qkv_dim = q_dim + 2 * kv_dim;
    let s = angles.len();
    let Scratch {
        normed,
        qkv,
        attended,
        projected,
        ..
    } = scratch;

    rms_norm_into(
        x,
        &layer.input_norm,
        config.residual_norm_eps() as f32,
        normed,
    );
    model.project(normed, layer.qkv, qkv, s, h, qkv_dim);

    let mut q = Vec::with_capacity(s * q_dim);
    let mut k = Vec::with_capacity(s * kv_dim);
    let mut v = Vec::with_capacity(s * kv_dim);
    for (row, (cos, sin)) in qkv.chunks_exact_mut(qkv_dim).zip(angles) {
        if let Some(bias) = &layer.qkv_bias {
            axpy(1.0, bias, row);
        }
        let (q_row, rest) = row.split_at_mut(q_dim);
        let (k_row, v_row) = rest.split_at_mut(kv_dim);
        if let Some((q_norm, k_norm)) = &layer.qk_norm {
            rms_norm_rows(q_row, q_norm, eps);
            rms_norm_rows(k_row, k_norm, eps);
        }
        Rope::apply(q_row, d, cos, sin);
        Rope::apply(k_row, d, cos, sin);
        q.extend_from_slice(q_row);
        k.extend_from_slice(k_row);
        v.extend_from_slice(v_row);
    }
    cache.append(layer_index, &k, &v);

    let shape = AttentionShape {
        heads: config.num_attention_heads,
        group: config.gqa_group(),
        head_dim: d,
        first_position: cache.len(),
        scale: config.attention_scale(),
        window: config.sliding_window(layer_index),
    };
    let (keys, values) = cache.layer(layer_index);
    attend(shape, &q, keys, values, attended, Some(model.team));

    model.project(attended, layer.o_proj, projected, s, q_dim, h);
    if let Some(bias) = &layer.o_bias {
        for row in projected.chunks_exact_mut(h) {
            axpy(1.0, bias, row);
        }
    }
    if let Some((post_attention, _)) = &layer.output_norms {
        rms_norm_rows(projected, post_attention, eps);
    }
    axpy(1.0, projected, x);
}

fn mlp_block(
    model: Model<'_>,
    layer: &LayerWeights,
    x: &mut [f32],
    eps: f32,
    scratch: &mut Scratch,
) {
    let config = model.config;
    let (h, inter) = (config.hidden_size, config.intermediate_size);
    let s = x.len() / h;
    let Scratch {
        normed,
        gate_up,
        act,
        projected: down,
        ..
    } = scratch;
    rms_norm_into(
        x,
        &layer.post_attention_norm,
        config.residual_norm_eps() as f32,
        normed,
    );
    let act_fn: fn(f32) -> f32 = if config.gemma.is_some() {
        gelu_tanh
    } else {
        silu
    };
    model.project(normed, layer.gate_up, gate_up, s, h, 2 * inter);
    // element by element, so the rows may go to the pool in any order (a batch's rows do)
    let activate = |(out, gu): (&mut [f32], &[f32])| {
        let (gate, up) = gu.split_at(inter);
        for ((o, g), u) in out.iter_mut().zip(gate).zip(up) {
            *o = act_fn(*g) * u;
        }
    };
    if s > 1 {
        act.par_chunks_exact_mut(inter)
            .zip(gate_up.par_chunks_exact(2 * inter))
            .for_each(activate);
    } else {
        act.chunks_exact_mut(inter)
            .zip(gate_up.chunks_exact(2 * inter))
            .for_each(activate);
    }
    model.project(act, layer.down, down, s, inter, h);
    if let Some((_, post_feedforward)) = &layer.output_norms {
        rms_norm_rows(down, post_feedforward, eps);
    }
    axpy(1.0, down, x);
}
