//! Two engines on one bundle, compared with each other: the gate feeds every engine the same
//! forced token path, so the logits and chunk outputs of two gate runs line up step by step and
//! their differences say where one engine departs from the other (on a Mac: Core ML on the Neural
//! Engine against the executor's fp16 model of it; on Linux: the executor's fp16 against its
//! fp16-accumulation bracket).

use serde::Serialize;

use super::{metrics, GateError};
use crate::pipeline::FeedTrace;

/// What one engine produced along a gate's path.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct GateTrace {
    /// Per step: `(prompt, step)`, the `[vocab]` logits, and per chunk the `[tokens, hidden]`
    /// outputs of the positions fed at that step.
    pub steps: Vec<TraceStep>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct TraceStep {
    pub prompt: usize,
    pub step: usize,
    pub logits: Vec<f32>,
    pub chunk_outputs: Vec<Vec<f32>>,
}

impl GateTrace {
    pub(crate) fn push(&mut self, prompt: usize, step: usize, feed: FeedTrace) {
        self.steps.push(TraceStep {
            prompt,
            step,
            logits: feed.logits,
            chunk_outputs: feed.chunk_outputs,
        });
    }
}

/// One chunk's output, engine `b` against engine `a`, over every fed position.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairChunk {
    pub chunk: usize,
    /// Least per-token cosine (NaN, from a non-finite output, counts as -2), and where:
    /// `(prompt, step)`.
    pub min_cosine: f64,
    pub min_cosine_at: (usize, usize),
    pub max_abs_error: f32,
}

/// Engine `b` against engine `a` on one bundle, along the gate's forced path.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairReport {
    /// The engines, as their gate reports name them (`executor-fp16`, `coreml-ane`, …).
    pub a: String,
    pub b: String,
    pub steps: usize,
    /// Fraction of steps where the two engines' top-1 ids agree.
    pub top1_agreement: f64,
    /// The first step where they do not, as `(prompt, step)`.
    pub first_top1_flip: Option<(usize, usize)>,
    pub min_logits_cosine: f64,
    pub max_logits_abs_error: f32,
    pub chunks: Vec<PairChunk>,
    /// The first chunk (in pipeline order) whose outputs' cosine falls below the threshold the
    /// comparison was given: where the engines part.
    pub first_divergent_chunk: Option<usize>,
}

fn nan_low(v: f64) -> f64 {
    if v.is_nan() {
        -2.0
    } else {
        v
    }
}

/// Compares what engines `a` and `b` produced along the same gate path; `hidden` is the model's
/// hidden size, `min_chunk_cosine` the cosine under which a chunk counts as divergent. Traces of
/// different paths (other prompts, steps or chunk counts) are refused.
pub fn compare_traces(
    (a_name, a): (&str, &GateTrace),
    (b_name, b): (&str, &GateTrace),
    hidden: usize,
    min_chunk_cosine: f64,
) -> Result<PairReport, GateError> {
    let mismatch = |field: &'static str, x: String, y: String| GateError::Mismatch {
        field,
        bundle: format!("{b_name}: {y}"),
        reference: format!("{a_name}: {x}"),
    };
    if a.steps.len() != b.steps.len() {
        return Err(mismatch(
            "traced steps",
            a.steps.len().to_string(),
            b.steps.len().to_string(),
        ));
    }
    let chunks = a.steps.first().map_or(0, |s| s.chunk_outputs.len());
    let mut pair_chunks: Vec<PairChunk> = (0..chunks)
        .map(|chunk| PairChunk {
            chunk,
            min_cosine: f64::INFINITY,
            min_cosine_at: (0, 0),
            max_abs_error: 0.0,
        })
        .collect();
    let (mut agree, mut first_flip) = (0, None);
    let (mut min_logits_cosine, mut max_logits_abs_error) = (f64::INFINITY, 0f32);
    for (sa, sb) in a.steps.iter().zip(&b.steps) {
        let at = (sa.prompt, sa.step);
        if (sb.prompt, sb.step) != at
            || sa.logits.len() != sb.logits.len()
            || sb.chunk_outputs.len() != chunks
            || sa.chunk_outputs.len() != chunks
        {
            return Err(mismatch(
                "trace shape",
                format!("prompt {} step {}", sa.prompt, sa.step),
                format!("prompt {} step {}", sb.prompt, sb.step),
            ));
        }
        if metrics::top2(&sa.logits).0 == metrics::top2(&sb.logits).0 {
            agree += 1;
        } else {
            first_flip.get_or_insert(at);
        }
        min_logits_cosine = min_logits_cosine.min(nan_low(metrics::cosine(&sb.logits, &sa.logits)));
        max_logits_abs_error =
            max_logits_abs_error.max(metrics::max_abs_error(&sb.logits, &sa.logits).1);
        for (c, pc) in pair_chunks.iter_mut().enumerate() {
            let (xa, xb) = (&sa.chunk_outputs[c], &sb.chunk_outputs[c]);
            if xa.len() != xb.len() || hidden == 0 || xa.len() % hidden != 0 {
                return Err(mismatch(
                    "chunk output length",
                    xa.len().to_string(),
                    xb.len().to_string(),
                ));
            }
            for (ta, tb) in xa.chunks(hidden).zip(xb.chunks(hidden)) {
                let cos = nan_low(metrics::cosine(tb, ta));
                if cos < pc.min_cosine {
                    pc.min_cosine = cos;
                    pc.min_cosine_at = at;
                }
                pc.max_abs_error = pc.max_abs_error.max(metrics::max_abs_error(tb, ta).1);
            }
        }
    }
    let steps = a.steps.len();
    Ok(PairReport {
        a: a_name.to_string(),
        b: b_name.to_string(),
        steps,
        top1_agreement: if steps == 0 {
            1.0
        } else {
            agree as f64 / steps as f64
        },
        first_top1_flip: first_flip,
        min_logits_cosine,
        max_logits_abs_error,
        first_divergent_chunk: pair_chunks
            .iter()
            .find(|c| c.min_cosine < min_chunk_cosine)
            .map(|c| c.chunk),
        chunks: pair_chunks,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn step(prompt: usize, step: usize, logits: &[f32], chunks: &[&[f32]]) -> TraceStep {
        TraceStep {
            prompt,
            step,
            logits: logits.to_vec(),
            chunk_outputs: chunks.iter().map(|c| c.to_vec()).collect(),
        }
    }

    #[test]
    fn the_pair_names_where_two_engines_part() {
        // hidden 2; two chunks; two steps (the first feeds two tokens)
        let a = GateTrace {
            steps: vec![
                step(
                    0,
                    0,
                    &[0.0, 1.0, 0.5],
                    &[&[1., 0., 0., 1.], &[1., 1., 2., 2.]],
                ),
                step(0, 1, &[1.0, 0.0, 0.5], &[&[1., 0.], &[1., 1.]]),
            ],
        };
        let mut b = a.clone();
        // chunk 1 of step 1 turns 90°, and the logits' top-1 flips there
        b.steps[1].chunk_outputs[1] = vec![1., -1.];
        b.steps[1].logits = vec![0.0, 1.0, 0.5];
        let pair = compare_traces(("x", &a), ("y", &b), 2, 0.999).unwrap();
        assert_eq!(pair.top1_agreement, 0.5);
        assert_eq!(pair.first_top1_flip, Some((0, 1)));
        assert_eq!(pair.chunks[0].min_cosine, 1.0);
        assert_eq!(pair.chunks[0].max_abs_error, 0.0);
        assert!(pair.chunks[1].min_cosine.abs() < 1e-12);
        assert_eq!(pair.chunks[1].min_cosine_at, (0, 1));
        assert_eq!(pair.chunks[1].max_abs_error, 2.0);
        assert_eq!(pair.first_divergent_chunk, Some(1));
        // an engine against itself is identical
        let same = compare_traces(("x", &a), ("x", &a), 2, 0.999).unwrap();
        assert_eq!(same.first_divergent_chunk, None);
        assert_eq!(same.top1_agreement, 1.0);
        // traces of other paths are refused
        let short = GateTrace {
            steps: a.steps[..1].to_vec(),
        };
        let err = compare_traces(("x", &a), ("z", &short), 2, 0.999).unwrap_err();
        assert!(err.to_string().contains("traced steps"), "{err}");
    }
}
