//! GGUF tensor names → Hugging Face names, and the undoing of llama.cpp's Q/K row permutation.

/// Per-layer GGUF suffixes and the Hugging Face suffix each maps to.
const LAYER_SUFFIXES: &[(&str, &str)] = &[
    ("attn_q.weight", "self_attn.q_proj.weight"),
    ("attn_k.weight", "self_attn.k_proj.weight"),
    ("attn_v.weight", "self_attn.v_proj.weight"),
    ("attn_output.weight", "self_attn.o_proj.weight"),
    ("attn_q.bias", "self_attn.q_proj.bias"),
    ("attn_k.bias", "self_attn.k_proj.bias"),
    ("attn_v.bias", "self_attn.v_proj.bias"),
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

/// The Hugging Face name of a GGUF tensor of a llama/qwen2/qwen3 model, or `None` if the name is
/// not one those architectures use.
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

/// Which rows of a Hugging Face tensor llama.cpp's converter permuted, if any.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RowPermutation {
    None,
    /// Rows of each of `heads` heads were interleaved (llama q_proj / k_proj).
    Interleaved {
        heads: usize,
    },
}

/// The GGUF row that holds Hugging Face row `hf_row` of a llama q/k projection whose heads are
/// `head_dim` rows each.
///
/// llama.cpp's converter writes rows of each head in the order it gets by viewing the Hugging
/// Face rows as `[heads, 2, head_dim/2, cols]` and swapping axes 1 and 2: Hugging Face row
/// `h·hd + s·hd/2 + i` (`s` ∈ {0, 1}, `i` < hd/2) lands in GGUF row `h·hd + 2i + s`. Reading
/// through this map puts each rotate-half pair (i, i + hd/2) back in its half.
pub fn gguf_row(hf_row: usize, head_dim: usize) -> usize {
    let half = head_dim / 2;
    let (head, within) = (hf_row / head_dim, hf_row % head_dim);
    let (s, i) = (within / half, within % half);
    head * head_dim + 2 * i + s
}

/// Undoes llama.cpp's `permute` of a `[rows, cols]` row-major matrix (see [`gguf_row`]).
///
/// Requires `rows % (2·heads) == 0` and `data.len() == rows·cols` (the caller checks both).
pub fn unpermute_rows(data: &[f32], rows: usize, cols: usize, heads: usize) -> Vec<f32> {
    let head_dim = rows / heads;
    let mut out = Vec::with_capacity(data.len());
    for hf_row in 0..rows {
        let g = gguf_row(hf_row, head_dim);
        out.extend_from_slice(&data[g * cols..(g + 1) * cols]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// llama.cpp's `permute`, written as the reshape/swapaxes it is: HF `[n, 2, hd/2, cols]`
    /// → `[n, hd/2, 2, cols]`, with explicit index arithmetic.
    fn llama_cpp_permute(w: &[f32], rows: usize, cols: usize, n: usize) -> Vec<f32> {
        let half = rows / n / 2;
        let mut out = vec![0.0; w.len()];
        for a in 0..n {
            for b in 0..half {
                for c in 0..2 {
                    // destination index [a, b, c] in the swapped view
                    let dst_row = (a * half + b) * 2 + c;
                    // source index [a, c, b] in the original view
                    let src_row = (a * 2 + c) * half + b;
                    out[dst_row * cols..(dst_row + 1) * cols]
                        .copy_from_slice(&w[src_row * cols..(src_row + 1) * cols]);
                }
            }
        }
        out
    }

    #[test]
    fn unpermute_inverts_llama_cpp_permute() {
        for &(heads, head_dim, cols) in &[(1, 4, 1), (3, 8, 5), (9, 64, 3), (2, 128, 2)] {
            let rows = heads * head_dim;
            let w: Vec<f32> = (0..rows * cols).map(|x| x as f32).collect();
            let permuted = llama_cpp_permute(&w, rows, cols, heads);
            assert_ne!(
                permuted, w,
                "permute should move rows for head_dim {head_dim}"
            );
            assert_eq!(unpermute_rows(&permuted, rows, cols, heads), w);
        }
    }

    #[test]
    fn unpermute_small_example_by_hand() {
        // One head, head_dim 4, one column. HF rows [r0 r1 | r2 r3] (halves of rotate-half);
        // llama.cpp interleaves them into [r0 r2 r1 r3].
        let gguf = [0.0, 2.0, 1.0, 3.0];
        assert_eq!(unpermute_rows(&gguf, 4, 1, 1), vec![0.0, 1.0, 2.0, 3.0]);
    }

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
