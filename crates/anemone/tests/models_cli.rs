//! Issue #16 as a user runs it: `convert --lora` / `generate --lora` against PEFT's merged model
//! (tests/fixtures/lora, made by tools/oracle/make_lora_fixtures.py), the adapter's hash in the
//! manifest and `inspect`; and contexts of 2K, 4K and 8K tokens on a tiny checkpoint against
//! transformers and against the reference at positions past 4K, with the KV-state memory that
//! `inspect` states.

mod support;
use support::{anemone, fixture, text};

use anemone_runtime::npy;
use anemone_testkit::{assert_close, repo_root, Tier};
use std::path::{Path, PathBuf};
use std::process::Output;

fn succeed(args: &[&str]) -> Output {
    let out = anemone(args);
    assert!(
        out.status.success(),
        "anemone {args:?} failed:\n{}",
        text(&out.stderr)
    );
    out
}

fn ids_arg(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

fn json(out: &Output) -> serde_json::Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&out.stdout)))
}

fn ids_of(v: &serde_json::Value, key: &str) -> Vec<u32> {
    serde_json::from_value(v[key].clone()).unwrap()
}

fn p(path: &Path) -> &str {
    path.to_str().unwrap()
}

/// `generate` teacher-forced through `ids`, its per-step logits.
fn forced_logits(model: &Path, prompt: &[u32], ids: &[u32], extra: &[&str]) -> npy::NpyArray {
    let tmp = tempfile::tempdir().unwrap();
    let dump = tmp.path().join("logits.npy");
    let (prompt, forced) = (ids_arg(prompt), ids_arg(ids));
    let mut args = vec![
        "generate",
        p(model),
        "--prompt-ids",
        &prompt,
        "--force-ids",
        &forced,
        "--json",
        "--dump-logits",
        p(&dump),
    ];
    args.extend_from_slice(extra);
    succeed(&args);
    npy::read_f32(&dump).unwrap()
}

#[test]
fn lora_convert_generate_and_inspect_match_peft() {
    let adapter = repo_root().join("tests/fixtures/lora/qwen3_gqa4_rslora_regex");
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(adapter.join("oracle.json")).unwrap()).unwrap();
    let base = fixture(oracle["base"].as_str().unwrap());
    let (prompt, greedy) = (ids_of(&oracle, "prompt_ids"), ids_of(&oracle, "greedy_ids"));
    let want = npy::read_f32(&adapter.join("logits.npy")).unwrap();

    // the reference on the checkpoint: greedy ids of the merged model
    let out = succeed(&[
        "generate",
        p(&base),
        "--lora",
        p(&adapter),
        "--prompt-ids",
        &ids_arg(&prompt),
        "--max-tokens",
        &greedy.len().to_string(),
        "--json",
    ]);
    assert_eq!(ids_of(&json(&out), "generated_ids"), greedy);

    // the bundle (fp32 graph on the executor)
    let tmp = tempfile::tempdir().unwrap();
    let out_dir = tmp.path().join("lora.bundle");
    let out = succeed(&[
        "convert",
        p(&base),
        "--out",
        p(&out_dir),
        "--lora",
        p(&adapter),
        "--precision",
        "fp32",
        "--context",
        "64",
        "--prefill-len",
        "4",
        "--json",
    ]);
    let report = json(&out);
    let sha = report["lora"]["adapter_sha256"]
        .as_str()
        .unwrap()
        .to_string();
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(out_dir.join("anemone.json")).unwrap()).unwrap();
    assert_eq!(manifest["lora"]["adapter_sha256"], sha.as_str());
    let provenance = manifest["provenance"].as_array().unwrap();
    assert!(
        provenance.iter().any(|s| s["sha256"] == sha.as_str()
            && s["path"]
                .as_str()
                .unwrap()
                .ends_with("adapter_model.safetensors")),
        "the adapter is among the sources: {provenance:?}"
    );
    let got = forced_logits(&out_dir, &prompt, &greedy, &[]);
    assert_eq!(got.shape, want.shape);
    assert_close(
        "LoRA bundle vs PEFT merge_and_unload",
        &got.data,
        &want.data,
        Tier::F32_MODEL,
    );

    let inspect = json(&succeed(&["inspect", p(&out_dir), "--json"]));
    assert_eq!(inspect["manifest"]["lora"]["adapter_sha256"], sha.as_str());
    let text_report = text(&succeed(&["inspect", p(&out_dir)]).stdout);
    assert!(text_report.contains(&sha), "{text_report}");

    // --lora is for checkpoints; a bundle has it merged already
    let err = anemone(&[
        "generate",
        p(&out_dir),
        "--lora",
        p(&adapter),
        "--prompt-ids",
        "5",
    ]);
    assert!(!err.status.success());
    assert!(text(&err.stderr).contains("--lora applies to checkpoints"));
    // an adapter for another base: named, nothing written
    let bad_out = tmp.path().join("bad.bundle");
    let err = anemone(&[
        "convert",
        p(&fixture("qwen3_mha_tied")),
        "--out",
        p(&bad_out),
        "--lora",
        p(&adapter),
    ]);
    assert!(!err.status.success());
    assert!(
        text(&err.stderr).contains("another base model"),
        "{}",
        text(&err.stderr)
    );
    assert!(!bad_out.exists());
}

/// A copy of oracle fixture `name` whose config allows `max` positions (which changes nothing
/// else: the model's RoPE does not depend on it).
fn with_max_positions(name: &str, max: usize, dir: &Path) -> PathBuf {
    let src = fixture(name);
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    let path = dst.join("config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = max.into();
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    dst
}

#[test]
fn contexts_of_2k_4k_8k_match_transformers_and_state_their_kv_memory() {
    let tmp = tempfile::tempdir().unwrap();
    let model = with_max_positions("llama_gqa4", 8192, tmp.path());
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(model.join("oracle.json")).unwrap()).unwrap();
    let (prompt, greedy) = (ids_of(&oracle, "prompt_ids"), ids_of(&oracle, "greedy_ids"));
    let want = npy::read_f32(&model.join("logits.npy")).unwrap();
    for context in [2048usize, 4096, 8192] {
        let out = tmp.path().join(format!("ctx{context}.bundle"));
        succeed(&[
            "convert",
            p(&model),
            "--out",
            p(&out),
            "--precision",
            "fp32",
            "--context",
            &context.to_string(),
            "--layers-per-chunk",
            "2",
        ]);
        let got = forced_logits(&out, &prompt, &greedy, &[]);
        assert_close(
            &format!("context {context} vs transformers"),
            &got.data,
            &want.data,
            Tier::F32_MODEL,
        );
        // llama_gqa4: 2 layers × (K, V) × 2 KV heads × head_dim 8 held as 32 × fp16
        let kv = json(&succeed(&["inspect", p(&out), "--json", "--no-verify"]))["kv_state"].clone();
        let bytes = (2 * 2 * 2 * 32 * 2 * context) as u64;
        assert_eq!(kv["bytes"], bytes, "{kv}");
        assert_eq!(kv["bytes_per_token"], bytes / context as u64);
        let report = text(&succeed(&["inspect", p(&out), "--no-verify"]).stdout);
        assert!(report.contains("KV state:"), "{report}");
        if context == 8192 {
            // positions past 4K: a 4,200-token prompt, then two decode steps, against the reference
            let long: Vec<u32> = (0..4200u32).map(|i| 4 + (i * 7919 + 13) % 330).collect();
            let reference = forced_logits(&model, &long, &[17, 23], &[]);
            let bundle = forced_logits(&out, &long, &[17, 23], &[]);
            assert_close(
                "8K bundle vs reference at positions 4199..4201",
                &bundle.data,
                &reference.data,
                Tier::F32_MODEL,
            );
        }
    }
    // past the model's maximum: a named option error
    let err = anemone(&[
        "convert",
        p(&fixture("llama_gqa4")),
        "--out",
        p(&tmp.path().join("too-long.bundle")),
        "--context",
        "512",
    ]);
    assert!(!err.status.success());
    assert!(
        text(&err.stderr).contains("max_position_embeddings 256"),
        "{}",
        text(&err.stderr)
    );
}

/// A Gemma 3 bundle whose sliding layers keep rings (window 4 + prefill 8 → 32 slots at context
/// 256): `inspect` states the smaller KV state and the ring, and the bundle follows the reference
/// past several wraps (a 100-id prompt, then forced steps).
#[test]
fn sliding_layer_rings_shrink_the_kv_state_and_follow_the_reference() {
    let tmp = tempfile::tempdir().unwrap();
    let model = fixture("gemma3_sliding_gqa2");
    let out = tmp.path().join("ring.bundle");
    succeed(&[
        "convert",
        p(&model),
        "--out",
        p(&out),
        "--precision",
        "fp32",
        "--context",
        "256",
        "--prefill-len",
        "8",
        "--layers-per-chunk",
        "3",
    ]);
    let kv = json(&succeed(&["inspect", p(&out), "--json", "--no-verify"]))["kv_state"].clone();
    // one global layer at 256 slots, two sliding layers at 32; (K, V) × 2 KV heads × head_dim
    // 16 held as 32 × fp16
    let per_slot = (2 * 2 * 32 * 2) as u64;
    assert_eq!(kv["local_kv_slots"], 32, "{kv}");
    assert_eq!(kv["bytes"], per_slot * (256 + 2 * 32), "{kv}");
    assert_eq!(kv["full_context_bytes"], per_slot * 3 * 256, "{kv}");
    let report = text(&succeed(&["inspect", p(&out), "--no-verify"]).stdout);
    assert!(report.contains("ring of 32 slots"), "{report}");

    let prompt: Vec<u32> = (0..100u32).map(|i| 4 + (i * 37 + 11) % 290).collect();
    let forced = [17, 23, 101, 5, 250];
    let reference = forced_logits(&model, &prompt, &forced, &[]);
    let bundle = forced_logits(&out, &prompt, &forced, &[]);
    assert_close(
        "ring bundle vs reference at positions 99..104",
        &bundle.data,
        &reference.data,
        Tier::F32_MODEL,
    );
}
