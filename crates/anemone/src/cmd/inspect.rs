//! `anemone inspect`: what a bundle or package holds — functions and their inputs, outputs and
//! states, op histograms, weight bytes by dtype, manifest provenance with every file hash
//! verified — and the static ANE-legality lint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anemone_compress::{CompressionRecord, CompressionSummary};
use anemone_mil::{read_package, BlobFile};
use anemone_models::ane::{lint_program, Finding, FunctionSignature, Severity};
use anemone_models::bundle::{
    read_manifest, signature_mismatches, verify_bundle, FileCheck, KvStateMemory, Manifest,
    MANIFEST_FILE,
};
use anyhow::{bail, Context, Result};
use clap::Args;
use serde::Serialize;

/// Show what a bundle or an .mlpackage holds and lint it for the Neural Engine.
///
/// For a bundle, every file's sha256 is checked against anemone.json (a mismatch always fails).
/// Lint findings have a severity; with --strict any error-level finding makes the exit status 1.
///
/// Examples:
///   anemone inspect smollm2.bundle
///   anemone inspect smollm2.bundle/chunks/chunk-00.mlpackage --json
///   anemone inspect some.mlpackage --strict
///   anemone inspect smollm2.bundle --plan --min-ane 0.95   (macOS 14.4+)
#[derive(Debug, Args)]
#[command(verbatim_doc_comment)]
pub struct InspectArgs {
    /// A bundle directory (with anemone.json) or one .mlpackage.
    pub path: PathBuf,

    /// Exit with status 1 when the lint finds an error.
    #[arg(long)]
    pub strict: bool,

    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,

    /// Skip checking a bundle's files against the manifest's sha256.
    #[arg(long)]
    pub no_verify: bool,

    /// Instead of the package report: Core ML's compute plan (MLComputePlan, macOS 14.4+) of
    /// every function of every chunk: each op's preferred and supported devices and estimated
    /// cost, the Neural Engine's share of the cost per chunk and in total, the ops off it by type.
    #[arg(long)]
    pub plan: bool,

    /// With --plan: exit with status 1 when the Neural Engine's share of the total cost is below
    /// F (0..1), a residency gate for a Mac CI.
    #[arg(long, value_name = "F", requires = "plan")]
    pub min_ane: Option<f64>,

    #[command(flatten)]
    pub coreml: super::CoreMlArgs,
}

#[derive(Debug, Serialize)]
struct Report {
    path: PathBuf,
    kind: &'static str,
    manifest: Option<Manifest>,
    /// Memory of one session's KV state (bundles).
    kv_state: Option<KvStateMemory>,
    /// Per tensor group: scheme, reconstruction error, bytes (compressed bundles only).
    compression: Option<CompressionSummary>,
    file_checks: Option<Vec<FileCheck>>,
    /// OS metadata files (.DS_Store, ._*, Icon\r) present in a bundle and not verified.
    ignored_files: Vec<String>,
    packages: Vec<PackageReport>,
    lint_errors: usize,
    lint_warnings: usize,
}

#[derive(Debug, Serialize)]
struct PackageReport {
    path: String,
    metadata: BTreeMap<String, String>,
    functions: Vec<FunctionReport>,
    weight_file_bytes: u64,
    /// Blob bytes in weight.bin by dtype (shared weights once).
    weight_bytes_by_dtype: BTreeMap<String, u64>,
    lint: Vec<Finding>,
}

#[derive(Debug, Serialize)]
struct FunctionReport {
    #[serde(flatten)]
    signature: FunctionSignature,
    ops: usize,
    op_histogram: BTreeMap<String, usize>,
}

/// `declared`: the functions the bundle manifest declares for this package; any disagreement
/// with the package is an error-level finding (`manifest-signature`).
fn inspect_package(
    path: &Path,
    label: String,
    declared: Option<&[FunctionSignature]>,
) -> Result<PackageReport> {
    let program =
        read_package(path).with_context(|| format!("cannot read package {}", path.display()))?;
    let mut mismatches = Vec::new();
    if let Some(declared) = declared {
        for message in signature_mismatches(declared, &program) {
            mismatches.push(Finding {
                severity: Severity::Error,
                rule: "manifest-signature".into(),
                location: String::new(),
                message,
            });
        }
    }
    let weights_dir = path.join("Data/com.apple.CoreML/weights");
    let mut weight_file_bytes = 0;
    let mut weight_bytes_by_dtype = BTreeMap::new();
    if weights_dir.is_dir() {
        let mut files: Vec<_> = std::fs::read_dir(&weights_dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.extension().is_some_and(|e| e == "bin"))
            .collect();
        files.sort();
        for file in files {
            let bytes =
                std::fs::read(&file).with_context(|| format!("cannot read {}", file.display()))?;
            weight_file_bytes += bytes.len() as u64;
            let blob = BlobFile::parse(&file.display().to_string(), bytes)?;
            for r in blob.records() {
                *weight_bytes_by_dtype
                    .entry(r.dtype.mil_name().to_string())
                    .or_insert(0) += r.size_bytes;
            }
        }
    }
    let functions = program
        .functions()
        .iter()
        .map(|f| {
            let mut op_histogram = BTreeMap::new();
            for op in f.operations() {
                *op_histogram
                    .entry(op.op.mil_type().to_string())
                    .or_insert(0) += 1;
            }
            FunctionReport {
                signature: FunctionSignature::of_function(f, None),
                ops: f.operations().len(),
                op_histogram,
            }
        })
        .collect();
    Ok(PackageReport {
        path: label,
        metadata: program.metadata.clone(),
        functions,
        weight_file_bytes,
        weight_bytes_by_dtype,
        lint: lint_program(&program, weight_file_bytes)
            .into_iter()
            .chain(mismatches)
            .collect(),
    })
}

pub fn run(args: InspectArgs) -> Result<()> {
    if args.plan {
        return super::inspect_plan::run(&args);
    }
    let path = &args.path;
    let is_bundle = path.join(MANIFEST_FILE).is_file();
    let mut report = if is_bundle {
        let manifest = read_manifest(path)?;
        let verification = if args.no_verify {
            None
        } else {
            Some(verify_bundle(path, &manifest)?)
        };
        let packages = manifest
            .package_paths()
            .iter()
            .map(|rel| {
                inspect_package(
                    &path.join(rel),
                    rel.to_string(),
                    Some(manifest.declared_functions(rel).unwrap_or(&[])),
                )
            })
            .collect::<Result<Vec<_>>>()?;
        let compression = CompressionRecord::from_manifest(&manifest)
            .with_context(|| format!("{}", path.join(MANIFEST_FILE).display()))?
            .map(|r| r.summary());
        Report {
            path: path.clone(),
            kind: "bundle",
            kv_state: Some(manifest.kv_state_memory()),
            manifest: Some(manifest),
            compression,
            ignored_files: verification
                .as_ref()
                .map(|v| v.ignored.clone())
                .unwrap_or_default(),
            file_checks: verification.map(|v| v.checks),
            packages,
            lint_errors: 0,
            lint_warnings: 0,
        }
    } else if path.join("Manifest.json").is_file() {
        Report {
            path: path.clone(),
            kind: "package",
            kv_state: None,
            manifest: None,
            compression: None,
            file_checks: None,
            ignored_files: Vec::new(),
            packages: vec![inspect_package(path, path.display().to_string(), None)?],
            lint_errors: 0,
            lint_warnings: 0,
        }
    } else {
        bail!(
            "{}: neither a bundle (no {MANIFEST_FILE}) nor an .mlpackage (no Manifest.json)",
            path.display()
        );
    };
    let findings = report.packages.iter().flat_map(|p| &p.lint);
    report.lint_errors = findings
        .clone()
        .filter(|f| f.severity == Severity::Error)
        .count();
    report.lint_warnings = findings.filter(|f| f.severity == Severity::Warning).count();

    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_text(&report);
    }
    let bad_files: Vec<&FileCheck> = report
        .file_checks
        .iter()
        .flatten()
        .filter(|c| !c.ok)
        .collect();
    if !bad_files.is_empty() {
        let names: Vec<&str> = bad_files.iter().map(|c| c.path.as_str()).collect();
        bail!(
            "{}: {} file(s) do not match the manifest: {}",
            path.display(),
            bad_files.len(),
            names.join(", ")
        );
    }
    if args.strict && report.lint_errors > 0 {
        bail!(
            "{}: lint found {} error(s) (--strict)",
            path.display(),
            report.lint_errors
        );
    }
    Ok(())
}

fn human_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 30 => format!("{:.2} GiB", b as f64 / (1u64 << 30) as f64),
        b if b >= 1 << 20 => format!("{:.1} MiB", b as f64 / (1u64 << 20) as f64),
        b if b >= 1 << 10 => format!("{:.1} KiB", b as f64 / 1024.0),
        b => format!("{b} B"),
    }
}

fn print_text(r: &Report) {
    println!("{} {}", r.kind, r.path.display());
    if let Some(m) = &r.manifest {
        let c = &m.conversion;
        println!(
            "  {} {} (schema {}), {} {} layers in {} chunk(s)",
            m.tool.name,
            m.tool.version,
            m.schema_version,
            m.architecture.name(),
            m.config.num_hidden_layers,
            m.chunks.len()
        );
        println!(
            "  spec {} ({}), context {}, prefill {}, {}, norm {}, state {}, lm head {}",
            c.spec_version,
            c.opset,
            c.context,
            c.prefill_len,
            c.precision.name(),
            c.norm.name(),
            c.state_layout.name(),
            c.lm_head.name()
        );
        if let Some(kv) = &r.kv_state {
            println!(
                "  KV state: {} per session (fp16; {} per token × {} tokens; head_dim {} held as {})",
                human_bytes(kv.bytes),
                human_bytes(kv.bytes_per_token),
                kv.context,
                kv.head_dim,
                kv.state_head_dim
            );
            if let Some(slots) = kv.local_kv_slots {
                println!(
                    "  sliding-window layers: ring of {slots} slots (full-context states would \
                     take {})",
                    human_bytes(kv.full_context_bytes)
                );
            }
        }
        if let Some(l) = &m.lora {
            println!(
                "  LoRA {} (sha256 {}), r {}, scale {}, {} tensors merged",
                l.dir.display(),
                l.adapter_sha256,
                l.rank,
                l.scale,
                l.merged_tensors.len()
            );
        }
        if let Some(summary) = &r.compression {
            super::compress_opts::print_summary(summary, "  ");
        }
        println!("  provenance:");
        for s in &m.provenance {
            println!("    {}  {} ({} bytes)", s.sha256, s.path.display(), s.bytes);
        }
    }
    if let Some(checks) = &r.file_checks {
        let ok = checks.iter().filter(|c| c.ok).count();
        println!("  files: {ok} of {} match the manifest", checks.len());
        for c in checks.iter().filter(|c| !c.ok) {
            println!(
                "    MISMATCH {}: expected {}, found {}",
                c.path,
                c.expected_sha256.as_deref().unwrap_or("(not listed)"),
                c.found_sha256.as_deref().unwrap_or("(missing)")
            );
        }
    } else if r.kind == "bundle" {
        println!("  files: not verified (--no-verify)");
    }
    if !r.ignored_files.is_empty() {
        println!(
            "  ignored (OS metadata, not verified): {}",
            r.ignored_files
                .iter()
                .map(|f| format!("{f:?}"))
                .collect::<Vec<_>>()
                .join(", ")
        );
    }
    for p in &r.packages {
        let by_dtype: Vec<String> = p
            .weight_bytes_by_dtype
            .iter()
            .map(|(d, b)| format!("{d} {}", human_bytes(*b)))
            .collect();
        println!(
            "package {} (weight.bin {}: {})",
            p.path,
            human_bytes(p.weight_file_bytes),
            by_dtype.join(", ")
        );
        for f in &p.functions {
            println!("  function {} ({} ops)", f.signature.name, f.ops);
            let port = |kind: &str, s: &anemone_models::ane::TensorSignature| {
                println!("    {kind:<5} {:<18} {} {:?}", s.name, s.dtype, s.shape);
            };
            f.signature.inputs.iter().for_each(|s| port("in", s));
            f.signature.states.iter().for_each(|s| port("state", s));
            f.signature.outputs.iter().for_each(|s| port("out", s));
            let hist: Vec<String> = f
                .op_histogram
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            println!("    ops: {}", hist.join(", "));
        }
        if p.lint.is_empty() {
            println!("  lint: clean");
        }
        for l in &p.lint {
            let sev = match l.severity {
                Severity::Error => "error",
                Severity::Warning => "warning",
                Severity::Info => "info",
            };
            let at = if l.location.is_empty() {
                String::new()
            } else {
                format!(" {}", l.location)
            };
            println!("  {sev} [{}]{at}: {}", l.rule, l.message);
        }
    }
    println!(
        "lint: {} error(s), {} warning(s)",
        r.lint_errors, r.lint_warnings
    );
}
