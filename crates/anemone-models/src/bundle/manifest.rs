//! The bundle manifest `anemone.json`: what was converted, how, from which files, and the sha256
//! of every file written. Maps are sorted and nothing depends on time, so identical inputs give
//! identical bytes.

use std::collections::BTreeMap;

use anemone_checkpoint::{Architecture, DecoderConfig, SourceFile};
use serde::{Deserialize, Serialize};

use crate::ane::{
    ChunkSizing, FunctionSignature, LmHeadPlacement, NormForm, Precision, StateLayout,
};

/// Version of this schema; readers refuse other versions.
pub const SCHEMA_VERSION: u32 = 1;
pub const MANIFEST_FILE: &str = "anemone.json";
pub const HOST_FILE: &str = "host.safetensors";
pub const TOKENIZER_FILE: &str = "tokenizer.json";
pub const CHAT_TEMPLATE_FILE: &str = "chat_template.jinja";
pub const CHUNKS_DIR: &str = "chunks";

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    pub schema_version: u32,
    pub tool: ToolInfo,
    pub architecture: Architecture,
    pub config: DecoderConfig,
    pub conversion: Conversion,
    /// Chunks in layer order; chunk i's output feeds chunk i + 1.
    pub chunks: Vec<ChunkEntry>,
    /// The LM-head package when `conversion.lm_head` is `package`.
    pub lm_head: Option<LmHeadEntry>,
    pub host: HostEntry,
    pub tokenizer: Option<TokenizerEntry>,
    /// sha256 of every file the checkpoint was read from.
    pub provenance: Vec<SourceFile>,
    /// sha256 and size of every file of the bundle except this manifest, by relative path.
    pub files: BTreeMap<String, FileHash>,
    /// What weight compression did (written by the compressor; absent when uncompressed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub compression: Option<serde_json::Value>,
    /// The LoRA adapter merged into the weights before conversion (absent when none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<anemone_checkpoint::LoraRecord>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolInfo {
    pub name: String,
    pub version: String,
}

/// How the bundle was converted.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversion {
    /// Core ML specification version (9 = iOS 18 / macOS 15) and function opset.
    pub spec_version: i32,
    pub opset: String,
    pub context: usize,
    pub prefill_len: usize,
    pub precision: Precision,
    pub norm: NormForm,
    pub state_layout: StateLayout,
    pub chunk_sizing: ChunkSizing,
    pub lm_head: LmHeadPlacement,
    /// head_dim as held in the KV state (rounded up to a multiple of 32; rows beyond
    /// `config.head_dim` are padding, never written or read).
    pub state_head_dim: usize,
    /// Additive mask value for hidden slots.
    pub mask_value: f32,
    /// Slots of the sliding-window layers' ring-buffer KV states (position `p` in slot
    /// `p mod slots`; `crate::ane::kv`). Absent: they keep full-context states with a sliding
    /// mask (every bundle written before rings, and models whose window plus prefill length
    /// reaches the context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_kv_slots: Option<usize>,
}

/// One decoder chunk package.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkEntry {
    pub index: usize,
    /// Relative path of the `.mlpackage` directory.
    pub path: String,
    /// First layer (global index) and number of layers.
    pub first_layer: usize,
    pub layer_count: usize,
    /// `decode` then `prefill`.
    pub functions: Vec<FunctionSignature>,
    /// Bytes of its weight.bin (weights shared by both functions counted once).
    pub weight_bytes: u64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LmHeadEntry {
    pub path: String,
    pub functions: Vec<FunctionSignature>,
    /// `(first token id, count)` of each output `logits_{i}`, in output order.
    pub vocab_slices: Vec<(usize, usize)>,
    pub weight_bytes: u64,
}

/// `host.safetensors`: what runs on the host.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostEntry {
    pub path: String,
    /// Tensor names in the file (Hugging Face names).
    pub tensors: Vec<String>,
    /// safetensors dtype of every tensor (`F16` or `F32`, the bundle precision).
    pub dtype: String,
    /// The LM head is the embedding matrix (`lm_head.weight` absent).
    pub tied_embeddings: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct TokenizerEntry {
    pub path: String,
    pub chat_template_path: Option<String>,
    pub bos_token: Option<String>,
    pub eos_token: Option<String>,
    pub bos_token_id: Option<u32>,
    /// Token ids that end generation.
    pub eos_token_ids: Vec<u32>,
    /// Whether a BOS token is prepended when encoding a plain prompt.
    pub add_bos: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileHash {
    pub sha256: String,
    pub bytes: u64,
}

/// The memory one session's KV state takes: every chunk's states as declared (fp16, the head
/// dimension padded as the state holds it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KvStateMemory {
    /// Bytes of all chunks' states.
    pub bytes: u64,
    /// `bytes / context`: what each token position of the cache costs.
    pub bytes_per_token: u64,
    pub context: usize,
    /// head_dim as the state holds it, and the model's.
    pub state_head_dim: usize,
    pub head_dim: usize,
    /// Slots of the sliding-window layers' rings (absent: every layer holds the full context).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub local_kv_slots: Option<usize>,
    /// What the states would take with every layer at full context (equal to `bytes` without
    /// rings).
    pub full_context_bytes: u64,
}

impl Manifest {
    /// The KV geometry the chunks were built with.
    pub fn kv_layout(&self) -> crate::ane::KvLayout {
        crate::ane::KvLayout::new(
            &self.config,
            self.conversion.context,
            self.conversion.local_kv_slots,
        )
    }

    /// The KV-state memory of one session of this bundle (see [`KvStateMemory`]).
    pub fn kv_state_memory(&self) -> KvStateMemory {
        let states = || {
            self.chunks
                .iter()
                .filter_map(|c| c.functions.first())
                .flat_map(|f| &f.states)
        };
        let bytes_of = |s: &crate::ane::TensorSignature, slots: usize| {
            (s.shape[..s.shape.len() - 1].iter().product::<usize>() * slots * s.dtype.bits() / 8)
                as u64
        };
        let context = self.conversion.context;
        let bytes: u64 = states()
            .map(|s| bytes_of(s, s.shape.last().copied().unwrap_or(0)))
            .sum();
        let full_context_bytes = states().map(|s| bytes_of(s, context)).sum();
        KvStateMemory {
            bytes,
            bytes_per_token: bytes / context.max(1) as u64,
            context,
            state_head_dim: self.conversion.state_head_dim,
            head_dim: self.config.head_dim,
            local_kv_slots: self.conversion.local_kv_slots,
            full_context_bytes,
        }
    }

    /// Relative paths of every package (chunks, then the LM head).
    /// The function signatures the manifest declares for the package at `rel`.
    pub fn declared_functions(&self, rel: &str) -> Option<&[crate::ane::FunctionSignature]> {
        self.chunks
            .iter()
            .find(|c| c.path == rel)
            .map(|c| c.functions.as_slice())
            .or_else(|| {
                self.lm_head
                    .as_ref()
                    .filter(|l| l.path == rel)
                    .map(|l| l.functions.as_slice())
            })
    }

    pub fn package_paths(&self) -> Vec<&str> {
        self.chunks
            .iter()
            .map(|c| c.path.as_str())
            .chain(self.lm_head.as_ref().map(|l| l.path.as_str()))
            .collect()
    }
}
