//! `anemone generate` as a user runs it: the built binary against transformers' oracle fixtures
//! (through `--prompt-ids … --temperature 0 --json --dump-logits`), its errors, and real models.

mod support;
use support::anemone;

use anemone_runtime::npy;
use serde::Deserialize;
use std::path::{Path, PathBuf};
use std::process::Output;

/// The bar for fp32 logits against transformers.
const LOGITS_TOLERANCE: f32 = 1e-3;

#[derive(Deserialize)]
struct Report {
    prompt_ids: Vec<u32>,
    generated_ids: Vec<u32>,
    text: String,
    prefill_tok_s: f64,
    decode_tok_s: f64,
}

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn succeed(args: &[&str]) -> Output {
    let out = anemone(args);
    assert!(
        out.status.success(),
        "anemone {args:?} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

fn oracle_dirs() -> Vec<PathBuf> {
    let root = workspace().join("tests/fixtures/oracle");
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("oracle.json").is_file())
        .collect();
    dirs.sort();
    assert!(
        dirs.len() >= 3,
        "expected oracle fixtures in {}",
        root.display()
    );
    dirs
}

fn oracle_ids(dir: &Path) -> (Vec<u32>, Vec<u32>) {
    let v: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("oracle.json")).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        serde_json::from_value(v[k].clone()).unwrap_or_else(|e| panic!("{k}: {e}"))
    };
    (ids("prompt_ids"), ids("greedy_ids"))
}

fn assert_logits_close(name: &str, got: &npy::NpyArray, want: &npy::NpyArray) {
    assert_eq!(got.shape, want.shape, "{name}: logits shape");
    let vocab = want.shape[1];
    let (i, g, w) = got
        .data
        .iter()
        .zip(&want.data)
        .enumerate()
        .map(|(i, (g, w))| (i, *g, *w))
        .max_by(|a, b| (a.1 - a.2).abs().total_cmp(&(b.1 - b.2).abs()))
        .unwrap();
    assert!(
        (g - w).abs() <= LOGITS_TOLERANCE,
        "{name}: step {}, token {}: ours {g}, transformers {w}",
        i / vocab,
        i % vocab
    );
}

#[test]
fn greedy_json_and_dumped_logits_match_transformers() {
    let tmp = tempfile::tempdir().unwrap();
    for dir in oracle_dirs() {
        let name = dir.file_name().unwrap().to_string_lossy().into_owned();
        let (prompt, greedy) = oracle_ids(&dir);
        let want = npy::read_f32(&dir.join("logits.npy")).unwrap();
        let dump = tmp.path().join(format!("{name}.npy"));
        let out = succeed(&[
            "generate",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids_arg(&prompt),
            "--temperature",
            "0",
            "--max-tokens",
            &greedy.len().to_string(),
            "--json",
            "--dump-logits",
            dump.to_str().unwrap(),
        ]);
        let report: Report = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
            panic!(
                "{name}: stdout is not one JSON report ({e}):\n{}",
                String::from_utf8_lossy(&out.stdout)
            )
        });
        assert_eq!(report.prompt_ids, prompt, "{name}");
        assert_eq!(report.generated_ids, greedy, "{name}: greedy ids");
        assert_eq!(report.text, "", "{name}: no tokenizer, so no text");
        assert!(
            report.prefill_tok_s > 0.0 && report.decode_tok_s > 0.0,
            "{name}"
        );
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("tok/s"),
            "{name}: speed on stderr"
        );
        assert_logits_close(&name, &npy::read_f32(&dump).unwrap(), &want);

        // Teacher forcing along the oracle's path gives the same rows.
        let forced = tmp.path().join(format!("{name}.forced.npy"));
        let out = succeed(&[
            "generate",
            dir.to_str().unwrap(),
            "--prompt-ids",
            &ids_arg(&prompt),
            "--force-ids",
            &ids_arg(&greedy),
            "--json",
            "--dump-logits",
            forced.to_str().unwrap(),
        ]);
        let report: Report = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(
            report.generated_ids, greedy,
            "{name}: forced ids are the output"
        );
        assert_logits_close(
            &format!("{name} (forced)"),
            &npy::read_f32(&forced).unwrap(),
            &want,
        );
    }
}

#[test]
fn forcing_diverging_ids_changes_later_logits_only() {
    let dir = &oracle_dirs()[0];
    let (prompt, greedy) = oracle_ids(dir);
    let tmp = tempfile::tempdir().unwrap();
    let mut forced = greedy.clone();
    forced[1] = (greedy[1] + 1) % 64;
    let dump = tmp.path().join("f.npy");
    succeed(&[
        "generate",
        dir.to_str().unwrap(),
        "--prompt-ids",
        &ids_arg(&prompt),
        "--force-ids",
        &ids_arg(&forced),
        "--json",
        "--dump-logits",
        dump.to_str().unwrap(),
    ]);
    let got = npy::read_f32(&dump).unwrap();
    let want = npy::read_f32(&dir.join("logits.npy")).unwrap();
    let vocab = want.shape[1];
    let row_diff = |step: usize| {
        got.data[step * vocab..(step + 1) * vocab]
            .iter()
            .zip(&want.data[step * vocab..(step + 1) * vocab])
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max)
    };
    assert!(row_diff(0) <= LOGITS_TOLERANCE && row_diff(1) <= LOGITS_TOLERANCE);
    assert!(row_diff(2) > 1e-2, "step 2 follows the changed id");
}

#[test]
fn errors_name_the_problem() {
    let dir = oracle_dirs()[0].clone();
    let dir = dir.to_str().unwrap();
    let out = anemone(&["generate", dir, "--prompt", "hello"]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no tokenizer"), "{stderr}");

    // max_position_embeddings of the fixtures is 256: prompt + 300 tokens cannot fit.
    let out = anemone(&[
        "generate",
        dir,
        "--prompt-ids",
        "1,2,3",
        "--max-tokens",
        "300",
    ]);
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("beyond the context length 256"), "{stderr}");
    assert!(out.stdout.is_empty(), "nothing generated on overflow");

    let out = anemone(&["generate", dir, "--prompt-ids", "1,2", "--top-p", "1.5"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("top_p"));

    let out = anemone(&["generate", dir, "--prompt-ids", "1,99999"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("outside the vocabulary"));

    let out = anemone(&["generate", "/nonexistent/model.gguf", "--prompt-ids", "1"]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/model.gguf"));
}

#[test]
fn seeded_sampling_is_reproducible() {
    let dir = oracle_dirs()[0].clone();
    let run = |seed: &str| {
        let out = succeed(&[
            "generate",
            dir.to_str().unwrap(),
            "--prompt-ids",
            "5,6,7",
            "--max-tokens",
            "24",
            "--temperature",
            "1.5",
            "--top-k",
            "50",
            "--top-p",
            "0.95",
            "--seed",
            seed,
            "--json",
        ]);
        serde_json::from_slice::<Report>(&out.stdout)
            .unwrap()
            .generated_ids
    };
    assert_eq!(run("1"), run("1"));
    assert_ne!(run("1"), run("2"));
}

fn smollm2() -> PathBuf {
    let dir = std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| workspace().join("models"));
    let path = dir.join("smollm2-135m-instruct.Q4_1.gguf");
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models.sh` (or set ANEMONE_MODELS)",
        path.display()
    );
    path
}

#[test]
fn smollm2_streams_paris() {
    let model = smollm2();
    let out = succeed(&[
        "generate",
        model.to_str().unwrap(),
        "--prompt",
        "The capital of France is",
        "--max-tokens",
        "6",
    ]);
    let text = String::from_utf8(out.stdout).unwrap();
    assert!(text.starts_with(" Paris"), "streamed {text:?}");

    let out = succeed(&[
        "generate",
        model.to_str().unwrap(),
        "--prompt",
        "What is the capital of France?",
        "--chat",
        "--max-tokens",
        "24",
        "--json",
    ]);
    let report: Report = serde_json::from_slice(&out.stdout).unwrap();
    // The chat template opens with SmolLM2's system prompt and ends with the assistant header.
    assert_eq!(
        &report.prompt_ids[..3],
        &[1, 9690, 198],
        "<|im_start|>system\\n"
    );
    assert!(
        report.text.contains("Paris"),
        "chat answer {:?}",
        report.text
    );
}
