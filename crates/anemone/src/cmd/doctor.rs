//! `anemone doctor`: the one report a Mac user runs and sends back — the machine, Core ML's
//! availability, and on a small real model converted on the spot: the compute plan, the gate on
//! every available engine against the fp32 reference and Core ML against the executor
//! (`engine_pair`), speed and memory, and a bisect of layers per chunk. Where Core ML is missing
//! its parts say why and the rest is filled in.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anemone_backend::Backend;
use anemone_mil::Precision;
use anemone_models::ane::{NormForm, StateLayout};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::backend::{run_on_backend, BackendKind, PipelineTask};
use anemone_runtime::gate::{self, GateOptions};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

use super::bisect::{self, Plan, VariantResult};

/// The default model: SmolLM2-135M-Instruct (Q4_1 GGUF) under $ANEMONE_MODELS.
const DEFAULT_MODEL: &str = "smollm2-135m-instruct.Q4_1.gguf";

/// Check this machine end to end and write one report to send back.
///
/// Reports the machine (chip, OS, cores, memory) and Core ML's availability, then converts a small
/// real model (--model, default $ANEMONE_MODELS/smollm2-135m-instruct.Q4_1.gguf) into a temporary
/// directory and runs: the compute plan (macOS 14.4+), the gate against the fp32 reference on
/// every available engine (Core ML, executor), speed and peak memory, and a bisect of layers per
/// chunk 1/2/4 in child processes. Parts that need Core ML are marked unavailable with the reason
/// where it is missing.
///
/// Examples:
///   anemone doctor --out report.json
///   anemone doctor --model ./my-small-model --decode-tokens 32
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct DoctorArgs {
    /// Write the report as JSON to this file.
    #[arg(long, value_name = "report.json")]
    pub out: Option<PathBuf>,

    /// The model to convert and run (default: $ANEMONE_MODELS/smollm2-135m-instruct.Q4_1.gguf).
    #[arg(long)]
    pub model: Option<PathBuf>,

    /// Context of the converted bundles.
    #[arg(long, default_value_t = 256)]
    pub context: usize,

    /// Prefill length of the converted bundles.
    #[arg(long, default_value_t = 64)]
    pub prefill_len: usize,

    /// Decode steps of the bench, the gate and the bisect.
    #[arg(long, default_value_t = 16)]
    pub decode_tokens: usize,

    /// Prompt as token ids (default: "The capital of France is" with the model's tokenizer).
    #[arg(long, value_delimiter = ',', num_args = 1..)]
    pub prompt_ids: Option<Vec<u32>>,

    /// Layers per chunk of the bisect.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub layers_per_chunk: Vec<usize>,

    /// Threads of the reference and the executor (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,

    /// Seconds each bisect child may run.
    #[arg(long, default_value_t = 900)]
    pub timeout: u64,

    /// Print the JSON report on stdout instead of the summary.
    #[arg(long)]
    pub json: bool,

    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
}

#[derive(Debug, Serialize)]
pub struct Machine {
    pub os: String,
    pub os_version: Option<String>,
    pub arch: &'static str,
    pub cpu: Option<String>,
    pub cores: usize,
    pub memory_bytes: Option<u64>,
}

/// A part of the report that may be missing, with the reason.
#[derive(Debug, Serialize)]
#[serde(tag = "status", rename_all = "lowercase")]
pub enum Part<T> {
    Done(T),
    Unavailable { reason: String },
    Failed { error: String },
}

#[derive(Debug, Serialize)]
pub struct GateRow {
    pub backend: String,
    pub passed: bool,
    pub top1_agreement: f64,
    pub min_cosine: f64,
    pub min_chunk_cosine: f64,
    pub failures: Vec<String>,
}

#[derive(Debug, Serialize)]
pub struct Bench {
    pub backend: String,
    pub load_seconds: f64,
    /// Of `load_seconds`, compiling packages (0 for the executor and for Core ML cache hits).
    pub compile_seconds: f64,
    /// Core ML's compiled-model cache over the packages (`{"hits", "misses"}`); null for the
    /// executor, which has none.
    pub compile_cache: Option<anemone_runtime::pipeline::CompileCache>,
    pub prefill_tokens: usize,
    pub prefill_tok_s: Option<f64>,
    pub decode_steps: usize,
    pub decode_tok_s: Option<f64>,
    pub peak_rss_bytes: Option<u64>,
}

#[derive(Debug, Serialize)]
pub struct BisectRows {
    pub variants: Vec<VariantResult>,
}

#[derive(Debug, Serialize)]
pub struct Report {
    pub anemone_version: &'static str,
    pub machine: Machine,
    pub coreml: anemone_coreml::Availability,
    pub model: PathBuf,
    /// Converting and running every bisect variant on every engine.
    pub bisect_seconds: f64,
    pub compute_plan: Part<anemone_coreml::plan::PlanSummary>,
    pub gate: BTreeMap<String, Part<GateRow>>,
    /// Core ML against the executor in fp16, step by step and chunk by chunk along the gate's
    /// path (`a` the executor, `b` Core ML): where the Neural Engine departs from our model of it.
    pub engine_pair: Part<gate::PairReport>,
    pub bench: BTreeMap<String, Part<Bench>>,
    pub bisect: BTreeMap<String, Part<BisectRows>>,
}

pub fn run(args: DoctorArgs) -> Result<()> {
    let model = match &args.model {
        Some(path) => path.clone(),
        None => {
            let dir = std::env::var_os("ANEMONE_MODELS")
                .map(PathBuf::from)
                .unwrap_or_else(|| PathBuf::from("models"));
            dir.join(DEFAULT_MODEL)
        }
    };
    if !model.exists() {
        bail!(
            "{} does not exist: give --model or set ANEMONE_MODELS to a directory holding {DEFAULT_MODEL}",
            model.display()
        );
    }
    let machine = machine();
    let coreml = anemone_coreml::availability();
    let checkpoint = anemone_models::open_checkpoint(&model)
        .with_context(|| format!("opening {}", model.display()))?;
    let ids = bisect::prompt_ids(&checkpoint, None, args.prompt_ids.as_deref())?;
    let work = tempfile::Builder::new()
        .prefix("anemone-doctor-")
        .tempdir()
        .context("creating a temporary directory")?;
    let backends: Vec<BackendKind> = BackendKind::ALL.to_vec();
    let spinner = super::spinner("running the fp32 reference".into());
    let reference =
        bisect::reference_run(&checkpoint, ids.clone(), args.decode_tokens, args.threads)?;
    spinner.finish_and_clear();

    // bisect (and the bench: its first variant) per engine, in child processes
    let variants = bisect::grid(
        &args.layers_per_chunk,
        &[StateLayout::Unified],
        &[args.prefill_len],
        &[Precision::Fp16],
    )?;
    let started = Instant::now();
    let mut bisects = BTreeMap::new();
    let mut bench = BTreeMap::new();
    for &kind in &backends {
        if !usable(kind, &coreml) {
            let reason = coreml.reason.clone().unwrap_or_default();
            bisects.insert(
                kind.name().to_string(),
                Part::Unavailable {
                    reason: reason.clone(),
                },
            );
            bench.insert(kind.name().to_string(), Part::Unavailable { reason });
            continue;
        }
        let dir = work.path().join(kind.name());
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let plan = Plan {
            checkpoint_path: &model,
            checkpoint: &checkpoint,
            variants: variants.clone(),
            context: args.context,
            norm: NormForm::MaxScaled,
            backend: kind,
            threads: args.threads,
            timeout_seconds: args.timeout,
            min_cosine: 0.99,
            work_dir: &dir,
            coreml: args.coreml.clone(),
        };
        let spinner = super::spinner(format!("bisect on {kind}"));
        let results = bisect::run_plan(&plan, &reference, &mut |r| {
            spinner.set_message(format!(
                "bisect on {kind}: {} {}",
                r.variant.label,
                r.status.name()
            ));
        });
        spinner.finish_and_clear();
        match results {
            Ok(results) => {
                bench.insert(kind.name().to_string(), bench_of(&results));
                bisects.insert(
                    kind.name().to_string(),
                    Part::Done(BisectRows { variants: results }),
                );
            }
            Err(e) => {
                bench.insert(
                    kind.name().to_string(),
                    Part::Failed {
                        error: format!("{e:#}"),
                    },
                );
                bisects.insert(
                    kind.name().to_string(),
                    Part::Failed {
                        error: format!("{e:#}"),
                    },
                );
            }
        }
    }
    let bisect_seconds = started.elapsed().as_secs_f64();

    // the first variant's bundle (converted by the first engine's bisect) for the gate and plan
    let first = &variants[0].label;
    let bundle = backends
        .iter()
        .map(|k| work.path().join(k.name()).join(first))
        .find(|b| b.join(anemone_models::bundle::MANIFEST_FILE).is_file());
    let compute_plan = compute_plan(bundle.as_deref(), &coreml, &args);
    let mut gates = BTreeMap::new();
    let mut traces = std::collections::HashMap::new();
    let mut reference_model = ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: args.threads,
            context_len: Some(args.context),
            huge_pages: false,
        },
    )
    .context("loading the fp32 reference")?;
    // one reference run, shared by the gates of every engine
    let mut reference = gate::GateReference::new(&mut reference_model);
    for &kind in &backends {
        let part = match (&bundle, usable(kind, &coreml)) {
            (_, false) => Part::Unavailable {
                reason: coreml.reason.clone().unwrap_or_default(),
            },
            (None, true) => Part::Failed {
                error: "no bundle converted".into(),
            },
            (Some(b), true) => match gate_on(b, kind, &ids, &mut reference, &args) {
                Ok((row, trace)) => {
                    traces.insert(kind, (row.backend.clone(), trace));
                    Part::Done(row)
                }
                Err(e) => Part::Failed {
                    error: format!("{e:#}"),
                },
            },
        };
        gates.insert(kind.name().to_string(), part);
    }
    let engine_pair = engine_pair(&traces, checkpoint.config.hidden_size, &coreml);
    #[cfg(not(target_vendor = "apple"))]
    {
        let reason = coreml
            .reason
            .clone()
            .unwrap_or_else(anemone_coreml::unavailable_reason);
        gates.insert(
            "coreml".into(),
            Part::Unavailable {
                reason: reason.clone(),
            },
        );
        bench.insert(
            "coreml".into(),
            Part::Unavailable {
                reason: reason.clone(),
            },
        );
        bisects.insert("coreml".into(), Part::Unavailable { reason });
    }
    let report = Report {
        anemone_version: env!("CARGO_PKG_VERSION"),
        machine,
        coreml,
        model,
        bisect_seconds,
        compute_plan,
        gate: gates,
        engine_pair,
        bench,
        bisect: bisects,
    };
    let json = serde_json::to_string_pretty(&report)?;
    if let Some(out) = &args.out {
        write_atomically(out, json.as_bytes())?;
    }
    if args.json {
        println!("{json}");
    } else {
        print_summary(&report, args.out.as_deref());
    }
    Ok(())
}

/// Whether `kind` can run here (Core ML needs the OS to support it).
#[cfg_attr(not(target_vendor = "apple"), allow(unused_variables))]
fn usable(kind: BackendKind, coreml: &anemone_coreml::Availability) -> bool {
    match kind {
        BackendKind::Executor => true,
        #[cfg(target_vendor = "apple")]
        BackendKind::CoreMl => coreml.available,
    }
}

fn bench_of(results: &[VariantResult]) -> Part<Bench> {
    let Some(first) = results.first() else {
        return Part::Failed {
            error: "no variant ran".into(),
        };
    };
    match &first.run {
        Some(run) => Part::Done(Bench {
            backend: run.backend.clone(),
            load_seconds: run.load_seconds,
            compile_seconds: run.compile_seconds,
            compile_cache: run.compile_cache,
            prefill_tokens: run.prefill_tokens,
            prefill_tok_s: run.prefill_tok_s(),
            decode_steps: run.decode_steps,
            decode_tok_s: run.decode_tok_s(),
            peak_rss_bytes: run.peak_rss_bytes,
        }),
        None => Part::Failed {
            error: format!(
                "{} {}: {}",
                first.variant.label,
                first.status.name(),
                first
                    .signal
                    .clone()
                    .or_else(|| first.error.clone())
                    .unwrap_or_default()
            ),
        },
    }
}

#[cfg(target_vendor = "apple")]
fn compute_plan(
    bundle: Option<&Path>,
    coreml: &anemone_coreml::Availability,
    args: &DoctorArgs,
) -> Part<anemone_coreml::plan::PlanSummary> {
    if !coreml.available {
        return Part::Unavailable {
            reason: coreml.reason.clone().unwrap_or_default(),
        };
    }
    let Some(bundle) = bundle else {
        return Part::Failed {
            error: "no bundle converted".into(),
        };
    };
    match super::inspect_plan::plan_of_bundle(
        bundle,
        args.coreml.compute_units,
        args.coreml.no_cache,
    ) {
        Ok(plans) => Part::Done(anemone_coreml::plan::summarize(&plans)),
        Err(e) => Part::Failed {
            error: format!("{e:#}"),
        },
    }
}

#[cfg(not(target_vendor = "apple"))]
fn compute_plan(
    _bundle: Option<&Path>,
    coreml: &anemone_coreml::Availability,
    _args: &DoctorArgs,
) -> Part<anemone_coreml::plan::PlanSummary> {
    Part::Unavailable {
        reason: coreml
            .reason
            .clone()
            .unwrap_or_else(anemone_coreml::unavailable_reason),
    }
}

struct GateTask<'a, 'r> {
    ids: &'a [u32],
    reference: &'a mut gate::GateReference<'r>,
    steps: usize,
}

impl PipelineTask for GateTask<'_, '_> {
    type Output = Result<(GateRow, gate::GateTrace)>;
    fn run<B: Backend>(self, pipeline: Pipeline<B>) -> Self::Output {
        let prompts = gate::resolve(&[gate::GatePrompt::ids(self.ids)], pipeline.tokenizer())?;
        let options = GateOptions {
            steps: self.steps,
            ..GateOptions::default()
        };
        let mut trace = gate::GateTrace::default();
        let report = gate::run_gate_traced(
            &pipeline,
            self.reference,
            &prompts,
            pipeline.tokenizer(),
            &options,
            &mut |_| {},
            Some(&mut trace),
        )?;
        let row = GateRow {
            backend: report.backend.clone(),
            passed: report.passed,
            top1_agreement: report.summary.top1_agreement,
            min_cosine: report.summary.min_cosine,
            min_chunk_cosine: report.summary.min_chunk_cosine,
            failures: report
                .failures
                .iter()
                .map(|f| format!("{}: {}", f.at, f.message))
                .collect(),
        };
        Ok((row, trace))
    }
}

/// The gate of `bundle` on `kind` in fp16, and what the bundle produced along its path.
fn gate_on(
    bundle: &Path,
    kind: BackendKind,
    ids: &[u32],
    reference: &mut gate::GateReference<'_>,
    args: &DoctorArgs,
) -> Result<(GateRow, gate::GateTrace)> {
    let spinner = super::spinner(format!("gate on {kind}"));
    let choice = args
        .coreml
        .choice(kind, Precision::Fp16.into(), args.threads);
    let task = GateTask {
        ids,
        reference,
        steps: args.decode_tokens.clamp(1, 8),
    };
    let out = run_on_backend(bundle, &choice, &PipelineOptions::default(), task)??;
    spinner.finish_and_clear();
    Ok(out)
}

/// Core ML against the executor along the gate's path, when both gates ran.
fn engine_pair(
    traces: &std::collections::HashMap<BackendKind, (String, gate::GateTrace)>,
    hidden: usize,
    coreml: &anemone_coreml::Availability,
) -> Part<gate::PairReport> {
    #[cfg(target_vendor = "apple")]
    let on_coreml = traces.get(&BackendKind::CoreMl);
    #[cfg(not(target_vendor = "apple"))]
    let on_coreml: Option<&(String, gate::GateTrace)> = None;
    match (traces.get(&BackendKind::Executor), on_coreml) {
        (Some((a_name, a)), Some((b_name, b))) => {
            let min_chunk_cosine = GateOptions::default().min_chunk_cosine;
            match gate::compare_traces((a_name, a), (b_name, b), hidden, min_chunk_cosine) {
                Ok(pair) => Part::Done(pair),
                Err(e) => Part::Failed {
                    error: e.to_string(),
                },
            }
        }
        _ if !coreml.available => Part::Unavailable {
            reason: coreml
                .reason
                .clone()
                .unwrap_or_else(anemone_coreml::unavailable_reason),
        },
        _ => Part::Failed {
            error: "the gate did not run on both the executor and Core ML".into(),
        },
    }
}

fn write_atomically(path: &Path, bytes: &[u8]) -> Result<()> {
    let dir = path
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let mut tmp = tempfile::NamedTempFile::new_in(dir)
        .with_context(|| format!("creating a temporary file beside {}", path.display()))?;
    std::io::Write::write_all(&mut tmp, bytes)
        .with_context(|| format!("writing {}", path.display()))?;
    tmp.persist(path)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

fn print_summary(r: &Report, out: Option<&Path>) {
    let m = &r.machine;
    println!(
        "machine: {} {} ({}), {}, {} cores, {}",
        m.os,
        m.os_version.as_deref().unwrap_or("?"),
        m.arch,
        m.cpu.as_deref().unwrap_or("unknown CPU"),
        m.cores,
        m.memory_bytes.map_or("memory unknown".into(), |b| format!(
            "{:.1} GB",
            b as f64 / 1e9
        ))
    );
    match &r.coreml.reason {
        None => println!("core ml: available"),
        Some(reason) => println!("core ml: unavailable: {reason}"),
    }
    println!(
        "model: {} (bundles converted and run in {:.1} s)",
        r.model.display(),
        r.bisect_seconds
    );
    match &r.compute_plan {
        Part::Done(s) => println!(
            "compute plan: {:.1}% of the cost on the Neural Engine ({} of {} ops)",
            s.total.ane_share * 100.0,
            s.total.ane_ops,
            s.total.placed_ops
        ),
        Part::Unavailable { reason } => println!("compute plan: unavailable: {reason}"),
        Part::Failed { error } => println!("compute plan: FAILED: {error}"),
    }
    for (backend, g) in &r.gate {
        match g {
            Part::Done(g) => println!(
                "gate {backend}: {} (top-1 {:.3}, logits cosine min {:.6}, chunk cosine min {:.6})",
                if g.passed { "PASS" } else { "FAIL" },
                g.top1_agreement,
                g.min_cosine,
                g.min_chunk_cosine
            ),
            Part::Unavailable { reason } => println!("gate {backend}: unavailable: {reason}"),
            Part::Failed { error } => println!("gate {backend}: FAILED: {error}"),
        }
    }
    match &r.engine_pair {
        Part::Done(p) => println!(
            "{} vs {}: top-1 agree {:.3}, logits cosine min {:.6}, first divergent chunk {}",
            p.b,
            p.a,
            p.top1_agreement,
            p.min_logits_cosine,
            p.first_divergent_chunk
                .map_or("none".to_string(), |c| c.to_string())
        ),
        Part::Unavailable { reason } => println!("coreml vs executor: unavailable: {reason}"),
        Part::Failed { error } => println!("coreml vs executor: FAILED: {error}"),
    }
    for (backend, b) in &r.bench {
        match b {
            Part::Done(b) => println!(
                "bench {backend}: load {:.2} s (compile {:.2} s{}), prefill {:.1} tok/s, decode {:.1} tok/s, peak {:.0} MB",
                b.load_seconds,
                b.compile_seconds,
                match b.compile_cache {
                    Some(c) => format!(", cache {} hits {} misses", c.hits, c.misses),
                    None => String::new(),
                },
                b.prefill_tok_s.unwrap_or(0.0),
                b.decode_tok_s.unwrap_or(0.0),
                b.peak_rss_bytes.unwrap_or(0) as f64 / 1e6
            ),
            Part::Unavailable { reason } => println!("bench {backend}: unavailable: {reason}"),
            Part::Failed { error } => println!("bench {backend}: FAILED: {error}"),
        }
    }
    for (backend, b) in &r.bisect {
        match b {
            Part::Done(rows) => {
                println!("bisect {backend}:");
                bisect::print_table(&rows.variants);
            }
            Part::Unavailable { reason } => println!("bisect {backend}: unavailable: {reason}"),
            Part::Failed { error } => println!("bisect {backend}: FAILED: {error}"),
        }
    }
    if let Some(out) = out {
        println!("report written to {}", out.display());
    }
}

fn command_output(program: &str, args: &[&str]) -> Option<String> {
    let out = std::process::Command::new(program)
        .args(args)
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .filter(|s| !s.is_empty())
}

/// What the machine is: from sysctl/sw_vers on macOS, /proc and /etc/os-release on Linux.
pub fn machine() -> Machine {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let os = std::env::consts::OS.to_string();
    let arch = std::env::consts::ARCH;
    if cfg!(target_vendor = "apple") {
        return Machine {
            os,
            os_version: command_output("sw_vers", &["-productVersion"]),
            arch,
            cpu: command_output("sysctl", &["-n", "machdep.cpu.brand_string"]),
            cores,
            memory_bytes: command_output("sysctl", &["-n", "hw.memsize"])
                .and_then(|s| s.parse().ok()),
        };
    }
    let read = |p: &str| std::fs::read_to_string(p).ok();
    let cpu = read("/proc/cpuinfo").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("model name"))
            .and_then(|l| l.split_once(':'))
            .map(|(_, v)| v.trim().to_string())
    });
    let memory_bytes = read("/proc/meminfo").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("MemTotal:"))
            .and_then(|l| l.split_whitespace().nth(1))
            .and_then(|kb| kb.parse::<u64>().ok())
            .map(|kb| kb * 1024)
    });
    let os_version = read("/etc/os-release").and_then(|s| {
        s.lines()
            .find(|l| l.starts_with("PRETTY_NAME="))
            .map(|l| l["PRETTY_NAME=".len()..].trim_matches('"').to_string())
    });
    Machine {
        os,
        os_version,
        arch,
        cpu,
        cores,
        memory_bytes,
    }
}
