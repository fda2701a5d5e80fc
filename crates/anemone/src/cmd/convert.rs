//! `anemone convert`: a checkpoint to a bundle of ANE-shaped, layer-chunked, stateful Core ML
//! packages plus host weights, tokenizer and manifest.

use std::path::PathBuf;
use std::time::Instant;

use anemone_models::ane::{
    ChunkOptions, ChunkSizing, LmHeadPlacement, NormForm, Precision, StateLayout, Uncompressed,
    WeightCompressor,
};
use anemone_models::bundle::{convert, ConvertOptions};
use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};

use super::compress_opts::CompressArgs;

/// Convert a checkpoint into a bundle of Core ML packages for the Neural Engine.
///
/// The bundle holds anemone.json (manifest with provenance and file hashes), host.safetensors
/// (embedding, final norm, LM head unless packaged), tokenizer.json + chat template, and
/// chunks/chunk-XX.mlpackage (decode and prefill functions sharing weights, KV cache in state).
/// It is written to .NAME.anemone-partial beside --out under a writer lock (.NAME.anemone-lock)
/// and swapped into place whole; identical inputs give identical bytes. --force replaces only a
/// bundle (a directory with anemone.json) or an empty directory, never one holding the input.
/// Ctrl-C/SIGTERM remove the partial output; debris of a killed run is removed by the next
/// convert into the same directory, or by `anemone clean`.
///
/// Examples:
///   anemone convert models/smollm2-135m-instruct.Q4_1.gguf --out smollm2.bundle
///   anemone convert ./qwen3-dir --out q3.bundle --layers-per-chunk 4 --state-layout split
///   anemone convert ./model --out m.bundle --precision fp32 --lm-head package --force --json
///   anemone convert model.gguf --out m-int8.bundle --quantize int8
///   anemone convert model.Q4_1.gguf --out m-q.bundle --quantize source
///   anemone convert model.gguf --out m-lut4.bundle --palettize 4 --group-size 16
///   anemone convert model.gguf --out m-mixed.bundle --compress-config mixed.json
///   anemone convert ./qwen3-dir --out tuned.bundle --lora ./my-adapter
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct ConvertArgs {
    /// A Hugging Face checkpoint directory (config.json + safetensors) or a .gguf file.
    pub model: PathBuf,

    /// Directory to write the bundle to (refused if it exists, unless --force).
    #[arg(long)]
    pub out: PathBuf,

    /// Decoder layers per chunk package (1 = the layout proven on the ANE).
    #[arg(long, conflicts_with = "chunk_size_mb")]
    pub layers_per_chunk: Option<usize>,

    /// Instead of --layers-per-chunk: as many layers per chunk as fit in S MiB of weights.
    #[arg(long, value_name = "S")]
    pub chunk_size_mb: Option<usize>,

    /// Tokens the KV cache holds (a multiple of 32).
    #[arg(long, default_value_t = 512)]
    pub context: usize,

    /// Tokens per prefill call.
    #[arg(long, default_value_t = 64)]
    pub prefill_len: usize,

    /// Compute and weight precision: fp16 (ANE) or fp32 (CPU/GPU only; exact checks).
    #[arg(long, default_value = "fp16")]
    pub precision: Precision,

    /// RMSNorm form: naive, layernorm-trick or max-scaled (the default: the only fp16 form that
    /// passes the default gate on both SmolLM2 and Qwen2.5, see README "The fp16 question").
    #[arg(long, default_value = "max-scaled")]
    pub norm: NormForm,

    /// KV state layout of multi-layer chunks: unified (one state) or split (k and v states).
    #[arg(long, default_value = "unified")]
    pub state_layout: StateLayout,

    /// Where the final norm + LM head run: host (host.safetensors) or package.
    #[arg(long, default_value = "host")]
    pub lm_head: LmHeadPlacement,

    #[command(flatten)]
    pub compression: CompressArgs,

    /// Encoders: the length buckets (one function each); every input runs in the smallest one
    /// holding it, longer inputs are refused.
    #[arg(long, value_delimiter = ',', default_value = "32,128,512")]
    pub lengths: Vec<usize>,

    /// Encoders with a classification head: run it in the package (`package`, 1×1 convs,
    /// output `logits`) or on the host in fp32 (`host`).
    #[arg(long, default_value = "package")]
    pub encoder_head: anemone_models::encoder::bundle::HeadPlacement,

    /// Replace an existing bundle at --out (only a bundle or an empty directory).
    #[arg(long)]
    pub force: bool,

    /// Merge this LoRA adapter (PEFT directory: adapter_config.json + adapter_model.safetensors)
    /// into the weights in fp32 before any compression; its sha256 goes into the manifest.
    /// Decoders only; works for Hugging Face and GGUF bases.
    #[arg(long, value_name = "ADAPTER_DIR")]
    pub lora: Option<PathBuf>,

    /// Print a JSON summary on stdout instead of text.
    #[arg(long)]
    pub json: bool,
}

pub fn run(args: ConvertArgs) -> Result<()> {
    let started = Instant::now();
    if anemone_models::families::model_kind(&args.model)
        .with_context(|| format!("cannot open checkpoint {}", args.model.display()))?
        == anemone_models::families::ModelKind::Encoder
    {
        if args.lora.is_some() {
            anyhow::bail!("--lora: adapters are merged into decoders only, not encoders");
        }
        return run_encoder(&args, started);
    }
    let mut checkpoint = anemone_models::open_checkpoint(&args.model)
        .with_context(|| format!("cannot open checkpoint {}", args.model.display()))?;
    if let Some(dir) = &args.lora {
        checkpoint = anemone_checkpoint::apply_lora(checkpoint, dir)
            .with_context(|| format!("merging LoRA adapter {}", dir.display()))?;
    }
    if args.precision == Precision::Fp16 {
        // Gemma's residual stream exceeds fp16: carry it scaled (folded into the weights that
        // write it; the logits are unchanged in exact arithmetic)
        if let Some((scale, bound)) = anemone_models::families::gemma3::fp16_residual_scale(
            &checkpoint,
        )
        .with_context(|| format!("sizing the residual stream of {}", args.model.display()))?
        {
            tracing::info!(scale, bound, "fp16 residual scale");
            if let Some(g) = checkpoint.config.gemma.as_mut() {
                g.residual_scale = scale;
            }
        }
    }
    let sizing = match (args.layers_per_chunk, args.chunk_size_mb) {
        (_, Some(mb)) => ChunkSizing::MaxMegabytes(mb),
        (n, None) => ChunkSizing::LayersPerChunk(n.unwrap_or(1)),
    };
    let options = ConvertOptions {
        chunk: ChunkOptions {
            context: args.context,
            prefill_len: args.prefill_len,
            precision: args.precision,
            norm: args.norm,
            state_layout: args.state_layout,
        },
        sizing,
        lm_head: args.lm_head,
        force: args.force,
    };
    let compressor = args
        .compression
        .compressor(args.precision, args.lm_head == LmHeadPlacement::Package)?;
    let hook: &dyn WeightCompressor = match &compressor {
        Some(c) => c,
        None => &Uncompressed,
    };
    let compressing = compressor
        .as_ref()
        .map(|c| format!(" (compressing: {})", c.record().origin))
        .unwrap_or_default();
    let bar = ProgressBar::new(1);
    bar.set_style(
        ProgressStyle::with_template("{spinner} [{elapsed_precise}] {bar:40} {pos}/{len} {msg}")
            .expect("progress template is valid"),
    );
    // A test knob: the signal and concurrency tests need a conversion that is still writing.
    let step_delay = std::env::var("ANEMONE_DEBUG_STEP_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map(std::time::Duration::from_millis);
    let summary = convert(&checkpoint, &args.out, &options, hook, &mut |p| {
        if let Some(delay) = step_delay {
            std::thread::sleep(delay);
        }
        bar.set_length(p.total as u64);
        bar.set_position(p.done as u64);
        bar.set_message(format!("{}{compressing}", p.message));
    });
    bar.finish_and_clear();
    let summary = summary.with_context(|| format!("converting {}", args.model.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let m = &summary.manifest;
    if args.json {
        let report = serde_json::json!({
            "out": summary.out,
            "architecture": m.architecture,
            "layers": m.config.num_hidden_layers,
            "chunks": m.chunks.iter().map(|c| serde_json::json!({
                "path": c.path, "first_layer": c.first_layer, "layer_count": c.layer_count,
                "weight_bytes": c.weight_bytes,
            })).collect::<Vec<_>>(),
            "lm_head": m.lm_head.as_ref().map(|l| &l.path),
            "files": m.files.len(),
            "total_bytes": summary.total_bytes,
            "seconds": seconds,
            "compression": compressor.as_ref().map(|c| c.record().summary()),
            "lora": m.lora,
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "wrote {} ({} {} layers in {} chunk(s), {} files, {:.1} MB) in {seconds:.2} s",
            summary.out.display(),
            m.architecture.name(),
            m.config.num_hidden_layers,
            m.chunks.len(),
            m.files.len(),
            summary.total_bytes as f64 / 1e6,
        );
        let c = &m.conversion;
        println!(
            "  context {}, prefill {}, {}, norm {}, state {}, lm head {}",
            c.context,
            c.prefill_len,
            c.precision.name(),
            c.norm.name(),
            c.state_layout.name(),
            c.lm_head.name()
        );
        if let Some(c) = &compressor {
            super::compress_opts::print_summary(&c.record().summary(), "  ");
        }
        if let Some(l) = &m.lora {
            println!(
                "  LoRA {} merged into {} tensors (r {}, scale {}, sha256 {})",
                l.dir.display(),
                l.merged_tensors.len(),
                l.rank,
                l.scale,
                l.adapter_sha256
            );
        }
    }
    Ok(())
}

fn run_encoder(args: &ConvertArgs, started: Instant) -> Result<()> {
    use anemone_models::encoder::bundle::{convert_encoder, EncoderConvertOptions};
    let ck = anemone_models::encoder::open_encoder(&args.model)
        .with_context(|| format!("cannot open encoder {}", args.model.display()))?;
    let compressor = args.compression.compressor(args.precision, false)?;
    let hook: &dyn WeightCompressor = match &compressor {
        Some(c) => c,
        None => &Uncompressed,
    };
    let options = EncoderConvertOptions {
        lengths: args.lengths.clone(),
        precision: args.precision,
        force: args.force,
        compressor: hook,
        head: args.encoder_head,
    };
    let m = convert_encoder(&ck, &args.out, &options)
        .with_context(|| format!("converting {}", args.model.display()))?;
    let seconds = started.elapsed().as_secs_f64();
    let total_bytes: u64 = m.files.values().map(|f| f.bytes).sum();
    if args.json {
        let report = serde_json::json!({
            "out": args.out,
            "kind": m.kind,
            "architecture": m.config.architecture,
            "model_type": m.config.model_type,
            "layers": m.config.num_hidden_layers,
            "buckets": m.conversion.buckets,
            "pooling": m.pooling,
            "files": m.files.len(),
            "total_bytes": total_bytes,
            "seconds": seconds,
            "compression": compressor.as_ref().map(|c| c.record().summary()),
        });
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "wrote {} (encoder {} / {}, {} layers, buckets {:?}, {}, pooling {}{}; {} files, {:.1} MB) in {seconds:.2} s",
            args.out.display(),
            m.config.architecture,
            m.config.model_type,
            m.config.num_hidden_layers,
            m.conversion.buckets,
            m.conversion.precision.name(),
            m.pooling.mode.name(),
            if m.pooling.normalize { " + normalise" } else { "" },
            m.files.len(),
            total_bytes as f64 / 1e6,
        );
        if let Some(c) = &compressor {
            super::compress_opts::print_summary(&c.record().summary(), "  ");
        }
    }
    Ok(())
}
