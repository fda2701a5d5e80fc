//! LongRoPE's per-call factors against transformers on `tests/fixtures/oracle/phi3_longrope_switch`
//! (`tools/oracle/make_longrope_switch_fixture.py`, original_max_position_embeddings 12): a
//! 5-token prompt (short factors) whose 12 greedy tokens cross the threshold (the step at
//! position 12 re-encodes the sequence with the long factors, as Phi-3's `generate` does) and a
//! 16-token prompt (long factors from the start). The reference forward matches transformers
//! (ids equal, logits within 1e-3) through the runtime's generation loop; the bundle (executor,
//! fp32) matches the reference, with prefill windows of 8 (the 16-token prompt's first window
//! ends below the threshold and still takes the prompt's long factors).

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, Precision};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anemone_runtime::{generate, npy, Generation, GenerationOptions, LogitsModel};
use pipeline_common::*;

const FIXTURE: &str = "phi3_longrope_switch";
const TOLERANCE: f32 = 1e-3;

struct Case {
    name: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
    /// transformers' `[steps, vocab]`
    logits: Vec<f32>,
}

fn cases() -> (std::path::PathBuf, Vec<Case>) {
    let dir = anemone_testkit::oracle_dir(FIXTURE);
    let path = dir.join("oracle.json");
    let oracle: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let ids = |v: &serde_json::Value| -> Vec<u32> {
        v.as_array()
            .unwrap()
            .iter()
            .map(|id| id.as_u64().unwrap() as u32)
            .collect()
    };
    let cases = oracle["cases"]
        .as_array()
        .unwrap_or_else(|| panic!("{}: no `cases`", path.display()))
        .iter()
        .map(|c| Case {
            name: c["name"].as_str().unwrap().to_string(),
            prompt_ids: ids(&c["prompt_ids"]),
            greedy_ids: ids(&c["greedy_ids"]),
            logits: npy::read_f32(&dir.join(c["logits"].as_str().unwrap()))
                .unwrap()
                .data,
        })
        .collect::<Vec<_>>();
    assert_eq!(cases.len(), 2, "{}", path.display());
    (dir, cases)
}

fn greedy(model: &mut dyn LogitsModel, case: &Case) -> Generation {
    let options = GenerationOptions {
        max_tokens: case.greedy_ids.len(),
        capture_logits: true,
        ..GenerationOptions::default()
    };
    generate(model, &case.prompt_ids, &options, &mut |_| Ok(()))
        .unwrap_or_else(|e| panic!("{}: {e}", case.name))
}

fn reference(dir: &std::path::Path) -> ReferenceModel {
    let checkpoint = anemone_models::open_checkpoint(dir).unwrap();
    let long = checkpoint.config.long_rope.as_ref().unwrap();
    assert_eq!(long.original_max_position_embeddings, 12);
    ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: Some(1),
            context_len: Some(32),
            huge_pages: false,
        },
    )
    .unwrap()
}

/// The fixture as an fp32 bundle: context 32, prefill windows of 8 (the long prompt's first window
/// ends below the switch).
fn convert_fp32(dir: &std::path::Path, out: &std::path::Path) {
    let chunk = ChunkOptions {
        context: 32,
        prefill_len: 8,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    };
    convert_to(dir, out, &small_options(chunk));
}

fn open_fp32(bundle: &std::path::Path) -> Pipeline<ExecutorBackend> {
    Pipeline::open(
        bundle,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions::default(),
    )
    .unwrap()
}

#[test]
fn reference_matches_transformers_below_across_and_above_the_switch() {
    let (dir, cases) = cases();
    let mut model = reference(&dir);
    for case in &cases {
        let g = greedy(&mut model, case);
        assert_eq!(
            g.generated_ids, case.greedy_ids,
            "{}: greedy ids",
            case.name
        );
        let (at, got, want) = worst(&g.logits, &case.logits);
        eprintln!(
            "{}: reference vs transformers, worst logit |diff| {:.2e} (element {at})",
            case.name,
            (got - want).abs()
        );
        assert_close(
            &format!("{}: reference logits", case.name),
            &g.logits,
            &case.logits,
            TOLERANCE,
        );
    }
}

#[test]
fn fp32_bundle_matches_the_reference_across_the_switch() {
    let (dir, cases) = cases();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    convert_fp32(&dir, &out);
    let manifest = anemone_models::bundle::read_manifest(&out).unwrap();
    let long = manifest.config.long_rope.as_ref().unwrap();
    assert_ne!(
        long.short_factor, long.long_factor,
        "the manifest keeps both factor sets"
    );
    let pipeline = open_fp32(&out);
    let mut model = reference(&dir);
    let mut session = pipeline.session().unwrap();
    for case in &cases {
        let want = greedy(&mut model, case);
        let got = greedy(&mut session, case);
        assert_eq!(got.generated_ids, want.generated_ids, "{}: ids", case.name);
        let (at, g, w) = worst(&got.logits, &want.logits);
        eprintln!(
            "{}: bundle vs reference, worst logit |diff| {:.2e} (element {at})",
            case.name,
            (g - w).abs()
        );
        assert_close(
            &format!("{}: bundle logits", case.name),
            &got.logits,
            &want.logits,
            TOLERANCE,
        );
    }

    // a sequence fed in pieces across the switch (5 ids, then 5, then 6: the last piece
    // re-encodes) gives the logits of feeding it at once, in the bundle and the reference
    let ids = &cases[1].prompt_ids;
    assert_eq!(ids.len(), 16);
    session.reset();
    let at_once = session.feed(ids).unwrap();
    let mut last = Vec::new();
    session.reset();
    for piece in [&ids[..5], &ids[5..10], &ids[10..]] {
        last = session.feed(piece).unwrap();
    }
    assert_close("bundle: pieces vs at once", &last, &at_once, 1e-4);
    model.reset();
    let mut reference_last = Vec::new();
    for piece in [&ids[..5], &ids[5..10], &ids[10..]] {
        reference_last = model
            .forward(piece, anemone_models::reference::LogitsFor::LastPosition)
            .unwrap();
    }
    assert_close(
        "reference: pieces vs bundle",
        &reference_last,
        &at_once,
        TOLERANCE,
    );
}

/// A bundle written before the factors were chosen per piece records `use_long` (the one set
/// its context chose) beside both factor sets: it loads, and the host now picks per piece.
#[test]
fn bundles_recording_use_long_still_load_and_switch_per_piece() {
    let (dir, cases) = cases();
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    convert_fp32(&dir, &out);
    let path = out.join(anemone_models::bundle::MANIFEST_FILE);
    let mut manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    manifest["config"]["long_rope"]["use_long"] = serde_json::Value::Bool(true);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest).unwrap()).unwrap();
    let pipeline = open_fp32(&out);
    let mut session = pipeline.session().unwrap();
    let case = &cases[0];
    let got = greedy(&mut session, case);
    assert_eq!(got.generated_ids, case.greedy_ids, "{}", case.name);
    assert_close(
        &format!("{}: old-manifest bundle vs transformers", case.name),
        &got.logits,
        &case.logits,
        TOLERANCE,
    );
}
