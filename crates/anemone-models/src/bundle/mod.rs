//! Bundles: the manifest schema (`anemone.json`), the writer behind `anemone convert`, and the
//! reader/verifier a runtime uses to load one.

pub mod host;
pub mod manifest;
pub mod read;
pub mod writer;

pub use manifest::{
    ChunkEntry, Conversion, FileHash, HostEntry, KvStateMemory, LmHeadEntry, Manifest,
    TokenizerEntry, ToolInfo, CHAT_TEMPLATE_FILE, CHUNKS_DIR, HOST_FILE, MANIFEST_FILE,
    SCHEMA_VERSION, TOKENIZER_FILE,
};
pub use read::{
    interface_mismatches, is_os_metadata, read_manifest, signature_mismatches, verify_bundle,
    verify_files, FileCheck, Verification,
};
pub use writer::{convert, is_bundle_dir, ConvertOptions, ConvertSummary, Progress};

use std::path::PathBuf;

use crate::ane::AneError;

/// Errors writing or reading a bundle; each names the path or the step it is about.
#[derive(Debug, thiserror::Error)]
pub enum BundleError {
    #[error("{}: {problem}", path.display())]
    Layout { path: PathBuf, problem: String },
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
    #[error("{}: {problem}", path.display())]
    Schema { path: PathBuf, problem: String },
    #[error("{}: safetensors: {problem}", path.display())]
    Safetensors { path: PathBuf, problem: String },
    #[error("tokenizer: {problem}")]
    Tokenizer { problem: String },
    #[error(transparent)]
    Staging(#[from] anemone_mil::staging::StagingError),
    #[error(transparent)]
    Ane(#[from] AneError),
    #[error(transparent)]
    Mil(#[from] anemone_mil::MilError),
    #[error(transparent)]
    Checkpoint(#[from] anemone_checkpoint::CheckpointError),
}
