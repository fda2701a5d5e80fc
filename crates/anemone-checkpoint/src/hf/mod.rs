//! Hugging Face directory import: config.json, (sharded) safetensors, tokenizer files,
//! generation_config.json.

mod fields;
mod safetensors_store;
mod tokenizer_files;

pub use fields::JsonFields;
pub use safetensors_store::SafetensorsStore;
pub use tokenizer_files::{read_tokenizer_files, TokenizerFiles};

use crate::config::DecoderConfig;
use crate::error::{CheckpointError, Result};
use crate::Checkpoint;
use std::path::{Path, PathBuf};

const CONFIG: &str = "config.json";
const SINGLE_FILE: &str = "model.safetensors";
const INDEX_FILE: &str = "model.safetensors.index.json";

/// `config.json` of a Hugging Face checkpoint directory: its path and parsed JSON, which the
/// model family turns into a [`DecoderConfig`] before [`open_dir`] opens the rest.
pub fn read_config(path: &Path) -> Result<(PathBuf, serde_json::Value)> {
    let config_path = path.join(CONFIG);
    if !config_path.is_file() {
        return Err(CheckpointError::MissingFile {
            path: path.to_path_buf(),
            what: CONFIG.into(),
        });
    }
    let json = read_json(&config_path)?;
    Ok((config_path, json))
}

/// Opens the tensors and tokenizer files of a Hugging Face checkpoint directory whose
/// `config.json` (read by [`read_config`] from `config_path`) the family mapped to `config`.
/// The caller checks the tensors against what the family implies.
///
/// EOS ids come from generation_config.json, else config.json, else the tokenizer's EOS token;
/// the BOS id from config.json, else generation_config.json, else the tokenizer's BOS token.
pub fn open_dir(
    path: &Path,
    config_path: PathBuf,
    mut config: DecoderConfig,
) -> Result<Checkpoint> {
    let index_path = path.join(INDEX_FILE);
    let single_path = path.join(SINGLE_FILE);
    let store = if index_path.is_file() {
        SafetensorsStore::open_index(&index_path)?
    } else if single_path.is_file() {
        SafetensorsStore::open_file(&single_path)?
    } else {
        return Err(CheckpointError::MissingFile {
            path: path.to_path_buf(),
            what: format!("{SINGLE_FILE} or {INDEX_FILE}"),
        });
    };

    let tokenizer = read_tokenizer_files(path)?;
    if !tokenizer.generation_eos_ids.is_empty() {
        config.eos_token_ids = tokenizer.generation_eos_ids.clone();
    } else if config.eos_token_ids.is_empty() {
        config.eos_token_ids.extend(tokenizer.tokenizer_eos_id);
    }
    config.bos_token_id = config
        .bos_token_id
        .or(tokenizer.generation_bos_id)
        .or(tokenizer.tokenizer_bos_id);

    let mut source_paths = vec![config_path];
    if index_path.is_file() {
        source_paths.push(index_path);
    }
    source_paths.extend(store.paths());
    source_paths.extend(tokenizer.paths);

    Ok(Checkpoint {
        config,
        tensors: Box::new(store),
        tokenizer: tokenizer.bundle,
        source_paths,
        lora: None,
    })
}

/// Reads and parses a JSON file, naming the file in errors.
pub(crate) fn read_json(path: &Path) -> Result<serde_json::Value> {
    let text = std::fs::read(path).map_err(|source| CheckpointError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    serde_json::from_slice(&text).map_err(|source| CheckpointError::Json {
        path: path.to_path_buf(),
        source,
    })
}
