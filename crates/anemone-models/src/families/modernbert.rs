//! ModernBERT (`modernbert`): a pre-LN bidirectional encoder with rotary positions (one RoPE
//! base for global layers, another for local ones), a GeGLU MLP (`Wi` fused: first half the
//! input, second half the gate), attention that alternates between global and a local window
//! (`global_attn_every_n_layers` / `layer_types`, `local_attention`), optional biases
//! (`norm_bias`, `attention_bias`, `mlp_bias`), a final LayerNorm and, for
//! `ModernBertForSequenceClassification`, a head that pools (`classifier_pooling`) → dense →
//! GELU → LayerNorm → classifier. Both the transformers 5 config form (`layer_types`,
//! `rope_parameters`) and the earlier one (`global_attn_every_n_layers`, `global_rope_theta`,
//! `local_rope_theta`) are read.

use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::Result;

use super::{EncoderFamily, ModelKind};
use crate::encoder::reference::{EncoderWeights, Head, LayerWeights, Linear, Norm};
use crate::encoder::{
    AttentionSpan, EncoderCheckpoint, EncoderConfig, EncoderLayout, HeadPooling, RopeLayout,
};

const NAME: &str = "modernbert";

#[derive(Debug, Clone, Copy)]
pub struct ModernBert;

impl EncoderFamily for ModernBert {
    fn name(&self) -> &'static str {
        NAME
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Encoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["modernbert"]
    }

    fn base_model_prefix(&self, _model_type: &str) -> &'static str {
        "model."
    }

    fn word_embeddings(&self) -> &'static str {
        "embeddings.tok_embeddings.weight"
    }

    fn config_from_hf(&self, fields: &JsonFields, model_type: &str) -> Result<EncoderConfig> {
        for key in ["hidden_activation", "classifier_activation"] {
            if let Some(act) = fields.str_opt(key)? {
                if act != "gelu" {
                    return Err(
                        fields.unsupported(key, format!("\"{act}\" (only the exact erf \"gelu\")"))
                    );
                }
            }
        }
        let hidden_size = fields.positive("hidden_size")?;
        let heads = fields.positive("num_attention_heads")?;
        if hidden_size % heads != 0 || (hidden_size / heads) % 2 != 0 {
            return Err(fields.bad(
                "num_attention_heads",
                format!("{heads} must divide hidden_size {hidden_size} into even head sizes"),
            ));
        }
        let layers = fields.positive("num_hidden_layers")?;
        let layer_spans = layer_spans(fields, layers)?;
        let (global_rope_theta, local_rope_theta) = rope_thetas(fields)?;
        let local_attention = fields.usize_opt("local_attention")?.unwrap_or(128);
        let head_pooling = match fields.str_opt("classifier_pooling")? {
            None | Some("cls") => HeadPooling::Cls,
            Some("mean") => HeadPooling::Mean,
            Some(other) => {
                return Err(fields.unsupported("classifier_pooling", format!("\"{other}\"")))
            }
        };
        let flag = |key: &str, default: bool| -> Result<bool> {
            Ok(fields.bool_opt(key)?.unwrap_or(default))
        };
        Ok(EncoderConfig {
            architecture: NAME.into(),
            model_type: model_type.into(),
            vocab_size: fields.positive("vocab_size")?,
            hidden_size,
            num_hidden_layers: layers,
            num_attention_heads: heads,
            head_dim: hidden_size / heads,
            intermediate_size: fields.positive("intermediate_size")?,
            max_position_embeddings: fields.positive("max_position_embeddings")?,
            type_vocab_size: 0,
            layer_norm_eps: fields.f64_opt("norm_eps")?.unwrap_or(1e-5),
            position_offset: 0,
            pad_token_id: fields.token_id("pad_token_id")?.unwrap_or(0),
            tensor_prefix: String::new(),
            labels: super::bert::labels(fields)?,
            layout: EncoderLayout::PreLnRope(RopeLayout {
                global_rope_theta,
                local_rope_theta,
                local_window: local_attention / 2,
                layer_spans,
                norm_bias: flag("norm_bias", false)?,
                attention_bias: flag("attention_bias", false)?,
                mlp_bias: flag("mlp_bias", false)?,
                classifier_bias: flag("classifier_bias", false)?,
                head_pooling,
            }),
        })
    }

    fn expected_tensors(&self, config: &EncoderConfig) -> Vec<(String, Vec<usize>)> {
        let Some(r) = config.rope() else {
            return Vec::new();
        };
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let mut out = vec![(
            config.tensor("embeddings.tok_embeddings.weight"),
            vec![config.vocab_size, h],
        )];
        let linear = |out: &mut Vec<_>, name: String, o: usize, n: usize, bias: bool| {
            out.push((format!("{name}.weight"), vec![o, n]));
            if bias {
                out.push((format!("{name}.bias"), vec![o]));
            }
        };
        let norm = |out: &mut Vec<_>, name: String| {
            out.push((format!("{name}.weight"), vec![h]));
            if r.norm_bias {
                out.push((format!("{name}.bias"), vec![h]));
            }
        };
        norm(&mut out, config.tensor("embeddings.norm"));
        for l in 0..config.num_hidden_layers {
            let p = config.tensor(&format!("layers.{l}"));
            if l > 0 {
                norm(&mut out, format!("{p}.attn_norm"));
            }
            linear(
                &mut out,
                format!("{p}.attn.Wqkv"),
                3 * h,
                h,
                r.attention_bias,
            );
            linear(&mut out, format!("{p}.attn.Wo"), h, h, r.attention_bias);
            norm(&mut out, format!("{p}.mlp_norm"));
            linear(&mut out, format!("{p}.mlp.Wi"), 2 * i, h, r.mlp_bias);
            linear(&mut out, format!("{p}.mlp.Wo"), h, i, r.mlp_bias);
        }
        norm(&mut out, config.tensor("final_norm"));
        if !config.labels.is_empty() {
            linear(&mut out, "head.dense".into(), h, h, r.classifier_bias);
            norm(&mut out, "head.norm".into());
            linear(&mut out, "classifier".into(), config.labels.len(), h, true);
        }
        out
    }
}

/// `layer_types` (transformers 5), else every `global_attn_every_n_layers`-th layer (from 0)
/// global and the others local.
fn layer_spans(fields: &JsonFields, layers: usize) -> Result<Vec<AttentionSpan>> {
    if let Some(list) = fields.get("layer_types").and_then(|v| v.as_array()) {
        if list.len() != layers {
            return Err(fields.bad(
                "layer_types",
                format!("{} entries for {layers} layers", list.len()),
            ));
        }
        return list
            .iter()
            .map(|v| match v.as_str() {
                Some("full_attention") => Ok(AttentionSpan::Global),
                Some("sliding_attention") => Ok(AttentionSpan::Local),
                _ => Err(fields.unsupported("layer_types", format!("entry {v}"))),
            })
            .collect();
    }
    let every = fields.usize_opt("global_attn_every_n_layers")?.unwrap_or(3);
    if every == 0 {
        return Err(fields.bad("global_attn_every_n_layers", "must be at least 1"));
    }
    Ok((0..layers)
        .map(|i| {
            if i % every == 0 {
                AttentionSpan::Global
            } else {
                AttentionSpan::Local
            }
        })
        .collect())
}

/// `(global, local)` RoPE bases: `rope_parameters.{full,sliding}_attention.rope_theta`, else
/// `global_rope_theta` / `local_rope_theta`, else 160000 / 10000. Only the default RoPE type.
fn rope_thetas(fields: &JsonFields) -> Result<(f64, f64)> {
    let mut thetas = (
        fields.f64_opt("global_rope_theta")?.unwrap_or(160_000.0),
        fields.f64_opt("local_rope_theta")?.unwrap_or(10_000.0),
    );
    if fields.get("rope_scaling").is_some_and(|v| !v.is_null()) {
        return Err(fields.unsupported("rope_scaling", "a scaled RoPE"));
    }
    if let Some(params) = fields.get("rope_parameters").and_then(|v| v.as_object()) {
        for (key, slot) in [
            ("full_attention", &mut thetas.0),
            ("sliding_attention", &mut thetas.1),
        ] {
            let Some(p) = params.get(key) else { continue };
            if let Some(kind) = p.get("rope_type").and_then(|v| v.as_str()) {
                if kind != "default" {
                    return Err(fields.unsupported(
                        "rope_parameters",
                        format!("{key}.rope_type \"{kind}\" (only \"default\")"),
                    ));
                }
            }
            if let Some(theta) = p.get("rope_theta").and_then(|v| v.as_f64()) {
                *slot = theta;
            }
        }
    }
    Ok(thetas)
}

/// Every weight of a ModernBERT checkpoint, fused projections split: `Wqkv` into query / key /
/// value, `Wi` into the GeGLU input and gate.
pub fn load_weights(ck: &EncoderCheckpoint) -> crate::encoder::Result<EncoderWeights> {
    let c = &ck.config;
    let Some(r) = c.rope() else {
        return Err(crate::encoder::EncoderError::Tensor {
            tensor: c.tensor("layers.0.attn.Wqkv.weight"),
            problem: "not a ModernBERT-style config".into(),
        });
    };
    let (h, i) = (c.hidden_size, c.intermediate_size);
    let norm = |name: &str| Norm::load_with_bias(ck, name, r.norm_bias);
    let mut layers = Vec::with_capacity(c.num_hidden_layers);
    for l in 0..c.num_hidden_layers {
        let p = c.tensor(&format!("layers.{l}"));
        let qkv =
            Linear::load_with_bias(ck, &format!("{p}.attn.Wqkv"), 3 * h, h, r.attention_bias)?;
        let wi = Linear::load_with_bias(ck, &format!("{p}.mlp.Wi"), 2 * i, h, r.mlp_bias)?;
        layers.push(LayerWeights {
            query: qkv.rows(0, h),
            key: qkv.rows(h, h),
            value: qkv.rows(2 * h, h),
            attn_out: Linear::load_with_bias(ck, &format!("{p}.attn.Wo"), h, h, r.attention_bias)?,
            attn_norm: if l == 0 {
                None
            } else {
                Some(norm(&format!("{p}.attn_norm"))?)
            },
            intermediate: wi.rows(0, i),
            gate: Some(wi.rows(i, i)),
            output: Linear::load_with_bias(ck, &format!("{p}.mlp.Wo"), h, i, r.mlp_bias)?,
            out_norm: norm(&format!("{p}.mlp_norm"))?,
        });
    }
    let head = if c.labels.is_empty() {
        None
    } else {
        Some(Head::ModernBert {
            pooling: r.head_pooling,
            dense: Linear::load_with_bias(ck, "head.dense", h, h, r.classifier_bias)?,
            norm: norm("head.norm")?,
            eps: c.layer_norm_eps,
            classifier: Linear::load(ck, "classifier", c.labels.len(), h)?,
        })
    };
    Ok(EncoderWeights {
        word: ck.load_f32(&c.tensor("embeddings.tok_embeddings.weight"))?,
        position: None,
        token_type: None,
        embed_norm: norm(&c.tensor("embeddings.norm"))?,
        layers,
        final_norm: Some(norm(&c.tensor("final_norm"))?),
        head,
    })
}
