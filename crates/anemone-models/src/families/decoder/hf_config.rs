//! `config.json` → [`DecoderConfig`] for the decoder families, with each family's rules.
//!
//! Only what the decoder blocks implement is accepted: RoPE scaling, sliding-window attention,
//! MLP biases, activations other than SiLU and other families' math keys
//! (`partial_rotary_factor`, logit soft-capping, Granite multipliers, …) are refused with an error naming
//! the field, because silently ignoring them would give a model that runs and is wrong.

use anemone_checkpoint::hf::JsonFields as Fields;
use anemone_checkpoint::{Architecture, DecoderConfig, Result};

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_RMS_NORM_EPS: f64 = 1e-6;

/// Where a family's `head_dim` comes from when `config.json` has none.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HeadDimDefault {
    /// `hidden_size / num_attention_heads`.
    HiddenOverHeads,
    /// A fixed size (transformers' Qwen3Config defaults head_dim to 128).
    Fixed(usize),
}

/// How a family's Q/K/V biases are configured.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AttentionBias {
    /// Always Q/K/V biases and never an o_proj bias; there is no config field (Qwen2).
    AlwaysQkv,
    /// `attention_bias: true` adds biases to the Q, K, V and o projections, as transformers'
    /// Llama and Qwen3 build them (default false).
    Field,
}

/// What distinguishes one decoder family's `config.json`.
#[derive(Debug, Clone, Copy)]
pub struct HfRules {
    pub architecture: &'static str,
    pub head_dim: HeadDimDefault,
    pub attention_bias: AttentionBias,
    /// Per-head RMSNorm of Q and K (always present in the family, no config field).
    pub qk_norm: bool,
}

/// Parses the fields of a `config.json` whose `model_type` named a family with `rules`.
pub fn parse(f: &Fields, rules: &HfRules) -> Result<DecoderConfig> {
    let hidden_size = f.positive("hidden_size")?;
    let num_attention_heads = f.positive("num_attention_heads")?;
    let num_key_value_heads = match f.usize_opt("num_key_value_heads")? {
        None => num_attention_heads,
        Some(0) => return Err(f.bad("num_key_value_heads", "must be positive")),
        Some(n) => n,
    };
    if num_attention_heads % num_key_value_heads != 0 {
        return Err(f.bad(
            "num_key_value_heads",
            format!(
                "{num_key_value_heads} does not divide num_attention_heads = {num_attention_heads}"
            ),
        ));
    }
    let head_dim = match f.usize_opt("head_dim")? {
        Some(0) => return Err(f.bad("head_dim", "must be positive")),
        Some(d) => d,
        None => match rules.head_dim {
            HeadDimDefault::Fixed(d) => d,
            HeadDimDefault::HiddenOverHeads if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
            HeadDimDefault::HiddenOverHeads => {
                return Err(f.bad(
                    "head_dim",
                    format!("missing, and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"),
                ))
            }
        },
    };
    if head_dim % 2 != 0 {
        return Err(f.bad(
            "head_dim",
            format!("{head_dim} is odd; rotary embedding needs pairs"),
        ));
    }

    check_activation(f)?;
    check_no_sliding_window(f)?;
    check_unimplemented_math(f, head_dim)?;
    let rope_theta = rope_theta(f)?;
    let (attention_bias, o_proj_bias) = match rules.attention_bias {
        AttentionBias::AlwaysQkv => (true, false),
        AttentionBias::Field => {
            let on = f.bool_opt("attention_bias")?.unwrap_or(false);
            (on, on)
        }
    };
    if f.bool_opt("mlp_bias")?.unwrap_or(false) {
        return Err(f.unsupported("mlp_bias", "true (MLP biases)"));
    }

    let rms_norm_eps = f.f64_opt("rms_norm_eps")?.unwrap_or(DEFAULT_RMS_NORM_EPS);
    if rms_norm_eps <= 0.0 {
        return Err(f.bad("rms_norm_eps", "must be positive"));
    }
    Ok(DecoderConfig {
        architecture: Architecture::new(rules.architecture),
        hidden_size,
        intermediate_size: f.positive("intermediate_size")?,
        num_hidden_layers: f.positive("num_hidden_layers")?,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size: f.positive("vocab_size")?,
        rope_theta,
        rms_norm_eps,
        tie_word_embeddings: f.bool_opt("tie_word_embeddings")?.unwrap_or(false),
        attention_bias,
        o_proj_bias,
        qk_norm: rules.qk_norm,
        max_position_embeddings: f.positive("max_position_embeddings")?,
        partial_rotary_dim: None,
        long_rope: None,
        bos_token_id: f.token_id("bos_token_id")?,
        eos_token_ids: f.token_ids("eos_token_id")?,
        gemma: None,
        attention_window: None,
    })
}

/// Keys of other model families' `config.json` that change the math when set to anything but
/// their neutral value: refused, naming the key, rather than converted into a wrong model.
/// (`key`, neutral value; `None`: any non-null value changes the math.)
const MATH_KEYS: &[(&str, Option<f64>)] = &[
    ("partial_rotary_factor", Some(1.0)),
    ("rotary_pct", Some(1.0)),
    ("attn_logit_softcapping", None),
    ("final_logit_softcapping", None),
    ("query_pre_attn_scalar", None),
    ("embedding_multiplier", Some(1.0)),
    ("residual_multiplier", Some(1.0)),
    ("attention_multiplier", None),
    ("logits_scaling", Some(1.0)),
    ("mrope_section", None),
    ("no_rope_layers", None),
];

fn check_unimplemented_math(f: &Fields, head_dim: usize) -> Result<()> {
    for &(key, neutral) in MATH_KEYS {
        let Some(value) = f.get(key) else { continue };
        if neutral.is_some() && value.as_f64() == neutral {
            continue;
        }
        return Err(f.unsupported(key, format!("{value} (not implemented)")));
    }
    if let Some(dim) = f.usize_opt("rotary_dim")? {
        if dim != head_dim {
            return Err(f.unsupported(
                "rotary_dim",
                format!("{dim} (partial rotary embedding; head_dim is {head_dim})"),
            ));
        }
    }
    Ok(())
}

fn check_activation(f: &Fields) -> Result<()> {
    match f.str_opt("hidden_act")? {
        None | Some("silu") | Some("swish") => Ok(()),
        Some(other) => Err(f.unsupported("hidden_act", format!("`{other}` (only silu)"))),
    }
}

/// Sliding-window attention changes which keys a query sees: refuse it rather than ignore it.
fn check_no_sliding_window(f: &Fields) -> Result<()> {
    if f.bool_opt("use_sliding_window")?.unwrap_or(false) {
        return Err(f.unsupported("use_sliding_window", "true (sliding-window attention)"));
    }
    if let Some(types) = f.get("layer_types") {
        let types = types
            .as_array()
            .ok_or_else(|| f.bad("layer_types", "expected a list of strings"))?;
        for (layer, kind) in types.iter().enumerate() {
            match kind.as_str() {
                Some("full_attention") => {}
                Some(other) => {
                    return Err(f.unsupported(
                        "layer_types",
                        format!("`{other}` for layer {layer} (only full_attention)"),
                    ))
                }
                None => {
                    return Err(f.bad("layer_types", format!("layer {layer}: expected a string")))
                }
            }
        }
    }
    Ok(())
}

/// `rope_theta` from the top level (transformers 4) or `rope_parameters` (transformers 5); RoPE
/// scaling (`rope_scaling`, or a `rope_type` other than `default`) is refused.
fn rope_theta(f: &Fields) -> Result<f64> {
    let mut theta = f.f64_opt("rope_theta")?;
    for field in ["rope_scaling", "rope_parameters"] {
        let Some(value) = f.get(field) else { continue };
        if !value.is_object() {
            return Err(f.bad(field, "expected an object"));
        }
        let params = Fields::new(f.path, value)?;
        let nested = |key: &str| format!("{field}.{key}");
        let kind = match (params.get("rope_type"), params.get("type")) {
            (Some(k), _) | (None, Some(k)) => Some(
                k.as_str()
                    .ok_or_else(|| f.bad(&nested("rope_type"), "expected a string"))?,
            ),
            (None, None) => None,
        };
        match kind {
            Some("default") => {}
            Some(kind) => {
                return Err(f.unsupported(&nested("rope_type"), format!("`{kind}` (RoPE scaling)")))
            }
            // transformers 4 only writes rope_scaling for scaled RoPE, so a type is required.
            None if field == "rope_scaling" => {
                return Err(f.unsupported(field, "an object without `rope_type` (RoPE scaling)"))
            }
            None => {}
        }
        if let Some(p) = params.get("partial_rotary_factor") {
            if p.as_f64() != Some(1.0) {
                return Err(f.unsupported(
                    &nested("partial_rotary_factor"),
                    format!("{p} (not implemented)"),
                ));
            }
        }
        if let Some(t) = params.get("rope_theta") {
            let t = t.as_f64().ok_or_else(|| {
                f.bad(
                    &nested("rope_theta"),
                    format!("expected a number, found {t}"),
                )
            })?;
            theta = Some(t);
        }
    }
    let theta = theta.unwrap_or(DEFAULT_ROPE_THETA);
    if !(theta.is_finite() && theta > 0.0) {
        return Err(f.bad("rope_theta", "must be a positive number"));
    }
    Ok(theta)
}
