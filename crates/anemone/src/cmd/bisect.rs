//! `anemone bisect`: converts a checkpoint into variants (layers per chunk, state layout, prefill
//! length, precision) and runs each in a child process, so a crash inside an engine (Core ML's
//! SIGTRAP on a multi-layer stateful package) is a row of the report, not the end of the run.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anemone_checkpoint::Checkpoint;
use anemone_mil::Precision;
use anemone_models::ane::{
    ChunkOptions, ChunkSizing, LmHeadPlacement, NormForm, StateLayout, Uncompressed,
};
use anemone_models::bundle::{convert, ConvertOptions};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::backend::BackendKind;
use anemone_runtime::LogitsModel;
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use super::bisect_child::{self, ChildReport};

/// Find the chunk layouts an engine runs: build variants of a checkpoint, run each in its own
/// process, report status, load time, parity and speed per variant.
///
/// Every combination of the comma-separated lists is converted into a temporary directory (or
/// --keep DIR), then loaded, prefilled with the prompt and decoded --decode-tokens steps along the
/// fp32 reference's greedy path, in a child process (this binary re-executing itself). A child
/// killed by a signal (SIGTRAP, SIGKILL, SIGSEGV…) is recorded with the signal's name; a child
/// that outlives --timeout is killed and recorded as a timeout. Parity: top-1 agreement and the
/// least logits cosine against the reference at every step.
///
/// Examples:
///   anemone bisect models/smollm2-135m-instruct.Q4_1.gguf
///   anemone bisect model.gguf --layers-per-chunk 1,2,4,8 --state-layout unified,split --json
///   anemone bisect ./qwen3-dir --precision fp16,fp32 --prefill-len 32,64 --backend executor
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct BisectArgs {
    /// A Hugging Face checkpoint directory (config.json + safetensors) or a .gguf file.
    pub checkpoint: PathBuf,

    /// Decoder layers per chunk, one variant per value.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4,8")]
    pub layers_per_chunk: Vec<usize>,

    /// KV state layouts (unified, split), one variant per value.
    #[arg(long, value_delimiter = ',', default_value = "unified")]
    pub state_layout: Vec<StateLayout>,

    /// Tokens per prefill call, one variant per value.
    #[arg(long, value_delimiter = ',', default_value = "64")]
    pub prefill_len: Vec<usize>,

    /// Conversion precisions (fp16, fp32), one variant per value.
    #[arg(long, value_delimiter = ',', default_value = "fp16")]
    pub precision: Vec<Precision>,

    /// Tokens the KV cache holds (a multiple of 32).
    #[arg(long, default_value_t = 512)]
    pub context: usize,

    /// RMSNorm form of every variant.
    #[arg(long, default_value = "max-scaled")]
    pub norm: NormForm,

    /// Prompt text (needs the checkpoint's tokenizer). Default: "The capital of France is".
    #[arg(long, conflicts_with = "prompt_ids")]
    pub prompt: Option<String>,

    /// Prompt as comma-separated token ids.
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompt_ids: Option<Vec<u32>>,

    /// Decode steps after the prompt (teacher-forced along the reference's greedy path).
    #[arg(long, default_value_t = 8)]
    pub decode_tokens: usize,

    /// The engine the children run the variants on (default: coreml on macOS, else executor).
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<BackendKind>,

    /// Seconds a child may run before it is killed and recorded as a timeout.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,

    /// Least logits cosine for a variant that ran to count as `ok` (else `mismatch`).
    #[arg(long, default_value_t = 0.99)]
    pub min_cosine: f64,

    /// Write the variant bundles under this directory and keep them (default: a temporary
    /// directory removed at the end).
    #[arg(long, value_name = "DIR")]
    pub keep: Option<PathBuf>,

    /// Threads of the reference forward and of each child's engine (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Print one JSON object {"checkpoint","backend","variants":[…]} on stdout instead of a table.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
}

/// One point of the variant grid.
#[derive(Debug, Clone, Serialize)]
pub struct Variant {
    pub label: String,
    pub layers_per_chunk: usize,
    pub state_layout: StateLayout,
    pub prefill_len: usize,
    pub precision: Precision,
}

impl Variant {
    fn new(lpc: usize, layout: StateLayout, prefill: usize, precision: Precision) -> Self {
        Variant {
            label: format!("lpc{lpc}-{}-p{prefill}-{}", layout.name(), precision.name()),
            layers_per_chunk: lpc,
            state_layout: layout,
            prefill_len: prefill,
            precision,
        }
    }
}

/// How a variant ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// Ran; parity within the thresholds.
    Ok,
    /// Ran; top-1 disagreed somewhere or the logits cosine fell below --min-cosine.
    Mismatch,
    /// The child was killed by a signal.
    Crashed,
    /// The child exited with an error.
    Failed,
    /// The child outlived --timeout and was killed.
    Timeout,
    /// The conversion itself failed (no child ran).
    ConvertFailed,
}

impl Status {
    pub fn name(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Mismatch => "mismatch",
            Status::Crashed => "crashed",
            Status::Failed => "failed",
            Status::Timeout => "timeout",
            Status::ConvertFailed => "convert-failed",
        }
    }
}

/// Parity of a variant's logits against the fp32 reference.
#[derive(Debug, Clone, Serialize)]
pub struct Parity {
    pub steps: usize,
    pub top1_agreement: f64,
    pub min_cosine: f64,
    pub mean_cosine: f64,
}

/// One row of the report.
#[derive(Debug, Clone, Serialize)]
pub struct VariantResult {
    #[serde(flatten)]
    pub variant: Variant,
    pub chunks: Option<usize>,
    pub status: Status,
    /// The signal that killed the child (`SIGTRAP`, …) when `crashed`.
    pub signal: Option<String>,
    /// The child's error (its last stderr line) or the conversion error.
    pub error: Option<String>,
    pub convert_seconds: Option<f64>,
    /// What the child measured (load/compile time, prefill/decode speed, peak memory).
    pub run: Option<ChildReport>,
    pub parity: Option<Parity>,
}

/// The prompt and the reference's logits along its greedy path: what every variant is held to.
pub struct ReferenceRun {
    pub prompt_ids: Vec<u32>,
    /// The reference's greedy tokens, fed to the variants one at a time.
    pub forced_ids: Vec<u32>,
    /// `forced_ids.len() + 1` rows of `[vocab]`: after the prompt, then after each forced id.
    pub logits: Vec<Vec<f32>>,
}

/// Runs the fp32 reference on the prompt and `decode_tokens` greedy steps.
pub fn reference_run(
    checkpoint: &Checkpoint,
    prompt_ids: Vec<u32>,
    decode_tokens: usize,
    threads: Option<usize>,
) -> Result<ReferenceRun> {
    let mut reference = ReferenceModel::load(
        checkpoint,
        &ReferenceOptions {
            threads,
            context_len: Some(prompt_ids.len() + decode_tokens + 1),
            huge_pages: false,
        },
    )
    .context("loading the fp32 reference")?;
    let mut logits = vec![reference.feed(&prompt_ids)?];
    let mut forced_ids = Vec::with_capacity(decode_tokens);
    for _ in 0..decode_tokens {
        let next = argmax(logits.last().expect("one row at least")) as u32;
        forced_ids.push(next);
        logits.push(reference.feed(&[next])?);
    }
    Ok(ReferenceRun {
        prompt_ids,
        forced_ids,
        logits,
    })
}

/// The prompt ids of `--prompt`/`--prompt-ids`, or of the default prompt.
pub fn prompt_ids(
    checkpoint: &Checkpoint,
    prompt: Option<&str>,
    ids: Option<&[u32]>,
) -> Result<Vec<u32>> {
    if let Some(ids) = ids {
        if ids.is_empty() {
            bail!("--prompt-ids is empty");
        }
        return Ok(ids.to_vec());
    }
    let text = prompt.unwrap_or("The capital of France is");
    let Some(tokenizer) = checkpoint.tokenizer.as_ref() else {
        bail!("the checkpoint has no tokenizer: give --prompt-ids");
    };
    let ids = anemone_runtime::prompt::encode_plain(tokenizer, text)?;
    if ids.is_empty() {
        bail!("the prompt {text:?} encodes to no tokens");
    }
    Ok(ids)
}

/// Everything the variants of one run share.
pub struct Plan<'a> {
    pub checkpoint_path: &'a Path,
    pub checkpoint: &'a Checkpoint,
    pub variants: Vec<Variant>,
    pub context: usize,
    pub norm: NormForm,
    pub backend: BackendKind,
    pub threads: Option<usize>,
    pub timeout_seconds: u64,
    pub min_cosine: f64,
    /// Where the variant bundles go.
    pub work_dir: &'a Path,
    pub coreml: super::CoreMlArgs,
}

/// The variant grid of the comma-separated lists, in the order given.
pub fn grid(
    lpcs: &[usize],
    layouts: &[StateLayout],
    prefills: &[usize],
    precisions: &[Precision],
) -> Result<Vec<Variant>> {
    if lpcs.contains(&0) {
        bail!("--layers-per-chunk values must be at least 1");
    }
    let mut out = Vec::new();
    for &lpc in lpcs {
        for &layout in layouts {
            for &prefill in prefills {
                for &precision in precisions {
                    let v = Variant::new(lpc, layout, prefill, precision);
                    if !out.iter().any(|o: &Variant| o.label == v.label) {
                        out.push(v);
                    }
                }
            }
        }
    }
    if out.is_empty() {
        bail!("no variants: every list needs at least one value");
    }
    Ok(out)
}

/// Converts and runs every variant of `plan`; `on_done` sees each result as it lands.
pub fn run_plan(
    plan: &Plan<'_>,
    reference: &ReferenceRun,
    on_done: &mut dyn FnMut(&VariantResult),
) -> Result<Vec<VariantResult>> {
    let mut results = Vec::new();
    for variant in &plan.variants {
        let result = run_variant(plan, variant, reference);
        on_done(&result);
        results.push(result);
    }
    Ok(results)
}

fn run_variant(plan: &Plan<'_>, variant: &Variant, reference: &ReferenceRun) -> VariantResult {
    let mut result = VariantResult {
        variant: variant.clone(),
        chunks: None,
        status: Status::ConvertFailed,
        signal: None,
        error: None,
        convert_seconds: None,
        run: None,
        parity: None,
    };
    let bundle = plan.work_dir.join(&variant.label);
    let options = ConvertOptions {
        chunk: ChunkOptions {
            context: plan.context,
            prefill_len: variant.prefill_len,
            precision: variant.precision,
            norm: plan.norm,
            state_layout: variant.state_layout,
        },
        sizing: ChunkSizing::LayersPerChunk(variant.layers_per_chunk),
        lm_head: LmHeadPlacement::Host,
        force: true,
    };
    let started = Instant::now();
    tracing::info!(variant = %variant.label, "converting");
    match convert(
        plan.checkpoint,
        &bundle,
        &options,
        &Uncompressed,
        &mut |_| {},
    ) {
        Ok(summary) => result.chunks = Some(summary.manifest.chunks.len()),
        Err(e) => {
            result.error = Some(format!("converting {}: {e}", variant.label));
            return result;
        }
    }
    result.convert_seconds = Some(started.elapsed().as_secs_f64());
    let logits_path = plan.work_dir.join(format!("{}.logits.npy", variant.label));
    let child = bisect_child::ChildSpec {
        bundle: &bundle,
        label: &variant.label,
        backend: plan.backend,
        precision: variant.precision,
        threads: plan.threads,
        prompt_ids: &reference.prompt_ids,
        forced_ids: &reference.forced_ids,
        logits_out: &logits_path,
        timeout_seconds: plan.timeout_seconds,
        coreml: &plan.coreml,
    };
    let outcome = bisect_child::spawn(&child);
    match outcome {
        Err(e) => {
            result.status = Status::Failed;
            result.error = Some(format!("{e:#}"));
        }
        Ok(bisect_child::Outcome::Signal { name, stderr_tail }) => {
            result.status = Status::Crashed;
            result.signal = Some(name);
            result.error = stderr_tail;
        }
        Ok(bisect_child::Outcome::Timeout) => {
            result.status = Status::Timeout;
            result.error = Some(format!("killed after {} s", plan.timeout_seconds));
        }
        Ok(bisect_child::Outcome::Failed { code, stderr_tail }) => {
            result.status = Status::Failed;
            result.error =
                Some(stderr_tail.unwrap_or_else(|| format!("exited with status {code}")));
        }
        Ok(bisect_child::Outcome::Finished(report)) => {
            match parity(&logits_path, reference) {
                Ok(p) => {
                    result.status = if p.top1_agreement < 1.0 || p.min_cosine < plan.min_cosine {
                        Status::Mismatch
                    } else {
                        Status::Ok
                    };
                    result.parity = Some(p);
                }
                Err(e) => {
                    result.status = Status::Failed;
                    result.error = Some(format!("{e:#}"));
                }
            }
            result.run = Some(report);
        }
    }
    result
}

fn parity(logits_path: &Path, reference: &ReferenceRun) -> Result<Parity> {
    let array = anemone_runtime::npy::read_f32(logits_path)?;
    let rows = reference.logits.len();
    let vocab = reference.logits[0].len();
    if array.shape != [rows, vocab] {
        bail!(
            "{}: shape {:?}, expected [{rows}, {vocab}]",
            logits_path.display(),
            array.shape
        );
    }
    let mut agree = 0;
    let mut min_cos = f64::INFINITY;
    let mut sum_cos = 0.0;
    for (row, want) in array.data.chunks(vocab).zip(&reference.logits) {
        if argmax(row) == argmax(want) {
            agree += 1;
        }
        let c = cosine(row, want);
        min_cos = min_cos.min(c);
        sum_cos += c;
    }
    Ok(Parity {
        steps: rows,
        top1_agreement: agree as f64 / rows as f64,
        min_cosine: min_cos,
        mean_cosine: sum_cos / rows as f64,
    })
}

pub fn argmax(v: &[f32]) -> usize {
    let mut best = 0;
    for (i, x) in v.iter().enumerate() {
        if *x > v[best] || v[best].is_nan() {
            best = i;
        }
    }
    best
}

/// Cosine of two vectors in f64 (NaN anywhere gives NaN, which fails every threshold).
pub fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut ab, mut aa, mut bb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        let (x, y) = (*x as f64, *y as f64);
        ab += x * y;
        aa += x * x;
        bb += y * y;
    }
    if aa == 0.0 || bb == 0.0 {
        return if aa == bb { 1.0 } else { 0.0 };
    }
    ab / (aa.sqrt() * bb.sqrt())
}

#[derive(Serialize)]
struct JsonReport<'a> {
    checkpoint: &'a Path,
    backend: &'static str,
    prompt_ids: &'a [u32],
    decode_tokens: usize,
    variants: &'a [VariantResult],
}

pub fn run(args: BisectArgs) -> Result<()> {
    let checkpoint = anemone_models::open_checkpoint(&args.checkpoint)
        .with_context(|| format!("opening checkpoint {}", args.checkpoint.display()))?;
    let variants = grid(
        &args.layers_per_chunk,
        &args.state_layout,
        &args.prefill_len,
        &args.precision,
    )?;
    let ids = prompt_ids(
        &checkpoint,
        args.prompt.as_deref(),
        args.prompt_ids.as_deref(),
    )?;
    let spinner = super::spinner("running the fp32 reference".into());
    let reference = reference_run(&checkpoint, ids, args.decode_tokens, args.threads)?;
    spinner.finish_and_clear();
    let temp;
    let work_dir = match &args.keep {
        Some(dir) => {
            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
            dir.clone()
        }
        None => {
            temp = tempfile::Builder::new()
                .prefix("anemone-bisect-")
                .tempdir()
                .context("creating a temporary directory")?;
            temp.path().to_path_buf()
        }
    };
    let plan = Plan {
        checkpoint_path: &args.checkpoint,
        checkpoint: &checkpoint,
        variants,
        context: args.context,
        norm: args.norm,
        backend: args.backend.unwrap_or_else(BackendKind::for_bundles),
        threads: args.threads,
        timeout_seconds: args.timeout,
        min_cosine: args.min_cosine,
        work_dir: &work_dir,
        coreml: args.coreml.clone(),
    };
    let bar = indicatif::ProgressBar::new(plan.variants.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("bisect [{bar:30}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let results = run_plan(&plan, &reference, &mut |r| {
        bar.inc(1);
        bar.set_message(format!("{}: {}", r.variant.label, r.status.name()));
    })?;
    bar.finish_and_clear();
    if args.json {
        let report = JsonReport {
            checkpoint: plan.checkpoint_path,
            backend: plan.backend.name(),
            prompt_ids: &reference.prompt_ids,
            decode_tokens: reference.forced_ids.len(),
            variants: &results,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        println!(
            "bisect {} on {} ({} prompt tokens, {} decode steps)",
            plan.checkpoint_path.display(),
            plan.backend,
            reference.prompt_ids.len(),
            reference.forced_ids.len()
        );
        print_table(&results);
    }
    Ok(())
}

pub fn print_table(results: &[VariantResult]) {
    println!(
        "  {:<28} {:>6}  {:<14} {:>8} {:>8} {:>7} {:>10} {:>9}",
        "variant", "chunks", "status", "load s", "ms/tok", "top-1", "min cos", "peak MB"
    );
    for r in results {
        let status = match &r.signal {
            Some(signal) => format!("{} {signal}", r.status.name()),
            None => r.status.name().to_string(),
        };
        let opt = |v: Option<f64>, digits: usize| match v {
            Some(v) => format!("{v:.digits$}"),
            None => "-".into(),
        };
        println!(
            "  {:<28} {:>6}  {:<14} {:>8} {:>8} {:>7} {:>10} {:>9}",
            r.variant.label,
            r.chunks.map_or("-".into(), |c| c.to_string()),
            status,
            opt(r.run.as_ref().map(|x| x.load_seconds), 2),
            opt(r.run.as_ref().and_then(|x| x.ms_per_token()), 1),
            opt(r.parity.as_ref().map(|p| p.top1_agreement), 3),
            opt(r.parity.as_ref().map(|p| p.min_cosine), 6),
            opt(
                r.run
                    .as_ref()
                    .and_then(|x| x.peak_rss_bytes)
                    .map(|b| b as f64 / 1e6),
                0
            ),
        );
        if let (Some(e), true) = (&r.error, r.status != Status::Ok) {
            println!("      {e}");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grid_is_the_product_in_order_without_duplicates() {
        let v = grid(
            &[1, 2, 1],
            &[StateLayout::Unified, StateLayout::Split],
            &[64],
            &[Precision::Fp16],
        )
        .unwrap();
        let labels: Vec<&str> = v.iter().map(|v| v.label.as_str()).collect();
        assert_eq!(
            labels,
            [
                "lpc1-unified-p64-fp16",
                "lpc1-split-p64-fp16",
                "lpc2-unified-p64-fp16",
                "lpc2-split-p64-fp16"
            ]
        );
        assert!(grid(&[0], &[StateLayout::Unified], &[64], &[Precision::Fp16]).is_err());
    }

    #[test]
    fn cosine_and_argmax() {
        assert!((cosine(&[1., 2.], &[2., 4.]) - 1.0).abs() < 1e-12);
        assert_eq!(cosine(&[1., 0.], &[0., 1.]), 0.0);
        assert!(cosine(&[f32::NAN, 1.], &[1., 1.]).is_nan());
        assert_eq!(argmax(&[0.5, 3.0, -1.0]), 1);
    }
}
