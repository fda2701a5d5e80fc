//! GGUF v2/v3 containers: the reader, typed metadata, dequantizers, the embedded tokenizer rebuilt
//! as a `tokenizers::Tokenizer`, and a [`GgufStore`] serving the tensors dequantized to f32 under
//! the Hugging Face names a model family maps them to.

pub mod dequant;
pub mod metadata;
pub mod permutation;
pub mod reader;
mod spm;
pub mod tokenizer;

pub use dequant::GgmlType;
pub use metadata::{MetaValue, Metadata};
pub use reader::{GgufFile, TensorDesc};

use crate::error::{CheckpointError, Result};
use crate::store::{check_len, TensorInfo, TensorStore};
pub use permutation::RowPermutation;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::sync::Arc;

#[derive(Debug, Clone, Copy)]
struct StoredTensor {
    index: usize,
    permutation: RowPermutation,
}

/// The tensors of a GGUF file under their Hugging Face names, dequantized on load.
///
/// A tensor mapped with [`RowPermutation::Interleaved`] (llama q/k projections) comes back in
/// Hugging Face's rotate-half row order (llama.cpp's converter interleaves them; see
/// [`permutation::unpermute_rows`]).
#[derive(Debug)]
pub struct GgufStore {
    file: Arc<GgufFile>,
    tensors: BTreeMap<String, StoredTensor>,
}

impl GgufStore {
    /// Maps every tensor of `file` through `hf_tensor` (the model family's naming: Hugging Face
    /// name and row permutation, or an error for a tensor the family does not have).
    pub fn new(
        file: Arc<GgufFile>,
        hf_tensor: impl Fn(&TensorDesc) -> Result<(String, RowPermutation)>,
    ) -> Result<Self> {
        let mut tensors = BTreeMap::new();
        for (index, desc) in file.tensors.iter().enumerate() {
            let (hf, permutation) = hf_tensor(desc)?;
            tensors.insert(hf, StoredTensor { index, permutation });
        }
        Ok(Self { file, tensors })
    }

    pub fn file(&self) -> &GgufFile {
        &self.file
    }

    /// The GGUF description of the tensor with this Hugging Face name.
    pub fn desc(&self, name: &str) -> Option<&TensorDesc> {
        self.tensors.get(name).map(|t| &self.file.tensors[t.index])
    }
}

impl TensorStore for GgufStore {
    fn names(&self) -> Vec<String> {
        self.tensors.keys().cloned().collect()
    }

    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.desc(name).map(|d| TensorInfo {
            shape: d.hf_shape(),
            dtype: d.ggml_type.name().to_string(),
        })
    }

    fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        let numel = self
            .desc(name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into() })?
            .numel();
        let mut out = vec![0.0f32; numel];
        self.load_f32_into(name, &mut out)?;
        Ok(out)
    }

    fn load_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        let stored = self
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into() })?;
        let desc = &self.file.tensors[stored.index];
        check_len(name, desc.numel(), out)?;
        let bytes = self.file.tensor_bytes(desc);
        let shape = desc.hf_shape();
        match (stored.permutation, shape.as_slice()) {
            (RowPermutation::Interleaved { heads }, &[rows, cols]) if rows > 0 => {
                // Each ggml row is whole blocks: dequantize it straight into its Hugging Face row.
                let head_dim = rows / heads;
                let row_bytes = bytes.len() / rows;
                out.par_chunks_mut(cols)
                    .enumerate()
                    .for_each(|(hf_row, dst)| {
                        let g = permutation::gguf_row(hf_row, head_dim);
                        dequant::dequantize_serial(
                            desc.ggml_type,
                            &bytes[g * row_bytes..(g + 1) * row_bytes],
                            dst,
                        );
                    });
            }
            (RowPermutation::Interleaved { heads }, &[rows]) => {
                let mut gguf_order = vec![0.0f32; out.len()];
                dequant::dequantize(desc.ggml_type, bytes, &mut gguf_order);
                out.copy_from_slice(&permutation::unpermute_rows(&gguf_order, rows, 1, heads));
            }
            _ => dequant::dequantize(desc.ggml_type, bytes, out),
        }
        Ok(())
    }
}
