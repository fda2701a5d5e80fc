//! `anemone gate`: converted bundles against the fp32 reference forward (top-1, cosine, KL,
//! canary, per-chunk parity), with a JSON report, an SVG plot and exit status 1 on failure.

use std::path::{Path, PathBuf};

use anemone_backend::Backend;
use anemone_checkpoint::Checkpoint;
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::backend::Arithmetic;
use anemone_runtime::backend::{run_on_backend, BackendKind, PipelineTask};
use anemone_runtime::gate::{self, plot, GateOptions, GateReport, GateTrace, PairReport};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anyhow::{bail, Context, Result};
use clap::Args;

/// Gate converted bundles against the fp32 reference forward of the checkpoint they came from.
///
/// Every prompt is teacher-forced along one token path (the reference's greedy path, or the
/// prompt file's force_ids) so one flip does not cascade. Per step: top-1 agreement with the
/// reference's top-1/top-2 margin (steps under --near-tie are reported apart), logits cosine, KL,
/// max abs error. Per chunk: cosine and max abs error of its output against the reference's
/// residual stream at that depth, and the largest |activation| (fp16 overflow shows as inf; the
/// executor also names the first op inside the chunk that produced inf or NaN).
/// Exit status 1 names the first failing chunk or step.
///
/// Examples:
///   anemone gate bundles/smollm2 --reference models/smollm2-135m-instruct.Q4_1.gguf
///   anemone gate b-naive b-layernorm b-max --reference model.gguf --json --plot depth.svg
///   anemone gate bundles/smollm2 --reference model.gguf --precision fp16,fp32 --steps 16
///   anemone gate bundles/smollm2 --reference model.gguf --compare executor:fp16-acc
///   anemone gate bundles/smollm2 --reference model.gguf --backend coreml   # (macOS) also
///                                          # compares Core ML with the executor in fp16
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct GateArgs {
    /// Bundle directories (written by `anemone convert`); each is one variant of the report.
    #[arg(required = true)]
    pub bundles: Vec<PathBuf>,

    /// The checkpoint the bundles were converted from (Hugging Face dir or .gguf).
    #[arg(long)]
    pub reference: PathBuf,

    /// Merge this LoRA adapter (PEFT directory) into the reference, as `convert --lora` merged
    /// it into the bundle.
    #[arg(long, value_name = "ADAPTER_DIR")]
    pub lora: Option<PathBuf>,

    /// Prompts: JSON (strings or {prompt|prompt_ids, expect?, force_ids?} objects, or an object
    /// with such a "prompts" list) or text, one prompt per line. Default: built-in prompts
    /// including the canary "The capital of France is" → " Paris".
    #[arg(long)]
    pub prompts: Option<PathBuf>,

    /// Logits vectors compared per prompt (after the prompt, then after each forced token).
    #[arg(long, default_value_t = 8)]
    pub steps: usize,

    /// Executor precision(s), comma-separated: each bundle runs once per precision: fp16 (fp16
    /// values, sums in f32), fp32, or fp16-acc (fp16 values, sums accumulated in fp16 blocks: the
    /// pessimistic bracket of the Neural Engine). Default: the bundle's own precision.
    #[arg(long, value_delimiter = ',')]
    pub precision: Vec<Arithmetic>,

    /// The engine that runs the bundles. executor: the MIL executor, a CPU interpreter on any OS
    /// that also names the first op producing inf or NaN; coreml (macOS only): Core ML.
    /// Default: coreml on macOS, executor elsewhere.
    #[arg(long, value_parser = super::backend_parser())]
    pub backend: Option<BackendKind>,

    #[command(flatten)]
    pub coreml: super::CoreMlArgs,

    /// Also run every bundle on this engine (KIND or KIND:PRECISION: executor, executor:fp16-acc,
    /// coreml) and compare the two engines step by step and chunk by chunk along the same
    /// forced path: the pairwise report (`pairs` in --json) shows where they part. The compared
    /// engine's own gate is reported (`compared`) without deciding the exit status. Default with
    /// --backend coreml: executor:fp16 (where the Neural Engine departs from our model of it).
    #[arg(long, value_name = "ENGINE")]
    pub compare: Option<super::gate_compare::EngineSpec>,

    /// Least fraction of steps (margin ≥ --near-tie) whose top-1 agrees.
    #[arg(long, default_value_t = 1.0)]
    pub min_top1: f64,

    /// Least logits cosine at every step.
    #[arg(long, default_value_t = 0.999)]
    pub min_cosine: f64,

    /// Least per-token hidden-state cosine at every chunk output.
    #[arg(long, default_value_t = GateOptions::default().min_chunk_cosine)]
    pub min_chunk_cosine: f64,

    /// Reference top-1/top-2 margins (logits) below this are near-ties: a flip there does not
    /// count against --min-top1.
    #[arg(long, default_value_t = 0.5)]
    pub near_tie: f32,

    /// Print one JSON object {"passed", "reports": [...]} on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,

    /// Write an SVG of per-layer hidden-state cosine against depth, one line per variant.
    #[arg(long, value_name = "FILE.svg")]
    pub plot: Option<PathBuf>,

    /// Threads of the reference forward and the executor (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Skip checking the bundle files against the manifest's sha256.
    #[arg(long)]
    pub no_verify: bool,

    /// Encoder bundles: the smallest embedding cosine per input that passes.
    #[arg(long, default_value_t = 0.9999)]
    pub min_embedding_cosine: f64,
}

/// `--json`: `passed` (every report in `reports` passed), `reports` (one per bundle and
/// precision on --backend), `compared` (the same on the --compare engine; never decides
/// `passed`), `pairs` (one per compared report: `a` the compared engine, `b` the gated one).
#[derive(serde::Serialize)]
struct JsonOutput<'a> {
    passed: bool,
    reports: &'a [GateReport],
    compared: &'a [GateReport],
    pairs: &'a [PairReport],
}

pub fn run(args: GateArgs) -> Result<()> {
    if let Some(first) = args.bundles.first() {
        if first.is_dir()
            && anemone_models::encoder::bundle::bundle_kind(first)?
                == anemone_models::families::ModelKind::Encoder
        {
            return super::gate_encoder::run(&args);
        }
    }
    let options = GateOptions {
        steps: args.steps,
        min_top1: args.min_top1,
        min_cosine: args.min_cosine,
        min_chunk_cosine: args.min_chunk_cosine,
        near_tie: args.near_tie,
    };
    options.validate()?;
    if let Some(path) = &args.plot {
        check_writable(path)?;
    }
    let given = match &args.prompts {
        Some(path) => gate::read_prompts(path)?,
        None => gate::default_prompts(),
    };
    let spinner = spinner(format!("loading reference {}", args.reference.display()));
    let mut checkpoint = anemone_models::open_checkpoint(&args.reference)
        .with_context(|| format!("opening reference {}", args.reference.display()))?;
    if let Some(dir) = &args.lora {
        checkpoint = anemone_checkpoint::apply_lora(checkpoint, dir)
            .with_context(|| format!("merging LoRA adapter {}", dir.display()))?;
    }
    let mut reference_model = ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: args.threads,
            context_len: None,
            huge_pages: false,
        },
    )
    .with_context(|| format!("loading reference {}", args.reference.display()))?;
    spinner.finish_and_clear();
    // one reference run per prompt, shared by every bundle, precision and engine gated
    let mut reference = gate::GateReference::new(&mut reference_model);

    let kind = args.backend.unwrap_or_else(BackendKind::for_bundles);
    let compare = args
        .compare
        .or_else(|| super::gate_compare::default_compare(kind));
    let (mut reports, mut compared, mut pairs) = (Vec::new(), Vec::new(), Vec::new());
    for bundle in &args.bundles {
        let manifest = anemone_models::bundle::read_manifest(bundle)
            .with_context(|| format!("reading bundle {}", bundle.display()))?;
        let precisions = if args.precision.is_empty() {
            vec![manifest.conversion.precision.into()]
        } else {
            args.precision.clone()
        };
        for precision in precisions {
            let run = Run {
                checkpoint: &checkpoint,
                given: &given,
                options: &options,
                args: &args,
            };
            let (report, trace) = gate_one(
                bundle,
                kind,
                precision,
                &mut reference,
                &run,
                compare.is_some(),
            )?;
            if !args.json {
                print_report(&report);
            }
            if let (Some(spec), Some(trace)) = (compare, trace) {
                let (other, other_trace) = gate_one(
                    bundle,
                    spec.kind,
                    spec.arithmetic,
                    &mut reference,
                    &run,
                    true,
                )?;
                let pair = gate::compare_traces(
                    (&other.backend, &other_trace.unwrap_or_default()),
                    (&report.backend, &trace),
                    manifest.config.hidden_size,
                    options.min_chunk_cosine,
                )
                .with_context(|| format!("comparing engines on {}", bundle.display()))?;
                if !args.json {
                    super::gate_compare::print_pair(bundle, &pair);
                }
                compared.push(other);
                pairs.push(pair);
            }
            reports.push(report);
        }
    }
    if let Some(path) = &args.plot {
        write_plot(path, &reports, &args, &checkpoint)?;
    }
    let passed = reports.iter().all(|r| r.passed);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&JsonOutput {
                passed,
                reports: &reports,
                compared: &compared,
                pairs: &pairs,
            })?
        );
    }
    if let Some(failed) = reports.iter().find(|r| !r.passed) {
        let first = &failed.failures[0];
        let more = reports.iter().map(|r| r.failures.len()).sum::<usize>() - 1;
        bail!(
            "gate failed: {}: {}: {}{}",
            failed.bundle.display(),
            failed.variant,
            first.message,
            if more > 0 {
                format!(" (and {more} more failure(s))")
            } else {
                String::new()
            }
        );
    }
    Ok(())
}

/// What every gate run of one invocation shares.
struct Run<'a> {
    checkpoint: &'a Checkpoint,
    given: &'a [gate::GatePrompt],
    options: &'a GateOptions,
    args: &'a GateArgs,
}

/// The gate of `bundle` on `kind` in `precision`; with `keep_trace`, also what the bundle
/// produced at every step (for the pairwise comparison).
fn gate_one(
    bundle: &Path,
    kind: BackendKind,
    precision: Arithmetic,
    reference: &mut gate::GateReference<'_>,
    run: &Run<'_>,
    keep_trace: bool,
) -> Result<(GateReport, Option<GateTrace>)> {
    let args = run.args;
    let spinner = spinner(format!("loading {} ({precision})", bundle.display()));
    let choice = args.coreml.choice(kind, precision, args.threads);
    let pipeline_options = PipelineOptions {
        verify_hashes: !args.no_verify,
        host_threads: args.threads,
        ..PipelineOptions::default()
    };
    let task = GateOnBundle {
        bundle,
        precision,
        checkpoint: run.checkpoint,
        reference,
        given: run.given,
        options: run.options,
        spinner,
        keep_trace,
    };
    let (mut report, trace) = run_on_backend(bundle, &choice, &pipeline_options, task)
        .with_context(|| format!("opening bundle {}", bundle.display()))??;
    let name = bundle
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    report.variant = format!("{name}: {}", report.variant);
    Ok((report, trace))
}

/// The gate of one bundle in one precision, whatever backend runs it.
struct GateOnBundle<'a, 'r> {
    bundle: &'a Path,
    precision: Arithmetic,
    checkpoint: &'a Checkpoint,
    reference: &'a mut gate::GateReference<'r>,
    given: &'a [gate::GatePrompt],
    options: &'a GateOptions,
    /// Shown while the bundle loads; cleared once it is open.
    spinner: indicatif::ProgressBar,
    keep_trace: bool,
}

impl PipelineTask for GateOnBundle<'_, '_> {
    type Output = Result<(GateReport, Option<GateTrace>)>;

    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Self::Output {
        self.spinner.finish_and_clear();
        let tokenizer = self.checkpoint.tokenizer.as_ref().or(pipeline.tokenizer());
        let prompts = gate::resolve(self.given, tokenizer)?;
        let bar = indicatif::ProgressBar::new(0).with_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:30}] {pos}/{len} steps ({elapsed})",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        bar.set_message(format!(
            "gating {} ({}, {})",
            self.bundle.display(),
            pipeline.backend().name(),
            self.precision
        ));
        let mut trace = self.keep_trace.then(GateTrace::default);
        let report = gate::run_gate_traced(
            &pipeline,
            self.reference,
            &prompts,
            tokenizer,
            self.options,
            &mut |p| {
                bar.set_length(p.total as u64);
                bar.set_position(p.done as u64);
            },
            trace.as_mut(),
        )
        .with_context(|| format!("gating {}", self.bundle.display()))?;
        bar.finish_and_clear();
        Ok((report, trace))
    }
}

fn print_report(r: &GateReport) {
    let s = &r.summary;
    println!(
        "{} {} ({:.1} s)",
        if r.passed { "PASS" } else { "FAIL" },
        r.variant,
        r.seconds
    );
    println!(
        "  steps {} (counted {}, near-ties {} with {} flip(s)): top-1 {:.4}; logits cosine min {:.6} mean {:.6}; KL max {:.3e}; max |err| {:.4}",
        s.steps, s.counted_steps, s.near_tie_steps, s.near_tie_disagreements, s.top1_agreement,
        s.min_cosine, s.mean_cosine, s.max_kl, s.max_abs_error
    );
    for p in &r.prompts {
        let canary = match &p.canary {
            Some(c) if !c.applicable => format!(
                "; canary {:?} n/a (the reference does not say it)",
                c.expect
            ),
            Some(c) => format!(
                "; canary {:?} {}",
                c.expect,
                if c.passed { "ok" } else { "MISSED" }
            ),
            None => String::new(),
        };
        println!(
            "  prompt {:?}: bundle {:?}{canary}",
            truncate(&p.label, 40),
            p.bundle_text
                .as_deref()
                .map(|t| truncate(t, 40))
                .unwrap_or_else(|| format!("{:?}", p.bundle_ids))
        );
    }
    println!("  chunk  layers   min cos     mean cos    max |err|  max |act|  ref max |act|");
    for c in &r.chunks {
        println!(
            "  {:>5}  {:>6}  {:<10.7}  {:<10.7}  {:>9.4}  {:>9.2}  {:>9.2}{}",
            c.chunk,
            format!("{}..{}", c.first_layer, c.first_layer + c.layer_count),
            c.min_cosine,
            c.mean_cosine,
            c.max_abs_error,
            c.max_abs_activation,
            c.reference_max_abs,
            c.first_non_finite_op
                .as_deref()
                .map_or(String::new(), |op| format!("  first non-finite: {op}"))
        );
    }
    for f in &r.failures {
        println!("  FAIL {}: {}", f.at, f.message);
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        format!("{}…", s.chars().take(n).collect::<String>())
    }
}

/// Fails before the gate runs when `path` cannot be written (a missing or read-only
/// directory), by creating and removing a probe file beside it.
fn check_writable(path: &std::path::Path) -> Result<()> {
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => std::path::Path::new("."),
    };
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
    let probe = parent.join(format!(
        ".{}.probe-{}",
        name.as_deref().unwrap_or("plot"),
        std::process::id()
    ));
    std::fs::File::create(&probe)
        .with_context(|| format!("--plot {}: cannot write there", path.display()))?;
    let _ = std::fs::remove_file(&probe);
    Ok(())
}

fn write_plot(
    path: &Path,
    reports: &[GateReport],
    args: &GateArgs,
    checkpoint: &Checkpoint,
) -> Result<()> {
    let series: Vec<plot::Series> = reports.iter().map(GateReport::series).collect();
    let title = format!(
        "{} ({} layers): per-layer cosine vs depth",
        args.reference
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default(),
        checkpoint.config.num_hidden_layers
    );
    let svg = plot::cosine_vs_depth_svg(&title, &series, Some(args.min_chunk_cosine));
    std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("plot written to {}", path.display());
    Ok(())
}

fn spinner(message: String) -> indicatif::ProgressBar {
    let bar = indicatif::ProgressBar::new_spinner().with_message(message);
    bar.enable_steady_tick(std::time::Duration::from_millis(120));
    bar
}
