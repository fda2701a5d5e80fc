//! `anemone generate BUNDLE` as a user runs it: an fp32 bundle of an oracle checkpoint run by the
//! executor reproduces transformers' greedy ids and logits through the same flags as a checkpoint;
//! `--precision fp16` runs the same bundle in fp16 arithmetic; prompt + tokens beyond the bundle's
//! context is an error; `--precision` on a checkpoint is refused.

mod support;
use support::anemone;

use std::path::{Path, PathBuf};

use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Precision, Uncompressed};
use anemone_models::bundle::{convert, ConvertOptions};
use anemone_runtime::npy;
use serde_json::Value;

/// fp32 bundle in fp32 arithmetic against fp32 transformers.
const LOGITS_TOLERANCE: f32 = 1e-3;
const FIXTURE: &str = "qwen3_gqa4";

fn fixture() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../tests/fixtures/oracle")
        .join(FIXTURE)
}

fn ids(oracle: &Value, key: &str) -> Vec<u32> {
    oracle[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

fn csv(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn write_bundle(out: &Path, precision: Precision) {
    let checkpoint = anemone_models::open_checkpoint(fixture()).unwrap();
    let options = ConvertOptions {
        chunk: ChunkOptions {
            context: 32,
            prefill_len: 4,
            precision,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(1),
        lm_head: LmHeadPlacement::Host,
        force: false,
    };
    convert(&checkpoint, out, &options, &Uncompressed, &mut |_| {}).unwrap();
}

#[test]
fn bundle_generates_transformers_greedy_ids_and_logits() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("fp32");
    write_bundle(&bundle, Precision::Fp32);
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture().join("oracle.json")).unwrap()).unwrap();
    let (prompt, greedy) = (ids(&oracle, "prompt_ids"), ids(&oracle, "greedy_ids"));
    let logits_path = tmp.path().join("logits.npy");
    let out = anemone(&[
        "generate",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        &csv(&prompt),
        "--max-tokens",
        &greedy.len().to_string(),
        "--json",
        "--dump-logits",
        logits_path.to_str().unwrap(),
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&report, "generated_ids"), greedy);
    let got = npy::read_f32(&logits_path).unwrap();
    let want = npy::read_f32(&fixture().join("logits.npy")).unwrap();
    assert_eq!(got.shape, want.shape);
    let (i, diff) = got
        .data
        .iter()
        .zip(&want.data)
        .map(|(g, w)| (g - w).abs())
        .enumerate()
        .fold((0, 0f32), |m, (i, d)| if d > m.1 { (i, d) } else { m });
    assert!(diff <= LOGITS_TOLERANCE, "worst logit {i}: |diff| {diff}");

    // the same bundle in fp16 arithmetic runs and reports its speed
    let out = anemone(&[
        "generate",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        &csv(&prompt),
        "--max-tokens",
        "4",
        "--precision",
        "fp16",
        "--json",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(ids(&report, "generated_ids").len(), 4);
    assert!(report["decode_tok_s"].as_f64().unwrap() > 0.0);
}

#[test]
fn tokens_beyond_the_bundle_context_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("b");
    write_bundle(&bundle, Precision::Fp16);
    let out = anemone(&[
        "generate",
        bundle.to_str().unwrap(),
        "--prompt-ids",
        "5,6,7,8,9,10,11,12",
        "--max-tokens",
        "25",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("8 tokens plus 25 new tokens") && err.contains("context length 32"),
        "{err}"
    );
    assert!(
        out.stdout.is_empty(),
        "nothing is generated: {:?}",
        String::from_utf8_lossy(&out.stdout)
    );
}

#[test]
fn precision_is_refused_for_a_checkpoint() {
    let out = anemone(&[
        "generate",
        fixture().to_str().unwrap(),
        "--prompt-ids",
        "5,6",
        "--precision",
        "fp16",
    ]);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--precision applies to bundles"));
}
