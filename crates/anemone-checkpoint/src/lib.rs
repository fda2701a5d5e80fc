//! Checkpoint containers: Hugging Face directories (config.json, safetensors, tokenizer files) and
//! GGUF files (metadata, dequantizers, embedded tokenizer), and the [`Checkpoint`] they become — a
//! decoder config, lazily loaded tensors under Hugging Face names, and the tokenizer with its chat
//! template.
//!
//! What a model family makes of a container (its config keys and defaults, its tensor names) is
//! not here: `anemone_models::families` resolves the family and opens checkpoints through this
//! crate's readers (see docs/ARCHITECTURE.md).

// Library code reports failures as errors; tests may unwrap (docs/ARCHITECTURE.md, "Lint gates").
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::panic,
        clippy::todo,
        clippy::unimplemented,
        clippy::dbg_macro
    )
)]

pub mod config;
pub mod error;
pub mod gguf;
pub mod hf;
pub mod lora;
pub mod store;
pub mod tokenizer;

pub use config::{Architecture, DecoderConfig, GemmaConfig, InvalidConfig, LongRope, RopeFactors};
pub use error::{CheckpointError, Result};
pub use lora::{apply_lora, LoraRecord};
pub use store::{MemoryStore, TensorInfo, TensorStore};
pub use tokenizer::TokenizerBundle;

use std::path::{Path, PathBuf};

/// A source file of a checkpoint and the sha256 of its bytes (recorded in bundle provenance).
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SourceFile {
    pub path: PathBuf,
    pub sha256: String,
    pub bytes: u64,
}

/// An imported checkpoint: everything the reference forward and the converter need.
///
/// Invariant (for checkpoints opened by `anemone_models::open_checkpoint`): every tensor the config
/// implies exists in `tensors` under its Hugging Face name (`model.embed_tokens.weight`,
/// `model.layers.{i}.self_attn.q_proj.weight`, …) with the Hugging Face shape
/// (`[out_features, in_features]` for projections), checked by [`Checkpoint::check_tensors`]
/// against the family's list. `lm_head.weight` is absent when embeddings are tied.
pub struct Checkpoint {
    pub config: DecoderConfig,
    pub tensors: Box<dyn TensorStore>,
    pub tokenizer: Option<TokenizerBundle>,
    /// Files the checkpoint was read from; hashing is done on demand by [`Checkpoint::provenance`].
    pub source_paths: Vec<PathBuf>,
    /// The LoRA adapter merged into `tensors` ([`apply_lora`]), if any.
    pub lora: Option<LoraRecord>,
}

impl std::fmt::Debug for Checkpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Checkpoint")
            .field("config", &self.config)
            .field("tensors", &self.tensors.names().len())
            .field("tokenizer", &self.tokenizer.is_some())
            .field("source_paths", &self.source_paths)
            .field("lora", &self.lora.as_ref().map(|l| &l.dir))
            .finish()
    }
}

impl Checkpoint {
    /// Checks that every `(name, shape)` of `expected` exists in `tensors` with that shape.
    pub fn check_tensors(&self, expected: &[(String, Vec<usize>)]) -> Result<()> {
        for (name, shape) in expected {
            let info = self
                .tensors
                .info(name)
                .ok_or_else(|| CheckpointError::MissingTensor { name: name.clone() })?;
            if info.shape != *shape {
                return Err(CheckpointError::ShapeMismatch {
                    name: name.clone(),
                    expected: shape.clone(),
                    found: info.shape,
                });
            }
        }
        Ok(())
    }

    /// Loads a tensor as f32 (dequantizing or widening as needed).
    pub fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        self.tensors.load_f32(name)
    }

    /// [`Checkpoint::load_f32`] into a buffer the caller owns (exactly the tensor's length).
    pub fn load_f32_into(&self, name: &str, out: &mut [f32]) -> Result<()> {
        self.tensors.load_f32_into(name, out)
    }

    /// sha256 of every source file.
    pub fn provenance(&self) -> Result<Vec<SourceFile>> {
        self.source_paths.iter().map(|p| hash_file(p)).collect()
    }
}

/// Bytes read a time by [`hash_file`]: below glibc's 128 KiB mapping threshold, so the buffer
/// is an ordinary heap block. A 1 MiB one was mapped and unmapped, which raised glibc's threshold
/// to 1 MiB: later buffers of each hashing thread then came from its arena and stayed resident
/// after the hashing (~0.5 MiB a thread for the rest of a `generate`); the sums are as fast.
const HASH_CHUNK: usize = 64 << 10;

/// sha256 of a file, streamed.
pub fn hash_file(path: &Path) -> Result<SourceFile> {
    use sha2::{Digest, Sha256};
    use std::io::Read;
    let io = |source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = std::fs::File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; HASH_CHUNK];
    let mut bytes = 0u64;
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        bytes += n as u64;
        hasher.update(&buf[..n]);
    }
    Ok(SourceFile {
        path: path.to_path_buf(),
        sha256: hex::encode(hasher.finalize()),
        bytes,
    })
}
