//! `anemone inspect BUNDLE --plan`: Core ML's compute plan of every chunk (macOS 14.4+).

use std::path::{Path, PathBuf};

use anemone_coreml::plan::{self, PackagePlan, PlanSummary};
use anemone_coreml::ComputeUnits;
use anyhow::{bail, Context, Result};

use super::inspect::InspectArgs;

/// The packages of a bundle (chunks, then the LM head) or the one package given.
pub fn packages(path: &Path) -> Result<Vec<PathBuf>> {
    if path.join(anemone_models::bundle::MANIFEST_FILE).is_file() {
        let m = anemone_models::bundle::read_manifest(path)
            .with_context(|| format!("reading bundle {}", path.display()))?;
        let mut out: Vec<PathBuf> = m.chunks.iter().map(|c| path.join(&c.path)).collect();
        out.extend(m.lm_head.as_ref().map(|l| path.join(&l.path)));
        return Ok(out);
    }
    if path.extension().is_some_and(|e| e == "mlpackage") && path.is_dir() {
        return Ok(vec![path.to_path_buf()]);
    }
    bail!(
        "{}: neither a bundle (no anemone.json) nor an .mlpackage",
        path.display()
    )
}

/// The compute plan of every package of `path`.
#[cfg(target_vendor = "apple")]
pub fn plan_of_bundle(
    path: &Path,
    units: ComputeUnits,
    no_cache: bool,
) -> Result<Vec<PackagePlan>> {
    let options = anemone_coreml::CoreMlOptions {
        compute_units: units,
        no_cache,
        cache_dir: None,
    };
    packages(path)?
        .iter()
        .map(|p| anemone_coreml::compute_plan(p, &options).map_err(anyhow::Error::from))
        .collect()
}

/// Elsewhere: the error that says the plan needs macOS.
#[cfg(not(target_vendor = "apple"))]
pub fn plan_of_bundle(
    path: &Path,
    units: ComputeUnits,
    no_cache: bool,
) -> Result<Vec<PackagePlan>> {
    let _ = (units, no_cache);
    packages(path)?;
    bail!(
        "{}: --plan needs Core ML's MLComputePlan (macOS {}.{} or later): {}",
        path.display(),
        anemone_coreml::MIN_MACOS_PLAN.0,
        anemone_coreml::MIN_MACOS_PLAN.1,
        anemone_coreml::unavailable_reason()
    )
}

#[derive(serde::Serialize)]
struct JsonPlan<'a> {
    path: &'a Path,
    compute_units: ComputeUnits,
    summary: &'a PlanSummary,
    packages: &'a [PackagePlan],
    min_ane: Option<f64>,
    passed: bool,
}

pub fn run(args: &InspectArgs) -> Result<()> {
    if let Some(f) = args.min_ane {
        if !(0.0..=1.0).contains(&f) {
            bail!("--min-ane {f} is not a fraction in [0, 1]");
        }
    }
    let plans = plan_of_bundle(&args.path, args.coreml.compute_units, args.coreml.no_cache)?;
    let summary = plan::summarize(&plans);
    let passed = args.min_ane.is_none_or(|f| summary.total.ane_share >= f);
    if args.json {
        let report = JsonPlan {
            path: &args.path,
            compute_units: args.coreml.compute_units,
            summary: &summary,
            packages: &plans,
            min_ane: args.min_ane,
            passed,
        };
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print_summary(&summary);
    }
    if !passed {
        bail!(
            "{}: {:.1}% of the estimated cost is on the Neural Engine, below --min-ane {:.1}%",
            args.path.display(),
            summary.total.ane_share * 100.0,
            args.min_ane.unwrap_or(0.0) * 100.0
        );
    }
    Ok(())
}

fn print_summary(s: &PlanSummary) {
    println!(
        "  {:<48} {:>8} {:>10}  off the Neural Engine",
        "package", "ANE %", "ANE ops"
    );
    for (package, r) in s
        .packages
        .iter()
        .map(|(p, r)| (p, r))
        .chain([(&PathBuf::from("total"), &s.total)])
    {
        let off: Vec<String> = r
            .off_ane_by_type
            .iter()
            .map(|(t, n)| format!("{t}×{n}"))
            .collect();
        println!(
            "  {:<48} {:>7.1}% {:>5}/{:<4}  {}",
            package.display(),
            r.ane_share * 100.0,
            r.ane_ops,
            r.placed_ops,
            if off.is_empty() {
                "-".into()
            } else {
                off.join(", ")
            }
        );
    }
}
