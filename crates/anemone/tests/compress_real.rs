//! Compressed bundles of the real models (`$ANEMONE_MODELS`, default `<repo>/models`, fetched by
//! `scripts/fetch-models.sh`) under `anemone gate`: teacher-forced against the fp32 reference,
//! top-1 agreement 1.0 away from near-ties and the "Paris" canary always required.
//!
//! The recommended default, `lut8:group=8`, passes the default gate (logits cosine ≥ 0.999,
//! per-chunk cosine ≥ the default). int8 per output channel does not on SmolLM2: its weights
//! come from a Q4_1 GGUF (16 levels per block of 32), which a symmetric 255-level grid per row
//! does not contain, and SmolLM2's massive activations (|x| ≈ 22k) amplify the 0.6% weight
//! error to a logits cosine of 0.993; int8 is gated at its own tier ([`INT8_MIN_COSINE`]).
//! On Qwen2.5 even the uncompressed fp16 bundle misses the default per-chunk cosine (0.9974 <
//! 0.999 at layers 7-9, an fp16 property of the converter/executor, not of compression), so it
//! too is gated at the int8 tier (its measured int8 logits cosine, 0.9996, also meets 0.999).
//! SmolLM2 runs the default prompts and steps; Qwen2.5 (4× the weights) the canary and the
//! code prompt for 4 steps, to bound the suite's time. `inspect` shows the compression summary.

mod support;
use support::{anemone, model, text};

use std::path::Path;

use serde_json::Value;

/// int8 per output channel: least logits cosine and least per-chunk hidden cosine (measured on
/// SmolLM2: 0.9931 and 0.9978).
const INT8_MIN_COSINE: &str = "0.99";
const INT8_MIN_CHUNK_COSINE: &str = "0.995";

/// Converts `file` with `--quantize int8`, gates it at the int8 tier and checks `inspect`.
fn int8_passes_its_gate(file: &str, gate_args: &[&str]) {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("int8.bundle");
    let source = model(file);
    let convert = anemone(&[
        "convert",
        source.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--quantize",
        "int8",
        "--json",
    ]);
    assert!(convert.status.success(), "{}", text(&convert.stderr));
    let report: Value = serde_json::from_slice(&convert.stdout).unwrap();
    let c = &report["compression"];
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(bundle.join("anemone.json")).unwrap()).unwrap();
    let layers = manifest["config"]["num_hidden_layers"].as_u64().unwrap();
    assert_eq!(c["compressed_tensors"].as_u64().unwrap(), 7 * layers, "{c}");
    // int8 per channel: about half the fp16 bytes, error around 1/127 of the row range
    let ratio = c["stored_bytes"].as_f64().unwrap() / c["dense_bytes"].as_f64().unwrap();
    assert!((0.5..0.52).contains(&ratio), "stored/dense {ratio}");
    let worst = c["worst_relative_rms"].as_f64().unwrap();
    assert!(worst > 1e-3 && worst < 0.03, "worst relative RMS {worst}");

    let mut tier = vec![
        "--min-cosine",
        INT8_MIN_COSINE,
        "--min-chunk-cosine",
        INT8_MIN_CHUNK_COSINE,
    ];
    tier.extend_from_slice(gate_args);
    gate(file, &bundle, &source, &tier);

    let inspect = anemone(&["inspect", bundle.to_str().unwrap()]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let shown = text(&inspect.stdout);
    assert!(
        shown.contains("compression (int8)") && shown.contains("self_attn.q_proj"),
        "{shown}"
    );
}

/// Runs `anemone gate` on one bundle with `gate_args`; panics with the failures unless it passes.
fn gate(file: &str, bundle: &Path, source: &Path, gate_args: &[&str]) -> Value {
    let mut args = vec![
        "gate",
        bundle.to_str().unwrap(),
        "--reference",
        source.to_str().unwrap(),
        "--json",
    ];
    args.extend_from_slice(gate_args);
    let gate = anemone(&args);
    let out: Value = serde_json::from_slice(&gate.stdout)
        .unwrap_or_else(|e| panic!("gate printed no JSON ({e}): {}", text(&gate.stderr)));
    let r = &out["reports"][0];
    assert!(
        gate.status.success() && out["passed"] == true,
        "{file} {} fails the gate {gate_args:?}: {}\nsummary {}",
        bundle.display(),
        r["failures"],
        r["summary"]
    );
    assert!(r["summary"]["counted_steps"].as_u64().unwrap() > 0);
    r["summary"].clone()
}

#[test]
fn smollm2_int8_passes_its_gate() {
    int8_passes_its_gate("smollm2-135m-instruct.Q4_1.gguf", &[]);
}

#[test]
fn smollm2_lut8_group8_passes_the_default_gate() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("lut8.bundle");
    let file = "smollm2-135m-instruct.Q4_1.gguf";
    let source = model(file);
    let convert = anemone(&[
        "convert",
        source.to_str().unwrap(),
        "--out",
        bundle.to_str().unwrap(),
        "--palettize",
        "8",
        "--group-size",
        "8",
    ]);
    assert!(convert.status.success(), "{}", text(&convert.stderr));
    let summary = gate(file, &bundle, &source, &[]);
    assert!(summary["min_cosine"].as_f64().unwrap() >= 0.999);
}

#[test]
fn qwen25_coder_int8_passes_its_gate() {
    let tmp = tempfile::tempdir().unwrap();
    let prompts = tmp.path().join("prompts.json");
    std::fs::write(
        &prompts,
        serde_json::json!([
            {"prompt": "The capital of France is", "expect": " Paris"},
            "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
        ])
        .to_string(),
    )
    .unwrap();
    int8_passes_its_gate(
        "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf",
        &["--prompts", prompts.to_str().unwrap(), "--steps", "4"],
    );
}
