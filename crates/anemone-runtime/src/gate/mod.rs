//! The numerics gate: a bundle on a backend against the fp32 reference forward, teacher-forced
//! along one token path per prompt so a single flip does not cascade.
//!
//! Per step it records top-1 agreement with the reference's top-1/top-2 margin (near-ties are
//! reported apart), logits cosine, KL and max abs error; per chunk the cosine and max abs error of
//! its output against the reference residual stream at that depth, and the largest |activation|
//! the bundle produced there (fp16 overflow shows up as inf, and the executor names the first op
//! inside the chunk that produced a non-finite value). Thresholds decide pass/fail; the
//! failures are listed in pipeline order (chunks first: the first failing chunk is where the
//! damage starts).

pub mod encoder;
pub mod metrics;
pub mod pair;
pub mod plot;
pub mod prompts;
mod reference;

use std::path::PathBuf;
use std::time::Instant;

use anemone_backend::Backend;
use anemone_checkpoint::TokenizerBundle;
use anemone_models::reference::{ForwardError, ReferenceModel};
use serde::Serialize;

use crate::error::RuntimeError;
use crate::pipeline::{Pipeline, PipelineError};
pub use pair::{compare_traces, GateTrace, PairChunk, PairReport};
pub use prompts::{default_prompts, read_prompts, resolve, GatePrompt, ResolvedPrompt};
pub use reference::GateReference;

#[derive(Debug, thiserror::Error)]
pub enum GateError {
    #[error("{}: {problem}", path.display())]
    Prompts { path: PathBuf, problem: String },
    #[error("prompt {prompt} is text, and neither the reference nor the bundle has a tokenizer (give prompt_ids)")]
    NoTokenizer { prompt: usize },
    #[error("prompt {prompt} has no token ids")]
    EmptyPrompt { prompt: usize },
    #[error(
        "prompt {prompt}: {prompt_len} prompt tokens + {steps} steps need {needed} positions, \
         beyond the bundle's context of {context} (use fewer --steps or a shorter prompt)"
    )]
    Context {
        prompt: usize,
        prompt_len: usize,
        steps: usize,
        needed: usize,
        context: usize,
    },
    #[error(
        "the bundle and the reference differ in {field}: bundle {bundle}, reference {reference}"
    )]
    Mismatch {
        field: &'static str,
        bundle: String,
        reference: String,
    },
    #[error("invalid gate option --{option}: {problem}")]
    Option {
        option: &'static str,
        problem: String,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("prompt {prompt}: the reference stopped before step {step}")]
    ReferenceStep { prompt: usize, step: usize },
    #[error("reference forward: {0}")]
    Reference(#[from] ForwardError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
}

/// Pass/fail thresholds and the amount of work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateOptions {
    /// Logits vectors compared per prompt (after the prompt, then after each fed token).
    pub steps: usize,
    /// Least fraction of counted steps (reference margin ≥ `near_tie`) whose top-1 agrees.
    pub min_top1: f64,
    /// Least logits cosine at every step.
    pub min_cosine: f64,
    /// Least hidden-state cosine (per token) at every chunk output.
    pub min_chunk_cosine: f64,
    /// Steps whose reference top-1/top-2 margin is below this many logits are near-ties: a
    /// top-1 flip there does not count against `min_top1` (it is reported separately).
    pub near_tie: f32,
}

impl Default for GateOptions {
    fn default() -> Self {
        GateOptions {
            steps: 8,
            min_top1: 1.0,
            min_cosine: 0.999,
            min_chunk_cosine: 0.999,
            near_tie: 0.5,
        }
    }
}

impl GateOptions {
    pub fn validate(&self) -> Result<(), GateError> {
        let bad =
            |option: &'static str, problem: String| Err(GateError::Option { option, problem });
        if self.steps == 0 {
            return bad("steps", "must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.min_top1) {
            return bad(
                "min-top1",
                format!("{} is not a fraction in [0, 1]", self.min_top1),
            );
        }
        for (option, v) in [
            ("min-cosine", self.min_cosine),
            ("min-chunk-cosine", self.min_chunk_cosine),
        ] {
            if !(-1.0..=1.0).contains(&v) {
                return bad(option, format!("{v} is not a cosine in [-1, 1]"));
            }
        }
        if self.near_tie.is_nan() || self.near_tie < 0.0 {
            return bad("near-tie", format!("{} must be ≥ 0", self.near_tie));
        }
        Ok(())
    }
}

/// One compared logits vector.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct StepRecord {
    pub prompt: usize,
    pub step: usize,
    /// Tokens before these logits (prompt + fed tokens).
    pub position: usize,
    pub reference_top1: u32,
    pub reference_top2: u32,
    pub reference_margin: f32,
    pub bundle_top1: u32,
    pub agree: bool,
    /// The reference margin is below `near_tie`: a flip here does not count.
    pub near_tie: bool,
    pub cosine: f64,
    pub kl: f64,
    pub max_abs_error: f32,
    /// Token id of the worst logit.
    pub max_abs_error_at: usize,
    /// The token fed after this step (the forced path).
    pub fed: Option<u32>,
}

/// One chunk over every position of every prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ChunkRecord {
    pub chunk: usize,
    pub first_layer: usize,
    pub layer_count: usize,
    /// Layers run at the chunk's output.
    pub depth: usize,
    /// Least per-token cosine, and where: `(prompt, position)`.
    pub min_cosine: f64,
    pub min_cosine_at: (usize, usize),
    pub mean_cosine: f64,
    pub max_abs_error: f32,
    /// Largest |value| of the bundle's chunk output (inf when it overflowed).
    pub max_abs_activation: f32,
    /// Largest |value| of the reference at that depth.
    pub reference_max_abs: f32,
    pub tokens: usize,
    /// The first op inside the chunk whose output held inf or NaN, as `name (type)`, and the
    /// step: `(prompt, step)`. Only a backend that sees inside packages (the executor) names
    /// one; a non-finite value that does not reach the chunk output is reported, not failed.
    pub first_non_finite_op: Option<String>,
    pub first_non_finite_at: Option<(usize, usize)>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CanaryReport {
    pub expect: String,
    /// The reference's own greedy continuation starts with `expect` (else the canary is not
    /// applicable to this model and never fails).
    pub applicable: bool,
    pub passed: bool,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PromptReport {
    pub label: String,
    pub prompt_tokens: usize,
    pub forced: bool,
    /// The reference's top-1 ids along the path, and the bundle's.
    pub reference_ids: Vec<u32>,
    pub bundle_ids: Vec<u32>,
    pub reference_text: Option<String>,
    pub bundle_text: Option<String>,
    pub canary: Option<CanaryReport>,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Summary {
    pub steps: usize,
    pub counted_steps: usize,
    pub near_tie_steps: usize,
    /// Agreeing fraction of the counted steps (1 when none is counted).
    pub top1_agreement: f64,
    pub near_tie_disagreements: usize,
    pub min_cosine: f64,
    pub mean_cosine: f64,
    pub max_kl: f64,
    pub max_abs_error: f32,
    pub min_chunk_cosine: f64,
    pub max_abs_activation: f32,
}

/// A threshold the bundle missed.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Failure {
    /// `chunk 3`, `prompt 1 step 4`, `top-1`, `canary`.
    pub at: String,
    pub message: String,
}

#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GateReport {
    pub bundle: PathBuf,
    /// Short description: conversion precision, norm form, backend.
    pub variant: String,
    pub backend: String,
    pub bundle_precision: String,
    pub norm: String,
    pub options: GateOptions,
    pub prompts: Vec<PromptReport>,
    pub steps: Vec<StepRecord>,
    pub chunks: Vec<ChunkRecord>,
    pub summary: Summary,
    pub failures: Vec<Failure>,
    pub passed: bool,
    pub seconds: f64,
}

impl GateReport {
    /// `(depth, min cosine)` per chunk, for the plot.
    pub fn series(&self) -> plot::Series {
        plot::Series {
            label: self.variant.clone(),
            points: self
                .chunks
                .iter()
                .map(|c| (c.depth, c.min_cosine))
                .collect(),
        }
    }
}

struct ChunkAccumulator {
    min_cosine: f64,
    min_cosine_at: (usize, usize),
    sum_cosine: f64,
    max_abs_error: f32,
    max_abs_activation: f32,
    reference_max_abs: f32,
    tokens: usize,
    first_non_finite: Option<(String, (usize, usize))>,
}

/// Checks that the reference is the model the bundle was converted from, as far as shapes go.
fn check_same_model<B: Backend>(
    pipeline: &Pipeline<B>,
    reference: &ReferenceModel,
) -> Result<(), GateError> {
    let (b, r) = (&pipeline.manifest().config, reference.config());
    let fields: [(&'static str, String, String); 5] = [
        (
            "architecture",
            b.architecture.name().into(),
            r.architecture.name().into(),
        ),
        (
            "hidden_size",
            b.hidden_size.to_string(),
            r.hidden_size.to_string(),
        ),
        (
            "num_hidden_layers",
            b.num_hidden_layers.to_string(),
            r.num_hidden_layers.to_string(),
        ),
        (
            "vocab_size",
            b.vocab_size.to_string(),
            r.vocab_size.to_string(),
        ),
        ("head_dim", b.head_dim.to_string(), r.head_dim.to_string()),
    ];
    for (field, bundle, reference) in fields {
        if bundle != reference {
            return Err(GateError::Mismatch {
                field,
                bundle,
                reference,
            });
        }
    }
    Ok(())
}

/// Progress of a gate run: `done` of `total` compared steps.
#[derive(Debug, Clone, Copy)]
pub struct GateProgress {
    pub done: usize,
    pub total: usize,
}

/// Gates `pipeline` against `reference` on `prompts`. `tokenizer` (optional) decodes the texts
/// of the report and the canary.
pub fn run_gate<B: Backend>(
    pipeline: &Pipeline<B>,
    reference: &mut ReferenceModel,
    prompts: &[ResolvedPrompt],
    tokenizer: Option<&TokenizerBundle>,
    options: &GateOptions,
    progress: &mut dyn FnMut(GateProgress),
) -> Result<GateReport, GateError> {
    run_gate_traced(
        pipeline,
        &mut GateReference::new(reference),
        prompts,
        tokenizer,
        options,
        progress,
        None,
    )
}

/// Like [`run_gate`], also keeping in `trace` what the bundle produced at every step (logits and
/// chunk outputs along the same forced path whatever the backend), for [`compare_traces`]
/// between two engines. The reference's steps are taken from `reference` where an earlier run
/// on the same prompts left them (the figures are the same; the reference runs once).
pub fn run_gate_traced<B: Backend>(
    pipeline: &Pipeline<B>,
    reference: &mut GateReference<'_>,
    prompts: &[ResolvedPrompt],
    tokenizer: Option<&TokenizerBundle>,
    options: &GateOptions,
    progress: &mut dyn FnMut(GateProgress),
    mut trace: Option<&mut GateTrace>,
) -> Result<GateReport, GateError> {
    options.validate()?;
    check_same_model(pipeline, reference.model())?;
    let started = Instant::now();
    let context = pipeline.context().min(reference.model().context_len());
    let plan: Vec<usize> = prompts
        .iter()
        .map(|p| match &p.force_ids {
            Some(forced) => options.steps.min(forced.len() + 1),
            None => options.steps,
        })
        .collect();
    for (index, (p, &steps)) in prompts.iter().zip(&plan).enumerate() {
        let needed = p.ids.len() + steps - 1;
        if needed > context {
            return Err(GateError::Context {
                prompt: index,
                prompt_len: p.ids.len(),
                steps,
                needed,
                context,
            });
        }
    }
    let total: usize = plan.iter().sum();
    let depths = pipeline.chunk_depths();
    let h = pipeline.manifest().config.hidden_size;
    let mut acc: Vec<ChunkAccumulator> = depths
        .iter()
        .map(|_| ChunkAccumulator {
            min_cosine: f64::INFINITY,
            min_cosine_at: (0, 0),
            sum_cosine: 0.0,
            max_abs_error: 0.0,
            max_abs_activation: 0.0,
            reference_max_abs: 0.0,
            tokens: 0,
            first_non_finite: None,
        })
        .collect();
    let mut steps = Vec::with_capacity(total);
    let mut prompt_reports = Vec::with_capacity(prompts.len());
    // a bundle may carry its residual stream scaled (Gemma in fp16): compare in the
    // reference's units, report the graph's own magnitudes
    let unscale = pipeline
        .manifest()
        .config
        .gemma
        .as_ref()
        .map_or(1.0, |g| (1.0 / g.residual_scale) as f32);
    let mut session = pipeline.session()?;
    let mut done = 0;
    for (pi, (p, &n_steps)) in prompts.iter().zip(&plan).enumerate() {
        // the reference's next id: the forced one, else its own top-1
        let next = |step: usize, logits: &[f32]| match &p.force_ids {
            Some(forced) => forced.get(step).copied(),
            None => Some(metrics::top2(logits).0),
        };
        reference.ensure(pi, p, n_steps, next)?;
        session.reset();
        let mut feed = p.ids.clone();
        let mut position = 0;
        let (mut reference_ids, mut bundle_ids) = (Vec::new(), Vec::new());
        for step in 0..n_steps {
            let r = reference
                .step(pi, step)
                .ok_or_else(|| GateError::ReferenceStep { prompt: pi, step })?;
            let b = session.feed_traced(&feed)?;
            let n = feed.len();
            let ref_logits = &r.logits[..];
            for (c, depth) in depths.iter().enumerate() {
                let want = &r.hidden_states[*depth];
                let got = &b.chunk_outputs[c];
                let a = &mut acc[c];
                if a.first_non_finite.is_none() {
                    if let Some(op) = &b.first_non_finite_ops[c] {
                        a.first_non_finite = Some((op.clone(), (pi, step)));
                    }
                }
                for t in 0..n {
                    let (raw, w) = (&got[t * h..(t + 1) * h], &want[t * h..(t + 1) * h]);
                    let unscaled: Vec<f32>;
                    let g = if unscale == 1.0 {
                        raw
                    } else {
                        unscaled = raw.iter().map(|v| v * unscale).collect();
                        &unscaled
                    };
                    let cos = metrics::cosine(g, w);
                    // NaN (non-finite output) counts as the worst possible
                    let cos_key = if cos.is_nan() { -2.0 } else { cos };
                    if cos_key < a.min_cosine {
                        a.min_cosine = cos_key;
                        a.min_cosine_at = (pi, position + t);
                    }
                    a.sum_cosine += cos_key;
                    a.max_abs_error = a.max_abs_error.max(metrics::max_abs_error(g, w).1);
                    a.max_abs_activation = a.max_abs_activation.max(metrics::max_abs(raw));
                    a.reference_max_abs = a.reference_max_abs.max(metrics::max_abs(w));
                    a.tokens += 1;
                }
            }
            let (ref_top1, ref_top2, margin) = metrics::top2(ref_logits);
            let (bundle_top1, _, _) = metrics::top2(&b.logits);
            let (err_at, err) = metrics::max_abs_error(&b.logits, ref_logits);
            position += n;
            let fed = (step + 1 < n_steps)
                .then(|| next(step, ref_logits))
                .flatten();
            steps.push(StepRecord {
                prompt: pi,
                step,
                position,
                reference_top1: ref_top1,
                reference_top2: ref_top2,
                reference_margin: margin,
                bundle_top1,
                agree: bundle_top1 == ref_top1,
                near_tie: margin < options.near_tie,
                cosine: metrics::cosine(&b.logits, ref_logits),
                kl: metrics::kl_divergence(ref_logits, &b.logits),
                max_abs_error: err,
                max_abs_error_at: err_at,
                fed,
            });
            reference_ids.push(ref_top1);
            bundle_ids.push(bundle_top1);
            if let Some(trace) = trace.as_deref_mut() {
                trace.push(pi, step, b);
            }
            done += 1;
            progress(GateProgress { done, total });
            match fed {
                Some(id) => feed = vec![id],
                None => break,
            }
        }
        let decode = |ids: &[u32]| tokenizer.and_then(|t| t.tokenizer.decode(ids, false).ok());
        let reference_text = decode(&reference_ids);
        let bundle_text = decode(&bundle_ids);
        let canary = p.expect.as_ref().map(|expect| {
            let starts =
                |t: &Option<String>| t.as_deref().is_some_and(|t| t.starts_with(expect.as_str()));
            CanaryReport {
                expect: expect.clone(),
                applicable: starts(&reference_text),
                passed: starts(&bundle_text),
            }
        });
        prompt_reports.push(PromptReport {
            label: p.label.clone(),
            prompt_tokens: p.ids.len(),
            forced: p.force_ids.is_some(),
            reference_ids,
            bundle_ids,
            reference_text,
            bundle_text,
            canary,
        });
    }
    let m = pipeline.manifest();
    let chunks: Vec<ChunkRecord> = acc
        .into_iter()
        .zip(&m.chunks)
        .zip(&depths)
        .map(|((a, entry), depth)| ChunkRecord {
            chunk: entry.index,
            first_layer: entry.first_layer,
            layer_count: entry.layer_count,
            depth: *depth,
            min_cosine: a.min_cosine,
            min_cosine_at: a.min_cosine_at,
            mean_cosine: a.sum_cosine / a.tokens.max(1) as f64,
            max_abs_error: a.max_abs_error,
            max_abs_activation: a.max_abs_activation,
            reference_max_abs: a.reference_max_abs,
            tokens: a.tokens,
            first_non_finite_at: a.first_non_finite.as_ref().map(|(_, at)| *at),
            first_non_finite_op: a.first_non_finite.map(|(op, _)| op),
        })
        .collect();
    let summary = summarize(&steps, &chunks);
    let failures = failures(&steps, &chunks, &prompt_reports, &summary, options);
    let backend = pipeline.backend().name();
    let (bundle_precision, norm) = (
        m.conversion.precision.name().to_string(),
        m.conversion.norm.name().to_string(),
    );
    Ok(GateReport {
        bundle: pipeline.dir().to_path_buf(),
        variant: format!("{bundle_precision} bundle, {norm} norm, {backend}"),
        backend,
        bundle_precision,
        norm,
        options: options.clone(),
        prompts: prompt_reports,
        steps,
        chunks,
        summary,
        passed: failures.is_empty(),
        failures,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn summarize(steps: &[StepRecord], chunks: &[ChunkRecord]) -> Summary {
    let counted: Vec<&StepRecord> = steps.iter().filter(|s| !s.near_tie).collect();
    let agreeing = counted.iter().filter(|s| s.agree).count();
    let fin = |v: f64| if v.is_nan() { -2.0 } else { v };
    Summary {
        steps: steps.len(),
        counted_steps: counted.len(),
        near_tie_steps: steps.len() - counted.len(),
        top1_agreement: if counted.is_empty() {
            1.0
        } else {
            agreeing as f64 / counted.len() as f64
        },
        near_tie_disagreements: steps.iter().filter(|s| s.near_tie && !s.agree).count(),
        min_cosine: steps
            .iter()
            .map(|s| fin(s.cosine))
            .fold(f64::INFINITY, f64::min),
        mean_cosine: steps.iter().map(|s| fin(s.cosine)).sum::<f64>() / steps.len().max(1) as f64,
        max_kl: steps.iter().map(|s| s.kl).fold(0.0, |m, v| {
            if v.is_nan() {
                f64::INFINITY
            } else {
                m.max(v)
            }
        }),
        max_abs_error: steps.iter().map(|s| s.max_abs_error).fold(0.0, f32::max),
        min_chunk_cosine: chunks
            .iter()
            .map(|c| c.min_cosine)
            .fold(f64::INFINITY, f64::min),
        max_abs_activation: chunks
            .iter()
            .map(|c| c.max_abs_activation)
            .fold(0.0, f32::max),
    }
}

/// Every missed threshold, chunks first (in depth order), then steps, top-1, canaries.
fn failures(
    steps: &[StepRecord],
    chunks: &[ChunkRecord],
    prompts: &[PromptReport],
    summary: &Summary,
    options: &GateOptions,
) -> Vec<Failure> {
    let mut out = Vec::new();
    for c in chunks {
        let layers = if c.layer_count == 1 {
            format!("layer {}", c.first_layer)
        } else {
            format!(
                "layers {}..={}",
                c.first_layer,
                c.first_layer + c.layer_count - 1
            )
        };
        if !c.max_abs_activation.is_finite() {
            out.push(Failure {
                at: format!("chunk {}", c.chunk),
                message: format!(
                    "chunk {} ({layers}) output is not finite (fp16 overflow?){}",
                    c.chunk,
                    match (&c.first_non_finite_op, c.first_non_finite_at) {
                        (Some(op), Some((prompt, step))) => format!(
                            "; the first non-finite value came from op {op} at prompt {prompt} step {step}"
                        ),
                        _ => String::new(),
                    }
                ),
            });
        } else if c.min_cosine < options.min_chunk_cosine {
            out.push(Failure {
                at: format!("chunk {}", c.chunk),
                message: format!(
                    "chunk {} ({layers}): hidden-state cosine {:.6} < {} (prompt {}, position {}; max abs error {:.4})",
                    c.chunk, c.min_cosine, options.min_chunk_cosine, c.min_cosine_at.0, c.min_cosine_at.1, c.max_abs_error
                ),
            });
        }
    }
    for s in steps {
        // NaN (non-finite logits) fails too
        if s.cosine.is_nan() || s.cosine < options.min_cosine {
            out.push(Failure {
                at: format!("prompt {} step {}", s.prompt, s.step),
                message: format!(
                    "prompt {} step {}: logits cosine {:.6} < {} (max abs error {:.4} at token {})",
                    s.prompt,
                    s.step,
                    s.cosine,
                    options.min_cosine,
                    s.max_abs_error,
                    s.max_abs_error_at
                ),
            });
        }
    }
    if summary.top1_agreement < options.min_top1 {
        let first = steps.iter().find(|s| !s.near_tie && !s.agree);
        out.push(Failure {
            at: first.map_or("top-1".into(), |s| {
                format!("prompt {} step {}", s.prompt, s.step)
            }),
            message: format!(
                "top-1 agreement {:.4} < {} over {} steps with margin ≥ {}{}",
                summary.top1_agreement,
                options.min_top1,
                summary.counted_steps,
                options.near_tie,
                first.map_or(String::new(), |s| format!(
                    "; first flip: prompt {} step {}: bundle {} vs reference {} (margin {:.3})",
                    s.prompt, s.step, s.bundle_top1, s.reference_top1, s.reference_margin
                ))
            ),
        });
    }
    for (i, p) in prompts.iter().enumerate() {
        if let Some(c) = &p.canary {
            if c.applicable && !c.passed {
                out.push(Failure {
                    at: "canary".into(),
                    message: format!(
                        "canary: prompt {i} {:?} continues {:?}, expected {:?}",
                        p.label,
                        p.bundle_text.as_deref().unwrap_or(""),
                        c.expect
                    ),
                });
            }
        }
    }
    out
}
