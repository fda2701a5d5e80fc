//! `anemone gate` on encoder bundles (chosen by the bundle manifest's `kind`): embedding cosine
//! per input, per-layer hidden-state cosine, classification decisions, SVG plot, exit 1 on a
//! failure naming the input.

use anemone_mil::Precision;
use anemone_runtime::encoder::Encoder;
use anemone_runtime::gate::encoder::{default_sentences, gate_encoder, read_lines};
use anemone_runtime::gate::plot::{cosine_vs_depth_svg, Series};
use anyhow::{bail, Context, Result};

use super::gate::GateArgs;

pub fn run(args: &GateArgs) -> Result<()> {
    let texts = match &args.prompts {
        Some(path) => read_lines(path)?,
        None => default_sentences(),
    };
    let reference = Encoder::open_reference(&args.reference)
        .with_context(|| format!("opening reference {}", args.reference.display()))?;
    let precisions = if args.precision.is_empty() {
        vec![Precision::Fp16]
    } else {
        let mut precisions = Vec::new();
        for a in &args.precision {
            match a {
                anemone_runtime::backend::Arithmetic::Fp16Acc => {
                    bail!("--precision fp16-acc is not available for encoder bundles (fp16, fp32)")
                }
                anemone_runtime::backend::Arithmetic::Fp16
                | anemone_runtime::backend::Arithmetic::Fp32 => precisions.push(a.precision()),
            }
        }
        precisions
    };
    let mut reports = Vec::new();
    for bundle in &args.bundles {
        for &precision in &precisions {
            let encoder = Encoder::open_bundle(bundle, precision)
                .with_context(|| format!("opening {}", bundle.display()))?;
            let name = bundle.display().to_string();
            let report = gate_encoder(
                &name,
                &encoder,
                &reference,
                &texts,
                args.min_embedding_cosine,
            )?;
            reports.push(report);
        }
    }
    if let Some(path) = &args.plot {
        let series: Vec<Series> = reports
            .iter()
            .map(|r| Series {
                label: format!("{} ({})", r.bundle, r.engine),
                points: r.min_layer_cosine.iter().copied().enumerate().collect(),
            })
            .collect();
        let svg = cosine_vs_depth_svg(
            "encoder: worst hidden-state cosine per depth (0 = embeddings)",
            &series,
            Some(args.min_embedding_cosine),
        );
        std::fs::write(path, svg).with_context(|| format!("writing {}", path.display()))?;
    }
    let passed = reports.iter().all(|r| r.passed);
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(
                &serde_json::json!({"passed": passed, "reports": reports})
            )?
        );
    } else {
        for r in &reports {
            println!(
                "{} [{}]: {} — {} inputs, embedding cosine min {:.7} (goal ≥ {}), worst layer cosine {:.6}{}",
                r.bundle,
                r.engine,
                if r.passed { "PASS" } else { "FAIL" },
                r.inputs.len(),
                r.min_embedding_cosine,
                r.threshold,
                r.min_layer_cosine.iter().copied().fold(1.0, f64::min),
                match (r.decisions_equal, r.max_probability_error) {
                    (Some(d), Some(e)) => format!(", decisions {d}/{}, max probability error {e:.5}", r.inputs.len()),
                    _ => String::new(),
                }
            );
            for i in &r.inputs {
                println!(
                    "  {:>3} {:>4} tokens  bucket {:>4}  cos {:.7}  max|Δ| {:.2e}",
                    i.index,
                    i.tokens,
                    i.bucket.map(|b| b.to_string()).unwrap_or_default(),
                    i.embedding_cosine,
                    i.embedding_max_abs_error
                );
            }
            for f in &r.failures {
                println!("  FAIL {f}");
            }
        }
    }
    if !passed {
        bail!("encoder gate failed");
    }
    Ok(())
}
