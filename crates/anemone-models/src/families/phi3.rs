//! Phi-3 (and Phi-3.5 / Phi-4-mini, `model_type` `phi3`): the Llama decoder with the Q/K/V
//! projections fused into `qkv_proj` and gate/up into `gate_up_proj` (split at import into the
//! Llama names, so every later stage sees a Llama-shaped checkpoint), partial rotation
//! (`partial_rotary_factor`) and LongRoPE scaling (`rope_scaling` / `rope_parameters` of type
//! `longrope`, or `su` / `yarn`, which transformers' Phi3Config maps to `longrope`).
//!
//! Every `config.json` key is either implemented, known to leave the math alone, or refused by
//! name. `sliding_window` masks every layer to its last `sliding_window` positions
//! (`DecoderConfig::attention_window`); converted, the KV states hold a ring of the window plus
//! the prefill length when that is smaller than the context (`crate::ane::kv`).
//! llama.cpp's `phi3` GGUF files (fused `attn_qkv` / `ffn_up`, `rope_factors_long` /
//! `rope_factors_short` tensors) read the same way: the fused tensors split, the factors into the
//! config.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::store::FusedModule;
use anemone_checkpoint::{
    CheckpointError, DecoderConfig, LongRope, Result, TensorInfo, TensorStore,
};
use serde_json::Value;

use super::decoder::gguf_config::{self, GgufRules};
use super::decoder::gguf_names::{self, QkRows};
use super::decoder::hf_config::{self, AttentionBias, HeadDimDefault, HfRules};
use super::decoder::tensor_names;
use super::{Family, ModelKind};

/// The Phi-3 family.
#[derive(Debug, Clone, Copy)]
pub struct Phi3;

pub static PHI3: Phi3 = Phi3;

/// transformers' Phi3Config default.
const DEFAULT_ORIGINAL_MAX_POSITIONS: usize = 4096;

/// Top-level keys read here or by the shared decoder parser, or that leave the math alone.
const KNOWN_KEYS: &[&str] = &[
    "_name_or_path",
    "architectures",
    "auto_map",
    "model_type",
    "transformers_version",
    "torch_dtype",
    "dtype",
    "use_cache",
    "initializer_range",
    "attention_dropout",
    "embd_pdrop",
    "resid_pdrop",
    "bos_token_id",
    "eos_token_id",
    "pad_token_id",
    "hidden_act",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "vocab_size",
    "rms_norm_eps",
    "tie_word_embeddings",
    "max_position_embeddings",
    "original_max_position_embeddings",
    "rope_theta",
    "rope_scaling",
    "rope_parameters",
    "partial_rotary_factor",
    "sliding_window",
    "mlp_bias",
];

/// Keys transformers' Phi3 does not read but some configs carry: accepted only at these values.
fn neutral_bools() -> [(&'static str, Value); 3] {
    [
        ("attention_bias", Value::Bool(false)),
        ("lm_head_bias", Value::Bool(false)),
        ("use_sliding_window", Value::Bool(false)),
    ]
}

/// Keys of the RoPE object (`rope_scaling` / `rope_parameters`) this family implements.
const ROPE_KEYS: &[&str] = &[
    "rope_type",
    "type",
    "rope_theta",
    "partial_rotary_factor",
    "original_max_position_embeddings",
    "short_factor",
    "long_factor",
    "factor",
    "attention_factor",
];

impl Family for Phi3 {
    fn name(&self) -> &'static str {
        "phi3"
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Decoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["phi3"]
    }

    fn gguf_architecture(&self) -> &'static str {
        "phi3"
    }

    fn config_from_hf(&self, f: &JsonFields) -> Result<DecoderConfig> {
        parse(f)
    }

    fn config_from_gguf(
        &self,
        file: &GgufFile,
        tokenizer: Option<&GgufTokenizer>,
    ) -> Result<DecoderConfig> {
        gguf_config(file, tokenizer)
    }

    fn expected_tensors(&self, config: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
        super::decoder::expected_tensors(config)
    }

    fn tensor_from_gguf(
        &self,
        file: &GgufFile,
        desc: &TensorDesc,
        config: &DecoderConfig,
    ) -> Result<(String, RowPermutation)> {
        // the fused tensors under their Hugging Face names, split by `FusedSplit`; the LongRoPE
        // factor tensors were read into the config
        let fused = desc.name.strip_prefix("blk.").and_then(|rest| {
            let (layer, suffix) = rest.split_once('.')?;
            let layer: usize = layer.parse().ok()?;
            let hf = match suffix {
                "attn_qkv.weight" => "self_attn.qkv_proj.weight",
                "ffn_up.weight" => "mlp.gate_up_proj.weight",
                _ => return None,
            };
            Some(tensor_names::layer(layer, hf))
        });
        if let Some(hf) = fused {
            return Ok((hf, RowPermutation::None));
        }
        if ROPE_FACTOR_TENSORS.contains(&desc.name.as_str()) {
            return Ok((desc.name.clone(), RowPermutation::None));
        }
        // llama.cpp rotates Phi-3 with NEOX (rotate-half) RoPE: Q/K rows as Hugging Face's
        gguf_names::map_tensor(file, desc, config, QkRows::AsHuggingFace)
    }

    fn adapt_gguf_tensors(
        &self,
        store: Box<dyn TensorStore>,
        config: &DecoderConfig,
    ) -> Result<Box<dyn TensorStore>> {
        Ok(Box::new(FusedSplit::new(store, config)?))
    }

    fn adapt_hf_tensors(
        &self,
        store: Box<dyn TensorStore>,
        config: &DecoderConfig,
    ) -> Result<Box<dyn TensorStore>> {
        Ok(Box::new(FusedSplit::new(store, config)?))
    }
}

/// LongRoPE's factors in a llama.cpp Phi-3 GGUF (`rope_rotary_dim / 2` f32 each).
const ROPE_FACTOR_TENSORS: [&str; 2] = ["rope_factors_long.weight", "rope_factors_short.weight"];

/// A llama.cpp `phi3` GGUF's metadata (and its rope factor tensors) → config. llama.cpp's
/// converter writes `rope.dimension_count` (partial rotation), `rope.scaling.attn_factor` and
/// `rope.scaling.original_context_length` with the factor tensors for LongRoPE, and
/// `attention.sliding_window` (0: none).
fn gguf_config(file: &GgufFile, tokenizer: Option<&GgufTokenizer>) -> Result<DecoderConfig> {
    let rules = GgufRules {
        architecture: "phi3",
        key_prefix: "phi3",
        qk_norm: false,
        partial_rotary: true,
        // norms, fused qkv, o, fused gate/up, down
        min_tensors_per_layer: 6,
    };
    let mut config = gguf_config::parse(file, &rules, tokenizer)?;
    let meta = &file.metadata;
    let factors = |name: &str| -> Result<Option<Vec<f64>>> {
        let Some(desc) = file.tensors.iter().find(|t| t.name == name) else {
            return Ok(None);
        };
        let mut out = vec![0f32; desc.numel()];
        anemone_checkpoint::gguf::dequant::dequantize(
            desc.ggml_type,
            file.tensor_bytes(desc),
            &mut out,
        );
        Ok(Some(out.into_iter().map(f64::from).collect()))
    };
    match (
        factors(ROPE_FACTOR_TENSORS[0])?,
        factors(ROPE_FACTOR_TENSORS[1])?,
    ) {
        (Some(long_factor), Some(short_factor)) => {
            let key = "phi3.rope.scaling.original_context_length";
            let original = match meta.opt_usize(key)? {
                Some(0) | None => return Err(meta.bad(key, "required with rope factor tensors")),
                Some(v) => v,
            };
            let max = config.max_position_embeddings;
            let attention_factor = match meta.opt_f64("phi3.rope.scaling.attn_factor")? {
                Some(a) => a,
                None if max <= original => 1.0,
                None => (1.0 + (max as f64 / original as f64).ln() / (original as f64).ln()).sqrt(),
            };
            config.long_rope = Some(LongRope {
                short_factor,
                long_factor,
                original_max_position_embeddings: original,
                attention_factor,
                use_long: max > original,
            });
        }
        (None, None) => {}
        _ => {
            return Err(CheckpointError::Unsupported {
                path: file.path.clone(),
                what: "a phi3 GGUF with only one of rope_factors_long / rope_factors_short".into(),
            })
        }
    }
    // as the Hugging Face config (transformers masks with it): a window shorter than the model
    // masks every layer. llama.cpp 0.3.36 reads the key but disables Phi's sliding window, so on
    // prompts longer than the window the two differ; anemone follows the checkpoint's authors.
    if let Some(window) = meta.opt_usize("phi3.attention.sliding_window")? {
        config.attention_window =
            (window > 0 && window < config.max_position_embeddings).then_some(window);
    }
    config.validate()?;
    Ok(config)
}

fn parse(f: &JsonFields) -> Result<DecoderConfig> {
    for (key, value) in f.object {
        if KNOWN_KEYS.contains(&key.as_str()) || value.is_null() {
            continue;
        }
        let neutral = neutral_bools()
            .into_iter()
            .find(|(k, _)| *k == key.as_str());
        match neutral {
            Some((_, n)) if *value == n => {}
            Some(_) => {
                return Err(f.unsupported(key, format!("{value} (not implemented for phi3)")))
            }
            None => {
                return Err(f.unsupported(
                    key,
                    format!("{value} (a key anemone does not implement for phi3)"),
                ))
            }
        }
    }

    // the RoPE object: transformers 5 writes rope_parameters, transformers 4 rope_scaling
    let (rope_field, rope) = match (f.get("rope_parameters"), f.get("rope_scaling")) {
        (Some(v), _) => ("rope_parameters", Some(v)),
        (None, Some(v)) => ("rope_scaling", Some(v)),
        (None, None) => ("rope_scaling", None),
    };
    let rope = match rope {
        Some(v) if v.is_object() => Some(JsonFields::new(f.path, v)?),
        Some(_) => return Err(f.bad(rope_field, "expected an object")),
        None => None,
    };
    let nested = |key: &str| format!("{rope_field}.{key}");
    if let Some(r) = &rope {
        for (key, value) in r.object {
            if !ROPE_KEYS.contains(&key.as_str()) && !value.is_null() {
                return Err(
                    f.unsupported(&nested(key), format!("{value} (not implemented for phi3)"))
                );
            }
        }
    }
    let rope_f64 = |key: &str| -> Result<Option<f64>> {
        match rope.as_ref().and_then(|r| r.get(key)) {
            Some(v) => v
                .as_f64()
                .map(Some)
                .ok_or_else(|| f.bad(&nested(key), format!("expected a number, found {v}"))),
            None => f.f64_opt(key),
        }
    };
    let kind = match rope.as_ref() {
        Some(r) => match (r.get("rope_type"), r.get("type")) {
            (Some(k), _) | (None, Some(k)) => Some(
                k.as_str()
                    .ok_or_else(|| f.bad(&nested("rope_type"), "expected a string"))?,
            ),
            (None, None) => None,
        },
        None => None,
    };
    let long = match kind {
        None | Some("default") => false,
        // Phi3Config maps su and yarn to longrope
        Some("longrope" | "su" | "yarn") => true,
        Some(other) => {
            return Err(f.unsupported(
                &nested("rope_type"),
                format!("`{other}` (phi3 implements default and longrope)"),
            ))
        }
    };
    let theta = rope_f64("rope_theta")?;
    let partial = rope_f64("partial_rotary_factor")?.unwrap_or(1.0);
    if !(partial > 0.0 && partial <= 1.0) {
        return Err(f.bad(
            "partial_rotary_factor",
            format!("{partial} is not in (0, 1]"),
        ));
    }

    // the shared decoder parser on what is left (every key it does not know is gone)
    let mut rest = f.object.clone();
    for key in [
        "rope_scaling",
        "rope_parameters",
        "partial_rotary_factor",
        "original_max_position_embeddings",
        "sliding_window",
        "attention_bias",
        "lm_head_bias",
    ] {
        rest.remove(key);
    }
    if let Some(theta) = theta {
        rest.insert("rope_theta".into(), theta.into());
    }
    let rest = Value::Object(rest);
    let rules = HfRules {
        architecture: "phi3",
        head_dim: HeadDimDefault::HiddenOverHeads,
        attention_bias: AttentionBias::Field,
        qk_norm: false,
    };
    let mut config = hf_config::parse(&JsonFields::new(f.path, &rest)?, &rules)?;

    let rotary = (config.head_dim as f64 * partial).floor() as usize;
    if rotary == 0 || !rotary.is_multiple_of(2) {
        return Err(f.bad(
            "partial_rotary_factor",
            format!(
                "{partial} of head_dim {} gives {rotary} rotary dimensions; RoPE needs a positive \
                 even number",
                config.head_dim
            ),
        ));
    }
    config.partial_rotary_dim = (rotary != config.head_dim).then_some(rotary);

    if long {
        let factors = |key: &str| -> Result<Vec<f64>> {
            let value = rope
                .as_ref()
                .and_then(|r| r.get(key))
                .ok_or_else(|| f.bad(&nested(key), "missing (LongRoPE needs it)"))?;
            let list = value
                .as_array()
                .ok_or_else(|| f.bad(&nested(key), "expected a list of numbers"))?;
            list.iter()
                .map(|v| {
                    v.as_f64()
                        .ok_or_else(|| f.bad(&nested(key), format!("expected numbers, found {v}")))
                })
                .collect()
        };
        let original = match rope
            .as_ref()
            .and_then(|r| r.usize_opt("original_max_position_embeddings").transpose())
        {
            Some(v) => v?,
            None => f
                .usize_opt("original_max_position_embeddings")?
                .unwrap_or(DEFAULT_ORIGINAL_MAX_POSITIONS),
        };
        if original == 0 {
            return Err(f.bad("original_max_position_embeddings", "must be positive"));
        }
        let max = config.max_position_embeddings;
        let factor = rope_f64("factor")?.unwrap_or(max as f64 / original as f64);
        let attention_factor = match rope_f64("attention_factor")? {
            Some(a) => a,
            None if factor <= 1.0 => 1.0,
            None => (1.0 + factor.ln() / (original as f64).ln()).sqrt(),
        };
        config.long_rope = Some(LongRope {
            short_factor: factors("short_factor")?,
            long_factor: factors("long_factor")?,
            original_max_position_embeddings: original,
            attention_factor,
            use_long: max > original,
        });
    }

    if let Some(window) = f.usize_opt("sliding_window")? {
        if window == 0 {
            return Err(f.bad("sliding_window", "must be positive"));
        }
        // transformers masks `kv_idx > q_idx - sliding_window` on every layer; a window of at
        // least the maximum context never hides anything
        config.attention_window = (window < config.max_position_embeddings).then_some(window);
    }
    config.validate()?;
    Ok(config)
}

/// Where a split tensor's rows come from: the fused tensor and the row range.
fn source(name: &str, config: &DecoderConfig) -> Option<(String, std::ops::Range<usize>)> {
    let (q, kv, inter) = (config.q_dim(), config.kv_dim(), config.intermediate_size);
    let (prefix, part) = name.rsplit_once('.').and_then(|(p, w)| {
        (w == "weight").then_some(())?;
        p.rsplit_once('.')
    })?;
    let (fused, rows) = match part {
        "q_proj" => ("qkv_proj", 0..q),
        "k_proj" => ("qkv_proj", q..q + kv),
        "v_proj" => ("qkv_proj", q + kv..q + 2 * kv),
        "gate_proj" => ("gate_up_proj", 0..inter),
        "up_proj" => ("gate_up_proj", inter..2 * inter),
        _ => return None,
    };
    Some((format!("{prefix}.{fused}.weight"), rows))
}

/// A Phi-3 store presenting `qkv_proj` / `gate_up_proj` as the separate Llama projections.
struct FusedSplit {
    base: Box<dyn TensorStore>,
    config: DecoderConfig,
}

impl FusedSplit {
    /// Checks every fused tensor's shape (naming it) before anything is split.
    fn new(base: Box<dyn TensorStore>, config: &DecoderConfig) -> Result<Self> {
        let (h, q, kv, inter) = (
            config.hidden_size,
            config.q_dim(),
            config.kv_dim(),
            config.intermediate_size,
        );
        for name in base.names() {
            let expected = if name.ends_with(".self_attn.qkv_proj.weight") {
                vec![q + 2 * kv, h]
            } else if name.ends_with(".mlp.gate_up_proj.weight") {
                vec![2 * inter, h]
            } else {
                continue;
            };
            let found = base.info(&name).map(|i| i.shape).unwrap_or_default();
            if found != expected {
                return Err(CheckpointError::ShapeMismatch {
                    name,
                    expected,
                    found,
                });
            }
        }
        Ok(Self {
            base,
            config: config.clone(),
        })
    }

    fn split(&self, name: &str) -> Option<(String, std::ops::Range<usize>)> {
        source(name, &self.config).filter(|(fused, _)| self.base.info(fused).is_some())
    }
}

impl TensorStore for FusedSplit {
    fn fused_modules(&self) -> Vec<FusedModule> {
        let h = self.config.hidden_size;
        self.base
            .names()
            .into_iter()
            .filter_map(|name| {
                let prefix = name
                    .strip_suffix("self_attn.qkv_proj.weight")
                    .map(|p| {
                        (
                            p,
                            "self_attn.qkv_proj",
                            ["q_proj", "k_proj", "v_proj"].as_slice(),
                            "self_attn",
                        )
                    })
                    .or_else(|| {
                        name.strip_suffix("mlp.gate_up_proj.weight").map(|p| {
                            (
                                p,
                                "mlp.gate_up_proj",
                                ["gate_proj", "up_proj"].as_slice(),
                                "mlp",
                            )
                        })
                    })?;
                let (prefix, fused, parts, block) = prefix;
                let parts: Vec<(String, std::ops::Range<usize>)> = parts
                    .iter()
                    .map(|part| {
                        let split = format!("{prefix}{block}.{part}.weight");
                        let (_, rows) = source(&split, &self.config)?;
                        Some((format!("{prefix}{block}.{part}"), rows))
                    })
                    .collect::<Option<_>>()?;
                let rows = parts.last()?.1.end;
                Some(FusedModule {
                    module: format!("{prefix}{fused}"),
                    shape: vec![rows, h],
                    parts,
                })
            })
            .collect()
    }

    fn names(&self) -> Vec<String> {
        let mut names = Vec::new();
        for name in self.base.names() {
            if let Some(prefix) = name.strip_suffix("self_attn.qkv_proj.weight") {
                for p in ["q_proj", "k_proj", "v_proj"] {
                    names.push(format!("{prefix}self_attn.{p}.weight"));
                }
            } else if let Some(prefix) = name.strip_suffix("mlp.gate_up_proj.weight") {
                for p in ["gate_proj", "up_proj"] {
                    names.push(format!("{prefix}mlp.{p}.weight"));
                }
            } else {
                names.push(name);
            }
        }
        names.sort();
        names
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        match self.split(name) {
            Some((fused, rows)) => {
                let mut info = self.base.info(&fused)?;
                info.shape[0] = rows.len();
                Some(info)
            }
            None => self.base.info(name),
        }
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        match self.split(name) {
            Some((fused, rows)) => {
                let cols = self.config.hidden_size;
                let values = self.base.load_f32(&fused)?;
                values
                    .get(rows.start * cols..rows.end * cols)
                    .map(<[f32]>::to_vec)
                    .ok_or_else(|| CheckpointError::ShapeMismatch {
                        name: fused,
                        expected: vec![rows.end, cols],
                        found: vec![values.len()],
                    })
            }
            None => self.base.load_f32(name),
        }
    }
}
