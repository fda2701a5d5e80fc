//! Encoders: the config and pooling ([`config`]), opening a Hugging Face encoder directory
//! through its family ([`open_encoder`]), tokenization that never truncates ([`tokenize`]), the
//! fp32 reference forward ([`mod@reference`]), the ANE graph with one function per length bucket
//! ([`ane`]) and the encoder bundle ([`bundle`]).

pub mod ane;
pub mod bundle;
pub mod config;
pub mod reference;
pub mod tokenize;

pub use config::{
    read_pooling, AttentionSpan, EncoderConfig, EncoderLayout, HeadPooling, Pooling, PoolingMode,
    RopeLayout,
};
pub use reference::{EncoderReference, EncoderTrace};
pub use tokenize::{Buckets, Encoded, EncoderTokenizer};

use std::path::{Path, PathBuf};

use anemone_checkpoint::hf::{self, JsonFields, SafetensorsStore};
use anemone_checkpoint::{CheckpointError, TensorStore, TokenizerBundle};

use crate::families::{self, EncoderFamily};

/// Errors of the encoder path; each names the file, tensor, input or option it is about.
#[derive(Debug, thiserror::Error)]
pub enum EncoderError {
    #[error(transparent)]
    Checkpoint(#[from] CheckpointError),
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json {
        path: PathBuf,
        #[source]
        source: serde_json::Error,
    },
    #[error("{}: pooling: {problem}", path.display())]
    Pooling { path: PathBuf, problem: String },
    #[error("{}: no tokenizer.json (an encoder needs its tokenizer)", dir.display())]
    NoTokenizer { dir: PathBuf },
    #[error("tokenizer: {problem}")]
    Tokenizer { problem: String },
    #[error("input {index}: empty text (nothing to embed; an empty or whitespace-only input is refused)")]
    EmptyInput { index: usize },
    #[error("input {index}: {tokens} tokens, longer than the largest bucket {largest} (inputs are never truncated; convert with a larger --lengths)")]
    TooLong {
        index: usize,
        tokens: usize,
        largest: usize,
    },
    #[error("input {index}: token id {id} is outside the vocabulary ({vocab})")]
    TokenId { index: usize, id: u32, vocab: usize },
    #[error("--lengths: {problem}")]
    Lengths { problem: String },
    #[error("tensor `{tensor}`: {problem}")]
    Tensor { tensor: String, problem: String },
}

pub type Result<T, E = EncoderError> = std::result::Result<T, E>;

/// An opened encoder checkpoint: config, pooling, tensors and tokenizer.
pub struct EncoderCheckpoint {
    pub config: EncoderConfig,
    pub pooling: Pooling,
    pub tensors: Box<dyn TensorStore>,
    pub tokenizer: Option<TokenizerBundle>,
    pub source_paths: Vec<PathBuf>,
    pub dir: PathBuf,
}

impl std::fmt::Debug for EncoderCheckpoint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EncoderCheckpoint")
            .field("config", &self.config)
            .field("pooling", &self.pooling)
            .field("dir", &self.dir)
            .finish()
    }
}

impl EncoderCheckpoint {
    pub fn load_f32(&self, name: &str) -> Result<Vec<f32>> {
        Ok(self.tensors.load_f32(name)?)
    }

    pub fn family(&self) -> Result<&'static dyn EncoderFamily> {
        Ok(families::encoder_by_name(&self.config.architecture)?)
    }

    /// The tokenizer with padding and truncation switched off.
    pub fn encoder_tokenizer(&self) -> Result<EncoderTokenizer> {
        let bundle = self
            .tokenizer
            .as_ref()
            .ok_or_else(|| EncoderError::NoTokenizer {
                dir: self.dir.clone(),
            })?;
        EncoderTokenizer::new(bundle.tokenizer.clone())
    }
}

/// Opens a Hugging Face encoder directory through the family its `model_type` names, finds the
/// tensor prefix (`""` for a base model, `bert.` / `roberta.` for a task model), reads the
/// pooling, and checks every tensor the config implies.
pub fn open_encoder(path: impl AsRef<Path>) -> Result<EncoderCheckpoint> {
    let dir = path.as_ref();
    if !dir.is_dir() {
        return Err(CheckpointError::NotFound {
            path: dir.to_path_buf(),
        }
        .into());
    }
    let (config_path, json) = hf::read_config(dir)?;
    let fields = JsonFields::new(&config_path, &json)?;
    let model_type = fields
        .str_opt("model_type")?
        .ok_or_else(|| fields.bad("model_type", "missing"))?;
    let Some(family) = families::encoder_by_hf_model_type(model_type) else {
        return Err(match families::by_hf_model_type(model_type) {
            Ok(_) => fields.unsupported(
                "model_type",
                format!("\"{model_type}\" is a decoder, not an encoder: use `anemone generate`"),
            ),
            Err(_) => CheckpointError::UnknownArchitecture {
                arch: model_type.to_string(),
                known: families::all_hf_model_types()
                    .collect::<Vec<_>>()
                    .join(", "),
            },
        }
        .into());
    };
    let mut config = family.config_from_hf(&fields, model_type)?;
    let single = dir.join("model.safetensors");
    let index = dir.join("model.safetensors.index.json");
    let store = if index.is_file() {
        SafetensorsStore::open_index(&index)?
    } else if single.is_file() {
        SafetensorsStore::open_file(&single)?
    } else {
        return Err(CheckpointError::MissingFile {
            path: dir.to_path_buf(),
            what: "model.safetensors or model.safetensors.index.json".into(),
        }
        .into());
    };
    let base = family.base_model_prefix(model_type);
    let probe = family.word_embeddings();
    config.tensor_prefix = ["", base]
        .into_iter()
        .find(|p| store.info(&format!("{p}{probe}")).is_some())
        .ok_or_else(|| CheckpointError::MissingTensor {
            name: format!("{probe} (or {base}{probe})"),
        })?
        .to_string();
    if config.type_vocab_size > 0
        && store
            .info(&config.tensor("embeddings.token_type_embeddings.weight"))
            .is_none()
    {
        config.type_vocab_size = 0;
    }
    let pooling = read_pooling(dir)?;
    let tokenizer = hf::read_tokenizer_files(dir)?;
    let mut source_paths = vec![config_path];
    source_paths.extend(store.paths());
    source_paths.extend(tokenizer.paths);
    let checkpoint = EncoderCheckpoint {
        config,
        pooling,
        tensors: Box::new(store),
        tokenizer: tokenizer.bundle,
        source_paths,
        dir: dir.to_path_buf(),
    };
    check_tensors(&checkpoint, family)?;
    tracing::debug!(dir = %dir.display(), config = ?checkpoint.config, pooling = ?checkpoint.pooling, "opened encoder");
    Ok(checkpoint)
}

fn check_tensors(checkpoint: &EncoderCheckpoint, family: &dyn EncoderFamily) -> Result<()> {
    for (name, shape) in family.expected_tensors(&checkpoint.config) {
        let info = checkpoint
            .tensors
            .info(&name)
            .ok_or_else(|| CheckpointError::MissingTensor { name: name.clone() })?;
        if info.shape != shape {
            return Err(CheckpointError::ShapeMismatch {
                name,
                expected: shape,
                found: info.shape,
            }
            .into());
        }
    }
    Ok(())
}
