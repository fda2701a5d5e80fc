//! What runs on the host: the token embedding, the final RMSNorm and the LM head (read from
//! `host.safetensors`), and the bundle's tokenizer.

use std::borrow::Cow;
use std::path::Path;

use anemone_checkpoint::TokenizerBundle;
use anemone_exec::team::{self, SharedOut, Team};
use anemone_models::bundle::Manifest;
use anemone_models::families::decoder::tensor_names::{EMBED_TOKENS as EMBED, FINAL_NORM, LM_HEAD};
use anemone_models::reference::kernels::{dot, dot_f16};
use half::f16;

/// Bytes of LM-head rows per block claimed by a thread of the team.
const HEAD_BLOCK_BYTES: usize = 256 << 10;

use super::PipelineError;

/// A host tensor kept in its stored dtype: fp16 tensors stay fp16 (half the memory of f32) and
/// are widened exactly when read, so every result equals the f32 computation on the widened
/// values bit for bit.
enum HostTensor {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

impl HostTensor {
    fn row(&self, row: usize, width: usize) -> Cow<'_, [f32]> {
        let range = row * width..(row + 1) * width;
        match self {
            HostTensor::F32(v) => Cow::Borrowed(&v[range]),
            HostTensor::F16(v) => Cow::Owned(v[range].iter().map(|h| h.to_f32()).collect()),
        }
    }

    /// `Σ_i self[row, i]·x[i]`, the same sums in the same order for either dtype.
    fn dot_row(&self, row: usize, x: &[f32]) -> f32 {
        let range = row * x.len()..(row + 1) * x.len();
        match self {
            HostTensor::F32(v) => dot(&v[range], x),
            HostTensor::F16(v) => dot_f16(&v[range], x),
        }
    }
}

/// Host tensors in their stored dtype (F16 or F32), in Hugging Face layout (`[vocab, hidden]`
/// rows); sums run in f32.
pub struct HostWeights {
    hidden: usize,
    vocab: usize,
    eps: f32,
    embed: HostTensor,
    final_norm: Vec<f32>,
    /// `None` when the head is tied to the embedding or runs as its own package.
    lm_head: Option<HostTensor>,
    /// The head runs on the host (else in the LM-head package, which holds its own norm).
    head_on_host: bool,
}

impl HostWeights {
    pub fn load(dir: &Path, manifest: &Manifest) -> Result<Self, PipelineError> {
        let path = dir.join(&manifest.host.path);
        let io = |e: std::io::Error| PipelineError::Host {
            path: path.clone(),
            tensor: "(file)".into(),
            problem: e.to_string(),
        };
        let file = std::fs::File::open(&path).map_err(io)?;
        // SAFETY: the bundle's files are not modified while a pipeline loads them (bundles are
        // replaced by atomic directory exchange, never written in place); the map is dropped
        // before this function returns.
        let bytes = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
        let file =
            safetensors::SafeTensors::deserialize(&bytes).map_err(|e| PipelineError::Host {
                path: path.clone(),
                tensor: "(header)".into(),
                problem: e.to_string(),
            })?;
        let c = &manifest.config;
        let (h, vocab) = (c.hidden_size, c.vocab_size);
        let head_on_host = manifest.lm_head.is_none();
        let load = |name: &str, shape: &[usize]| read_tensor(&path, &file, &bytes, name, shape);
        let embed = load(EMBED, &[vocab, h])?;
        let final_norm = match load(FINAL_NORM, &[h])? {
            HostTensor::F32(v) => v,
            HostTensor::F16(v) => v.iter().map(|x| x.to_f32()).collect(),
        };
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

    /// The embedding row of `id` as f32 (checked against the vocabulary by the caller).
    pub fn embedding(&self, id: u32) -> Cow<'_, [f32]> {
        self.embed.row(id as usize, self.hidden)
    }

    /// Whether [`HostWeights::logits`] is the head (else the LM-head package is).
    pub fn head_on_host(&self) -> bool {
        self.head_on_host
    }

    /// `lm_head(rms_norm(x) · w)` for one hidden vector, in f32, its rows spread over `team`
    /// (each row one [`dot`] / [`dot_f16`], whichever thread runs it).
    pub fn logits(&self, x: &[f32], team: Option<&Team>) -> Vec<f32> {
        let h = self.hidden;
        let mean_sq = x.iter().map(|v| (*v as f64) * (*v as f64)).sum::<f64>() / h as f64;
        let inv = 1.0 / (mean_sq + self.eps as f64).sqrt();
        let normed: Vec<f32> = x
            .iter()
            .zip(&self.final_norm)
            .map(|(v, w)| (*v as f64 * inv) as f32 * w)
            .collect();
        let head = self.lm_head.as_ref().unwrap_or(&self.embed);
        let mut logits = vec![0f32; self.vocab];
        let row_bytes = h * if matches!(head, HostTensor::F16(_)) {
            2
        } else {
            4
        };
        let rows_per_block = (HEAD_BLOCK_BYTES / row_bytes.max(1)).max(1);
        let blocks = self.vocab.div_ceil(rows_per_block);
        let out = SharedOut::new(&mut logits);
        let vocab = self.vocab;
        team::for_each_block(team, blocks, &|b| {
            let first = b * rows_per_block;
            let last = (first + rows_per_block).min(vocab);
            // SAFETY: blocks are disjoint row ranges of `logits`, which outlives the region.
            let rows = unsafe { out.slice(first..last) };
            for (i, o) in rows.iter_mut().enumerate() {
                *o = head.dot_row(first + i, &normed);
            }
        });
        logits
    }
}

/// A tensor of `file` in its stored dtype, checked against `shape` (F16 or F32 on disk). The
/// file's pages are released from the map as they are copied, so loading never holds the file
/// and the tensors at once.
fn read_tensor(
    path: &Path,
    file: &safetensors::SafeTensors,
    map: &memmap2::Mmap,
    name: &str,
    shape: &[usize],
) -> Result<HostTensor, PipelineError> {
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
    let offset = data.as_ptr() as usize - map.as_ptr() as usize;
    const BLOCK: usize = 8 << 20;
    let release = |at: usize, len: usize| {
        // page-aligned inner part of [at, at + len): never read again
        let page = 4096;
        let (lo, hi) = (at.div_ceil(page) * page, (at + len) / page * page);
        if hi > lo {
            // SAFETY: the range lies inside the map and its bytes have been copied; nothing
            // reads them again (a read would see the file again, not zeros: the map is shared).
            let _ = unsafe {
                map.unchecked_advise_range(memmap2::UncheckedAdvice::DontNeed, lo, hi - lo)
            };
        }
    };
    match view.dtype() {
        safetensors::Dtype::F32 => {
            let mut out = Vec::with_capacity(data.len() / 4);
            for (i, block) in data.chunks(BLOCK).enumerate() {
                out.extend(
                    block
                        .chunks_exact(4)
                        .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])),
                );
                release(offset + i * BLOCK, block.len());
            }
            Ok(HostTensor::F32(out))
        }
        safetensors::Dtype::F16 => {
            let mut out = Vec::with_capacity(data.len() / 2);
            for (i, block) in data.chunks(BLOCK).enumerate() {
                out.extend(
                    block
                        .chunks_exact(2)
                        .map(|b| f16::from_le_bytes([b[0], b[1]])),
                );
                release(offset + i * BLOCK, block.len());
            }
            Ok(HostTensor::F16(out))
        }
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
