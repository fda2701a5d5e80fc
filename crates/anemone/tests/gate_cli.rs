//! `anemone gate` as a user runs it: an fp32 bundle of an oracle checkpoint passes against its
//! reference; a bundle whose chunk 1 was converted from swapped K/V projections fails with exit
//! status 1 naming chunk 1; an fp16 overflow inside a chunk is named by op; a modified bundle
//! file is refused by its sha256; a context overflow is an error; several variants land in one
//! JSON report and one SVG plot; `--compare` runs a second engine and reports the pair.

mod support;
use support::{anemone, fixture};

use std::path::{Path, PathBuf};
use std::process::Output;

use anemone_checkpoint::{CheckpointError, TensorInfo, TensorStore};
use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Precision, Uncompressed};
use anemone_models::bundle::{convert, ConvertOptions};
use serde_json::Value;

/// Three layers (multi-head attention): chunk 1 sits between two healthy chunks.
const FIXTURE: &str = "qwen2_mha";

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn options(precision: Precision) -> ConvertOptions {
    ConvertOptions {
        chunk: ChunkOptions {
            context: 64,
            prefill_len: 4,
            precision,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(1),
        lm_head: LmHeadPlacement::Host,
        force: false,
    }
}

/// The fixture's tensors with two of them exchanged.
struct Swapped {
    inner: Box<dyn TensorStore>,
    a: String,
    b: String,
}

impl Swapped {
    fn map<'n>(&'n self, name: &'n str) -> &'n str {
        if name == self.a {
            &self.b
        } else if name == self.b {
            &self.a
        } else {
            name
        }
    }
}

impl TensorStore for Swapped {
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.inner.info(self.map(name))
    }
    fn load_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        self.inner.load_f32(self.map(name))
    }
}

/// The fixture with one tensor multiplied by a factor.
struct Scaled {
    inner: Box<dyn TensorStore>,
    name: String,
    factor: f32,
}

impl TensorStore for Scaled {
    fn names(&self) -> Vec<String> {
        self.inner.names()
    }
    fn info(&self, name: &str) -> Option<TensorInfo> {
        self.inner.info(name)
    }
    fn load_f32(&self, name: &str) -> Result<Vec<f32>, CheckpointError> {
        let mut values = self.inner.load_f32(name)?;
        if name == self.name {
            values.iter_mut().for_each(|v| *v *= self.factor);
        }
        Ok(values)
    }
}

/// The fixture's tensors as they are.
fn intact(tensors: Box<dyn TensorStore>) -> Box<dyn TensorStore> {
    tensors
}

/// Converts the fixture with its tensors seen through `tamper`.
fn write_bundle(
    out: &Path,
    precision: Precision,
    tamper: impl FnOnce(Box<dyn TensorStore>) -> Box<dyn TensorStore>,
) {
    let mut checkpoint = anemone_models::open_checkpoint(fixture(FIXTURE)).unwrap();
    let tensors = std::mem::replace(
        &mut checkpoint.tensors,
        Box::new(anemone_checkpoint::MemoryStore::new()),
    );
    checkpoint.tensors = tamper(tensors);
    convert(
        &checkpoint,
        out,
        &options(precision),
        &Uncompressed,
        &mut |_| {},
    )
    .unwrap();
}

/// `anemone gate BUNDLES… --reference <fixture> --prompts <prompts_file> EXTRA…`.
fn gate_on_fixture_prompts(bundles: &[&Path], tmp: &Path, extra: &[&str]) -> Output {
    let prompts = prompts_file(tmp);
    let reference = fixture(FIXTURE);
    let mut args = vec!["gate"];
    args.extend(bundles.iter().map(|b| b.to_str().unwrap()));
    args.extend([
        "--reference",
        reference.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
    ]);
    args.extend_from_slice(extra);
    anemone(&args)
}

fn prompts_file(dir: &Path) -> PathBuf {
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture(FIXTURE).join("oracle.json")).unwrap())
            .unwrap();
    let path = dir.join("prompts.json");
    let prompts = serde_json::json!([
        {"prompt_ids": oracle["prompt_ids"]},
        {"prompt_ids": [5, 6, 7]},
    ]);
    std::fs::write(&path, prompts.to_string()).unwrap();
    path
}

#[test]
fn fp32_bundle_passes_and_reports_every_step_and_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("fp32");
    write_bundle(&bundle, Precision::Fp32, intact);
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &["--steps", "6", "--json"]);
    assert!(out.status.success(), "gate failed:\n{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["passed"], true);
    let r = &report["reports"][0];
    assert_eq!(r["steps"].as_array().unwrap().len(), 12);
    assert_eq!(r["chunks"].as_array().unwrap().len(), 3);
    assert_eq!(r["summary"]["top1_agreement"], 1.0);
    assert!(r["summary"]["min_cosine"].as_f64().unwrap() > 0.999_999);
    assert!(r["summary"]["min_chunk_cosine"].as_f64().unwrap() > 0.999_999);
    // the path is the reference's greedy one: the fixture's greedy ids
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture(FIXTURE).join("oracle.json")).unwrap())
            .unwrap();
    let greedy: Vec<u64> = oracle["greedy_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    let fed: Vec<u64> = r["steps"].as_array().unwrap()[..5]
        .iter()
        .map(|s| s["fed"].as_u64().unwrap())
        .collect();
    assert_eq!(fed, greedy[..5]);
}

#[test]
fn swapped_kv_weights_fail_naming_the_chunk() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("broken");
    write_bundle(&bundle, Precision::Fp32, |inner| {
        Box::new(Swapped {
            inner,
            a: "model.layers.1.self_attn.k_proj.weight".into(),
            b: "model.layers.1.self_attn.v_proj.weight".into(),
        })
    });
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &["--json"]);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{}", stderr(&out));
    let err = stderr(&out);
    assert!(
        err.contains("gate failed") && err.contains("chunk 1 (layer 1)"),
        "{err}"
    );
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let chunks = report["reports"][0]["chunks"].as_array().unwrap();
    assert!(
        chunks[0]["min_cosine"].as_f64().unwrap() > 0.999_999,
        "chunk 0 is intact"
    );
    assert!(
        chunks[1]["min_cosine"].as_f64().unwrap() < 0.999,
        "chunk 1 is broken"
    );
    assert_eq!(report["reports"][0]["failures"][0]["at"], "chunk 1");
}

#[test]
fn an_fp16_overflow_inside_a_chunk_is_named_by_op() {
    // layer 1's down projection ×20000: its weights still fit fp16, its outputs do not
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("overflowing");
    write_bundle(&bundle, Precision::Fp16, |inner| {
        Box::new(Scaled {
            inner,
            name: "model.layers.1.mlp.down_proj.weight".into(),
            factor: 20000.0,
        })
    });
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &["--json"]);
    assert_eq!(out.status.code(), Some(1), "stderr:\n{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &report["reports"][0];
    let chunks = r["chunks"].as_array().unwrap();
    assert_eq!(
        chunks[0]["first_non_finite_op"],
        Value::Null,
        "chunk 0 is finite"
    );
    assert_eq!(
        chunks[1]["first_non_finite_op"], "l1_down_proj (conv)",
        "{}",
        chunks[1]
    );
    assert_eq!(chunks[1]["first_non_finite_at"], serde_json::json!([0, 0]));
    assert_eq!(r["failures"][0]["at"], "chunk 1");
    let message = r["failures"][0]["message"].as_str().unwrap();
    assert!(
        message.contains("not finite") && message.contains("op l1_down_proj (conv)"),
        "{message}"
    );
}

#[test]
fn modified_bundle_is_refused_by_its_hashes() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("b");
    write_bundle(&bundle, Precision::Fp32, intact);
    let host = bundle.join("host.safetensors");
    let mut bytes = std::fs::read(&host).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&host, bytes).unwrap();
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &[]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(
        err.contains("host.safetensors differs") && err.contains("sha256"),
        "{err}"
    );
}

#[test]
fn steps_beyond_the_context_are_an_error() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("b");
    write_bundle(&bundle, Precision::Fp32, intact);
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &["--steps", "60"]);
    assert_eq!(out.status.code(), Some(1));
    let err = stderr(&out);
    assert!(err.contains("beyond the bundle's context of 64"), "{err}");
}

#[test]
fn variants_share_one_report_and_one_plot() {
    let tmp = tempfile::tempdir().unwrap();
    let (b32, b16) = (tmp.path().join("b32"), tmp.path().join("b16"));
    write_bundle(&b32, Precision::Fp32, intact);
    write_bundle(&b16, Precision::Fp16, intact);
    let plot = tmp.path().join("depth.svg");
    let out = gate_on_fixture_prompts(
        &[&b32, &b16],
        tmp.path(),
        &[
            "--precision",
            "fp16,fp32",
            // random-init weights are not fp16-friendly; this test is about the report's shape
            "--min-top1",
            "0",
            "--min-cosine",
            "0",
            "--min-chunk-cosine",
            "0",
            "--json",
            "--plot",
            plot.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", stderr(&out));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let reports = report["reports"].as_array().unwrap();
    assert_eq!(reports.len(), 4, "2 bundles × 2 precisions");
    let backends: Vec<&str> = reports
        .iter()
        .map(|r| r["backend"].as_str().unwrap())
        .collect();
    assert_eq!(
        backends,
        [
            "executor-fp16",
            "executor-fp32",
            "executor-fp16",
            "executor-fp32"
        ]
    );
    // fp16 arithmetic is measurably further from the reference than fp32 on the same bundle
    let cos = |i: usize| reports[i]["summary"]["min_cosine"].as_f64().unwrap();
    assert!(cos(0) < cos(1), "fp16 {} vs fp32 {}", cos(0), cos(1));
    let svg = std::fs::read_to_string(&plot).unwrap();
    assert_eq!(svg.matches("<polyline").count(), 4);
    assert!(svg.contains("b16: fp16 bundle") && svg.contains("b32: fp32 bundle"));
}

#[test]
fn compare_runs_a_second_engine_and_reports_the_pair() {
    let tmp = tempfile::tempdir().unwrap();
    let bundle = tmp.path().join("b16");
    write_bundle(&bundle, Precision::Fp16, intact);
    let gate = |compare: &str| {
        let out = gate_on_fixture_prompts(
            &[&bundle],
            tmp.path(),
            &[
                "--precision",
                "fp16",
                "--compare",
                compare,
                "--steps",
                "4",
                // random-init weights are not fp16-friendly; this test is about the pair
                "--min-top1",
                "0",
                "--min-cosine",
                "0",
                "--min-chunk-cosine",
                "0",
                "--json",
            ],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        serde_json::from_slice::<Value>(&out.stdout).unwrap()
    };
    // the same engine twice: the traces line up exactly
    let same = gate("executor:fp16");
    let pair = &same["pairs"][0];
    assert_eq!(pair["a"], "executor-fp16");
    assert_eq!(pair["b"], "executor-fp16");
    assert_eq!(pair["steps"], 8, "2 prompts × 4 steps");
    assert_eq!(pair["top1_agreement"], 1.0);
    assert_eq!(pair["max_logits_abs_error"], 0.0);
    assert_eq!(pair["first_divergent_chunk"], Value::Null);
    for c in pair["chunks"].as_array().unwrap() {
        assert_eq!(c["max_abs_error"], 0.0, "{c}");
    }
    // fp16 values against fp16-block sums: measurably apart, and every chunk is there
    let report = gate("executor:fp16-acc");
    assert_eq!(report["passed"], true);
    assert_eq!(report["reports"][0]["backend"], "executor-fp16");
    assert_eq!(report["compared"][0]["backend"], "executor-fp16-acc");
    let pair = &report["pairs"][0];
    assert_eq!(pair["a"], "executor-fp16-acc");
    let chunks = pair["chunks"].as_array().unwrap();
    assert_eq!(chunks.len(), 3);
    assert!(pair["max_logits_abs_error"].as_f64().unwrap() > 0.0);
    let last = chunks[2]["min_cosine"].as_f64().unwrap();
    assert!(last < 1.0 && last > 0.9, "chunk 2 cosine {last}");
    // an unknown engine is refused by name
    let out = gate_on_fixture_prompts(&[&bundle], tmp.path(), &["--compare", "executor:fp8"]);
    assert!(!out.status.success());
    assert!(stderr(&out).contains("fp8"), "{}", stderr(&out));
}
