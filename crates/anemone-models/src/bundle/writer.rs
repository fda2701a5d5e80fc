//! Writes a bundle: host weights, tokenizer, one package per chunk (streamed one layer at a time),
//! the optional LM-head package, and the manifest with every file's sha256. Everything goes into
//! a partial directory beside the destination under a writer lock, swapped in whole at the end
//! ([`anemone_mil::staging`]); `--force` replaces only a bundle or an empty directory, never one
//! holding an input.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};

use anemone_checkpoint::Checkpoint;
use anemone_mil::staging::{remove_stale, ReplacePolicy, Staging};
use anemone_mil::{write_package, WriteOptions};

use super::host::write_host_file;
use super::manifest::*;
use super::read::hash_tree;
use super::BundleError;
use crate::ane::{
    self, build_chunk_program, chunk_signature, plan_chunks, ChunkOptions, ChunkSizing,
    FunctionSignature, LayerWeights, LmHeadPlacement, WeightCompressor,
};

/// Everything `anemone convert` decides.
#[derive(Debug, Clone)]
pub struct ConvertOptions {
    pub chunk: ChunkOptions,
    pub sizing: ChunkSizing,
    pub lm_head: LmHeadPlacement,
    /// Replace an existing bundle at the destination.
    pub force: bool,
}

impl Default for ConvertOptions {
    fn default() -> Self {
        ConvertOptions {
            chunk: ChunkOptions::default(),
            sizing: ChunkSizing::default(),
            lm_head: LmHeadPlacement::Host,
            force: false,
        }
    }
}

/// Progress of a conversion: `done` of `total` steps, with what is being done now.
#[derive(Debug, Clone)]
pub struct Progress {
    pub done: usize,
    pub total: usize,
    pub message: String,
}

/// What a conversion wrote.
#[derive(Debug, Clone)]
pub struct ConvertSummary {
    pub out: PathBuf,
    pub manifest: Manifest,
    /// Total bytes of the bundle's files.
    pub total_bytes: u64,
}

/// Converts `checkpoint` into a bundle at `out`.
pub fn convert(
    checkpoint: &Checkpoint,
    out: &Path,
    options: &ConvertOptions,
    compressor: &dyn WeightCompressor,
    progress: &mut dyn FnMut(Progress),
) -> Result<ConvertSummary, BundleError> {
    let config = &checkpoint.config;
    check_supported(config)?;
    options.chunk.validate(config.max_position_embeddings)?;
    crate::families::validate_checkpoint(checkpoint)?;
    let plan = plan_chunks(config, options.sizing, options.chunk.precision)?;
    let inputs: Vec<&Path> = checkpoint
        .source_paths
        .iter()
        .map(PathBuf::as_path)
        .collect();
    let policy = ReplacePolicy {
        force: options.force,
        is_ours: &is_bundle_dir,
        inputs: &inputs,
    };
    let staging = Staging::begin(out, &policy)?;
    remove_stale_beside(out);
    let dir = staging.path();
    fs::create_dir_all(dir.join(CHUNKS_DIR)).map_err(io(dir))?;
    // On an error the staging is dropped, which removes its partial directory.
    let manifest = write_bundle(checkpoint, dir, &plan, options, compressor, progress)?;
    staging.commit(&policy)?;
    let total_bytes = manifest.files.values().map(|f| f.bytes).sum();
    Ok(ConvertSummary {
        out: out.to_path_buf(),
        manifest,
        total_bytes,
    })
}

/// Whether `path` is a bundle anemone could have written: a directory with `anemone.json`.
pub fn is_bundle_dir(path: &Path) -> bool {
    path.join(MANIFEST_FILE).is_file()
}

/// Removes the partial outputs of dead writers beside `out` (kill -9, power loss); a failure
/// only warns, it is not this conversion's business.
fn remove_stale_beside(out: &Path) {
    let parent = match out.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    match remove_stale(parent) {
        Ok(removed) => {
            for path in removed {
                tracing::warn!("removed {} left by an interrupted run", path.display());
            }
        }
        Err(e) => tracing::warn!("cannot clean stale partial outputs: {e}"),
    }
}

/// The config's consistency ([`DecoderConfig::validate`](anemone_checkpoint::DecoderConfig::validate))
/// and the dimensions one ANE op takes.
fn check_supported(config: &anemone_checkpoint::DecoderConfig) -> Result<(), BundleError> {
    config.validate().map_err(ane::AneError::from)?;
    let bad = |problem: String| Err(ane::AneError::Unsupported { problem }.into());
    for (what, d) in [
        ("hidden_size", config.hidden_size),
        ("intermediate_size", config.intermediate_size),
        ("q_dim", config.q_dim()),
    ] {
        if d > ane::options::MAX_ANE_DIM {
            return bad(format!(
                "{what} {d} exceeds {} (not split yet)",
                ane::options::MAX_ANE_DIM
            ));
        }
    }
    Ok(())
}

fn write_bundle(
    checkpoint: &Checkpoint,
    dir: &Path,
    plan: &[std::ops::Range<usize>],
    options: &ConvertOptions,
    compressor: &dyn WeightCompressor,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, BundleError> {
    // sha256 of the source files (a full read of the checkpoint) overlaps the conversion
    std::thread::scope(|scope| {
        let provenance = scope.spawn(|| checkpoint.provenance());
        let manifest = write_contents(checkpoint, dir, plan, options, compressor, progress);
        let provenance = provenance.join().map_err(|_| BundleError::Layout {
            path: dir.to_path_buf(),
            problem: "the provenance hashing thread panicked".into(),
        })??;
        let mut manifest = manifest?;
        manifest.provenance = provenance;
        write_manifest(dir, &manifest)?;
        Ok(manifest)
    })
}

fn write_manifest(dir: &Path, manifest: &Manifest) -> Result<(), BundleError> {
    let path = dir.join(MANIFEST_FILE);
    let mut text = serde_json::to_string_pretty(manifest).map_err(|e| BundleError::Json {
        path: path.clone(),
        source: e,
    })?;
    text.push('\n');
    fs::write(&path, text).map_err(io(&path))
}

/// Everything but the manifest file; the manifest's provenance is left empty.
fn write_contents(
    checkpoint: &Checkpoint,
    dir: &Path,
    plan: &[std::ops::Range<usize>],
    options: &ConvertOptions,
    compressor: &dyn WeightCompressor,
    progress: &mut dyn FnMut(Progress),
) -> Result<Manifest, BundleError> {
    // the config as the bundle's context sees it (LongRoPE's factors), recorded in the manifest
    let config = &checkpoint.config.for_context(options.chunk.context);
    let copts = &options.chunk;
    // hashes already known from writing (package model and weights), by absolute path
    let mut known = BTreeMap::new();
    let lm_package = options.lm_head == LmHeadPlacement::Package;
    let total = 2 + config.num_hidden_layers + usize::from(lm_package);
    let mut done = 0;
    let mut step = |done: &mut usize, message: String| {
        progress(Progress {
            done: *done,
            total,
            message,
        });
        *done += 1;
    };

    step(&mut done, "host weights".into());
    let host = write_host_file(
        checkpoint,
        &dir.join(HOST_FILE),
        copts.precision,
        !lm_package,
    )?;

    step(&mut done, "tokenizer".into());
    let tokenizer = write_tokenizer(checkpoint, dir)?;

    let mut chunks = Vec::with_capacity(plan.len());
    for (index, range) in plan.iter().enumerate() {
        let mut layers = Vec::with_capacity(range.len());
        for layer in range.clone() {
            step(&mut done, format!("chunk {index}: layer {layer}"));
            layers.push(LayerWeights::load(
                checkpoint,
                layer,
                copts.precision,
                compressor,
            )?);
        }
        let program = build_chunk_program(config, copts, &layers)?;
        drop(layers);
        let rel = format!("{CHUNKS_DIR}/chunk-{index:02}.mlpackage");
        let summary = write_package(&program, &dir.join(&rel), &WriteOptions::default())?;
        remember_package_hashes(&mut known, &summary);
        let functions = program
            .functions()
            .iter()
            .map(|f| {
                let t = if f.name() == ane::names::DECODE {
                    1
                } else {
                    copts.prefill_len
                };
                let described = chunk_signature(config, copts, range.clone(), f.name(), t);
                FunctionSignature::of_function(f, Some(&described))
            })
            .collect();
        tracing::info!(chunk = index, layers = ?range, weight_bytes = summary.weight_bytes, "chunk written");
        chunks.push(ChunkEntry {
            index,
            path: rel,
            first_layer: range.start,
            layer_count: range.len(),
            functions,
            weight_bytes: summary.weight_bytes,
        });
    }

    let lm_head = if lm_package {
        step(&mut done, "LM head".into());
        let program = ane::lm_head::build_lm_head_program(checkpoint, copts, compressor)?;
        let rel = "lm_head.mlpackage".to_string();
        let summary = write_package(&program, &dir.join(&rel), &WriteOptions::default())?;
        remember_package_hashes(&mut known, &summary);
        Some(LmHeadEntry {
            path: rel,
            functions: program
                .functions()
                .iter()
                .map(|f| FunctionSignature::of_function(f, None))
                .collect(),
            vocab_slices: ane::lm_head::vocab_slices(config.vocab_size),
            weight_bytes: summary.weight_bytes,
        })
    } else {
        None
    };
    progress(Progress {
        done: total,
        total,
        message: "hashing".into(),
    });

    let (files, _) = hash_tree(dir, &known)?;
    let manifest = Manifest {
        schema_version: SCHEMA_VERSION,
        tool: ToolInfo {
            name: "anemone".into(),
            version: env!("CARGO_PKG_VERSION").into(),
        },
        architecture: config.architecture.clone(),
        config: config.clone(),
        conversion: Conversion {
            spec_version: anemone_mil::SpecVersion::V9.number(),
            opset: anemone_mil::SpecVersion::V9.opset().into(),
            context: copts.context,
            prefill_len: copts.prefill_len,
            precision: copts.precision,
            norm: copts.norm,
            state_layout: copts.state_layout,
            chunk_sizing: options.sizing,
            lm_head: options.lm_head,
            state_head_dim: ChunkOptions::padded_head_dim(config.head_dim),
            mask_value: ane::options::MASK_NEG,
            local_kv_slots: ane::KvLayout::for_conversion(config, copts).ring_slots,
        },
        chunks,
        lm_head,
        host,
        tokenizer,
        provenance: Vec::new(),
        files,
        compression: compressor.describe(),
        lora: checkpoint.lora.clone(),
    };
    Ok(manifest)
}

fn remember_package_hashes(
    known: &mut BTreeMap<PathBuf, FileHash>,
    s: &anemone_mil::PackageSummary,
) {
    let data = s.path.join("Data/com.apple.CoreML");
    known.insert(
        data.join("model.mlmodel"),
        FileHash {
            sha256: s.model_sha256.clone(),
            bytes: s.model_bytes,
        },
    );
    known.insert(
        data.join("weights/weight.bin"),
        FileHash {
            sha256: s.weights_sha256.clone(),
            bytes: s.weight_bytes,
        },
    );
}

fn write_tokenizer(
    checkpoint: &Checkpoint,
    dir: &Path,
) -> Result<Option<TokenizerEntry>, BundleError> {
    let Some(tok) = &checkpoint.tokenizer else {
        return Ok(None);
    };
    let json = tok
        .tokenizer
        .to_string(false)
        .map_err(|e| BundleError::Tokenizer {
            problem: format!("cannot serialize the tokenizer: {e}"),
        })?;
    let path = dir.join(TOKENIZER_FILE);
    fs::write(&path, json).map_err(io(&path))?;
    let chat_template_path = match &tok.chat_template {
        Some(t) => {
            let p = dir.join(CHAT_TEMPLATE_FILE);
            fs::write(&p, t).map_err(io(&p))?;
            Some(CHAT_TEMPLATE_FILE.to_string())
        }
        None => None,
    };
    let bos_token_id = checkpoint.config.bos_token_id.or_else(|| {
        tok.bos_token
            .as_deref()
            .and_then(|t| tok.tokenizer.token_to_id(t))
    });
    let mut eos_token_ids = checkpoint.config.eos_token_ids.clone();
    if let Some(id) = tok
        .eos_token
        .as_deref()
        .and_then(|t| tok.tokenizer.token_to_id(t))
    {
        if !eos_token_ids.contains(&id) {
            eos_token_ids.push(id);
        }
    }
    Ok(Some(TokenizerEntry {
        path: TOKENIZER_FILE.into(),
        chat_template_path,
        bos_token: tok.bos_token.clone(),
        eos_token: tok.eos_token.clone(),
        bos_token_id,
        eos_token_ids,
        add_bos: tok.add_bos,
    }))
}

pub(crate) fn io(path: &Path) -> impl FnOnce(std::io::Error) -> BundleError {
    let path = path.to_path_buf();
    move |source| BundleError::Io { path, source }
}
