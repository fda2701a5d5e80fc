//! `anemone bench --llama-cpp`: the peer runs round by round with anemone along anemone's own
//! tokens and the ratios are anemone / peer. The peer here is a stand-in that speaks the peer's
//! protocol with known timings (llama-cpp-python is not installed for the tests); the real peer
//! is `tools/llama_cpp_peer.py`, run by `benches/exec_vs_llamacpp.sh` too.

mod support;

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// An executable `python` at `dir` running `body` (a Python program) with python3, ignoring the
/// script anemone passes; returns its path.
fn stand_in_python(dir: &Path, body: &str) -> PathBuf {
    let program = dir.join("peer.py");
    std::fs::write(&program, body).unwrap();
    let python = dir.join("python");
    std::fs::write(
        &python,
        format!("#!/bin/sh\nexec python3 {} \"$@\"\n", program.display()),
    )
    .unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    python
}

/// Replies 0.5 s per prompt and 0.125 s per forced token, and logs argv and every request.
const STAND_IN: &str = r#"
import json, sys
log = open(sys.argv[0].replace("peer.py", "requests.jsonl"), "w")
log.write(json.dumps(sys.argv[1:]) + "\n")
print(json.dumps({"ready": True, "gguf": "stand-in", "load_s": 0.25}), flush=True)
for line in sys.stdin:
    request = json.loads(line)
    log.write(line); log.flush()
    print(json.dumps({"prefill_s": 0.5, "token_s": [0.125] * len(request["forced"]),
                      "peak_rss_bytes": 1 << 20}), flush=True)
"#;

/// A temporary directory with a small bundle, the [`STAND_IN`] peer's `python` and a
/// stand-in source GGUF (never read by the stand-in).
struct StandIn {
    dir: tempfile::TempDir,
    bundle: PathBuf,
    python: PathBuf,
    source: PathBuf,
}

impl StandIn {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let bundle = support::small_bundle(dir.path());
        let python = stand_in_python(dir.path(), STAND_IN);
        let source = dir.path().join("source.gguf");
        std::fs::write(&source, b"GGUF").unwrap();
        StandIn {
            dir,
            bundle,
            python,
            source,
        }
    }

    /// `anemone bench` of the bundle with the stand-in peer, one thread, `--json`, and `args`.
    fn bench(&self, args: &[&str]) -> std::process::Output {
        let mut all = vec![
            "bench",
            self.bundle.to_str().unwrap(),
            "--llama-cpp",
            self.source.to_str().unwrap(),
            "--python",
            self.python.to_str().unwrap(),
            "--threads",
            "1",
            "--json",
        ];
        all.extend_from_slice(args);
        support::anemone(&all)
    }
}

#[test]
fn bench_runs_the_peer_along_anemones_tokens_and_reports_ratios() {
    let stand_in = StandIn::new();
    let out = stand_in.bench(&[
        "--prompt-len",
        "4",
        "--gen",
        "3",
        "--runs",
        "2",
        "--warmup",
        "1",
    ]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    let peer = &report["peer"];
    assert_eq!(
        peer["engine"], "llama.cpp F16",
        "an fp16 bundle is compared with F16"
    );
    assert_eq!(
        peer["prefill_tok_s"], 8.0,
        "4 prompt tokens in 0.5 s: {peer:#}"
    );
    assert_eq!(peer["decode_tok_s"], 8.0, "0.125 s per token: {peer:#}");
    assert_eq!(
        peer["raw"].as_array().unwrap().len(),
        2,
        "warm-up runs not counted"
    );
    let result = &report["results"][0];
    let ratio = &result["ratio_to_peer"];
    let anemone_prefill = result["prefill_tok_s"].as_f64().unwrap();
    let anemone_decode = result["decode_tok_s"].as_f64().unwrap();
    // JSON numbers round-trip to within an ulp or two
    let close = |got: f64, want: f64| (got - want).abs() <= 1e-12 * want.abs();
    let (prefill, decode) = (
        ratio["prefill"].as_f64().unwrap(),
        ratio["decode"].as_f64().unwrap(),
    );
    assert!(
        close(prefill, anemone_prefill / 8.0),
        "{prefill} vs {anemone_prefill} / 8"
    );
    assert!(
        close(decode, anemone_decode / 8.0),
        "{decode} vs {anemone_decode} / 8"
    );

    // one request per round (warm-up included), each along the tokens anemone fed that round
    let log = std::fs::read_to_string(stand_in.dir.path().join("requests.jsonl")).unwrap();
    let mut lines = log.lines();
    let argv: Vec<String> = serde_json::from_str(lines.next().unwrap()).unwrap();
    let at = argv.iter().position(|a| a == "--type").unwrap();
    assert_eq!(argv[at + 1], "F16");
    assert!(
        argv.contains(&stand_in.source.to_str().unwrap().to_string()),
        "{argv:?}"
    );
    let requests: Vec<Value> = lines.map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(requests.len(), 3);
    let raw = result["raw"].as_array().unwrap();
    for (request, run) in requests[1..].iter().zip(raw) {
        assert_eq!(request["prompt"].as_array().unwrap().len(), 4);
        assert_eq!(
            request["forced"], run["fed"],
            "the peer is forced along anemone's tokens"
        );
        assert_eq!(request["forced"].as_array().unwrap().len(), 2);
    }
}

#[test]
fn bench_peer_errors_name_the_cause_and_leave_nothing_behind() {
    let dir = tempfile::tempdir().unwrap();
    let bundle = support::small_bundle(dir.path());
    let source = dir.path().join("source.gguf");
    std::fs::write(&source, b"GGUF").unwrap();
    // the real peer under a Python without site-packages: llama-cpp-python and gguf are missing
    let python = dir.path().join("bare-python");
    std::fs::write(&python, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&python, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let tmp = tempfile::tempdir().unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_anemone"))
        .args(["bench", bundle.to_str().unwrap(), "--llama-cpp"])
        .arg(&source)
        .arg("--python")
        .arg(&python)
        .args(["--threads", "1", "--gen", "2", "--prompt-len", "4"])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    let stderr = support::text(&out.stderr);
    assert!(!out.status.success());
    assert!(stderr.contains("No module named"), "{stderr}");
    assert!(
        stderr.contains("pip install llama-cpp-python gguf"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_dir(tmp.path()).unwrap().count(),
        0,
        "the peer's temporary directory is removed"
    );

    let out = support::anemone(&[
        "bench",
        bundle.to_str().unwrap(),
        "--llama-cpp",
        "/no/such.gguf",
    ]);
    let stderr = support::text(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("/no/such.gguf: no such GGUF file"),
        "{stderr}"
    );
}

#[test]
fn bench_runs_the_prompt_ids_given_and_names_one_outside_the_vocabulary() {
    let stand_in = StandIn::new();
    let bench = |prompt_ids: &str| {
        stand_in.bench(&[
            "--prompt-ids",
            prompt_ids,
            "--gen",
            "2",
            "--runs",
            "1",
            "--warmup",
            "0",
        ])
    };
    let out = bench("5,3,9");
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let report: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["prompt_len"], 3);
    if cfg!(target_os = "linux") {
        assert!(
            report["file_huge_mapped_bytes"].is_u64(),
            "how much of the weights is in huge pages: {}",
            report["file_huge_mapped_bytes"]
        );
    }
    assert_eq!(report["results"][0]["raw"][0]["prompt_tokens"], 3);
    let log = std::fs::read_to_string(stand_in.dir.path().join("requests.jsonl")).unwrap();
    let request: Value = serde_json::from_str(log.lines().nth(1).unwrap()).unwrap();
    assert_eq!(
        request["prompt"],
        serde_json::json!([5, 3, 9]),
        "the peer prefills the same ids"
    );

    let out = bench("5,100000");
    assert!(!out.status.success());
    let err = support::text(&out.stderr);
    assert!(
        err.contains("--prompt-ids") && err.contains("100000"),
        "{err}"
    );
}
