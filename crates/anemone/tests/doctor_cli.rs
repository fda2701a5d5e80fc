//! `anemone doctor` on Linux with a tiny fixture model: the report holds the machine, Core ML
//! marked unavailable with the reason (compute plan, gate, bench, bisect), and the executor's gate,
//! bench and layers-per-chunk bisect filled in; the JSON file is written whole.

// On a Mac Core ML is available and the report differs: the macOS workflow runs doctor itself.
#![cfg(not(target_vendor = "apple"))]

mod support;

use std::process::Command;

use serde_json::Value;

#[test]
fn the_report_marks_core_ml_unavailable_and_fills_in_the_rest() {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("report.json");
    let run = Command::new(env!("CARGO_BIN_EXE_anemone"))
        .arg("doctor")
        .arg("--model")
        .arg(support::fixture("llama_gqa4"))
        .args([
            "--context",
            "32",
            "--prefill-len",
            "4",
            "--decode-tokens",
            "3",
        ])
        .args(["--prompt-ids", "1,2,3,4,5", "--layers-per-chunk", "1,2"])
        .args(["--threads", "1"])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = support::text(&run.stdout);
    assert!(run.status.success(), "{}", support::text(&run.stderr));
    assert!(
        stdout.contains("core ml: unavailable: Core ML exists only on Apple platforms"),
        "{stdout}"
    );
    assert!(stdout.contains(&format!("report written to {}", out.display())));

    let r: Value = serde_json::from_slice(&std::fs::read(&out).unwrap()).unwrap();
    assert!(r["machine"]["cores"].as_u64().unwrap() >= 1);
    assert_eq!(r["machine"]["os"], std::env::consts::OS);
    assert!(r["machine"]["memory_bytes"].as_u64().unwrap() > 0);
    assert_eq!(r["coreml"]["available"], false);
    for part in [
        &r["compute_plan"],
        &r["gate"]["coreml"],
        &r["engine_pair"],
        &r["bench"]["coreml"],
        &r["bisect"]["coreml"],
    ] {
        assert_eq!(part["status"], "unavailable", "{part:#}");
        assert!(
            part["reason"].as_str().unwrap().contains("Core ML"),
            "{part:#}"
        );
    }
    let gate = &r["gate"]["executor"];
    assert_eq!(gate["status"], "done", "{gate:#}");
    assert_eq!(gate["backend"], "executor-fp16");
    assert!(gate["min_cosine"].as_f64().unwrap() > 0.99, "{gate:#}");
    let bench = &r["bench"]["executor"];
    assert_eq!(bench["status"], "done", "{bench:#}");
    assert_eq!(bench["prefill_tokens"], 5);
    assert_eq!(bench["decode_steps"], 3);
    assert!(bench["decode_tok_s"].as_f64().unwrap() > 0.0);
    assert!(bench["peak_rss_bytes"].as_u64().unwrap() > 1_000_000);
    assert_eq!(
        bench["compile_seconds"], 0.0,
        "the executor compiles nothing"
    );
    assert!(
        bench.get("compile_cache").is_some_and(|c| c.is_null()),
        "the executor has no compiled-model cache: {bench:#}"
    );
    let bisect = &r["bisect"]["executor"];
    assert_eq!(bisect["status"], "done");
    let rows = bisect["variants"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{bisect:#}");
    assert_eq!(rows[0]["label"], "lpc1-unified-p4-fp16");
    assert_eq!(rows[1]["label"], "lpc2-unified-p4-fp16");
    for row in rows {
        assert!(
            row["status"] == "ok" || row["status"] == "mismatch",
            "{row:#}"
        );
    }
}

#[test]
fn inspect_plan_says_it_needs_macos() {
    let tmp = tempfile::tempdir().unwrap();
    let package = tmp.path().join("chunk-00.mlpackage");
    std::fs::create_dir(&package).unwrap();
    let out = support::anemone(&[
        "inspect",
        package.to_str().unwrap(),
        "--plan",
        "--min-ane",
        "0.9",
    ]);
    assert!(!out.status.success());
    let stderr = support::text(&out.stderr);
    assert!(
        stderr.contains(
            "chunk-00.mlpackage: --plan needs Core ML's MLComputePlan (macOS 14.4 or later)"
        ),
        "{stderr}"
    );
    let out = support::anemone(&["inspect", package.to_str().unwrap(), "--min-ane", "0.9"]);
    assert!(!out.status.success(), "--min-ane without --plan is refused");
}
