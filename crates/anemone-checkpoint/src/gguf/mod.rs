//! GGUF v2/v3 import: metadata → [`DecoderConfig`], tensors dequantized to f32 under Hugging Face
//! names, the embedded tokenizer rebuilt as a `tokenizers::Tokenizer`.

pub mod dequant;
pub mod hparams;
pub mod metadata;
pub mod names;
pub mod reader;
pub mod tokenizer;

pub use dequant::GgmlType;
pub use metadata::{MetaValue, Metadata};
pub use reader::{GgufFile, TensorDesc};

use crate::config::{Architecture, DecoderConfig};
use crate::error::{CheckpointError, Result};
use crate::store::{TensorInfo, TensorStore};
use crate::Checkpoint;
use names::RowPermutation;
use rayon::prelude::*;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;

/// Opens a GGUF file as a validated [`Checkpoint`].
pub fn open_file(path: &Path) -> Result<Checkpoint> {
    let started = std::time::Instant::now();
    let file = Arc::new(GgufFile::open(path)?);
    let meta = &file.metadata;
    // The architecture first: an unknown one is the clearest thing to report.
    let architecture = hparams::architecture(meta)?;
    let tokenizer = tokenizer::build(meta)?;
    let find = |name: &str| file.tensors.iter().find(|t| t.name == name);
    let facts = hparams::TensorFacts {
        has_output: find("output.weight").is_some(),
        has_q_bias: find("blk.0.attn_q.bias").is_some(),
        embedding_rows: find("token_embd.weight").and_then(|t| t.hf_shape().first().copied()),
        count: file.tensors.len(),
    };
    let config = hparams::decoder_config(meta, facts, tokenizer.as_ref())?;
    let store = GgufStore::new(file.clone(), &config)?;
    let checkpoint = Checkpoint {
        config,
        tensors: Box::new(store),
        tokenizer: tokenizer.map(|t| t.bundle),
        source_paths: vec![path.to_path_buf()],
    };
    checkpoint.validate()?;
    tracing::info!(
        path = %path.display(),
        version = file.version,
        architecture = architecture.name(),
        tensors = file.tensors.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "opened GGUF"
    );
    Ok(checkpoint)
}

#[derive(Debug, Clone, Copy)]
struct StoredTensor {
    index: usize,
    permutation: RowPermutation,
}

/// The tensors of a GGUF file under their Hugging Face names, dequantized on load.
///
/// For the llama architecture, q/k projections come back in Hugging Face's rotate-half row order
/// (llama.cpp's converter interleaves them; see [`names::unpermute_rows`]).
#[derive(Debug)]
pub struct GgufStore {
    file: Arc<GgufFile>,
    tensors: BTreeMap<String, StoredTensor>,
}

impl GgufStore {
    /// Maps every tensor of `file` to its Hugging Face name. A tensor no supported architecture
    /// has (for instance `rope_freqs.weight`, Llama 3 RoPE scaling) is an error, not ignored.
    pub fn new(file: Arc<GgufFile>, config: &DecoderConfig) -> Result<Self> {
        let mut tensors = BTreeMap::new();
        for (index, desc) in file.tensors.iter().enumerate() {
            let hf = names::hf_name(&desc.name).ok_or_else(|| CheckpointError::Unsupported {
                path: file.path.clone(),
                what: if desc.name == "rope_freqs.weight" {
                    "RoPE frequency scaling (tensor `rope_freqs.weight`)".to_string()
                } else {
                    format!(
                        "tensor `{}` (no Hugging Face counterpart in a llama/qwen2/qwen3 decoder)",
                        desc.name
                    )
                },
            })?;
            let heads = match hf.rsplit_once(".self_attn.").map(|(_, s)| s) {
                Some("q_proj.weight" | "q_proj.bias") => Some(config.num_attention_heads),
                Some("k_proj.weight" | "k_proj.bias") => Some(config.num_key_value_heads),
                _ => None,
            };
            let permutation = match heads {
                Some(heads) if config.architecture == Architecture::Llama => {
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
                _ => RowPermutation::None,
            };
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
        let stored = self
            .tensors
            .get(name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.into() })?;
        let desc = &self.file.tensors[stored.index];
        let bytes = self.file.tensor_bytes(desc);
        let mut out = vec![0.0f32; desc.numel()];
        let shape = desc.hf_shape();
        match (stored.permutation, shape.as_slice()) {
            (RowPermutation::Interleaved { heads }, &[rows, cols]) if rows > 0 => {
                // Each ggml row is whole blocks: dequantize it straight into its Hugging Face row.
                let head_dim = rows / heads;
                let row_bytes = bytes.len() / rows;
                out.par_chunks_mut(cols)
                    .enumerate()
                    .for_each(|(hf_row, dst)| {
                        let g = names::gguf_row(hf_row, head_dim);
                        dequant::dequantize_serial(
                            desc.ggml_type,
                            &bytes[g * row_bytes..(g + 1) * row_bytes],
                            dst,
                        );
                    });
                Ok(out)
            }
            (RowPermutation::Interleaved { heads }, &[rows]) => {
                dequant::dequantize(desc.ggml_type, bytes, &mut out);
                Ok(names::unpermute_rows(&out, rows, 1, heads))
            }
            _ => {
                dequant::dequantize(desc.ggml_type, bytes, &mut out);
                Ok(out)
            }
        }
    }
}
