//! Static ANE-legality lint of a program: what is known to keep a graph off the Neural Engine or
//! to crash it, found without a Mac (docs/ARCHITECTURE.md, "What the Neural Engine accepts").

use anemone_mil::{DType, Op, Program};
use serde::{Deserialize, Serialize};

use super::options::{MAX_ANE_DIM, STATE_ALIGN};

/// How serious a finding is: errors make `inspect --strict` fail.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Severity {
    Info,
    Warning,
    Error,
}

/// One lint finding.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    pub severity: Severity,
    /// Stable rule id (`fp32-op`, `state-count`, …).
    pub rule: String,
    /// Function (and op or value) the finding is about; empty for package-wide findings.
    pub location: String,
    pub message: String,
}

const GIB: u64 = 1 << 30;

type RawFinding = (Severity, &'static str, String, String);

/// What the graph computes, where it can be read off the ops. `softmax-axis`: attention
/// probabilities must sum to one over the axis the next matmul contracts (the keys); a softmax
/// over any other axis normalises over queries or channels. (An output that is an input or state
/// passed through is refused by the verifier; outputs renamed against the manifest by the
/// manifest check.)
fn graph_semantics(f: &anemone_mil::Function) -> Vec<RawFinding> {
    let fname = f.name();
    let mut out = Vec::new();
    for op in f.operations() {
        let Op::Softmax { axis, .. } = op.op else {
            continue;
        };
        let Some(&probs) = op.outputs.first() else {
            continue;
        };
        let rank = f.tensor_type(probs).rank();
        for consumer in f.operations() {
            let Op::Matmul {
                x,
                y,
                transpose_x,
                transpose_y,
            } = consumer.op
            else {
                continue;
            };
            let contracted = if x == probs {
                if transpose_x {
                    rank - 2
                } else {
                    rank - 1
                }
            } else if y == probs {
                if transpose_y {
                    rank - 1
                } else {
                    rank - 2
                }
            } else {
                continue;
            };
            if contracted != axis {
                out.push((
                    Severity::Error,
                    "softmax-axis",
                    format!("{fname}/{}", op.name),
                    format!(
                        "softmax normalises axis {axis} but `{}` sums its output over axis \
                         {contracted}: the weights must sum to one over the keys",
                        consumer.name
                    ),
                ));
            }
        }
    }
    out
}

/// Lints `program`; `weight_bytes` is the size of its weight.bin files.
pub fn lint_program(program: &Program, weight_bytes: u64) -> Vec<Finding> {
    let mut out = Vec::new();
    let mut push = |severity, rule: &str, location: String, message: String| {
        out.push(Finding {
            severity,
            rule: rule.to_string(),
            location,
            message,
        })
    };
    for f in program.functions() {
        let fname = f.name();
        let float_inputs: Vec<DType> = f
            .tensor_inputs()
            .map(|v| f.tensor_type(v).dtype)
            .filter(|d| d.is_float())
            .collect();
        let fp32_program =
            !float_inputs.is_empty() && float_inputs.iter().all(|d| *d == DType::F32);
        if fp32_program {
            push(
                Severity::Warning,
                "fp32-program",
                fname.to_string(),
                "fp32 inputs and compute: Core ML runs this on CPU/GPU, never on the ANE".into(),
            );
        }
        let mut fp32_ops = 0usize;
        let mut first_fp32 = None;
        for op in f.operations() {
            if op.op.is_constant() {
                if let Op::Const { value } = &op.op {
                    if value.dtype().is_float()
                        && value.to_f32_vec().iter().any(|v| v.is_infinite())
                    {
                        push(
                            Severity::Error,
                            "infinite-const",
                            format!("{fname}/{}", op.name),
                            "constant holds ±inf (use -1e4 for masks: fp16 softmax of -inf gives NaN)".into(),
                        );
                    }
                }
                continue;
            }
            let produces_fp32 = op
                .outputs
                .iter()
                .any(|v| f.tensor_type(*v).dtype == DType::F32);
            if produces_fp32 && !fp32_program {
                fp32_ops += 1;
                first_fp32.get_or_insert_with(|| op.name.clone());
            }
        }
        if let Some(first) = first_fp32 {
            push(
                Severity::Error,
                "fp32-op",
                format!("{fname}/{first}"),
                format!("{fp32_ops} op(s) compute in fp32 in an fp16 program (the ANE computes fp16 only; these run elsewhere)"),
            );
        }
        for (severity, rule, location, message) in graph_semantics(f) {
            push(severity, rule, location, message);
        }
        let states: Vec<_> = f.state_inputs().collect();
        if states.len() > 2 {
            push(
                Severity::Error,
                "state-count",
                fname.to_string(),
                format!("{} states: more than one k/v pair per package fails on the ANE (≤ 2 states work)", states.len()),
            );
        }
        for s in &states {
            let t = f.tensor_type(*s);
            let r = t.rank();
            if t.dtype != DType::F16 {
                push(
                    Severity::Error,
                    "state-dtype",
                    format!("{fname}/{}", f.value_name(*s)),
                    format!("state is {t}; states must be fp16"),
                );
            }
            let tiled = &t.shape[r.saturating_sub(2)..];
            if tiled.iter().any(|d| d % STATE_ALIGN != 0) {
                push(
                    Severity::Error,
                    "state-align",
                    format!("{fname}/{}", f.value_name(*s)),
                    format!("state {t}: its two innermost dims must be multiples of {STATE_ALIGN}"),
                );
            }
        }
        for (i, v) in f.values().iter().enumerate() {
            let t = v.ty.tensor();
            if t.shape.contains(&0) {
                push(
                    Severity::Error,
                    "dynamic-shape",
                    format!("{fname}/{}", v.name),
                    format!("{t} has an unknown (0) dim; the ANE needs static shapes"),
                );
            }
            if let Some(big) = t.shape.iter().find(|d| **d > MAX_ANE_DIM) {
                let _ = i;
                push(
                    Severity::Error,
                    "dim-limit",
                    format!("{fname}/{}", v.name),
                    format!("{t} has dim {big} > {MAX_ANE_DIM}; split it (e.g. the LM head by vocabulary)"),
                );
            }
        }
    }
    if let Some(layers) = program
        .metadata
        .get("anemone.layer_count")
        .and_then(|n| n.parse::<usize>().ok())
        .filter(|n| *n > 1)
    {
        push(
            Severity::Warning,
            "multi-layer-state",
            String::new(),
            format!("KV state shared by {layers} layers: prior work saw ANE predict crash (SIGTRAP) with this; one layer per chunk is the proven layout"),
        );
    }
    if weight_bytes > 2 * GIB {
        push(
            Severity::Error,
            "package-size",
            String::new(),
            format!("{weight_bytes} weight bytes > 2 GiB (macOS limit)"),
        );
    } else if weight_bytes > GIB {
        push(
            Severity::Warning,
            "package-size",
            String::new(),
            format!("{weight_bytes} weight bytes > 1 GiB (iOS limit)"),
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use anemone_mil::{FunctionBuilder, SpecVersion, TensorType};

    /// Scores `[1, 1, T, K]` → softmax over `axis` → probs · V, as the decoder builds attention.
    fn attention(softmax_axis: i64) -> Program {
        let mut f = FunctionBuilder::new("decode");
        let scores = f
            .input("scores", TensorType::new(DType::F16, [1, 1, 4, 32]))
            .expect("input");
        let values = f
            .state("v_cache", TensorType::new(DType::F16, [1, 1, 32, 32]))
            .expect("state");
        let v = f.read_state("v_read", values).expect("read_state");
        let probs = f.softmax("probs", scores, softmax_axis).expect("softmax");
        let attn = f.matmul("attn", v, probs, false, true).expect("matmul");
        f.output(attn).expect("output");
        let mut program = Program::new(SpecVersion::V9);
        program
            .add_function(f.finish().expect("verified"))
            .expect("added");
        program
    }

    fn rules(program: &Program) -> Vec<String> {
        lint_program(program, 0)
            .into_iter()
            .filter(|f| f.severity == Severity::Error)
            .map(|f| f.rule)
            .collect()
    }

    #[test]
    fn softmax_over_the_keys_passes_and_over_the_queries_is_an_error() {
        assert!(rules(&attention(-1)).is_empty());
        let wrong = lint_program(&attention(2), 0);
        let finding = wrong
            .iter()
            .find(|f| f.rule == "softmax-axis")
            .expect("softmax-axis finding");
        assert_eq!(finding.location, "decode/probs");
        assert!(finding.message.contains("axis 2") && finding.message.contains("axis 3"));
    }
}
