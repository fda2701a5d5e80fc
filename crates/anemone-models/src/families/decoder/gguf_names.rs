//! llama.cpp's GGUF tensor names of the decoder families → Hugging Face names, and which of them
//! a family's converter row-permuted.

use anemone_checkpoint::gguf::{GgufFile, RowPermutation, TensorDesc};
use anemone_checkpoint::{CheckpointError, DecoderConfig, Result};

/// Per-layer GGUF suffixes and the Hugging Face suffix each maps to.
const LAYER_SUFFIXES: &[(&str, &str)] = &[
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
    ("attn_output.bias", "self_attn.o_proj.bias"),
    ("attn_q_norm.weight", "self_attn.q_norm.weight"),
    ("attn_k_norm.weight", "self_attn.k_norm.weight"),
    ("ffn_gate.weight", "mlp.gate_proj.weight"),
    ("ffn_up.weight", "mlp.up_proj.weight"),
    ("ffn_down.weight", "mlp.down_proj.weight"),
    ("attn_norm.weight", "input_layernorm.weight"),
    ("ffn_norm.weight", "post_attention_layernorm.weight"),
];

/// Model-level GGUF names and their Hugging Face names.
const GLOBAL_NAMES: &[(&str, &str)] = &[
    ("token_embd.weight", "model.embed_tokens.weight"),
    ("output_norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
];

/// The Hugging Face name of a GGUF tensor of a decoder family, or `None` if the name is not one
/// the decoder families use.
pub fn hf_name(gguf: &str) -> Option<String> {
    if let Some(&(_, hf)) = GLOBAL_NAMES.iter().find(|(g, _)| *g == gguf) {
        return Some(hf.to_string());
    }
    let rest = gguf.strip_prefix("blk.")?;
    let (layer, suffix) = rest.split_once('.')?;
    if layer.is_empty() || !layer.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let layer: usize = layer.parse().ok()?;
    let &(_, hf) = LAYER_SUFFIXES.iter().find(|(g, _)| *g == suffix)?;
    Some(format!("model.layers.{layer}.{hf}"))
}

/// How a family's converter stored Q/K projections.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum QkRows {
    /// In Hugging Face order.
    AsHuggingFace,
    /// Rows of each head interleaved (llama.cpp's `permute` for the llama architecture).
    Interleaved,
}

/// The Hugging Face name of `desc` and the row permutation to undo on load. A tensor no decoder
/// family has (for instance `rope_freqs.weight`, Llama 3 RoPE scaling) is an error, not ignored.
pub fn map_tensor(
    file: &GgufFile,
    desc: &TensorDesc,
    config: &DecoderConfig,
    qk_rows: QkRows,
) -> Result<(String, RowPermutation)> {
    let hf = hf_name(&desc.name).ok_or_else(|| CheckpointError::Unsupported {
        path: file.path.clone(),
        what: if desc.name == "rope_freqs.weight" {
            "RoPE frequency scaling (tensor `rope_freqs.weight`)".to_string()
        } else {
            format!(
                "tensor `{}` (no Hugging Face counterpart in a {} decoder)",
                desc.name, config.architecture
            )
        },
    })?;
    let heads = match hf.rsplit_once(".self_attn.").map(|(_, s)| s) {
        Some("q_proj.weight" | "q_proj.bias") => Some(config.num_attention_heads),
        Some("k_proj.weight" | "k_proj.bias") => Some(config.num_key_value_heads),
        _ => None,
    };
    let permutation = match (heads, qk_rows) {
        (Some(heads), QkRows::Interleaved) => {
            let rows = desc.hf_shape().first().copied().unwrap_or(0);
            if !rows.is_multiple_of(2 * heads) {
                return Err(CheckpointError::ShapeMismatch {
                    name: hf,
                    expected: vec![heads * config.head_dim],
                    found: desc.hf_shape(),
                });
            }
            RowPermutation::Interleaved { heads }
        }
        (Some(_), QkRows::AsHuggingFace) | (None, _) => RowPermutation::None,
    };
    Ok((hf, permutation))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_every_documented_name() {
        let cases = [
            ("token_embd.weight", "model.embed_tokens.weight"),
            ("output_norm.weight", "model.norm.weight"),
            ("output.weight", "lm_head.weight"),
            (
                "blk.0.attn_q.weight",
                "model.layers.0.self_attn.q_proj.weight",
            ),
            (
                "blk.12.attn_k.weight",
                "model.layers.12.self_attn.k_proj.weight",
            ),
            (
                "blk.3.attn_v.weight",
                "model.layers.3.self_attn.v_proj.weight",
            ),
            (
                "blk.3.attn_output.weight",
                "model.layers.3.self_attn.o_proj.weight",
            ),
            ("blk.1.attn_q.bias", "model.layers.1.self_attn.q_proj.bias"),
            ("blk.1.attn_k.bias", "model.layers.1.self_attn.k_proj.bias"),
            ("blk.1.attn_v.bias", "model.layers.1.self_attn.v_proj.bias"),
            (
                "blk.2.attn_q_norm.weight",
                "model.layers.2.self_attn.q_norm.weight",
            ),
            (
                "blk.2.attn_k_norm.weight",
                "model.layers.2.self_attn.k_norm.weight",
            ),
            (
                "blk.4.ffn_gate.weight",
                "model.layers.4.mlp.gate_proj.weight",
            ),
            ("blk.4.ffn_up.weight", "model.layers.4.mlp.up_proj.weight"),
            (
                "blk.4.ffn_down.weight",
                "model.layers.4.mlp.down_proj.weight",
            ),
            (
                "blk.5.attn_norm.weight",
                "model.layers.5.input_layernorm.weight",
            ),
            (
                "blk.5.ffn_norm.weight",
                "model.layers.5.post_attention_layernorm.weight",
            ),
        ];
        for (gguf, hf) in cases {
            assert_eq!(hf_name(gguf).as_deref(), Some(hf), "{gguf}");
        }
        for bad in [
            "blk.x.attn_q.weight",
            "blk..attn_q.weight",
            "blk.0.attn_qkv.weight",
            "rope_freqs.weight",
            "blk.+1.attn_q.weight",
        ] {
            assert_eq!(hf_name(bad), None, "{bad}");
        }
    }
}
