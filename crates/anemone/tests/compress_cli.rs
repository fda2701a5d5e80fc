//! `anemone convert --quantize/--palettize/--compress-config` as a user runs it, on the oracle
//! fixtures with the LM head packaged: every package passes coremltools' validator (--strict),
//! the bundle runs in the executor under `anemone gate` within a per-scheme cosine tier, the
//! manifest records every weight's scheme and error, the errors agree with what the scheme's
//! step size predicts from the checkpoint's own values, and `inspect` shows the summary.
//! Conflicting options are refused with a message naming them.

mod support;
use anemone_testkit::validate;
use support::{anemone, fixture, text};

use std::path::Path;

use anemone_checkpoint::Checkpoint;
use serde_json::Value;

/// Least logits cosine (fp16 executor vs fp32 reference, teacher-forced) per scheme on the tiny
/// random-weight fixtures, whose logits are far more fragile than a trained model's (measured:
/// int8 > 0.999, 6-bit uniform 0.95, 4-bit 0.75-0.79). Loose, but a payload decoded wrongly
/// (index order, LUT or scale layout) leaves no correlation at all; the strict gate is on the
/// real models (compress_real.rs).
const TIER_INT8: f64 = 0.999;
const TIER_6BIT: f64 = 0.93;
const TIER_4BIT: f64 = 0.7;

/// Converts `name` with the LM head packaged and `flags`; returns the manifest.
fn convert(name: &str, out: &Path, flags: &[&str]) -> Value {
    let model = fixture(name);
    let mut args = vec![
        "convert",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--context",
        "64",
        "--prefill-len",
        "8",
        "--lm-head",
        "package",
        "--json",
    ];
    args.extend_from_slice(flags);
    let run = anemone(&args);
    assert!(
        run.status.success(),
        "convert failed: {}",
        text(&run.stderr)
    );
    let report: Value = serde_json::from_slice(&run.stdout).unwrap();
    assert!(
        report["compression"]["bytes_saved"].as_u64().unwrap() > 0,
        "{report}"
    );
    serde_json::from_slice(&std::fs::read(out.join("anemone.json")).unwrap()).unwrap()
}

/// `anemone gate` with thresholds off (the tier is asserted by the caller); returns the summary.
fn gate(bundle: &Path, name: &str) -> Value {
    let tmp = tempfile::tempdir().unwrap();
    let oracle: Value =
        serde_json::from_slice(&std::fs::read(fixture(name).join("oracle.json")).unwrap()).unwrap();
    let prompts = tmp.path().join("prompts.json");
    std::fs::write(
        &prompts,
        serde_json::json!([{ "prompt_ids": oracle["prompt_ids"] }]).to_string(),
    )
    .unwrap();
    let reference = fixture(name);
    let run = anemone(&[
        "gate",
        bundle.to_str().unwrap(),
        "--reference",
        reference.to_str().unwrap(),
        "--prompts",
        prompts.to_str().unwrap(),
        "--steps",
        "6",
        "--min-top1",
        "0",
        "--min-cosine",
        "0",
        "--min-chunk-cosine",
        "0",
        "--json",
    ]);
    assert!(run.status.success(), "gate failed: {}", text(&run.stderr));
    let report: Value = serde_json::from_slice(&run.stdout).unwrap();
    report["reports"][0]["summary"].clone()
}

/// The error the scheme's step sizes predict for rounding to a grid (uniform error in ±step/2):
/// `(relative RMS, largest half step)`. `steps` yields `(values, step)` per scale block / group.
fn grid_prediction<'a>(blocks: impl Iterator<Item = (&'a [f32], f64)>) -> (f64, f64) {
    let (mut err2, mut ref2, mut half_step) = (0.0, 0.0, 0f64);
    for (values, step) in blocks {
        err2 += values.len() as f64 * step * step / 12.0;
        ref2 += values.iter().map(|&v| (v as f64).powi(2)).sum::<f64>();
        half_step = half_step.max(step / 2.0);
    }
    ((err2 / ref2).sqrt(), half_step)
}

fn abs_max(v: &[f32]) -> f64 {
    v.iter().fold(0f64, |m, &x| m.max(x.abs() as f64))
}

/// Checks one tensor record's error against the prediction from the original weights.
fn check_record(ckpt: &Checkpoint, t: &Value) {
    let name = t["tensor"].as_str().unwrap();
    let source = t["source"].as_str().unwrap_or(name);
    let shape: Vec<usize> = t["shape"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as usize)
        .collect();
    let (rows, cols) = (shape[0], shape[1]);
    let all = ckpt.load_f32(source).unwrap();
    let first = t["rows"]
        .as_array()
        .map_or(0, |r| r[0].as_u64().unwrap() as usize);
    let w = &all[first * cols..(first + rows) * cols];
    let scheme = t["scheme"].as_str().unwrap();
    let rel = t["error"]["relative_rms"].as_f64().unwrap();
    let max_abs = t["error"]["max_abs"].as_f64().unwrap();
    assert!(rel > 0.0 && rel.is_finite(), "{name} {scheme}: {t}");
    assert!(
        t["stored_bytes"].as_u64().unwrap() < t["dense_bytes"].as_u64().unwrap(),
        "{name}: {t}"
    );
    let option = |key: &str| {
        scheme
            .split(':')
            .find_map(|p| p.strip_prefix(key))
            .map(|v| v.parse::<usize>().unwrap())
    };
    // fp16 rounding of the reconstructed value adds up to half an ulp of the largest weight
    let fp16_slop = abs_max(w) * 2f64.powi(-11);
    if let Some(qmax) = match &scheme[..4] {
        "int8" => Some(127.0),
        "int4" => Some(7.0),
        _ => None,
    } {
        let block = option("block=").unwrap_or(cols);
        let blocks = w
            .chunks(block)
            .map(|b| (b, abs_max(b) / qmax))
            .collect::<Vec<_>>();
        let (predicted, half_step) = grid_prediction(blocks.into_iter());
        assert!(
            (0.6 * predicted..1.4 * predicted).contains(&rel),
            "{name} {scheme}: relative RMS {rel:.4e}, a grid of its scales predicts {predicted:.4e}"
        );
        assert!(
            max_abs <= half_step * 1.001 + fp16_slop,
            "{name} {scheme}: max abs {max_abs:.4e} beyond half a step {half_step:.4e}"
        );
    } else {
        let bits: u32 = scheme[3..4].parse().unwrap();
        let group = option("group=").unwrap();
        let group = if group == 0 { rows } else { group };
        let blocks = w
            .chunks(group * cols)
            .map(|g| {
                let (lo, hi) = g
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(lo, hi), &v| (lo.min(v), hi.max(v)));
                (g, (hi - lo) as f64 / ((1u32 << bits) - 1) as f64)
            })
            .collect::<Vec<_>>();
        let (predicted, half_step) = grid_prediction(blocks.into_iter());
        if scheme.contains("uniform") {
            assert!(
                (0.6 * predicted..1.4 * predicted).contains(&rel),
                "{name} {scheme}: relative RMS {rel:.4e}, its uniform grid predicts {predicted:.4e}"
            );
            assert!(
                max_abs <= half_step * 1.001 + fp16_slop,
                "{name} {scheme}: max abs {max_abs:.4e} beyond half a step {half_step:.4e}"
            );
        } else {
            // k-means minimizes the squared error: never worse than the uniform grid
            assert!(
                rel <= predicted,
                "{name} {scheme}: k-means relative RMS {rel:.4e} above the uniform grid's {predicted:.4e}"
            );
        }
    }
}

/// The whole check for one fixture and one set of flags; `expect(tensor)` is the scheme the
/// manifest must record for each tensor.
fn check_bundle(name: &str, flags: &[&str], tier: f64, expect: &dyn Fn(&str) -> String) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let manifest = convert(name, &out, flags);
    for chunk in manifest["chunks"].as_array().unwrap() {
        validate(&out.join(chunk["path"].as_str().unwrap()));
    }
    validate(&out.join(manifest["lm_head"]["path"].as_str().unwrap()));

    let layers = manifest["config"]["num_hidden_layers"].as_u64().unwrap() as usize;
    let slices = manifest["lm_head"]["vocab_slices"]
        .as_array()
        .unwrap()
        .len();
    let record = &manifest["compression"];
    let tensors = record["tensors"].as_array().unwrap();
    assert_eq!(tensors.len(), 7 * layers + slices, "{record}");
    let ckpt = anemone_models::open_checkpoint(fixture(name)).unwrap();
    for t in tensors {
        let tensor = t["tensor"].as_str().unwrap();
        assert_eq!(t["scheme"], expect(tensor), "{tensor}");
        check_record(&ckpt, t);
    }
    let tied = manifest["config"]["tie_word_embeddings"] == true;
    let head = tensors.last().unwrap();
    assert_eq!(head["tensor"], "lm_head.weight");
    if tied {
        assert_eq!(head["source"], "model.embed_tokens.weight");
    }

    let summary = gate(&out, name);
    let min_cos = summary["min_cosine"].as_f64().unwrap();
    assert!(
        min_cos >= tier,
        "{name} {flags:?}: executor logits cosine {min_cos:.6} below the tier {tier} ({summary})"
    );

    let inspect = anemone(&["inspect", out.to_str().unwrap(), "--json"]);
    assert!(inspect.status.success(), "{}", text(&inspect.stderr));
    let report: Value = serde_json::from_slice(&inspect.stdout).unwrap();
    let c = &report["compression"];
    assert_eq!(c["compressed_tensors"], tensors.len());
    let groups: Vec<&str> = c["groups"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["group"].as_str().unwrap())
        .collect();
    assert!(groups.contains(&"lm_head") && groups.contains(&"mlp.down_proj"));
    let worst = tensors
        .iter()
        .map(|t| t["error"]["relative_rms"].as_f64().unwrap())
        .fold(0.0, f64::max);
    assert_eq!(c["worst_relative_rms"].as_f64().unwrap(), worst);
    let plain = anemone(&["inspect", out.to_str().unwrap()]);
    assert!(plain.status.success());
    let plain = text(&plain.stdout);
    assert!(
        plain.contains("compression (") && plain.contains("mlp.down_proj"),
        "{plain}"
    );
}

#[test]
fn int8_per_channel() {
    // the fixtures' f32 weights have no source grid: auto resolves to symmetric
    check_bundle("llama_gqa4", &["--quantize", "int8"], TIER_INT8, &|_| {
        "int8:symmetric".into()
    });
}

#[test]
fn int4_per_block() {
    check_bundle(
        "qwen2_mha",
        &[
            "--quantize",
            "int4",
            "--block-size",
            "16",
            "--linear-mode",
            "symmetric",
        ],
        TIER_4BIT,
        &|_| "int4:symmetric:block=16".into(),
    );
}

#[test]
fn lut4_kmeans() {
    // q has 96 rows, o/down 64, k/v 24, gate/up 80 and the head 360: a group of 32 is lowered
    // to the largest divisor below it
    check_bundle("qwen3_gqa4", &["--palettize", "4"], TIER_4BIT, &|t| {
        let group = match t {
            t if t.contains("k_proj") || t.contains("v_proj") => 24,
            t if t.contains("gate_proj") || t.contains("up_proj") => 20,
            "lm_head.weight" => 30,
            _ => 32,
        };
        format!("lut4:kmeans:group={group}")
    });
}

#[test]
fn lut6_uniform_tied_head() {
    check_bundle(
        "qwen2_gqa3_tied",
        &[
            "--palettize",
            "6",
            "--palette-mode",
            "uniform",
            "--group-size",
            "16",
        ],
        TIER_6BIT,
        &|_| "lut6:uniform:group=16".into(),
    );
}

#[test]
fn mixed_config_file() {
    let tmp = tempfile::tempdir().unwrap();
    let config = tmp.path().join("mixed.json");
    std::fs::write(
        &config,
        r#"{ "rules": [
            { "pattern": "*.self_attn.*", "scheme": "int8" },
            { "pattern": "*.mlp.down_proj.*", "scheme": "lut6:group=16" },
            { "pattern": "lm_head.weight", "scheme": "lut8:group=16" } ],
          "default": "int4:block=16" }"#,
    )
    .unwrap();
    check_bundle(
        "qwen3_mha_tied",
        &["--compress-config", config.to_str().unwrap()],
        TIER_4BIT,
        &|t| {
            if t.contains("self_attn") {
                "int8:symmetric".into()
            } else if t.contains("down_proj") {
                "lut6:kmeans:group=16".into()
            } else if t == "lm_head.weight" {
                "lut8:kmeans:group=16".into()
            } else {
                "int4:symmetric:block=16".into()
            }
        },
    );
}

#[test]
fn conflicting_or_bad_options_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("b");
    let model = fixture("qwen3_gqa4");
    let head_rule = tmp.path().join("head.json");
    std::fs::write(
        &head_rule,
        r#"{"rules": [{"pattern": "lm_head.weight", "scheme": "lut8"}]}"#,
    )
    .unwrap();
    let broken = tmp.path().join("broken.json");
    std::fs::write(
        &broken,
        r#"{"rules": [{"pattern": "*", "scheme": "int5"}]}"#,
    )
    .unwrap();
    let cases: [(&[&str], &str); 9] = [
        (&["--quantize", "int8", "--palettize", "4"], "--palettize"),
        (
            &["--quantize", "int8", "--compress-config", "x.json"],
            "--compress-config",
        ),
        (&["--group-size", "16"], "--palettize"),
        (&["--block-size", "16"], "--quantize"),
        (&["--linear-mode", "grid"], "--quantize"),
        (
            &["--quantize", "source", "--linear-mode", "symmetric"],
            "--linear-mode",
        ),
        (&["--palettize", "5"], "2, 3, 4, 6 or 8"),
        (
            &["--quantize", "int8", "--precision", "fp32"],
            "--precision fp16",
        ),
        (
            &["--compress-config", head_rule.to_str().unwrap()],
            "--lm-head package",
        ),
    ];
    for (flags, needle) in cases {
        let mut args = vec![
            "convert",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(flags);
        let run = anemone(&args);
        assert!(!run.status.success(), "{flags:?} was accepted");
        let err = text(&run.stderr);
        assert!(err.contains(needle), "{flags:?}: {err}");
        assert!(!out.exists(), "{flags:?} left a bundle behind");
    }
    let run = anemone(&[
        "convert",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--compress-config",
        broken.to_str().unwrap(),
    ]);
    let err = text(&run.stderr);
    assert!(
        !run.status.success() && err.contains("broken.json") && err.contains("int5"),
        "{err}"
    );
}
