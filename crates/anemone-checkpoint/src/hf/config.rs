//! `config.json` → [`DecoderConfig`] for the llama, qwen2 and qwen3 model types.
//!
//! Only what the decoder family implements is accepted: RoPE scaling, sliding-window attention,
//! MLP biases, an o_proj bias and activations other than SiLU are refused with an error naming
//! the field, because silently ignoring them would give a model that runs and is wrong.

use crate::config::{Architecture, DecoderConfig};
use crate::error::{CheckpointError, Result};
use serde_json::{Map, Value};
use std::path::Path;

const DEFAULT_ROPE_THETA: f64 = 10_000.0;
const DEFAULT_RMS_NORM_EPS: f64 = 1e-6;
const QWEN3_DEFAULT_HEAD_DIM: usize = 128;

/// Typed access to the fields of one JSON object, with errors naming file and field.
pub(crate) struct Fields<'a> {
    pub path: &'a Path,
    pub object: &'a Map<String, Value>,
}

impl<'a> Fields<'a> {
    pub fn new(path: &'a Path, value: &'a Value) -> Result<Self> {
        let object = value.as_object().ok_or_else(|| CheckpointError::BadField {
            path: path.to_path_buf(),
            field: "(root)".into(),
            problem: "expected a JSON object".into(),
        })?;
        Ok(Self { path, object })
    }

    pub fn bad(&self, field: &str, problem: impl Into<String>) -> CheckpointError {
        CheckpointError::BadField {
            path: self.path.to_path_buf(),
            field: field.into(),
            problem: problem.into(),
        }
    }

    /// A feature the file asks for that anemone does not implement.
    pub fn unsupported(&self, field: &str, what: impl std::fmt::Display) -> CheckpointError {
        CheckpointError::Unsupported {
            path: self.path.to_path_buf(),
            what: format!("`{field}` = {what}"),
        }
    }

    /// The field's value, treating JSON `null` as absent.
    pub fn get(&self, field: &str) -> Option<&'a Value> {
        self.object.get(field).filter(|v| !v.is_null())
    }

    pub fn usize_opt(&self, field: &str) -> Result<Option<usize>> {
        self.get(field)
            .map(|v| {
                v.as_u64()
                    .and_then(|n| usize::try_from(n).ok())
                    .ok_or_else(|| {
                        self.bad(field, format!("expected a non-negative integer, found {v}"))
                    })
            })
            .transpose()
    }

    pub fn usize(&self, field: &str) -> Result<usize> {
        self.usize_opt(field)?
            .ok_or_else(|| self.bad(field, "missing"))
    }

    /// A required positive integer (a zero dimension would make an empty model).
    pub fn positive(&self, field: &str) -> Result<usize> {
        match self.usize(field)? {
            0 => Err(self.bad(field, "must be positive")),
            n => Ok(n),
        }
    }

    pub fn f64_opt(&self, field: &str) -> Result<Option<f64>> {
        self.get(field)
            .map(|v| {
                v.as_f64()
                    .filter(|x| x.is_finite())
                    .ok_or_else(|| self.bad(field, format!("expected a number, found {v}")))
            })
            .transpose()
    }

    pub fn bool_opt(&self, field: &str) -> Result<Option<bool>> {
        self.get(field)
            .map(|v| {
                v.as_bool()
                    .ok_or_else(|| self.bad(field, format!("expected true or false, found {v}")))
            })
            .transpose()
    }

    pub fn str_opt(&self, field: &str) -> Result<Option<&'a str>> {
        self.get(field)
            .map(|v| {
                v.as_str()
                    .ok_or_else(|| self.bad(field, format!("expected a string, found {v}")))
            })
            .transpose()
    }

    pub fn token_id(&self, field: &str) -> Result<Option<u32>> {
        self.usize_opt(field)?
            .map(|n| u32::try_from(n).map_err(|_| self.bad(field, "token id out of range")))
            .transpose()
    }

    /// Token ids given as one integer or a list of integers (`eos_token_id`).
    pub fn token_ids(&self, field: &str) -> Result<Vec<u32>> {
        let to_id = |v: &Value| {
            v.as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .ok_or_else(|| self.bad(field, format!("expected a token id, found {v}")))
        };
        match self.get(field) {
            None => Ok(Vec::new()),
            Some(Value::Array(items)) => items.iter().map(to_id).collect(),
            Some(v) => Ok(vec![to_id(v)?]),
        }
    }
}

/// Parses a `config.json` value (already read from `path`).
pub fn parse_config(path: &Path, json: &Value) -> Result<DecoderConfig> {
    let f = Fields::new(path, json)?;
    let model_type = f
        .str_opt("model_type")?
        .ok_or_else(|| f.bad("model_type", "missing"))?;
    let architecture = match model_type {
        "llama" => Architecture::Llama,
        "qwen2" => Architecture::Qwen2,
        "qwen3" => Architecture::Qwen3,
        other => {
            return Err(CheckpointError::UnknownArchitecture {
                arch: other.to_string(),
            })
        }
    };

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
        // transformers' Qwen3Config defaults head_dim to 128 rather than hidden / heads.
        None if architecture == Architecture::Qwen3 => QWEN3_DEFAULT_HEAD_DIM,
        None if hidden_size % num_attention_heads == 0 => hidden_size / num_attention_heads,
        None => {
            return Err(f.bad(
                "head_dim",
                format!("missing, and hidden_size {hidden_size} is not a multiple of num_attention_heads {num_attention_heads}"),
            ))
        }
    };
    if head_dim % 2 != 0 {
        return Err(f.bad(
            "head_dim",
            format!("{head_dim} is odd; rotary embedding needs pairs"),
        ));
    }

    check_activation(&f)?;
    check_no_sliding_window(&f)?;
    let rope_theta = rope_theta(&f)?;
    let attention_bias = match architecture {
        // Qwen2 always has Q/K/V biases and never an o_proj bias; it has no such config field.
        Architecture::Qwen2 => true,
        Architecture::Llama | Architecture::Qwen3 => {
            if f.bool_opt("attention_bias")?.unwrap_or(false) {
                return Err(f.unsupported(
                    "attention_bias",
                    "true (for this model type it also adds an o_proj bias)",
                ));
            }
            false
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
        architecture,
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
        qk_norm: architecture == Architecture::Qwen3,
        max_position_embeddings: f.positive("max_position_embeddings")?,
        bos_token_id: f.token_id("bos_token_id")?,
        eos_token_ids: f.token_ids("eos_token_id")?,
    })
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
