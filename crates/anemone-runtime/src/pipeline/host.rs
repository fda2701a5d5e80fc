//! What runs on the host: the token embedding, the final RMSNorm and the LM head (read from
//! `host.safetensors`), and the bundle's tokenizer.

use std::path::Path;

use anemone_checkpoint::TokenizerBundle;
use anemone_models::bundle::Manifest;
use anemone_models::families::decoder::tensor_names::{EMBED_TOKENS as EMBED, FINAL_NORM, LM_HEAD};
use half::f16;
use rayon::prelude::*;

use super::PipelineError;

/// Host tensors as f32, in Hugging Face layout (`[vocab, hidden]` rows).
pub struct HostWeights {
    hidden: usize,
    vocab: usize,
    eps: f32,
    embed: Vec<f32>,
    final_norm: Vec<f32>,
    /// `None` when the head is tied to the embedding or runs as its own package.
    lm_head: Option<Vec<f32>>,
    /// The head runs on the host (else in the LM-head package, which holds its own norm).
    head_on_host: bool,
}

impl HostWeights {
    pub fn load(dir: &Path, manifest: &Manifest) -> Result<Self, PipelineError> {
        let path = dir.join(&manifest.host.path);
        let bytes = std::fs::read(&path).map_err(|e| PipelineError::Host {
            path: path.clone(),
            tensor: "(file)".into(),
            problem: e.to_string(),
        })?;
        let file =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| PipelineError::Host {
                path: path.clone(),
                tensor: "(header)".into(),
                problem: e.to_string(),
            })?;
        let c = &manifest.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let head_on_host = manifest.lm_head.is_none();
        let load = |name: &str, shape: &[usize]| read_tensor(&path, &file, name, shape);
        let embed = load(EMBED, &[vocab, h])?;
        let final_norm = load(FINAL_NORM, &[h])?;
        let lm_head = if head_on_host && !c.tie_word_embeddings {
            Some(load(LM_HEAD, &[vocab, h])?)
        } else {
            None
        };
        Ok(HostWeights {
            hidden: h,
            vocab,
            eps: c.residual_norm_eps() as f32,
            embed,
            final_norm,
            lm_head,
            head_on_host,
        })
    }

    /// The embedding row of `id` (checked against the vocabulary by the caller).
    pub fn embedding(&self, id: u32) -> &[f32] {
        let row = id as usize * self.hidden;
        &self.embed[row..row + self.hidden]
    }

    /// Whether [`HostWeights::logits`] is the head (else the LM-head package is).
    pub fn head_on_host(&self) -> bool {
        self.head_on_host
    }

    /// `lm_head(rms_norm(x) · w)` for one hidden vector, in f32.
    pub fn logits(&self, x: &[f32]) -> Vec<f32> {
        let h = self.hidden;
        let mean_sq = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_sq + self.eps as f64).sqrt();
        let normed: Vec<f32> = x
            .iter()
            .zip(&self.final_norm)
            .map(|(v, w)| (*v as f64 * inv) as f32 * w)
            .collect();
        let head = self.lm_head.as_deref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; self.vocab];
        logits
            .par_chunks_mut(1024)
            .enumerate()
            .for_each(|(block, out)| {
                for (i, o) in out.iter_mut().enumerate() {
                    let row = (block * 1024 + i) * h;
                    *o = anemone_models::reference::kernels::dot(&head[row..row + h], &normed);
                }
            });
        logits
    }
}

/// A tensor of `file` as f32, checked against `shape` (F16 or F32 on disk).
fn read_tensor(
    path: &Path,
    file: &safetensors::SafeTensors,
    name: &str,
    shape: &[usize],
) -> Result<Vec<f32>, PipelineError> {
    let bad = |problem: String| PipelineError::Host {
        path: path.to_path_buf(),
        tensor: name.to_string(),
        problem,
    };
    let view = file
        .tensor(name)
        .map_err(|e| bad(format!("not readable: {e}")))?;
    if view.shape() != shape {
        return Err(bad(format!(
            "shape {:?}, the manifest's config implies {shape:?}",
            view.shape()
        )));
    }
    let data = view.data();
    match view.dtype() {
        safetensors::Dtype::F32 => Ok(data
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect()),
        safetensors::Dtype::F16 => Ok(data
            .chunks_exact(2)
            .map(|b| f16::from_le_bytes([b[0], b[1]]).to_f32())
            .collect()),
        other => Err(bad(format!("dtype {other:?}; bundles hold F16 or F32"))),
    }
}

/// The bundle's `tokenizer.json` and chat template, if it has them.
pub(crate) fn load_tokenizer(
    dir: &Path,
    manifest: &Manifest,
) -> Result<Option<TokenizerBundle>, PipelineError> {
    let Some(entry) = &manifest.tokenizer else {
        return Ok(None);
    };
    let path = dir.join(&entry.path);
    let tokenizer =
        tokenizers::Tokenizer::from_file(&path).map_err(|e| PipelineError::Tokenizer {
            path: path.clone(),
            problem: e.to_string(),
        })?;
    let chat_template = match &entry.chat_template_path {
        Some(rel) => {
            let p = dir.join(rel);
            Some(
                std::fs::read_to_string(&p).map_err(|e| PipelineError::Tokenizer {
                    path: p.clone(),
                    problem: e.to_string(),
                })?,
            )
        }
        None => None,
    };
    Ok(Some(TokenizerBundle {
        tokenizer,
        chat_template,
        bos_token: entry.bos_token.clone(),
        eos_token: entry.eos_token.clone(),
        add_bos: entry.add_bos,
    }))
}
