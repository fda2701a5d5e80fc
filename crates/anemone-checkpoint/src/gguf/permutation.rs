//! The undoing of llama.cpp's Q/K row permutation (which tensors a family permuted is the
//! family's business: `anemone_models::families`).

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
}
