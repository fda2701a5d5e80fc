//! The decoder chunk: consecutive layers of the Llama/Qwen2/Qwen3 family as one stateful ML
//! Program with a `decode` (T = 1) and a `prefill` (T = prefill_len) function sharing weights.
//!
//! Layout `[1, C, 1, T]` throughout; projections are 1×1 convs; attention is per query head
//! against the shared K/V head of its group, read straight out of the KV state.
//!
//! Per function (T tokens, D = head_dim, Dp = D rounded up to 32, N = layers in the chunk):
//! - inputs: `hidden_states [1, hidden, 1, T]`, `cos`, `sin` `[1, 1, D, T]` (rotate-half
//!   tables, `cos[d] = cos(p·inv_freq[d mod D/2])`), `mask [1, 1, T, context]` (0 where a query
//!   may attend, −1e4 elsewhere), `position [1]` int32 (first slot written; position + T ≤ context);
//! - states: unified `kv_cache [2·N·Hkv, 1, Dp, context]` (rows of layer j: K at
//!   `2j·Hkv + g`, V at `(2j+1)·Hkv + g`), or split `k_cache`, `v_cache [N·Hkv, 1, Dp, context]`
//!   (rows `j·Hkv + g`); fp16; rows `D..Dp` are padding, never written or read;
//! - Gemma (sliding-window layers with their own RoPE base): also `cos_local`, `sin_local` and
//!   `mask_local` (the mask also hides what left the window), which its sliding layers read
//!   instead of `cos`, `sin`, `mask`;
//! - sliding-window layers keep a ring of `slots` < context positions when the window allows
//!   ([`KvLayout`], `super::kv`): Gemma's in their own states `kv_cache_local` (or
//!   `k_cache_local`, `v_cache_local`) `[.., slots]` written at `position_local` (= position mod
//!   slots) with `mask_local [1, 1, T, slots]`; a model whose every layer slides (Phi-3) holds
//!   all its layers so, through `mask`, `position` and the ordinary states;
//! - output: `hidden_states_out [1, hidden, 1, T]`.
//!
//! The states are read once at the start and written once at the end of each function.
//!
//! Key centering (models with a K bias: Qwen2, Llama/Qwen3 with `attention_bias`): the cache holds `k − c` instead of `k`,
//! where `c` is the K bias rotated by RoPE and averaged over the cache positions. Softmax is
//! invariant to a per-query shift and `q·(k − c) = q·k − q·c`, so the attention is unchanged in
//! exact arithmetic; what changes is the size of the fp16 scores. Qwen2.5 puts 93–99% of its
//! K-bias energy in the lowest-frequency RoPE pairs, which barely rotate, with |b| up to ≈ 150
//! per element: its raw layer-0 scores reach ≈ 1500, where fp16 spacing (0.5–1) perturbs the
//! softmax by tens of percent. Centered, the same scores stay under ≈ 30.

use anemone_checkpoint::DecoderConfig;
use anemone_mil::{DType, FunctionBuilder, GeluMode, Program, SpecVersion, TensorType, Var};

use std::collections::HashMap;
use std::ops::Range;

use super::io::rope_tables;
use super::kv::{KvLayout, LayerGroup};
use super::norm::rms_norm;
use super::options::{ChunkOptions, StateLayout};
use super::rope::RopeTables;
use super::signature::{FunctionSignature, TensorSignature};
use super::weights::{dense, LayerWeights};
use super::AneError;

/// Names of the chunk functions' values (the runtime binds by these).
pub mod names {
    pub const HIDDEN_IN: &str = "hidden_states";
    pub const COS: &str = "cos";
    pub const SIN: &str = "sin";
    pub const MASK: &str = "mask";
    pub const COS_LOCAL: &str = "cos_local";
    pub const SIN_LOCAL: &str = "sin_local";
    pub const MASK_LOCAL: &str = "mask_local";
    pub const POSITION: &str = "position";
    pub const POSITION_LOCAL: &str = "position_local";
    pub const HIDDEN_OUT: &str = "hidden_states_out";
    pub const KV_CACHE: &str = "kv_cache";
    pub const K_CACHE: &str = "k_cache";
    pub const V_CACHE: &str = "v_cache";
    pub const KV_CACHE_LOCAL: &str = "kv_cache_local";
    pub const K_CACHE_LOCAL: &str = "k_cache_local";
    pub const V_CACHE_LOCAL: &str = "v_cache_local";
    pub const DECODE: &str = "decode";
    pub const PREFILL: &str = "prefill";
}

/// The state tensors of a chunk holding `layers` (global indices): `(name, shape)` in
/// declaration order. The main states hold the chunk's layers without a ring; with a ring
/// (see [`KvLayout`]), Gemma's sliding layers get their own `*_local` states of the ring's size.
pub fn state_shapes(
    config: &DecoderConfig,
    options: &ChunkOptions,
    layers: Range<usize>,
) -> Vec<(&'static str, Vec<usize>)> {
    let layout = KvLayout::for_conversion(config, options);
    let dp = ChunkOptions::padded_head_dim(config.head_dim);
    let hkv = config.num_key_value_heads;
    let mut out = Vec::new();
    for group in [LayerGroup::Main, LayerGroup::Local] {
        let n = layers
            .clone()
            .filter(|&l| layout.state_group(config, l) == group)
            .count();
        if n == 0 {
            continue;
        }
        let slots = layout.slots(group);
        let local = group == LayerGroup::Local;
        match options.state_layout {
            StateLayout::Unified => out.push((
                if local {
                    names::KV_CACHE_LOCAL
                } else {
                    names::KV_CACHE
                },
                vec![2 * n * hkv, 1, dp, slots],
            )),
            StateLayout::Split => {
                let (k, v) = if local {
                    (names::K_CACHE_LOCAL, names::V_CACHE_LOCAL)
                } else {
                    (names::K_CACHE, names::V_CACHE)
                };
                out.push((k, vec![n * hkv, 1, dp, slots]));
                out.push((v, vec![n * hkv, 1, dp, slots]));
            }
        }
    }
    out
}

/// The signature of one chunk function over `layers` (global indices) with `t` tokens.
pub fn chunk_signature(
    config: &DecoderConfig,
    options: &ChunkOptions,
    layers: Range<usize>,
    name: &str,
    t: usize,
) -> FunctionSignature {
    let layout = KvLayout::for_conversion(config, options);
    let dt = options.precision.dtype();
    let (h, d) = (config.hidden_size, config.head_dim);
    let main_slots = layout.slots(LayerGroup::Main);
    let mut inputs = vec![
        TensorSignature::new(
            names::HIDDEN_IN,
            dt,
            vec![1, h, 1, t],
            "residual stream entering the chunk",
        ),
        TensorSignature::new(
            names::COS,
            dt,
            vec![1, 1, d, t],
            "rotate-half cos table: cos(position · inv_freq[i mod head_dim/2])",
        ),
        TensorSignature::new(
            names::SIN,
            dt,
            vec![1, 1, d, t],
            "rotate-half sin table: sin(position · inv_freq[i mod head_dim/2])",
        ),
        TensorSignature::new(
            names::MASK,
            dt,
            vec![1, 1, t, main_slots],
            if layout.is_ring(LayerGroup::Main) {
                "additive attention mask over the ring's KV slots: 0 on the window's, -1e4 elsewhere"
            } else {
                "additive attention mask over the KV slots: 0 visible, -1e4 hidden"
            },
        ),
        TensorSignature::new(
            names::POSITION,
            DType::I32,
            vec![1],
            if layout.is_ring(LayerGroup::Main) {
                "KV slot of the first token: position mod slots; slot + T <= slots"
            } else {
                "KV slot of the first token; position + T <= context"
            },
        ),
    ];
    if config.gemma.is_some() {
        let local = LayerGroup::Local;
        inputs.extend([
            TensorSignature::new(
                names::COS_LOCAL,
                dt,
                vec![1, 1, d, t],
                "cos table of the sliding layers' RoPE base",
            ),
            TensorSignature::new(
                names::SIN_LOCAL,
                dt,
                vec![1, 1, d, t],
                "sin table of the sliding layers' RoPE base",
            ),
            TensorSignature::new(
                names::MASK_LOCAL,
                dt,
                vec![1, 1, t, layout.slots(local)],
                if layout.is_ring(local) {
                    "additive mask of the sliding layers over their ring's slots: 0 on the window's"
                } else {
                    "additive mask of the sliding layers: also -1e4 on slots outside the window"
                },
            ),
        ]);
        if layout.own_states(local) {
            inputs.push(TensorSignature::new(
                names::POSITION_LOCAL,
                DType::I32,
                vec![1],
                "ring slot of the first token in the sliding layers' states: position mod slots",
            ));
        }
    }
    FunctionSignature {
        name: name.to_string(),
        inputs,
        outputs: vec![TensorSignature::new(
            names::HIDDEN_OUT,
            dt,
            vec![1, h, 1, t],
            "residual stream after the chunk's last layer",
        )],
        states: state_shapes(config, options, layers)
            .into_iter()
            .map(|(n, shape)| {
                TensorSignature::new(n, DType::F16, shape, "KV cache (see manifest state_layout)")
            })
            .collect(),
    }
}

/// Values of the KV state(s) while a function is being built.
struct KvValues {
    layout: StateLayout,
    /// Current (updated) value of each state, in [`state_shapes`] order.
    current: Vec<Var>,
    /// Index in `current` of the first state of each group (main, local).
    first_state: [usize; 2],
    kv_heads: usize,
}

impl KvValues {
    fn base(&self, group: LayerGroup) -> usize {
        self.first_state[group as usize]
    }
    /// `(state index, first row)` of the K block of the `row`-th layer of its state group.
    fn k_slot(&self, group: LayerGroup, row: usize) -> (usize, usize) {
        let base = self.base(group);
        match self.layout {
            StateLayout::Unified => (base, 2 * row * self.kv_heads),
            StateLayout::Split => (base, row * self.kv_heads),
        }
    }
    fn v_slot(&self, group: LayerGroup, row: usize) -> (usize, usize) {
        let base = self.base(group);
        match self.layout {
            StateLayout::Unified => (base, (2 * row + 1) * self.kv_heads),
            StateLayout::Split => (base + 1, row * self.kv_heads),
        }
    }
}

/// Builds the `decode` and `prefill` functions over `layers` and returns the program.
pub fn build_chunk_program(
    config: &DecoderConfig,
    options: &ChunkOptions,
    layers: &[LayerWeights],
) -> Result<Program, AneError> {
    if layers.is_empty() {
        return Err(AneError::Option {
            option: "layers-per-chunk",
            problem: "a chunk needs at least one layer".into(),
        });
    }
    let mut program = Program::new(SpecVersion::V9);
    program.add_function(build_chunk_function(
        config,
        options,
        layers,
        names::DECODE,
        1,
    )?)?;
    program.add_function(build_chunk_function(
        config,
        options,
        layers,
        names::PREFILL,
        options.prefill_len,
    )?)?;
    let first = layers[0].index;
    let last = layers[layers.len() - 1].index;
    let layout = KvLayout::for_conversion(config, options);
    let meta = [
        ("anemone.kind", "decoder_chunk".to_string()),
        (
            "anemone.architecture",
            config.architecture.name().to_string(),
        ),
        ("anemone.layers", format!("{first}..={last}")),
        ("anemone.layer_count", layers.len().to_string()),
        ("anemone.context", options.context.to_string()),
        ("anemone.prefill_len", options.prefill_len.to_string()),
        ("anemone.precision", options.precision.name().to_string()),
        ("anemone.norm", options.norm.name().to_string()),
        (
            "anemone.state_layout",
            options.state_layout.name().to_string(),
        ),
    ];
    for (k, v) in meta {
        program.metadata.insert(k.to_string(), v);
    }
    if let Some(slots) = layout.ring_slots {
        program
            .metadata
            .insert("anemone.local_kv_slots".into(), slots.to_string());
    }
    Ok(program)
}

/// One chunk function with `t` tokens.
pub fn build_chunk_function(
    config: &DecoderConfig,
    options: &ChunkOptions,
    layers: &[LayerWeights],
    name: &str,
    t: usize,
) -> Result<anemone_mil::Function, AneError> {
    let range = layers[0].index..layers[0].index + layers.len();
    let layout = KvLayout::for_conversion(config, options);
    let sig = chunk_signature(config, options, range.clone(), name, t);
    let mut f = FunctionBuilder::new(name);
    let mut inputs = HashMap::new();
    for input in &sig.inputs {
        inputs.insert(
            input.name.as_str(),
            f.input(&input.name, input.tensor_type())?,
        );
    }
    let mut states = Vec::new();
    for s in &sig.states {
        states.push(f.state(&s.name, s.tensor_type())?);
    }
    let mut current = Vec::new();
    for (i, s) in states.iter().enumerate() {
        current.push(f.read_state(&format!("{}_read", sig.states[i].name), *s)?);
    }
    let local_states = sig
        .states
        .iter()
        .position(|s| s.name.ends_with("_local"))
        .unwrap_or(sig.states.len());
    let mut kv = KvValues {
        layout: options.state_layout,
        current,
        first_state: [0, local_states],
        kv_heads: config.num_key_value_heads,
    };
    let input = |name: &str| {
        inputs
            .get(name)
            .copied()
            .ok_or_else(|| AneError::Unsupported {
                problem: format!("chunk function `{name}` lacks its input `{name}`"),
            })
    };
    let half = config.head_dim / 2;
    let rope = RopeTables {
        cos: input(names::COS)?,
        sin: input(names::SIN)?,
        half,
    };
    let io = LayerIo {
        rope: &rope,
        mask: input(names::MASK)?,
        position: input(names::POSITION)?,
        slots: layout.slots(LayerGroup::Main),
        t,
    };
    // Gemma's sliding layers: the local RoPE tables, their mask and (with a ring) write slot
    let local_rope = match config.gemma {
        Some(_) => Some(RopeTables {
            cos: input(names::COS_LOCAL)?,
            sin: input(names::SIN_LOCAL)?,
            half,
        }),
        None => None,
    };
    let local_io = match &local_rope {
        Some(rope) => Some(LayerIo {
            rope,
            mask: input(names::MASK_LOCAL)?,
            position: if layout.own_states(LayerGroup::Local) {
                input(names::POSITION_LOCAL)?
            } else {
                io.position
            },
            slots: layout.slots(LayerGroup::Local),
            t,
        }),
        None => None,
    };
    let mut hidden = input(names::HIDDEN_IN)?;
    let mut rows = [0usize; 2];
    for (local, layer) in layers.iter().enumerate() {
        // the last layer's residual add is the function output and carries its name
        let out_name = (local + 1 == layers.len()).then_some(names::HIDDEN_OUT);
        let layer_io = match (layout.group(config, layer.index), &local_io) {
            (LayerGroup::Local, Some(local_io)) => local_io,
            _ => &io,
        };
        let group = layout.state_group(config, layer.index);
        let row = rows[group as usize];
        rows[group as usize] += 1;
        hidden = decoder_layer(
            &mut f,
            config,
            options,
            layer,
            (group, row),
            hidden,
            layer_io,
            &mut kv,
            out_name,
        )?;
    }
    for (i, s) in states.iter().enumerate() {
        f.write_state(&format!("{}_write", sig.states[i].name), *s, kv.current[i])?;
    }
    f.output(hidden)?;
    Ok(f.finish()?)
}

/// Per-function values every layer uses.
#[derive(Clone, Copy)]
struct LayerIo<'a> {
    rope: &'a RopeTables,
    mask: Var,
    position: Var,
    /// Slots of the layer's state (the mask's last dim).
    slots: usize,
    t: usize,
}

#[allow(clippy::too_many_arguments)]
fn decoder_layer(
    f: &mut FunctionBuilder,
    config: &DecoderConfig,
    options: &ChunkOptions,
    w: &LayerWeights,
    (state_group, state_row): (LayerGroup, usize),
    x: Var,
    io: &LayerIo,
    kv: &mut KvValues,
    out_name: Option<&str>,
) -> Result<Var, AneError> {
    let LayerIo {
        rope,
        mask,
        position,
        slots,
        t,
    } = *io;
    let p = format!("l{}", w.index);
    let eps = config.rms_norm_eps as f32;
    // the norms reading the residual stream (scaled with it, see GemmaConfig::residual_scale)
    let residual_eps = config.residual_norm_eps() as f32;
    let dtype = options.precision.dtype();
    let (hq, hkv, d) = (
        config.num_attention_heads,
        config.num_key_value_heads,
        config.head_dim,
    );
    let group = config.gqa_group();

    // attention
    let h = rms_norm(
        f,
        &format!("{p}_input_norm"),
        x,
        1,
        &w.input_norm,
        residual_eps,
        options.norm,
    )?;
    let (qb, kb, vb) = match &w.qkv_bias {
        Some((q, k, v)) => (
            Some(f.constant(&format!("{p}_q_proj_bias"), q.clone())?),
            Some(f.constant(&format!("{p}_k_proj_bias"), k.clone())?),
            Some(f.constant(&format!("{p}_v_proj_bias"), v.clone())?),
        ),
        None => (None, None, None),
    };
    let wq = w.q_proj.emit(f, &format!("{p}_q_proj_weight"))?;
    let wk = w.k_proj.emit(f, &format!("{p}_k_proj_weight"))?;
    let wv = w.v_proj.emit(f, &format!("{p}_v_proj_weight"))?;
    let q = f.conv1x1(&format!("{p}_q_proj"), h, wq, qb)?;
    let k = f.conv1x1(&format!("{p}_k_proj"), h, wk, kb)?;
    let v = f.conv1x1(&format!("{p}_v_proj"), h, wv, vb)?;
    let (hq_i, hkv_i, d_i, t_i) = (hq as i64, hkv as i64, d as i64, t as i64);
    let mut q = f.reshape(&format!("{p}_q_heads"), q, &[hq_i, 1, d_i, t_i])?;
    let mut k = f.reshape(&format!("{p}_k_heads"), k, &[hkv_i, 1, d_i, t_i])?;
    let v = f.reshape(&format!("{p}_v_heads"), v, &[hkv_i, 1, d_i, t_i])?;
    if let Some((qn, kn)) = &w.qk_norm {
        q = rms_norm(f, &format!("{p}_q_norm"), q, 2, qn, eps, options.norm)?;
        k = rms_norm(f, &format!("{p}_k_norm"), k, 2, kn, eps, options.norm)?;
    }
    let q = rope.apply(f, &format!("{p}_q_rope"), q)?;
    let mut k = rope.apply(f, &format!("{p}_k_rope"), k)?;
    if let Some((_, k_bias, _)) = &w.qkv_bias {
        let center = key_center(config, options.context, &k_bias.to_f32_vec());
        let center = f.constant(
            &format!("{p}_k_center"),
            dense(vec![hkv, 1, d, 1], &center, options.precision)?,
        )?;
        k = f.sub(&format!("{p}_k_centered"), k, center)?;
    }
    let scale = f.scalar(&format!("{p}_attn_scale"), dtype, config.attention_scale())?;
    let q = f.mul(&format!("{p}_q_scaled"), q, scale)?;

    // write K and V of the new tokens into the state value at `position`
    let (k16, v16) = if dtype == DType::F16 {
        (k, v)
    } else {
        (
            f.cast(&format!("{p}_k_fp16"), k, DType::F16)?,
            f.cast(&format!("{p}_v_fp16"), v, DType::F16)?,
        )
    };
    let extent = f.const_i32(
        &format!("{p}_kv_extent"),
        &[4],
        &[hkv as i32, 1, d as i32, t as i32],
    )?;
    for (kind, value, (state, row)) in [
        ("k", k16, kv.k_slot(state_group, state_row)),
        ("v", v16, kv.v_slot(state_group, state_row)),
    ] {
        let head = f.const_i32(&format!("{p}_{kind}_begin_head"), &[3], &[row as i32, 0, 0])?;
        let begin = f.concat(&format!("{p}_{kind}_begin"), &[head, position], 0)?;
        let end = f.add(&format!("{p}_{kind}_end"), begin, extent)?;
        kv.current[state] = f.slice_update(
            &format!("{p}_{kind}_cache_update"),
            kv.current[state],
            value,
            begin,
            end,
        )?;
    }

    // per KV head: its K and V over every slot; per query head: scores, softmax, values
    let ctx = slots as i64;
    let q_heads = f.split(&format!("{p}_q_split"), q, &vec![1; hq], 0)?;
    let mut outputs = Vec::with_capacity(hq);
    for g in 0..hkv {
        let mut read = |kind: &str, (state, row): (usize, usize)| -> Result<Var, AneError> {
            let r = (row + g) as i64;
            let s = f.slice_by_index(
                &format!("{p}_{kind}{g}"),
                kv.current[state],
                &[r, 0, 0, 0],
                &[r + 1, 1, d as i64, ctx],
                None,
            )?;
            if dtype == DType::F16 {
                Ok(s)
            } else {
                Ok(f.cast(&format!("{p}_{kind}{g}_{}", dtype.mil_name()), s, dtype)?)
            }
        };
        let kg = read("k", kv.k_slot(state_group, state_row))?;
        let vg = read("v", kv.v_slot(state_group, state_row))?;
        // query heads g·group .. (g+1)·group share KV head g
        for (head, &q_head) in q_heads.iter().enumerate().skip(g * group).take(group) {
            let hp = format!("{p}_h{head}");
            let scores = f.matmul(&format!("{hp}_scores"), q_head, kg, true, false)?;
            let masked = f.add(&format!("{hp}_masked"), scores, mask)?;
            let row_max = f.reduce_max(&format!("{hp}_row_max"), masked, &[-1], true)?;
            let shifted = f.sub(&format!("{hp}_shifted"), masked, row_max)?;
            let probs = f.softmax(&format!("{hp}_probs"), shifted, -1)?;
            outputs.push(f.matmul(&format!("{hp}_attn"), vg, probs, false, true)?);
        }
    }
    let attn = f.concat(&format!("{p}_attn_heads"), &outputs, 0)?;
    let attn = f.reshape(&format!("{p}_attn"), attn, &[1, hq_i * d_i, 1, t_i])?;
    let wo = w.o_proj.emit(f, &format!("{p}_o_proj_weight"))?;
    let ob = match &w.o_bias {
        Some(b) => Some(f.constant(&format!("{p}_o_proj_bias"), b.clone())?),
        None => None,
    };
    let mut o = f.conv1x1(&format!("{p}_o_proj"), attn, wo, ob)?;
    if let Some((post_attention, _)) = &w.output_norms {
        o = rms_norm(
            f,
            &format!("{p}_attn_out_norm"),
            o,
            1,
            post_attention,
            eps,
            options.norm,
        )?;
    }
    let x = f.add(&format!("{p}_attn_residual"), x, o)?;

    // SwiGLU MLP (Gemma: GeGLU with tanh GELU)
    let h = rms_norm(
        f,
        &format!("{p}_post_attention_norm"),
        x,
        1,
        &w.post_attention_norm,
        residual_eps,
        options.norm,
    )?;
    let wg = w.gate_proj.emit(f, &format!("{p}_gate_proj_weight"))?;
    let wu = w.up_proj.emit(f, &format!("{p}_up_proj_weight"))?;
    let wd = w.down_proj.emit(f, &format!("{p}_down_proj_weight"))?;
    let gate = f.conv1x1(&format!("{p}_gate_proj"), h, wg, None)?;
    let up = f.conv1x1(&format!("{p}_up_proj"), h, wu, None)?;
    let act = if config.gemma.is_some() {
        f.gelu(&format!("{p}_gate_act"), gate, GeluMode::TanhApproximation)?
    } else {
        f.silu(&format!("{p}_gate_act"), gate)?
    };
    let prod = f.mul(&format!("{p}_swiglu"), act, up)?;
    let mut down = f.conv1x1(&format!("{p}_down_proj"), prod, wd, None)?;
    if let Some((_, post_feedforward)) = &w.output_norms {
        down = rms_norm(
            f,
            &format!("{p}_mlp_out_norm"),
            down,
            1,
            post_feedforward,
            eps,
            options.norm,
        )?;
    }
    let residual_name = format!("{p}_mlp_residual");
    Ok(f.add(out_name.unwrap_or(&residual_name), x, down)?)
}

/// `[kv_heads · head_dim]`: per KV head, the K bias after RoPE averaged over the positions
/// `0..context` (the constant subtracted from every cached key, see the module docs). Any
/// constant keeps the attention exact; this one minimizes the mean squared size of what the
/// bias contributes to the centered keys.
pub fn key_center(config: &DecoderConfig, context: usize, k_bias: &[f32]) -> Vec<f32> {
    let d = config.head_dim;
    let half = d / 2;
    let positions: Vec<usize> = (0..context).collect();
    // any constant centers exactly; the factors of a piece spanning the whole context
    let (cos, sin) = rope_tables(config, &positions, config.rope_factors(context));
    // row r of the tables is dimension r; its mean over the positions
    let mean = |table: &[f32], r: usize| {
        table[r * context..(r + 1) * context]
            .iter()
            .map(|&v| v as f64)
            .sum::<f64>()
            / context as f64
    };
    let (mean_cos, mean_sin): (Vec<f64>, Vec<f64>) =
        (0..d).map(|r| (mean(&cos, r), mean(&sin, r))).unzip();
    k_bias
        .chunks_exact(d)
        .flat_map(|b| {
            (0..d)
                .map(|r| {
                    // rotate_half(b)[r] = −b[r + D/2] for r < D/2, else b[r − D/2]
                    let rotated = if r < half { -b[r + half] } else { b[r - half] };
                    (b[r] as f64 * mean_cos[r] + rotated as f64 * mean_sin[r]) as f32
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// The tensor type of a signature entry.
impl TensorSignature {
    pub fn tensor_type(&self) -> TensorType {
        TensorType::new(self.dtype, self.shape.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use anemone_checkpoint::Architecture;

    fn qwen2_like(head_dim: usize, rope_theta: f64) -> DecoderConfig {
        DecoderConfig {
            architecture: Architecture::new("qwen2"),
            hidden_size: 2 * head_dim,
            intermediate_size: 4 * head_dim,
            num_hidden_layers: 1,
            num_attention_heads: 2,
            num_key_value_heads: 2,
            head_dim,
            vocab_size: 16,
            rope_theta,
            rms_norm_eps: 1e-6,
            tie_word_embeddings: false,
            attention_bias: true,
            o_proj_bias: false,
            qk_norm: false,
            max_position_embeddings: 4096,
            partial_rotary_dim: None,
            long_rope: None,
            bos_token_id: None,
            eos_token_ids: vec![],
            gemma: None,
            attention_window: None,
        }
    }

    /// `b` rotated to position `p` pair by pair (dims `i` and `i + D/2` by `p·θ_i`), in f64.
    fn rotate(b: &[f32], p: usize, theta: f64) -> Vec<f64> {
        let d = b.len();
        let mut out = vec![0f64; d];
        for i in 0..d / 2 {
            let angle = p as f64 * theta.powf(-2.0 * i as f64 / d as f64);
            let (x, y) = (b[i] as f64, b[i + d / 2] as f64);
            out[i] = x * angle.cos() - y * angle.sin();
            out[i + d / 2] = y * angle.cos() + x * angle.sin();
        }
        out
    }

    #[test]
    fn key_center_is_the_rotated_bias_averaged_over_the_context() {
        let (d, context, theta) = (16, 64, 1e4);
        let config = qwen2_like(d, theta);
        let bias: Vec<f32> = (0..2 * d)
            .map(|i| ((i * 7 % 11) as f32 - 5.0) * 3.0)
            .collect();
        let center = key_center(&config, context, &bias);
        for (head, (b, c)) in bias.chunks(d).zip(center.chunks(d)).enumerate() {
            let mut mean = vec![0f64; d];
            for p in 0..context {
                for (m, r) in mean.iter_mut().zip(rotate(b, p, theta)) {
                    *m += r / context as f64;
                }
            }
            for (r, (&got, want)) in c.iter().zip(&mean).enumerate() {
                assert!(
                    (got as f64 - want).abs() < 1e-4 * (1.0 + want.abs()),
                    "head {head} dim {r}: {got} vs {want}"
                );
            }
        }
    }

    #[test]
    fn a_low_frequency_bias_is_almost_removed_by_centering() {
        // Qwen2.5-like: the K bias sits in the lowest-frequency RoPE pair, θ = 1e6
        let (d, context) = (64, 512);
        let config = qwen2_like(d, 1e6);
        let mut bias = vec![0f32; 2 * d];
        for head in 0..2 {
            bias[head * d + d / 2 - 1] = 150.0;
            bias[head * d + d - 1] = -90.0;
        }
        let center = key_center(&config, context, &bias);
        let norm = |v: &[f64]| v.iter().map(|x| x * x).sum::<f64>().sqrt();
        for (b, c) in bias.chunks(d).zip(center.chunks(d)) {
            let worst = (0..context)
                .map(|p| {
                    let r = rotate(b, p, 1e6);
                    let left: Vec<f64> = r.iter().zip(c).map(|(r, &c)| r - c as f64).collect();
                    norm(&left)
                })
                .fold(0f64, f64::max);
            let size = norm(&b.iter().map(|&x| x as f64).collect::<Vec<_>>());
            assert!(
                worst < 0.01 * size,
                "what centering leaves, {worst:.3}, is not ≪ |b| = {size:.1}"
            );
        }
    }
}
