//! `anemone inspect`: bundle and package reports, file-hash verification, and the ANE lint on a
//! deliberately bad package (with `--strict` turning lint errors into a failing exit status).

mod support;
use support::{anemone, text};

use std::path::{Path, PathBuf};

use anemone_mil::{DType, FunctionBuilder, Program, SpecVersion, TensorType, WriteOptions};

fn converted(dir: &Path) -> PathBuf {
    let model = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/fixtures/oracle/qwen2_mha");
    let out = dir.join("bundle");
    let o = anemone(&[
        "convert",
        model.to_str().unwrap(),
        "--out",
        out.to_str().unwrap(),
        "--context",
        "64",
        "--prefill-len",
        "16",
        "--lm-head",
        "package",
    ]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    out
}

#[test]
fn inspect_reports_a_bundle_and_verifies_its_hashes() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = converted(dir.path());
    let o = anemone(&["inspect", bundle.to_str().unwrap(), "--strict"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let out = text(&o.stdout);
    assert!(out.contains("function decode"), "{out}");
    assert!(out.contains("state kv_cache"), "{out}");
    assert!(out.contains("lint: 0 error(s)"), "{out}");
    let files = std::fs::read_dir(bundle.join("chunks")).unwrap().count();
    assert_eq!(files, 3, "one chunk per layer");

    let o = anemone(&["inspect", bundle.to_str().unwrap(), "--json"]);
    assert!(o.status.success(), "{}", text(&o.stderr));
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert_eq!(r["kind"], "bundle");
    assert!(r["file_checks"]
        .as_array()
        .unwrap()
        .iter()
        .all(|c| c["ok"] == true));
    let pkgs = r["packages"].as_array().unwrap();
    assert_eq!(pkgs.len(), 4, "three chunks and the LM head");
    let decode = &pkgs[0]["functions"][0];
    assert_eq!(decode["name"], "decode");
    assert_eq!(decode["op_histogram"]["conv"], 7);
    assert_eq!(
        decode["op_histogram"]["softmax"], 4,
        "one softmax per head (4 heads)"
    );
    assert!(pkgs[0]["weight_bytes_by_dtype"]["fp16"].as_u64().unwrap() > 0);
    let provenance = r["manifest"]["provenance"].as_array().unwrap();
    assert!(provenance.iter().any(
        |p| p["path"].as_str().unwrap().ends_with("model.safetensors")
            && p["sha256"].as_str().unwrap().len() == 64
    ));

    // one flipped byte in a weight file is found and named
    let weights = bundle.join("chunks/chunk-01.mlpackage/Data/com.apple.CoreML/weights/weight.bin");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x40;
    std::fs::write(&weights, bytes).unwrap();
    let o = anemone(&["inspect", bundle.to_str().unwrap()]);
    assert!(!o.status.success());
    let err = text(&o.stderr);
    assert!(
        err.contains("chunks/chunk-01.mlpackage/Data/com.apple.CoreML/weights/weight.bin"),
        "{err}"
    );
}

/// An fp16 program breaking every lint rule it can while still being a valid package.
fn bad_package(path: &Path) {
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("x", TensorType::new(DType::F16, [1, 8, 1, 4]))
        .unwrap();
    let mut states = Vec::new();
    for (i, shape) in [[1, 1, 48, 64], [1, 1, 32, 64], [1, 1, 32, 64]]
        .into_iter()
        .enumerate()
    {
        states.push(
            f.state(&format!("s{i}"), TensorType::new(DType::F16, shape))
                .unwrap(),
        );
    }
    for (i, s) in states.iter().enumerate() {
        let v = f.read_state(&format!("r{i}"), *s).unwrap();
        f.write_state(&format!("w{i}"), *s, v).unwrap();
    }
    let x32 = f.cast("x32", x, DType::F32).unwrap();
    let two = f.scalar("two", DType::F32, 2.0).unwrap();
    let y32 = f.mul("y32", x32, two).unwrap();
    let y = f.cast("y", y32, DType::F16).unwrap();
    let mut mask = vec![0.0f32; 16];
    mask[3] = f32::NEG_INFINITY;
    let m = f.const_f16("mask_inf", &[1, 1, 4, 4], &mask).unwrap();
    let big = f
        .const_f16("wide", &[20000, 8, 1, 1], &vec![0.01; 160000])
        .unwrap();
    let wide = f.conv1x1("wide_proj", y, big, None).unwrap();
    f.output(wide).unwrap();
    f.output(m).unwrap();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    anemone_mil::write_package(&p, path, &WriteOptions::default()).unwrap();
}

#[test]
fn inspect_lints_a_bad_package_and_strict_fails_on_it() {
    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("bad.mlpackage");
    bad_package(&pkg);
    let o = anemone(&["inspect", pkg.to_str().unwrap(), "--json"]);
    assert!(
        o.status.success(),
        "lint errors fail only with --strict: {}",
        text(&o.stderr)
    );
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let rules: Vec<String> = r["packages"][0]["lint"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["severity"] == "error")
        .map(|f| f["rule"].as_str().unwrap().to_string())
        .collect();
    for rule in [
        "fp32-op",
        "state-count",
        "state-align",
        "dim-limit",
        "infinite-const",
    ] {
        assert!(
            rules.iter().any(|r| r == rule),
            "rule {rule} not reported: {rules:?}"
        );
    }
    let align: Vec<_> = r["packages"][0]["lint"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|f| f["rule"] == "state-align")
        .collect();
    assert_eq!(align.len(), 1, "only s0 (48) is misaligned: {align:?}");
    assert!(align[0]["location"].as_str().unwrap().ends_with("s0"));

    let o = anemone(&["inspect", pkg.to_str().unwrap(), "--strict"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(text(&o.stderr).contains("--strict"), "{}", text(&o.stderr));
    assert!(
        text(&o.stdout).contains("error [state-count]"),
        "{}",
        text(&o.stdout)
    );

    let o = anemone(&["inspect", dir.path().to_str().unwrap()]);
    assert!(!o.status.success());
    assert!(text(&o.stderr).contains("neither a bundle"));
}
