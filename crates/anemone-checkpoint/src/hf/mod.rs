//! Hugging Face directory import: config.json, (sharded) safetensors, tokenizer files,
//! generation_config.json.

use crate::{Checkpoint, Result};
use std::path::Path;

pub fn open_dir(path: &Path) -> Result<Checkpoint> {
    let _ = path;
    unimplemented!("Hugging Face import is being written")
}
