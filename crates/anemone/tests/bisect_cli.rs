//! `anemone bisect` as a user runs it on a tiny checkpoint: every variant is converted and run in
//! its own child process; a child that really dies (the `ANEMONE_BISECT_CRASH` hook makes it
//! raise SIGKILL or SIGABRT on itself) is a row with its signal, and the run goes on to the next
//! variant; the variants that ran match the fp32 reference.

mod support;

use std::process::Command;

use serde_json::Value;

fn bisect(extra: &[&str], crash: Option<&str>) -> (std::process::Output, tempfile::TempDir) {
    let keep = tempfile::tempdir().unwrap();
    let fixture = support::fixture("llama_gqa4");
    let mut command = Command::new(env!("CARGO_BIN_EXE_anemone"));
    command
        .arg("bisect")
        .arg(&fixture)
        .args([
            "--context",
            "32",
            "--prefill-len",
            "4",
            "--precision",
            "fp32",
        ])
        .args(["--prompt-ids", "1,2,3,4,5", "--decode-tokens", "3"])
        .args(["--threads", "1", "--backend", "executor"])
        .arg("--keep")
        .arg(keep.path())
        .args(extra);
    command.env_remove("ANEMONE_BISECT_CRASH");
    if let Some(crash) = crash {
        command.env("ANEMONE_BISECT_CRASH", crash);
    }
    (command.output().expect("run anemone bisect"), keep)
}

fn variant<'a>(report: &'a Value, label: &str) -> &'a Value {
    report["variants"]
        .as_array()
        .unwrap()
        .iter()
        .find(|v| v["label"] == label)
        .unwrap_or_else(|| panic!("no variant {label} in {report:#}"))
}

#[test]
fn a_child_killed_by_a_signal_is_a_result_and_the_others_still_run() {
    let (out, _keep) = bisect(
        &[
            "--layers-per-chunk",
            "1,2",
            "--state-layout",
            "unified,split",
            "--json",
        ],
        Some("lpc2-unified-p4-fp32:kill,lpc1-split-p4-fp32:abort"),
    );
    let stderr = support::text(&out.stderr);
    assert!(out.status.success(), "bisect failed: {stderr}");
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["backend"], "executor");
    assert_eq!(report["variants"].as_array().unwrap().len(), 4);

    let killed = variant(&report, "lpc2-unified-p4-fp32");
    assert_eq!(killed["status"], "crashed", "{killed:#}");
    assert_eq!(killed["signal"], "SIGKILL");
    assert!(killed["run"].is_null() && killed["parity"].is_null());
    let aborted = variant(&report, "lpc1-split-p4-fp32");
    assert_eq!(aborted["status"], "crashed", "{aborted:#}");
    assert_eq!(aborted["signal"], "SIGABRT");

    for (label, chunks) in [("lpc1-unified-p4-fp32", 2), ("lpc2-split-p4-fp32", 1)] {
        let v = variant(&report, label);
        assert_eq!(v["status"], "ok", "{v:#}");
        assert!(v["signal"].is_null());
        assert_eq!(v["chunks"], chunks);
        assert_eq!(v["layers_per_chunk"].as_u64().unwrap() as usize, 2 / chunks);
        let parity = &v["parity"];
        assert_eq!(parity["steps"], 4, "prompt + 3 decode steps");
        assert_eq!(parity["top1_agreement"], 1.0);
        assert!(parity["min_cosine"].as_f64().unwrap() > 0.9999, "{parity}");
        let run = &v["run"];
        assert_eq!(run["backend"], "executor-fp32");
        assert_eq!(run["prefill_tokens"], 5);
        assert_eq!(run["decode_steps"], 3);
        assert!(run["load_seconds"].as_f64().unwrap() > 0.0);
        assert!(run["peak_rss_bytes"].as_u64().unwrap() > 1_000_000);
    }
}

#[test]
fn the_table_names_the_signal_and_a_timeout_kills_the_child() {
    let (out, _keep) = bisect(
        &["--layers-per-chunk", "1,2"],
        Some("lpc1-unified-p4-fp32:trap"),
    );
    let stdout = support::text(&out.stdout);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let crashed = stdout
        .lines()
        .find(|l| l.contains("lpc1-unified-p4-fp32"))
        .unwrap();
    assert!(crashed.contains("crashed SIGTRAP"), "{stdout}");
    let ok = stdout
        .lines()
        .find(|l| l.contains("lpc2-unified-p4-fp32"))
        .unwrap();
    assert!(ok.contains(" ok "), "{stdout}");

    let (out, _keep) = bisect(
        &["--layers-per-chunk", "2", "--timeout", "0", "--json"],
        None,
    );
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let v = variant(&report, "lpc2-unified-p4-fp32");
    assert_eq!(v["status"], "timeout", "{v:#}");
}

#[test]
fn bad_lists_are_refused_before_any_work() {
    let (out, keep) = bisect(&["--layers-per-chunk", "0,1"], None);
    assert!(!out.status.success());
    assert!(support::text(&out.stderr).contains("--layers-per-chunk values must be at least 1"));
    assert_eq!(std::fs::read_dir(keep.path()).unwrap().count(), 0);
}
