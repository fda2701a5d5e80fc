//! `anemone convert` as a user runs it: the built binary on an oracle fixture, its JSON summary,
//! refusal to overwrite, and named errors for bad option values.

mod support;
use support::{anemone, fixture, text};

#[test]
fn convert_writes_a_bundle_and_refuses_to_overwrite_it() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("q3.bundle");
    let model = fixture("qwen3_gqa4");
    let args = [
        "convert",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--context",
        "64",
        "--prefill-len",
        "8",
        "--layers-per-chunk",
        "2",
        "--state-layout",
        "split",
        "--json",
    ];
    let first = anemone(&args);
    assert!(first.status.success(), "{}", text(&first.stderr));
    let report: serde_json::Value = serde_json::from_slice(&first.stdout).unwrap();
    assert_eq!(report["layers"], 2);
    assert_eq!(report["chunks"].as_array().unwrap().len(), 1);
    assert_eq!(report["chunks"][0]["layer_count"], 2);
    assert!(out.join("anemone.json").is_file());
    assert!(out.join("host.safetensors").is_file());
    assert!(out
        .join("chunks/chunk-00.mlpackage/Manifest.json")
        .is_file());
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out.join("anemone.json")).unwrap()).unwrap();
    assert_eq!(manifest["conversion"]["state_layout"], "split");
    assert_eq!(manifest["conversion"]["context"], 64);
    let before = std::fs::read(out.join("anemone.json")).unwrap();

    let again = anemone(&args);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("--force"),
        "{}",
        text(&again.stderr)
    );

    let mut forced = args.to_vec();
    forced.push("--force");
    let third = anemone(&forced);
    assert!(third.status.success(), "{}", text(&third.stderr));
    assert_eq!(
        std::fs::read(out.join("anemone.json")).unwrap(),
        before,
        "not reproducible"
    );
}

#[test]
fn bad_option_values_are_named() {
    let dir = tempfile::tempdir().unwrap();
    let model = fixture("llama_gqa4");
    let out = dir.path().join("b");
    let cases: &[(&[&str], &str)] = &[
        (&["--context", "100"], "multiple of 32"),
        (&["--context", "64", "--prefill-len", "65"], "prefill-len"),
        (&["--norm", "rms"], "layernorm-trick"),
        (&["--precision", "int3"], "fp16"),
        (&["--state-layout", "many"], "unified"),
        (
            &["--layers-per-chunk", "0", "--context", "64"],
            "layers-per-chunk",
        ),
        (
            &["--layers-per-chunk", "2", "--chunk-size-mb", "4"],
            "cannot be used with",
        ),
    ];
    for (extra, needle) in cases {
        let mut args = vec![
            "convert",
            model.to_str().unwrap(),
            "--out",
            out.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let o = anemone(&args);
        assert!(!o.status.success(), "{extra:?} succeeded");
        let err = text(&o.stderr);
        assert!(
            err.contains(needle),
            "{extra:?}: `{err}` does not mention {needle}"
        );
        assert!(!out.exists(), "{extra:?} left output behind");
    }
    let missing = anemone(&[
        "convert",
        "/nonexistent/model",
        "--out",
        out.to_str().unwrap(),
    ]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("/nonexistent/model"));
}
