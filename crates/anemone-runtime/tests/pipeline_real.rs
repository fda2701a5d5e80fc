//! fp16 bundles of the real GGUF models, run by the executor in fp16 (the ANE's arithmetic),
//! teacher-forced along transformers' greedy path (tests/fixtures/real/<model>.json) for 16
//! steps: top-1 equals transformers' at every step whose top-1/top-2 margin exceeds 0.5 logits,
//! and the logits cosine against the fp32 reference is ≥ 0.999 at every step; the gate passes.
//!
//! `ANEMONE_REAL_PROMPTS=holdout` runs the held-out prompts (`<model>.holdout.json`) instead.
//! Models are located via `ANEMONE_MODELS` (default `<workspace>/models`).

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, Precision, Uncompressed};
use anemone_models::bundle::convert;
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::gate::{run_gate, GateOptions, ResolvedPrompt};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use pipeline_common::*;
use serde::Deserialize;

/// The bar for fp16 bundles in fp16 arithmetic.
const MIN_LOGITS_COSINE: f64 = 0.999;
/// Steps whose transformers top-1/top-2 margin is at most this are near-ties.
const NEAR_TIE: f32 = 0.5;
const STEPS: usize = 16;

#[derive(Deserialize)]
struct RealFixture {
    gguf: String,
    prompts: Vec<RealPrompt>,
}

#[derive(Deserialize)]
struct RealPrompt {
    prompt: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    steps: Vec<RealStep>,
}

#[derive(Deserialize)]
struct RealStep {
    top_ids: Vec<u32>,
    margin: f32,
}

fn fixture(model: &str) -> RealFixture {
    let suffix = match std::env::var("ANEMONE_REAL_PROMPTS").as_deref() {
        Ok("holdout") => ".holdout",
        _ => "",
    };
    let path = repo_root().join(format!("tests/fixtures/real/{model}{suffix}.json"));
    serde_json::from_slice(&std::fs::read(&path).unwrap())
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn gate_real_model(model: &str, max_prompts: usize) {
    let fx = fixture(model);
    let gguf = models_dir().join(&fx.gguf);
    assert!(
        gguf.is_file(),
        "{} is missing: run `scripts/fetch-models.sh` (or set ANEMONE_MODELS)",
        gguf.display()
    );
    let checkpoint = anemone_models::open_checkpoint(&gguf).unwrap();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let chunk = ChunkOptions {
        // the prompts are ≤ 18 tokens: a short context keeps attention over the state cheap
        context: 128,
        precision: Precision::Fp16,
        ..ChunkOptions::default()
    };
    convert(
        &checkpoint,
        &out,
        &small_options(chunk),
        &Uncompressed,
        &mut |_| {},
    )
    .unwrap();
    let pipeline = Pipeline::open(
        &out,
        ExecutorBackend::new(Precision::Fp16),
        &PipelineOptions::default(),
    )
    .unwrap();
    let mut reference = ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: None,
            context_len: Some(128),
            huge_pages: false,
        },
    )
    .unwrap();
    let used = &fx.prompts[..fx.prompts.len().min(max_prompts)];
    let prompts: Vec<ResolvedPrompt> = used
        .iter()
        .map(|p| ResolvedPrompt {
            label: p.prompt.clone(),
            ids: p.prompt_ids.clone(),
            expect: None,
            force_ids: Some(p.greedy_ids.clone()),
        })
        .collect();
    let options = GateOptions {
        steps: STEPS,
        min_cosine: MIN_LOGITS_COSINE,
        near_tie: NEAR_TIE,
        ..GateOptions::default()
    };
    let report = run_gate(
        &pipeline,
        &mut reference,
        &prompts,
        None,
        &options,
        &mut |_| {},
    )
    .unwrap();
    assert_eq!(report.steps.len(), used.len() * STEPS);

    // against transformers' own top-1 and margins, independently of our reference
    for s in &report.steps {
        let want = &used[s.prompt].steps[s.step];
        let what = format!(
            "{model}: prompt {:?} step {}: bundle top-1 {}, transformers top-1 {} (margin {}), logits cosine {:.6}",
            used[s.prompt].prompt, s.step, s.bundle_top1, want.top_ids[0], want.margin, s.cosine
        );
        if want.margin > NEAR_TIE {
            assert_eq!(s.bundle_top1, want.top_ids[0], "{what}");
        }
        assert!(s.cosine >= MIN_LOGITS_COSINE, "{what}");
    }
    assert!(
        report.passed,
        "{model}: gate failed: {:#?}",
        report.failures
    );
    eprintln!(
        "{model}: {} steps, top-1 {:.4} (near-ties {}), logits cosine min {:.6}, min chunk cosine {:.6}, max |act| {}, {:.1} s",
        report.summary.steps,
        report.summary.top1_agreement,
        report.summary.near_tie_steps,
        report.summary.min_cosine,
        report.summary.min_chunk_cosine,
        report.summary.max_abs_activation,
        report.seconds
    );
}

#[test]
fn smollm2_fp16_bundle_follows_transformers() {
    gate_real_model("smollm2-135m-instruct", usize::MAX);
}

#[test]
fn qwen2_5_coder_fp16_bundle_follows_transformers() {
    // 0.5B parameters: two prompts keep the test time reasonable
    gate_real_model("qwen2.5-coder-0.5b-instruct", 2);
}
