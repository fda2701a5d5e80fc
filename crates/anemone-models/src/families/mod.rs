//! Model families: one file per architecture family (`llama.rs`, `qwen2.rs`, `qwen3.rs`,
//! `bert.rs`, `modernbert.rs`), each implementing [`Family`] (a Llama-like decoder as one `static`
//! [`decoder::LlamaLike`]) — its name, the `model_type` / `general.architecture` values it reads,
//! its config mapping (Hugging Face `config.json` keys and defaults, GGUF metadata keys), its
//! tensor names (Hugging Face and GGUF) — and the one registry [`FAMILIES`] through which a
//! checkpoint is opened ([`open_checkpoint`]).
//!
//! The layers a family is built from live once and are chosen by the config's flags:
//! [`decoder`] holds what the decoder families share (config parsing, tensor lists, GGUF names),
//! `crate::reference` the fp32 blocks, `crate::ane` the ANE graph blocks, `crate::attention` the
//! causal rule. Adding a family is one new file here plus one line in [`FAMILIES`]
//! (see docs/ARCHITECTURE.md).

pub mod bert;
pub mod decoder;
pub mod gemma3;
mod gemma3_multimodal;
mod llama;
pub mod modernbert;
mod phi3;
mod qwen2;
mod qwen3;

pub use bert::Bert;
pub use gemma3::GEMMA3;
pub use llama::LLAMA;
pub use modernbert::ModernBert;
pub use phi3::PHI3;
pub use qwen2::QWEN2;
pub use qwen3::QWEN3;

use std::path::Path;
use std::sync::Arc;

use anemone_checkpoint::gguf::{self, GgufFile, GgufStore, RowPermutation, TensorDesc};
use anemone_checkpoint::hf::{self, JsonFields};
use anemone_checkpoint::{Checkpoint, CheckpointError, DecoderConfig, Result, TensorStore};

/// Every family anemone knows, in the order error messages list them.
pub static FAMILIES: &[&dyn Family] = &[&LLAMA, &QWEN2, &QWEN3, &PHI3, &GEMMA3];

/// Every encoder family anemone knows (bidirectional, no cache, embeddings and classifier heads).
pub static ENCODER_FAMILIES: &[&dyn EncoderFamily] = &[&Bert, &ModernBert];

/// How a family's model runs, which decides what a runtime keeps between calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ModelKind {
    /// A causal decoder: a prefill, then one token at a time against a KV cache.
    Decoder,
    /// A bidirectional encoder: one call per input (padded to a length bucket), no cache.
    Encoder,
}

impl ModelKind {
    pub fn name(self) -> &'static str {
        match self {
            ModelKind::Decoder => "decoder",
            ModelKind::Encoder => "encoder",
        }
    }
}

/// What an encoder family provides: its identity, its config mapping and its tensor names.
pub trait EncoderFamily: Sync {
    /// The name configs and bundle manifests record (`EncoderConfig::architecture`).
    fn name(&self) -> &'static str;

    fn kind(&self) -> ModelKind;

    /// The `model_type` values of a Hugging Face `config.json` this family reads.
    fn hf_model_types(&self) -> &'static [&'static str];

    /// The prefix transformers' task models put before the base model's tensors (`bert.`).
    fn base_model_prefix(&self, model_type: &str) -> &'static str;

    /// The word-embedding tensor (without prefix), which locates the base model's prefix.
    fn word_embeddings(&self) -> &'static str {
        "embeddings.word_embeddings.weight"
    }

    /// `config.json` → config (its `tensor_prefix` still empty); refuses every feature the
    /// family does not implement.
    fn config_from_hf(
        &self,
        fields: &JsonFields,
        model_type: &str,
    ) -> Result<crate::encoder::EncoderConfig>;

    /// Every tensor `config` implies (prefix applied), with its Hugging Face name and shape.
    fn expected_tensors(&self, config: &crate::encoder::EncoderConfig)
        -> Vec<(String, Vec<usize>)>;
}

/// The encoder family reading Hugging Face `model_type`, if any.
pub fn encoder_by_hf_model_type(model_type: &str) -> Option<&'static dyn EncoderFamily> {
    ENCODER_FAMILIES
        .iter()
        .copied()
        .find(|f| f.hf_model_types().contains(&model_type))
}

/// The encoder family whose name is `name`.
pub fn encoder_by_name(name: &str) -> Result<&'static dyn EncoderFamily> {
    ENCODER_FAMILIES
        .iter()
        .copied()
        .find(|f| f.name() == name)
        .ok_or_else(|| unknown(name, ENCODER_FAMILIES.iter().map(|f| f.name())))
}

/// Every Hugging Face `model_type` anemone reads, decoders then encoders.
pub fn all_hf_model_types() -> impl Iterator<Item = &'static str> {
    FAMILIES
        .iter()
        .flat_map(|f| f.hf_model_types().iter().copied())
        .chain(
            ENCODER_FAMILIES
                .iter()
                .flat_map(|f| f.hf_model_types().iter().copied()),
        )
}

/// The kind of the model in a Hugging Face directory (by its `model_type`) or a GGUF file
/// (always a decoder); an unknown `model_type` is an error naming it and every known one.
pub fn model_kind(path: &Path) -> Result<ModelKind> {
    if !path.is_dir() {
        return Ok(ModelKind::Decoder);
    }
    let (config_path, json) = hf::read_config(path)?;
    let fields = JsonFields::new(&config_path, &json)?;
    let model_type = fields
        .str_opt("model_type")?
        .ok_or_else(|| fields.bad("model_type", "missing"))?;
    if encoder_by_hf_model_type(model_type).is_some() {
        Ok(ModelKind::Encoder)
    } else if by_hf_model_type(model_type).is_ok() {
        Ok(ModelKind::Decoder)
    } else {
        Err(unknown(model_type, all_hf_model_types()))
    }
}

/// What a model family provides: its identity, its config mapping and its tensor names. The
/// blocks it is built from are selected by the flags its configs carry.
pub trait Family: Sync {
    /// The name configs and bundle manifests record (`DecoderConfig::architecture`).
    fn name(&self) -> &'static str;

    fn kind(&self) -> ModelKind;

    /// The `model_type` values of a Hugging Face `config.json` this family reads.
    fn hf_model_types(&self) -> &'static [&'static str];

    /// The `general.architecture` of a GGUF file this family reads (also its metadata key prefix).
    fn gguf_architecture(&self) -> &'static str;

    /// `config.json` → config; refuses every feature the family's blocks do not implement.
    fn config_from_hf(&self, fields: &JsonFields) -> Result<DecoderConfig>;

    /// GGUF metadata (and what the tensor list says) → config.
    fn config_from_gguf(
        &self,
        file: &GgufFile,
        tokenizer: Option<&gguf::tokenizer::GgufTokenizer>,
    ) -> Result<DecoderConfig>;

    /// Every tensor `config` implies, with its Hugging Face name and shape.
    fn expected_tensors(&self, config: &DecoderConfig) -> Vec<(String, Vec<usize>)>;

    /// The Hugging Face name of a GGUF tensor and the row permutation to undo on load; an error
    /// for a tensor this family does not have.
    fn tensor_from_gguf(
        &self,
        file: &GgufFile,
        desc: &TensorDesc,
        config: &DecoderConfig,
    ) -> Result<(String, RowPermutation)>;

    /// The tensors of a Hugging Face directory as the decoder blocks name them (Phi-3 splits its
    /// fused projections here); most families store them that way already.
    fn adapt_hf_tensors(
        &self,
        store: Box<dyn TensorStore>,
        _config: &DecoderConfig,
    ) -> Result<Box<dyn TensorStore>> {
        Ok(store)
    }

    /// The tensors of a GGUF file (under [`Family::tensor_from_gguf`]'s names) as the decoder
    /// blocks name them (Phi-3 splits its fused projections here).
    fn adapt_gguf_tensors(
        &self,
        store: Box<dyn TensorStore>,
        _config: &DecoderConfig,
    ) -> Result<Box<dyn TensorStore>> {
        Ok(store)
    }

    /// The checkpoint of a Hugging Face directory as the shared blocks read it (Gemma reads its
    /// `(1 + w)` norm weights as the multiplier); unchanged for most families.
    fn adapt_hf_checkpoint(&self, checkpoint: Checkpoint) -> Checkpoint {
        checkpoint
    }
}

fn unknown(arch: &str, known: impl Iterator<Item = &'static str>) -> CheckpointError {
    CheckpointError::UnknownArchitecture {
        arch: arch.to_string(),
        known: known.collect::<Vec<_>>().join(", "),
    }
}

/// The family whose [`Family::name`] is `name` (as recorded in configs and manifests).
pub fn by_name(name: &str) -> Result<&'static dyn Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.name() == name)
        .ok_or_else(|| unknown(name, FAMILIES.iter().map(|f| f.name())))
}

/// The family reading Hugging Face `model_type`.
pub fn by_hf_model_type(model_type: &str) -> Result<&'static dyn Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.hf_model_types().contains(&model_type))
        .ok_or_else(|| {
            unknown(
                model_type,
                FAMILIES
                    .iter()
                    .flat_map(|f| f.hf_model_types().iter().copied()),
            )
        })
}

/// The family reading GGUF `general.architecture`.
pub fn by_gguf_architecture(architecture: &str) -> Result<&'static dyn Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.gguf_architecture() == architecture)
        .ok_or_else(|| unknown(architecture, FAMILIES.iter().map(|f| f.gguf_architecture())))
}

/// The family of `config`.
pub fn family_of(config: &DecoderConfig) -> Result<&'static dyn Family> {
    by_name(config.architecture.name())
}

/// Every tensor `config` implies (its family's list), with Hugging Face name and shape.
pub fn expected_tensors(config: &DecoderConfig) -> Result<Vec<(String, Vec<usize>)>> {
    Ok(family_of(config)?.expected_tensors(config))
}

/// Checks the config's consistency and that every tensor it implies exists with its shape.
pub fn validate_checkpoint(checkpoint: &Checkpoint) -> Result<()> {
    let family = family_of(&checkpoint.config)?;
    checkpoint.config.validate()?;
    checkpoint.check_tensors(&family.expected_tensors(&checkpoint.config))
}

/// Opens a Hugging Face directory or a `.gguf` file, chosen by what `path` is, through the family
/// its `model_type` / `general.architecture` names, and validates it.
pub fn open_checkpoint(path: impl AsRef<Path>) -> Result<Checkpoint> {
    let path = path.as_ref();
    if path.is_dir() {
        open_hf_dir(path)
    } else if path.is_file() {
        open_gguf_file(path)
    } else if path.symlink_metadata().is_ok() {
        // a device, FIFO or socket (e.g. /dev/null): it exists, it is just not a checkpoint
        Err(CheckpointError::Unsupported {
            path: path.to_path_buf(),
            what: "not a regular file or a directory (a device, FIFO or socket); expected a \
                   .gguf file or a Hugging Face checkpoint directory"
                .into(),
        })
    } else {
        Err(CheckpointError::NotFound {
            path: path.to_path_buf(),
        })
    }
}

fn open_hf_dir(path: &Path) -> Result<Checkpoint> {
    let (config_path, json) = hf::read_config(path)?;
    let fields = JsonFields::new(&config_path, &json)?;
    let model_type = fields
        .str_opt("model_type")?
        .ok_or_else(|| fields.bad("model_type", "missing"))?;
    if encoder_by_hf_model_type(model_type).is_some() {
        return Err(fields.bad(
            "model_type",
            format!(
                "\"{model_type}\" is an encoder, not a decoder: run it with `anemone embed` or \
                 `anemone classify`"
            ),
        ));
    }
    let family = by_hf_model_type(model_type)?;
    let config = family.config_from_hf(&fields)?;
    let mut checkpoint = hf::open_dir(path, config_path, config)?;
    let raw = std::mem::replace(
        &mut checkpoint.tensors,
        Box::new(anemone_checkpoint::MemoryStore::new()),
    );
    checkpoint.tensors = family.adapt_hf_tensors(raw, &checkpoint.config)?;
    let checkpoint = family.adapt_hf_checkpoint(checkpoint);
    validate_checkpoint(&checkpoint)?;
    tracing::debug!(dir = %path.display(), config = ?checkpoint.config, "opened Hugging Face checkpoint");
    Ok(checkpoint)
}

fn open_gguf_file(path: &Path) -> Result<Checkpoint> {
    let started = std::time::Instant::now();
    let file = Arc::new(GgufFile::open(path)?);
    // The architecture first: an unknown one is the clearest thing to report.
    let family = by_gguf_architecture(file.metadata.str("general.architecture")?)?;
    let tokenizer = gguf::tokenizer::build(&file.metadata)?;
    let config = family.config_from_gguf(&file, tokenizer.as_ref())?;
    let store = GgufStore::new(file.clone(), |desc| {
        family.tensor_from_gguf(&file, desc, &config)
    })?;
    let tensors = family.adapt_gguf_tensors(Box::new(store), &config)?;
    let checkpoint = Checkpoint {
        config,
        tensors,
        tokenizer: tokenizer.map(|t| t.bundle),
        source_paths: vec![path.to_path_buf()],
        lora: None,
    };
    validate_checkpoint(&checkpoint)?;
    tracing::info!(
        path = %path.display(),
        version = file.version,
        architecture = family.name(),
        tensors = file.tensors.len(),
        elapsed_ms = started.elapsed().as_millis() as u64,
        "opened GGUF"
    );
    Ok(checkpoint)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registry_names_are_unique_and_resolve() {
        for family in FAMILIES {
            assert_eq!(by_name(family.name()).unwrap().name(), family.name());
            assert_eq!(
                by_gguf_architecture(family.gguf_architecture())
                    .unwrap()
                    .name(),
                family.name()
            );
            for model_type in family.hf_model_types() {
                assert_eq!(by_hf_model_type(model_type).unwrap().name(), family.name());
            }
        }
    }

    #[test]
    fn unknown_names_list_the_known_ones() {
        match by_hf_model_type("t5") {
            Err(CheckpointError::UnknownArchitecture { arch, known }) => {
                assert_eq!(arch, "t5");
                assert_eq!(known, "llama, qwen2, qwen3, phi3, gemma3_text, gemma3");
            }
            other => panic!(
                "expected UnknownArchitecture, got {:?}",
                other.map(|f| f.name())
            ),
        }
        let err = by_gguf_architecture("mamba").map(|f| f.name()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "unsupported architecture `mamba` (supported: llama, qwen2, qwen3, phi3, gemma3)"
        );
    }
}
