//! `anemone gate --compare ENGINE`: the engine a gate's bundles are also run on, and the pairwise
//! row that compares the two (on a Mac, Core ML against the executor's fp16 model of the Neural
//! Engine; anywhere, one executor arithmetic against another).

use anemone_runtime::backend::{Arithmetic, BackendKind};
use anemone_runtime::gate::PairReport;

/// An engine to compare with: a backend and, for the executor, its arithmetic (default: fp16,
/// the executor's model of the Neural Engine).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EngineSpec {
    pub kind: BackendKind,
    pub arithmetic: Arithmetic,
}

impl std::str::FromStr for EngineSpec {
    type Err = String;
    /// `KIND[:PRECISION]`: `executor`, `executor:fp16-acc`, `coreml`.
    fn from_str(s: &str) -> Result<Self, String> {
        let (kind, arithmetic) = match s.split_once(':') {
            Some((kind, arithmetic)) => (kind, arithmetic.parse::<Arithmetic>()?),
            None => (s, Arithmetic::Fp16),
        };
        let kind = kind.parse::<BackendKind>().map_err(|e| e.to_string())?;
        Ok(EngineSpec { kind, arithmetic })
    }
}

/// The comparison a gate on `kind` makes when `--compare` is not given: Core ML against the
/// executor in fp16 (where the real Neural Engine departs from our model of it); none for the
/// executor.
pub fn default_compare(kind: BackendKind) -> Option<EngineSpec> {
    match kind {
        BackendKind::Executor => None,
        #[cfg(target_vendor = "apple")]
        BackendKind::CoreMl => Some(EngineSpec {
            kind: BackendKind::Executor,
            arithmetic: Arithmetic::Fp16,
        }),
    }
}

pub fn print_pair(bundle: &std::path::Path, p: &PairReport) {
    println!(
        "{} vs {} on {}: top-1 agree {:.4} over {} steps{}; logits cosine min {:.6}, max |diff| {:.4}{}",
        p.b,
        p.a,
        bundle.display(),
        p.top1_agreement,
        p.steps,
        p.first_top1_flip
            .map_or(String::new(), |(prompt, step)| format!(
                " (first flip: prompt {prompt} step {step})"
            )),
        p.min_logits_cosine,
        p.max_logits_abs_error,
        p.first_divergent_chunk
            .map_or("; no chunk diverges".to_string(), |c| format!(
                "; first divergent chunk: {c}"
            ))
    );
    println!("  chunk  min cos     max |diff|");
    for c in &p.chunks {
        println!(
            "  {:>5}  {:<10.7}  {:>9.4}",
            c.chunk, c.min_cosine, c.max_abs_error
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engine_specs_parse_kind_and_arithmetic() {
        assert_eq!(
            "executor:fp16-acc".parse::<EngineSpec>(),
            Ok(EngineSpec {
                kind: BackendKind::Executor,
                arithmetic: Arithmetic::Fp16Acc
            })
        );
        assert_eq!(
            "executor".parse::<EngineSpec>().map(|s| s.arithmetic),
            Ok(Arithmetic::Fp16)
        );
        assert!("executor:fp8"
            .parse::<EngineSpec>()
            .unwrap_err()
            .contains("fp8"));
        assert!("npu".parse::<EngineSpec>().unwrap_err().contains("npu"));
        assert_eq!(default_compare(BackendKind::Executor), None);
    }
}
