//! BERT and its close relatives (`roberta`, `xlm-roberta`, `camembert`): post-LN bidirectional
//! encoders with word + absolute position (+ token-type) embeddings and an erf-GELU MLP.
//! RoBERTa differs only in its position ids, which start at `pad_token_id + 1`, and its
//! classification head (`classifier.dense` → tanh → `classifier.out_proj`, where BERT has the
//! `pooler` → `classifier`).

use anemone_checkpoint::hf::JsonFields;
use anemone_checkpoint::Result;

use super::{EncoderFamily, ModelKind};
use crate::encoder::EncoderConfig;

const NAME: &str = "bert";

#[derive(Debug, Clone, Copy)]
pub struct Bert;

/// Whether `model_type` uses RoBERTa's position ids and head.
pub fn is_roberta(model_type: &str) -> bool {
    matches!(model_type, "roberta" | "xlm-roberta" | "camembert")
}

impl EncoderFamily for Bert {
    fn name(&self) -> &'static str {
        NAME
    }

    fn kind(&self) -> ModelKind {
        ModelKind::Encoder
    }

    fn hf_model_types(&self) -> &'static [&'static str] {
        &["bert", "roberta", "xlm-roberta", "camembert"]
    }

    fn base_model_prefix(&self, model_type: &str) -> &'static str {
        if is_roberta(model_type) {
            "roberta."
        } else {
            "bert."
        }
    }

    fn config_from_hf(&self, fields: &JsonFields, model_type: &str) -> Result<EncoderConfig> {
        if let Some(act) = fields.str_opt("hidden_act")? {
            if act != "gelu" {
                return Err(fields.unsupported(
                    "hidden_act",
                    format!("\"{act}\" (only the exact erf \"gelu\")"),
                ));
            }
        }
        if let Some(kind) = fields.str_opt("position_embedding_type")? {
            if kind != "absolute" {
                return Err(fields.unsupported("position_embedding_type", format!("\"{kind}\"")));
            }
        }
        if fields.bool_opt("is_decoder")? == Some(true) {
            return Err(fields.unsupported("is_decoder", "true"));
        }
        let hidden_size = fields.positive("hidden_size")?;
        let heads = fields.positive("num_attention_heads")?;
        if hidden_size % heads != 0 {
            return Err(fields.bad(
                "num_attention_heads",
                format!("{heads} does not divide hidden_size {hidden_size}"),
            ));
        }
        let roberta = is_roberta(model_type);
        let pad_token_id = fields
            .token_id("pad_token_id")?
            .unwrap_or(if roberta { 1 } else { 0 });
        let position_offset = if roberta {
            pad_token_id as usize + 1
        } else {
            0
        };
        let labels = labels(fields)?;
        Ok(EncoderConfig {
            architecture: NAME.into(),
            model_type: model_type.into(),
            vocab_size: fields.positive("vocab_size")?,
            hidden_size,
            num_hidden_layers: fields.positive("num_hidden_layers")?,
            num_attention_heads: heads,
            head_dim: hidden_size / heads,
            intermediate_size: fields.positive("intermediate_size")?,
            max_position_embeddings: fields.positive("max_position_embeddings")?,
            type_vocab_size: fields.usize_opt("type_vocab_size")?.unwrap_or(2),
            layer_norm_eps: fields.f64_opt("layer_norm_eps")?.unwrap_or(1e-12),
            position_offset,
            pad_token_id,
            tensor_prefix: String::new(),
            labels,
            layout: crate::encoder::EncoderLayout::PostLn,
        })
    }

    fn expected_tensors(&self, config: &EncoderConfig) -> Vec<(String, Vec<usize>)> {
        let (h, i) = (config.hidden_size, config.intermediate_size);
        let mut out = vec![
            (
                "embeddings.word_embeddings.weight".to_string(),
                vec![config.vocab_size, h],
            ),
            (
                "embeddings.position_embeddings.weight".to_string(),
                vec![config.max_position_embeddings, h],
            ),
            ("embeddings.LayerNorm.weight".to_string(), vec![h]),
            ("embeddings.LayerNorm.bias".to_string(), vec![h]),
        ];
        if config.type_vocab_size > 0 {
            out.push((
                "embeddings.token_type_embeddings.weight".into(),
                vec![config.type_vocab_size, h],
            ));
        }
        for l in 0..config.num_hidden_layers {
            let p = format!("encoder.layer.{l}");
            for (name, shape) in [
                ("attention.self.query.weight", vec![h, h]),
                ("attention.self.query.bias", vec![h]),
                ("attention.self.key.weight", vec![h, h]),
                ("attention.self.key.bias", vec![h]),
                ("attention.self.value.weight", vec![h, h]),
                ("attention.self.value.bias", vec![h]),
                ("attention.output.dense.weight", vec![h, h]),
                ("attention.output.dense.bias", vec![h]),
                ("attention.output.LayerNorm.weight", vec![h]),
                ("attention.output.LayerNorm.bias", vec![h]),
                ("intermediate.dense.weight", vec![i, h]),
                ("intermediate.dense.bias", vec![i]),
                ("output.dense.weight", vec![h, i]),
                ("output.dense.bias", vec![h]),
                ("output.LayerNorm.weight", vec![h]),
                ("output.LayerNorm.bias", vec![h]),
            ] {
                out.push((format!("{p}.{name}"), shape));
            }
        }
        let mut out: Vec<_> = out
            .into_iter()
            .map(|(n, s)| (config.tensor(&n), s))
            .collect();
        out.extend(head_tensors(config));
        out
    }
}

/// The classification head's tensors (full names; the head is outside the base model prefix,
/// except BERT's pooler).
pub fn head_tensors(config: &EncoderConfig) -> Vec<(String, Vec<usize>)> {
    let (h, n) = (config.hidden_size, config.labels.len());
    if n == 0 {
        return Vec::new();
    }
    if is_roberta(&config.model_type) {
        vec![
            ("classifier.dense.weight".into(), vec![h, h]),
            ("classifier.dense.bias".into(), vec![h]),
            ("classifier.out_proj.weight".into(), vec![n, h]),
            ("classifier.out_proj.bias".into(), vec![n]),
        ]
    } else {
        vec![
            (config.tensor("pooler.dense.weight"), vec![h, h]),
            (config.tensor("pooler.dense.bias"), vec![h]),
            ("classifier.weight".into(), vec![n, h]),
            ("classifier.bias".into(), vec![n]),
        ]
    }
}

/// `id2label` in id order, for a `*ForSequenceClassification` checkpoint; empty otherwise.
pub(crate) fn labels(fields: &JsonFields) -> Result<Vec<String>> {
    let classifier = fields
        .get("architectures")
        .and_then(|a| a.as_array())
        .is_some_and(|a| {
            a.iter()
                .filter_map(|v| v.as_str())
                .any(|s| s.ends_with("ForSequenceClassification"))
        });
    if !classifier {
        return Ok(Vec::new());
    }
    let map = fields
        .get("id2label")
        .and_then(|m| m.as_object())
        .ok_or_else(|| fields.bad("id2label", "a sequence classifier needs an id2label object"))?;
    let mut labels = vec![None; map.len()];
    for (id, label) in map {
        let index: usize = id.parse().ok().filter(|&i| i < map.len()).ok_or_else(|| {
            fields.bad(
                "id2label",
                format!("key `{id}` is not an id below {}", map.len()),
            )
        })?;
        let label = label
            .as_str()
            .ok_or_else(|| fields.bad("id2label", format!("label of id {id} is not a string")))?;
        labels[index] = Some(label.to_string());
    }
    Ok(labels.into_iter().flatten().collect())
}
