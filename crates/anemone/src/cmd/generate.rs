//! `anemone generate`: text (or token ids) from a checkpoint through the fp32 reference forward,
//! or from a converted bundle on a backend (the MIL executor, fp16 or fp32 arithmetic).

use anemone_backend::Backend;
use anemone_checkpoint::{Checkpoint, TokenizerBundle};
use anemone_models::bundle::Manifest;
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::backend::Arithmetic;
use anemone_runtime::backend::{run_on_backend, BackendChoice, BackendKind, PipelineTask};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anemone_runtime::{
    generate, npy, prompt, Generation, GenerationOptions, LogitsModel, SamplerConfig, TextStream,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use std::io::Write;
use std::path::PathBuf;

/// Generate text from a checkpoint (fp32 reference forward) or a bundle (on a backend: the MIL
/// executor).
///
/// Text is streamed to stdout as it is generated; prefill and decode tok/s go to stderr.
/// Sampling is greedy unless --temperature is above 0.
///
/// Examples:
///   anemone generate models/smollm2-135m-instruct.Q4_1.gguf --prompt "The capital of France is"
///   anemone generate ./my-hf-model --prompt "Write a haiku" --chat --temperature 0.7 --seed 1
///   anemone generate ./my-hf-model --prompt-ids 1,2,3 --json --dump-logits logits.npy
///   anemone generate ./my-hf-model --lora ./my-adapter --prompt "Hello"
///   anemone generate smollm2.bundle --prompt "The capital of France is" --precision fp16
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GenerateArgs {
    /// A Hugging Face checkpoint directory (config.json + safetensors), a .gguf file, or a bundle
    /// directory written by `anemone convert`.
    pub model: PathBuf,

    /// Prompt text (encoded with the checkpoint's tokenizer).
    #[arg(
        long,
        required_unless_present = "prompt_ids",
        conflicts_with = "prompt_ids"
    )]
    pub prompt: Option<String>,

    /// Prompt as comma-separated token ids (works without a tokenizer).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompt_ids: Option<Vec<u32>>,

    /// Most tokens to generate (generation also stops at an end-of-sequence token).
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,

    /// Sampling temperature; 0 = greedy (always the most likely token).
    #[arg(long, default_value_t = 0.0)]
    pub temperature: f32,

    /// Sample only among the K most likely tokens.
    #[arg(long)]
    pub top_k: Option<usize>,

    /// Sample only among the most likely tokens whose probabilities add up to P (0 < P ≤ 1).
    #[arg(long)]
    pub top_p: Option<f32>,

    /// Seed of the sampling RNG (same seed, same output); random when absent.
    #[arg(long)]
    pub seed: Option<u64>,

    /// Wrap the prompt in the checkpoint's chat template as one user message.
    #[arg(long, requires = "prompt")]
    pub chat: bool,

    /// Print one JSON object {"prompt_ids","generated_ids","text","prefill_tok_s","decode_tok_s"}
    /// on stdout instead of streaming text.
    #[arg(long)]
    pub json: bool,

    /// Write the logits that chose each generated token as an f32 NPY array [steps, vocab].
    #[arg(long, value_name = "FILE.npy")]
    pub dump_logits: Option<PathBuf>,

    /// Teacher forcing: feed these comma-separated ids instead of sampling (one step per id;
    /// step i's logits follow the prompt and the first i forced ids). --max-tokens is ignored.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub force_ids: Option<Vec<u32>>,

    /// Threads for the forward pass (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Bundles only: the executor's arithmetic, fp16 (as the Neural Engine computes: fp16
    /// values, sums in f32), fp32, or fp16-acc (sums accumulated in fp16 blocks, pessimistic).
    /// Default: the bundle's own precision.
    #[arg(long)]
    pub precision: Option<Arithmetic>,

    /// Bundles only: the engine that runs the bundle's packages. executor: the MIL executor, a
    /// CPU interpreter on any OS; coreml (macOS only): Core ML. Default: coreml on macOS,
    /// executor elsewhere.
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<BackendKind>,

    #[command(flatten)]
    pub coreml: super::CoreMlArgs,

    /// Bundles only: skip checking the bundle's files against the manifest's sha256 (for a
    /// bundle checked already, e.g. by `anemone inspect`).
    #[arg(long)]
    pub no_verify: bool,

    /// Checkpoints only: merge this LoRA adapter (PEFT directory: adapter_config.json +
    /// adapter_model.safetensors) into the weights in fp32 before running.
    #[arg(long, value_name = "ADAPTER_DIR")]
    pub lora: Option<PathBuf>,
}

#[derive(serde::Serialize)]
struct JsonReport<'a> {
    prompt_ids: &'a [u32],
    generated_ids: &'a [u32],
    text: &'a str,
    prefill_tok_s: f64,
    decode_tok_s: f64,
}

pub fn run(args: GenerateArgs) -> Result<()> {
    if args
        .model
        .join(anemone_models::bundle::MANIFEST_FILE)
        .is_file()
    {
        if args.lora.is_some() {
            bail!(
                "--lora applies to checkpoints; a bundle has its adapter merged at conversion \
                 (`anemone convert --lora`)"
            );
        }
        return run_bundle(&args);
    }
    if args.precision.is_some() {
        bail!("--precision applies to bundles; a checkpoint runs the fp32 reference forward");
    }
    if args.backend.is_some() {
        bail!("--backend applies to bundles; a checkpoint runs the fp32 reference forward");
    }
    let mut checkpoint = load_checkpoint(&args)?;
    let stop_ids = prompt::stop_ids(
        &checkpoint.config.eos_token_ids,
        checkpoint.tokenizer.as_ref(),
    );
    let tokenizer = checkpoint.tokenizer.take();
    run_model(&args, tokenizer, stop_ids, || {
        load_reference(&checkpoint, &args)
    })
}

/// Encodes the prompt, loads the model (after the prompt is known to encode) and generates.
/// The tokenizer is needed whole only to encode the prompt: the text stream keeps what decoding
/// needs (a byte-level BPE's token bytes, ~1/16 of the tokenizer) and the rest is freed and
/// given back to the OS before the model is loaded.
fn run_model<M: LogitsModel>(
    args: &GenerateArgs,
    tokenizer: Option<TokenizerBundle>,
    stop_ids: Vec<u32>,
    load: impl FnOnce() -> Result<M>,
) -> Result<()> {
    let prompt_ids = match (&args.prompt, &args.prompt_ids) {
        (_, Some(ids)) => ids.clone(),
        (Some(text), None) => {
            let bundle = tokenizer
                .as_ref()
                .ok_or(anemone_runtime::RuntimeError::NoTokenizer {
                    needed_for: "--prompt",
                })?;
            if args.chat {
                prompt::encode_chat(bundle, text)?
            } else {
                prompt::encode_plain(bundle, text)?
            }
        }
        (None, None) => bail!("give --prompt or --prompt-ids"),
    };
    tracing::info!(prompt_tokens = prompt_ids.len(), "prompt encoded");
    let options = GenerationOptions {
        max_tokens: args.max_tokens,
        sampler: SamplerConfig {
            temperature: args.temperature,
            top_k: args.top_k,
            top_p: args.top_p,
            seed: args.seed,
        },
        force_ids: args.force_ids.clone(),
        capture_logits: args.dump_logits.is_some(),
        stop_ids,
    };
    options.sampler.validate()?;
    let mut stream = tokenizer.map(|b| TextStream::owning(b.tokenizer));
    crate::memory::release_freed_heap();
    let mut model = load()?;

    let stdout = std::io::stdout();
    let streaming = !args.json;
    let mut on_token = |id: u32| -> Result<(), anemone_runtime::RuntimeError> {
        let piece = match stream.as_mut() {
            Some(s) => s.push(id)?,
            None => Some(format!("{id} ")),
        };
        if let (true, Some(piece)) = (streaming, piece) {
            let mut out = stdout.lock();
            out.write_all(piece.as_bytes())
                .and_then(|()| out.flush())
                .map_err(|source| anemone_runtime::RuntimeError::Stream { source })?;
        }
        Ok(())
    };
    let generation = generate(&mut model, &prompt_ids, &options, &mut on_token)?;
    let text = match stream.as_mut() {
        Some(s) => {
            if streaming {
                if let Some(rest) = s.finish()? {
                    print!("{rest}");
                }
            }
            s.text()?
        }
        None => String::new(),
    };
    if streaming {
        println!();
    }
    report_speed(&generation);

    if let Some(path) = &args.dump_logits {
        let shape = [generation.generated_ids.len(), generation.vocab_size];
        npy::write_f32(path, &shape, &generation.logits)
            .with_context(|| format!("writing logits to {}", path.display()))?;
    }
    if args.json {
        let report = JsonReport {
            prompt_ids: &generation.prompt_ids,
            generated_ids: &generation.generated_ids,
            text: &text,
            prefill_tok_s: generation.prefill_tok_s(),
            decode_tok_s: generation.decode_tok_s(),
        };
        println!("{}", serde_json::to_string(&report)?);
    }
    Ok(())
}

fn load_checkpoint(args: &GenerateArgs) -> Result<Checkpoint> {
    let spinner = spinner(format!("opening {}", args.model.display()));
    let mut checkpoint = anemone_models::open_checkpoint(&args.model)
        .with_context(|| format!("opening checkpoint {}", args.model.display()))?;
    if let Some(dir) = &args.lora {
        checkpoint = anemone_checkpoint::apply_lora(checkpoint, dir)
            .with_context(|| format!("merging LoRA adapter {}", dir.display()))?;
    }
    spinner.finish_and_clear();
    Ok(checkpoint)
}

/// Opens the bundle on the chosen backend and generates from it.
fn run_bundle(args: &GenerateArgs) -> Result<()> {
    let manifest = anemone_models::bundle::read_manifest(&args.model)
        .with_context(|| format!("reading bundle {}", args.model.display()))?;
    let choice = args.coreml.choice(
        args.backend.unwrap_or_else(BackendKind::for_bundles),
        args.precision
            .unwrap_or_else(|| manifest.conversion.precision.into()),
        args.threads,
    );
    let spinner = spinner(format!(
        "loading bundle {} ({} {})",
        args.model.display(),
        choice.arithmetic(),
        choice.kind
    ));
    let options = PipelineOptions {
        host_threads: args.threads,
        verify_hashes: !args.no_verify,
        // the tokenizer is dropped once the prompt is encoded (`run_model`)
        tokenizer_after_packages: true,
    };
    let task = GenerateFromBundle {
        args,
        manifest: &manifest,
        choice: &choice,
        spinner,
    };
    run_on_backend(&args.model, &choice, &options, task)
        .with_context(|| format!("opening bundle {}", args.model.display()))?
}

/// `generate` on an open bundle, whatever backend runs it.
struct GenerateFromBundle<'a> {
    args: &'a GenerateArgs,
    manifest: &'a Manifest,
    choice: &'a BackendChoice,
    /// Shown while the bundle loads; cleared once it is open.
    spinner: indicatif::ProgressBar,
}

impl PipelineTask for GenerateFromBundle<'_> {
    type Output = Result<()>;

    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Result<()> {
        self.spinner.finish_and_clear();
        tracing::info!(
            context = pipeline.context(),
            chunks = self.manifest.chunks.len(),
            precision = %self.choice.arithmetic(),
            backend = %self.choice.kind,
            "bundle ready"
        );
        let mut pipeline = pipeline;
        let tokenizer = pipeline.take_tokenizer();
        let stop_ids = pipeline.stop_ids();
        run_model(self.args, tokenizer, stop_ids, || Ok(pipeline.session()?))
    }
}

fn load_reference(checkpoint: &Checkpoint, args: &GenerateArgs) -> Result<ReferenceModel> {
    let spinner = spinner(format!(
        "loading {} weights as f32",
        checkpoint.config.architecture.name()
    ));
    let options = ReferenceOptions {
        threads: args.threads,
        context_len: None,
        // a session decodes token by token: see the field
        huge_pages: true,
    };
    let model = ReferenceModel::load(checkpoint, &options)
        .with_context(|| format!("loading {} for the reference forward", args.model.display()))?;
    spinner.finish_and_clear();
    tracing::info!(
        context_len = LogitsModel::context_len(&model),
        "reference model ready"
    );
    Ok(model)
}

fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}

fn report_speed(g: &Generation) {
    eprintln!(
        "prefill: {} tokens, {:.1} tok/s; decode: {} tokens, {:.1} tok/s ({:?})",
        g.prompt_ids.len(),
        g.prefill_tok_s(),
        g.decode_steps,
        g.decode_tok_s(),
        g.stop_reason
    );
}
