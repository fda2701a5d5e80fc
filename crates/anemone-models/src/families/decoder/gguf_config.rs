//! GGUF metadata (`{arch}.*` hyperparameters) → [`DecoderConfig`] for the decoder families, with
//! each family's rules.

use anemone_checkpoint::gguf::tokenizer::GgufTokenizer;
use anemone_checkpoint::gguf::{GgufFile, Metadata};
use anemone_checkpoint::{Architecture, CheckpointError, DecoderConfig, Result};

/// llama.cpp's RoPE base when the file does not state one.
const DEFAULT_ROPE_THETA: f64 = 10_000.0;

/// What distinguishes one decoder family's GGUF metadata.
#[derive(Debug, Clone, Copy)]
pub struct GgufRules {
    /// The family name the config records.
    pub architecture: &'static str,
    /// `general.architecture`, also the prefix of the hyperparameter keys (`{prefix}.block_count`).
    pub key_prefix: &'static str,
    /// Per-head RMSNorm of Q and K (always present in the family).
    pub qk_norm: bool,
    /// `rope.dimension_count` below the head size is partial rotation (Phi-3), not refused.
    pub partial_rotary: bool,
    /// Tensors every layer has at least (9 with separate projections; Phi-3's fused `attn_qkv`
    /// and `ffn_up` leave 6).
    pub min_tensors_per_layer: usize,
}

/// What the tensor list says about the model, which the metadata does not.
#[derive(Debug, Clone, Copy)]
pub struct TensorFacts {
    pub has_output: bool,
    pub has_q_bias: bool,
    pub has_o_bias: bool,
    /// Rows of `token_embd.weight`, the vocabulary the weights were trained with.
    pub embedding_rows: Option<usize>,
    /// How many tensors the file holds.
    pub count: usize,
}

/// Bound on any single dimension, so shape arithmetic downstream cannot overflow.
const MAX_DIM: usize = 1 << 32;

/// Tensors every decoder layer has at least (norms, q/k/v/o, gate/up/down).
pub const MIN_TENSORS_PER_LAYER: usize = 9;

impl TensorFacts {
    /// The facts of a file's tensor list (llama.cpp names).
    pub fn of(file: &GgufFile) -> Self {
        let find = |name: &str| file.tensors.iter().find(|t| t.name == name);
        Self {
            has_output: find("output.weight").is_some(),
            has_q_bias: find("blk.0.attn_q.bias").is_some(),
            has_o_bias: find("blk.0.attn_output.bias").is_some(),
            embedding_rows: find("token_embd.weight").and_then(|t| t.hf_shape().first().copied()),
            count: file.tensors.len(),
        }
    }
}

/// Parses the metadata of a file whose `general.architecture` named a family with `rules`.
pub fn parse(
    file: &GgufFile,
    rules: &GgufRules,
    tokenizer: Option<&GgufTokenizer>,
) -> Result<DecoderConfig> {
    let meta = &file.metadata;
    let tensors = TensorFacts::of(file);
    let arch = rules.key_prefix;
    let key = |k: &str| format!("{arch}.{k}");
    let positive = |k: &str| -> Result<usize> {
        let k = key(k);
        match meta.usize(&k)? {
            0 => Err(meta.bad(&k, "must be positive")),
            v => Ok(v),
        }
    };
    let hidden_size = positive("embedding_length")?;
    let num_hidden_layers = positive("block_count")?;
    // Bounds the work (and memory) of checking the tensors a lying layer count would imply.
    if num_hidden_layers.saturating_mul(rules.min_tensors_per_layer) > tensors.count {
        return Err(meta.bad(
            &key("block_count"),
            format!(
                "{num_hidden_layers} layers, but the file holds only {} tensors",
                tensors.count
            ),
        ));
    }
    let intermediate_size = positive("feed_forward_length")?;
    let num_attention_heads = positive("attention.head_count")?;
    let kv_key = key("attention.head_count_kv");
    let num_key_value_heads = meta.opt_usize(&kv_key)?.unwrap_or(num_attention_heads);
    if num_key_value_heads == 0 || !num_attention_heads.is_multiple_of(num_key_value_heads) {
        return Err(meta.bad(
            &kv_key,
            format!("{num_key_value_heads} does not divide the {num_attention_heads} query heads"),
        ));
    }
    let head_dim = match meta.opt_usize(&key("attention.key_length"))? {
        Some(0) => return Err(meta.bad(&key("attention.key_length"), "must be positive")),
        Some(d) => d,
        None if hidden_size.is_multiple_of(num_attention_heads) => {
            hidden_size / num_attention_heads
        }
        None => {
            return Err(meta.bad(
                &key("attention.head_count"),
                format!("{num_attention_heads} heads do not divide embedding_length {hidden_size}"),
            ))
        }
    };
    if num_attention_heads
        .checked_mul(head_dim)
        .is_none_or(|q_dim| q_dim > MAX_DIM)
    {
        return Err(meta.bad(
            &key("attention.head_count"),
            format!("{num_attention_heads} heads of size {head_dim} is implausibly large"),
        ));
    }
    let unsupported = |what: String| CheckpointError::Unsupported {
        path: meta.path.clone(),
        what,
    };
    if let Some(v) = meta.opt_usize(&key("attention.value_length"))? {
        if v != head_dim {
            return Err(unsupported(format!(
                "value head size {v} differing from key head size {head_dim}"
            )));
        }
    }
    let mut partial_rotary_dim = None;
    if let Some(rot) = meta.opt_usize(&key("rope.dimension_count"))? {
        if rot != head_dim && !rules.partial_rotary {
            return Err(unsupported(format!(
                "partial rotary embedding ({rot} of {head_dim} head dimensions)"
            )));
        }
        if rot == 0 || rot > head_dim || !rot.is_multiple_of(2) {
            return Err(meta.bad(
                &key("rope.dimension_count"),
                format!("{rot} rotary dimensions for head size {head_dim}"),
            ));
        }
        partial_rotary_dim = (rot != head_dim).then_some(rot);
    }
    if !head_dim.is_multiple_of(2) {
        return Err(meta.bad(
            &key("attention.key_length"),
            format!("head size {head_dim} is odd"),
        ));
    }
    check_rope_scaling(meta, arch)?;

    let vocab_size = match (tokenizer, tensors.embedding_rows) {
        (Some(t), _) => t.vocab_size,
        (None, rows) => match meta.opt_usize(&key("vocab_size"))? {
            Some(v) => v,
            None => rows.ok_or_else(|| meta.bad(&key("vocab_size"), "required key is missing"))?,
        },
    };
    let (bos_token_id, eos_token_ids) = match tokenizer {
        Some(t) => (t.bos_token_id, t.eos_token_ids.clone()),
        None => (
            meta.opt_u32("tokenizer.ggml.bos_token_id")?,
            meta.opt_u32("tokenizer.ggml.eos_token_id")?
                .into_iter()
                .collect(),
        ),
    };
    Ok(DecoderConfig {
        architecture: Architecture::new(rules.architecture),
        hidden_size,
        intermediate_size,
        num_hidden_layers,
        num_attention_heads,
        num_key_value_heads,
        head_dim,
        vocab_size,
        rope_theta: meta
            .opt_f64(&key("rope.freq_base"))?
            .unwrap_or(DEFAULT_ROPE_THETA),
        rms_norm_eps: meta.f64(&key("attention.layer_norm_rms_epsilon"))?,
        tie_word_embeddings: !tensors.has_output,
        attention_bias: tensors.has_q_bias,
        o_proj_bias: tensors.has_o_bias,
        qk_norm: rules.qk_norm,
        max_position_embeddings: positive("context_length")?,
        partial_rotary_dim,
        long_rope: None,
        bos_token_id,
        eos_token_ids,
        gemma: None,
        attention_window: None,
    })
}

/// Fails on any RoPE scaling or logit soft-capping, which the reference forward does not
/// implement.
fn check_rope_scaling(meta: &Metadata, arch: &str) -> Result<()> {
    let unsupported = |what: String| CheckpointError::Unsupported {
        path: meta.path.clone(),
        what,
    };
    for key in [
        format!("{arch}.attn_logit_softcapping"),
        format!("{arch}.final_logit_softcapping"),
    ] {
        if let Some(v) = meta.opt_f64(&key)? {
            if v != 0.0 {
                return Err(unsupported(format!(
                    "logit soft-capping {v} ({key}, not implemented)"
                )));
            }
        }
    }
    let type_key = format!("{arch}.rope.scaling.type");
    let scaling_type = meta.opt_str(&type_key)?;
    if let Some(t) = scaling_type.filter(|t| *t != "none") {
        return Err(unsupported(format!("RoPE scaling `{t}` ({type_key})")));
    }
    for factor_key in [
        format!("{arch}.rope.scaling.factor"),
        format!("{arch}.rope.scale_linear"),
    ] {
        if let Some(f) = meta.opt_f64(&factor_key)? {
            if f != 0.0 && f != 1.0 && scaling_type != Some("none") {
                return Err(unsupported(format!(
                    "RoPE scaling factor {f} ({factor_key})"
                )));
            }
        }
    }
    Ok(())
}
