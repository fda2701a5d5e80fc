//! Gemma 3 (text decoders): the Llama layer with QK-norm plus Gemma's departures, carried by
//! [`GemmaConfig`]: the embedding times √hidden, `(1 + w)` RMSNorms, a post-norm on each block's
//! output, GeGLU with tanh GELU, `query_pre_attn_scalar`, and interleaved sliding-window (local)
//! and global layers with their own RoPE bases.
//!
//! Norm weights: transformers stores `w` and multiplies by `1 + w`; llama.cpp's converter stores
//! `1 + w`. A Hugging Face checkpoint is opened with its norm tensors read as `1 + w`
//! (`UnitOffsetNorms`), so every consumer sees the multiplier and uses the shared norm blocks.
//!
//! Hugging Face `model_type` `gemma3_text` (transformers 4 and 5 config layouts); GGUF
//! `general.architecture` `gemma3`, whose sliding pattern, local RoPE base and attention scalar
//! llama.cpp does not store but fixes for the architecture (every 6th layer global, base 10 000,
//! `head_dim`), as read here.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::{Checkpoint, DecoderConfig, GemmaConfig, Result, TensorInfo, TensorStore};
use serde_json::Value;

use super::decoder::gguf_config::{self, GgufRules};
use super::decoder::gguf_names::{self, QkRows};
use super::decoder::hf_config::{self, AttentionBias, HeadDimDefault, HfRules};
use super::decoder::tensor_names;
use super::{Family, ModelKind};

pub struct Gemma3;

pub static GEMMA3: Gemma3 = Gemma3;

const NAME: &str = "gemma3";
/// transformers' Gemma3TextConfig defaults.
const DEFAULT_HEAD_DIM: usize = 256;
const DEFAULT_QUERY_PRE_ATTN_SCALAR: f64 = 256.0;
const DEFAULT_SLIDING_WINDOW_PATTERN: usize = 6;
const DEFAULT_ROPE_THETA: f64 = 1_000_000.0;
const DEFAULT_ROPE_LOCAL_THETA: f64 = 10_000.0;
/// What llama.cpp fixes for `gemma3` (llama-model.cpp): every 6th layer global, local base 10 000.
const GGUF_SLIDING_WINDOW_PATTERN: usize = 6;
const GGUF_ROPE_LOCAL_THETA: f64 = 10_000.0;

/// Gemma-only keys of `config.json`, read here and hidden from the shared Llama parser (which
/// refuses them for the other families).
const GEMMA_KEYS: &[&str] = &[
    "hidden_activation",
    "hidden_act",
    "query_pre_attn_scalar",
    "sliding_window",
    "sliding_window_pattern",
    "_sliding_window_pattern",
    "layer_types",
    "rope_parameters",
    "rope_local_base_freq",
    "rope_theta",
    "rope_scaling",
    "attn_logit_softcapping",
    "final_logit_softcapping",
    "use_bidirectional_attention",
];

/// Layer `i` is global when `(i + 1) % pattern == 0` (transformers and llama.cpp alike).
fn pattern_layers(layers: usize, pattern: usize) -> Vec<bool> {
    (0..layers).map(|i| (i + 1) % pattern != 0).collect()
}

impl Family for Gemma3 {
    fn name(&self) -> &'static str {
        NAME
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Decoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        // gemma3: the multimodal model, converted as its text decoder
        &["gemma3_text", "gemma3"]
    }

    fn gguf_architecture(&self) -> &'static str {
        NAME
    }

    fn config_from_hf(&self, f: &JsonFields) -> Result<DecoderConfig> {
        if f.str_opt("model_type")? == Some("gemma3") {
            let text = super::gemma3_multimodal::text_config(f)?;
            return text_config_from_hf(&JsonFields::new(f.path, &text)?);
        }
        text_config_from_hf(f)
    }

    fn adapt_hf_tensors(
        &self,
        store: Box<dyn TensorStore>,
        _config: &DecoderConfig,
    ) -> Result<Box<dyn TensorStore>> {
        Ok(super::gemma3_multimodal::language_model(store).unwrap_or_else(|text| text))
    }

    fn config_from_gguf(
        &self,
        file: &GgufFile,
        tokenizer: Option<&GgufTokenizer>,
    ) -> Result<DecoderConfig> {
        let rules = GgufRules {
            architecture: NAME,
            key_prefix: NAME,
            qk_norm: true,
            partial_rotary: false,
            min_tensors_per_layer: gguf_config::MIN_TENSORS_PER_LAYER,
        };
        let mut config = gguf_config::parse(file, &rules, tokenizer)?;
        let meta = &file.metadata;
        let window_key = format!("{NAME}.attention.sliding_window");
        let sliding_window = match meta.opt_usize(&window_key)? {
            Some(0) => return Err(meta.bad(&window_key, "must be positive")),
            Some(w) => w,
            None => return Err(meta.bad(&window_key, "required key is missing")),
        };
        config.gemma = Some(GemmaConfig {
            query_pre_attn_scalar: config.head_dim as f64,
            sliding_window,
            sliding_layers: pattern_layers(config.num_hidden_layers, GGUF_SLIDING_WINDOW_PATTERN),
            rope_local_theta: GGUF_ROPE_LOCAL_THETA,
            residual_scale: 1.0,
        });
        Ok(config)
    }

    fn expected_tensors(&self, config: &DecoderConfig) -> Vec<(String, Vec<usize>)> {
        let mut out = super::decoder::expected_tensors(config);
        for layer in 0..config.num_hidden_layers {
            for norm in ["pre_feedforward_layernorm", "post_feedforward_layernorm"] {
                out.push((
                    tensor_names::layer(layer, &format!("{norm}.weight")),
                    vec![config.hidden_size],
                ));
            }
        }
        out
    }

    fn tensor_from_gguf(
        &self,
        file: &GgufFile,
        desc: &TensorDesc,
        config: &DecoderConfig,
    ) -> Result<(String, RowPermutation)> {
        // Gemma's four norms per layer: llama.cpp's `ffn_norm` is the MLP pre-norm here, not the
        // Llama post-attention norm.
        let renamed = desc
            .name
            .strip_prefix("blk.")
            .and_then(|rest| rest.split_once('.'))
            .and_then(|(layer, suffix)| {
                let hf = match suffix {
                    "post_attention_norm.weight" => "post_attention_layernorm.weight",
                    "ffn_norm.weight" => "pre_feedforward_layernorm.weight",
                    "post_ffw_norm.weight" => "post_feedforward_layernorm.weight",
                    _ => return None,
                };
                let layer: usize = layer.parse().ok()?;
                Some(tensor_names::layer(layer, hf))
            });
        match renamed {
            Some(hf) => Ok((hf, RowPermutation::None)),
            None => gguf_names::map_tensor(file, desc, config, QkRows::AsHuggingFace),
        }
    }

    fn adapt_hf_checkpoint(&self, checkpoint: Checkpoint) -> Checkpoint {
        Checkpoint {
            tensors: Box::new(UnitOffsetNorms(checkpoint.tensors)),
            ..checkpoint
        }
    }
}

/// A `gemma3_text` config (also the `text_config` of a multimodal one).
fn text_config_from_hf(f: &JsonFields) -> Result<DecoderConfig> {
    match f.str_opt("hidden_activation")?.or(f.str_opt("hidden_act")?) {
        None | Some("gelu_pytorch_tanh") => {}
        Some(other) => {
            return Err(f.unsupported(
                "hidden_activation",
                format!("`{other}` (only gelu_pytorch_tanh)"),
            ))
        }
    }
    for key in ["attn_logit_softcapping", "final_logit_softcapping"] {
        if f.get(key).is_some_and(|v| !v.is_null()) {
            return Err(f.unsupported(key, "logit soft-capping (not implemented)"));
        }
    }
    if f.bool_opt("use_bidirectional_attention")?.unwrap_or(false) {
        return Err(f.unsupported(
            "use_bidirectional_attention",
            "true (an encoder-style Gemma)",
        ));
    }
    let layers = f.positive("num_hidden_layers")?;
    let sliding_layers = match f.get("layer_types") {
        Some(types) => {
            let types = types
                .as_array()
                .ok_or_else(|| f.bad("layer_types", "expected a list of strings"))?;
            if types.len() != layers {
                return Err(f.bad(
                    "layer_types",
                    format!("{} entries for {layers} layers", types.len()),
                ));
            }
            types
                .iter()
                .enumerate()
                .map(|(i, t)| match t.as_str() {
                    Some("sliding_attention") => Ok(true),
                    Some("full_attention") => Ok(false),
                    Some(other) => {
                        Err(f.unsupported("layer_types", format!("`{other}` for layer {i}")))
                    }
                    None => Err(f.bad("layer_types", format!("layer {i}: expected a string"))),
                })
                .collect::<Result<Vec<_>>>()?
        }
        None => {
            let pattern = match f.usize_opt("sliding_window_pattern")? {
                Some(0) => return Err(f.bad("sliding_window_pattern", "must be positive")),
                Some(p) => p,
                None => DEFAULT_SLIDING_WINDOW_PATTERN,
            };
            pattern_layers(layers, pattern)
        }
    };
    let (rope_theta, rope_local_theta) = rope_bases(f)?;
    let query_pre_attn_scalar = f
        .f64_opt("query_pre_attn_scalar")?
        .unwrap_or(DEFAULT_QUERY_PRE_ATTN_SCALAR);
    let sliding_window = match f.usize_opt("sliding_window")? {
        Some(0) => return Err(f.bad("sliding_window", "must be positive")),
        Some(w) => w,
        None if sliding_layers.iter().any(|&s| s) => {
            return Err(f.bad("sliding_window", "missing, and some layers are sliding"))
        }
        None => 1,
    };

    // The rest is the Llama layout: parse it with the Gemma keys hidden.
    let mut map = f.object.clone();
    for key in GEMMA_KEYS {
        map.remove(*key);
    }
    let rest = Value::Object(map);
    let rest_fields = JsonFields::new(f.path, &rest)?;
    let rules = HfRules {
        architecture: NAME,
        head_dim: HeadDimDefault::Fixed(DEFAULT_HEAD_DIM),
        attention_bias: AttentionBias::Field,
        qk_norm: true,
    };
    let mut config = hf_config::parse(&rest_fields, &rules)?;
    config.rope_theta = rope_theta;
    config.tie_word_embeddings = f.bool_opt("tie_word_embeddings")?.unwrap_or(true);
    config.gemma = Some(GemmaConfig {
        query_pre_attn_scalar,
        sliding_window,
        sliding_layers,
        rope_local_theta,
        residual_scale: 1.0,
    });
    Ok(config)
}

/// The largest residual-stream magnitude fp16 is asked to hold: half of fp16's 65,504, so the
/// sum of the stream and one block's output cannot overflow either.
const FP16_RESIDUAL_LIMIT: f64 = 32_752.0;

/// The residual scale (a power of two, so scaling is exact in binary floating point) for a
/// Gemma checkpoint to be run in fp16, from a bound every input respects: an RMS-normed vector of
/// `h` entries has no entry above `√h`, so the stream never exceeds
/// `max|embedding| · √h + Σ_layers √h · (max|w_post_attention| + max|w_post_feedforward|)`.
/// Returns `(scale, bound)`; `(1, bound)` for a bound already within fp16, `None` for a
/// non-Gemma checkpoint.
///
/// Gemma 3 270M: the bound is ≈ 512,000 (the stream itself reaches ≈ 104,000 on ordinary text,
/// past fp16's 65,504 from layer 8 on), so the scale is 1/16.
pub fn fp16_residual_scale(checkpoint: &Checkpoint) -> Result<Option<(f64, f64)>> {
    let c = &checkpoint.config;
    if c.gemma.is_none() {
        return Ok(None);
    }
    let max_abs = |name: &str| -> Result<f64> {
        Ok(checkpoint
            .load_f32(name)?
            .iter()
            .fold(0f64, |m, v| m.max(v.abs() as f64)))
    };
    let root_h = (c.hidden_size as f64).sqrt();
    let mut bound = max_abs(tensor_names::EMBED_TOKENS)? * root_h;
    for layer in 0..c.num_hidden_layers {
        for norm in ["post_attention_layernorm", "post_feedforward_layernorm"] {
            bound += root_h * max_abs(&tensor_names::layer(layer, &format!("{norm}.weight")))?;
        }
    }
    let mut scale = 1.0;
    while bound * scale > FP16_RESIDUAL_LIMIT {
        scale /= 2.0;
    }
    Ok(Some((scale, bound)))
}

/// `(global, local)` RoPE bases: transformers 5's `rope_parameters.{full,sliding}_attention`, or
/// transformers 4's `rope_theta` + `rope_local_base_freq`. Scaled RoPE is refused.
fn rope_bases(f: &JsonFields) -> Result<(f64, f64)> {
    let mut global = f.f64_opt("rope_theta")?.unwrap_or(DEFAULT_ROPE_THETA);
    let mut local = f
        .f64_opt("rope_local_base_freq")?
        .unwrap_or(DEFAULT_ROPE_LOCAL_THETA);
    if let Some(scaling) = f.get("rope_scaling").filter(|v| !v.is_null()) {
        return Err(f.unsupported("rope_scaling", format!("{scaling} (RoPE scaling)")));
    }
    if let Some(params) = f.get("rope_parameters") {
        let params = JsonFields::new(f.path, params)?;
        for (kind, target) in [
            ("full_attention", &mut global),
            ("sliding_attention", &mut local),
        ] {
            let field = format!("rope_parameters.{kind}");
            let Some(p) = params.get(kind) else {
                return Err(f.bad(&field, "missing"));
            };
            let p = JsonFields::new(f.path, p)?;
            match p.str_opt("rope_type")? {
                None | Some("default") => {}
                Some(other) => {
                    return Err(f.unsupported(
                        &format!("{field}.rope_type"),
                        format!("`{other}` (RoPE scaling)"),
                    ))
                }
            }
            if let Some(theta) = p.f64_opt("rope_theta")? {
                *target = theta;
            }
        }
    }
    for (field, v) in [("rope_theta", global), ("rope_local_base_freq", local)] {
        if !(v.is_finite() && v > 0.0) {
            return Err(f.bad(field, "must be a positive number"));
        }
    }
    Ok((global, local))
}

/// A Hugging Face Gemma store whose RMSNorm weights read as `1 + w`, the multiplier transformers
/// applies (and llama.cpp's GGUF stores).
struct UnitOffsetNorms(Box<dyn TensorStore>);

fn is_norm(name: &str) -> bool {
    name.ends_with("norm.weight")
}

impl TensorStore for UnitOffsetNorms {
    fn names(&self) -> Vec<String> {
        self.0.names()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.0.info(name)
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        let mut values = self.0.load_f32(name)?;
        if is_norm(name) {
            values.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(values)
    }

    fn load_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        self.0.load_f32_into(name, out)?;
        if is_norm(name) {
            out.iter_mut().for_each(|v| *v += 1.0);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_sixth_layer_is_global() {
        let layers = pattern_layers(18, 6);
        let global: Vec<usize> = (0..18).filter(|&i| !layers[i]).collect();
        assert_eq!(global, vec![5, 11, 17]);
    }
}
