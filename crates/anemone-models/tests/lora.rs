//! LoRA adapters merged at import against PEFT's `merge_and_unload` + transformers on the
//! random-init adapters of tests/fixtures/lora (made by tools/oracle/make_lora_fixtures.py):
//! greedy ids equal, logits within 1e-3 — on the Hugging Face base and on the same base written
//! as a GGUF file; and every misfit adapter refused with an error naming the problem.

mod gguf_support;

use std::path::{Path, PathBuf};

use anemone_backend::npy;
use anemone_checkpoint::{apply_lora, Checkpoint, CheckpointError};
use anemone_models::reference::{LogitsFor, ReferenceModel, ReferenceOptions};
use anemone_testkit::{argmax, assert_close, oracle_dir, repo_root, Tier};
use gguf_support::{llama_cpp_permute, GgufWriter, Val};

struct LoraFixture {
    name: String,
    dir: PathBuf,
    base: String,
    prompt_ids: Vec<u32>,
    greedy_ids: Vec<u32>,
}

fn lora_root() -> PathBuf {
    repo_root().join("tests/fixtures/lora")
}

fn read_fixture(dir: PathBuf) -> LoraFixture {
    let oracle: serde_json::Value =
        serde_json::from_slice(&std::fs::read(dir.join("oracle.json")).unwrap()).unwrap();
    let ids = |k: &str| -> Vec<u32> {
        oracle[k]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap() as u32)
            .collect()
    };
    LoraFixture {
        name: dir.file_name().unwrap().to_string_lossy().into_owned(),
        base: oracle["base"].as_str().unwrap().to_string(),
        prompt_ids: ids("prompt_ids"),
        greedy_ids: ids("greedy_ids"),
        dir,
    }
}

fn fixtures() -> Vec<LoraFixture> {
    let mut out: Vec<LoraFixture> = std::fs::read_dir(lora_root())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|d| d.join("oracle.json").is_file())
        .map(read_fixture)
        .collect();
    out.sort_by(|a, b| a.name.cmp(&b.name));
    assert!(
        out.len() >= 3,
        "expected LoRA fixtures in {}",
        lora_root().display()
    );
    out
}

fn fixture(name: &str) -> LoraFixture {
    read_fixture(lora_root().join(name))
}

/// The greedy steps of the merged checkpoint against PEFT's merged model.
fn check_against_peft(checkpoint: &Checkpoint, f: &LoraFixture, what: &str) {
    let want = npy::read_f32(&f.dir.join("logits.npy")).unwrap();
    let options = ReferenceOptions {
        threads: Some(2),
        context_len: None,
        huge_pages: false,
    };
    let mut model = ReferenceModel::load(checkpoint, &options).unwrap();
    let vocab = model.config().vocab_size;
    let mut logits = model
        .forward(&f.prompt_ids, LogitsFor::LastPosition)
        .unwrap();
    for (step, &id) in f.greedy_ids.iter().enumerate() {
        assert_close(
            &format!("{what}: step {step} logits"),
            &logits,
            &want.data[step * vocab..(step + 1) * vocab],
            Tier::F32_MODEL,
        );
        assert_eq!(argmax(&logits), id, "{what}: greedy step {step}");
        logits = model.forward(&[id], LogitsFor::LastPosition).unwrap();
    }
}

#[test]
fn merged_hf_bases_match_peft_merge_and_unload() {
    for f in fixtures() {
        let base = anemone_models::open_checkpoint(oracle_dir(&f.base)).unwrap();
        let merged = apply_lora(base, &f.dir).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        let record = merged.lora.clone().unwrap();
        assert_eq!(record.adapter_sha256.len(), 64);
        assert!(!record.merged_tensors.is_empty());
        assert!(merged
            .source_paths
            .contains(&f.dir.join("adapter_model.safetensors")));
        check_against_peft(&merged, &f, &f.name);
    }
}

#[test]
fn the_adapter_changes_the_model() {
    // the same prompt on the bare base chooses differently or scores differently by far more
    // than the tolerance, so the comparison above cannot pass without the merge
    let f = fixture("llama_gqa4_all");
    let base = anemone_models::open_checkpoint(oracle_dir(&f.base)).unwrap();
    let want = npy::read_f32(&f.dir.join("logits.npy")).unwrap();
    let mut model = ReferenceModel::load(&base, &ReferenceOptions::default()).unwrap();
    let logits = model
        .forward(&f.prompt_ids, LogitsFor::LastPosition)
        .unwrap();
    let vocab = logits.len();
    let (_, got, wanted) = anemone_testkit::worst(&logits, &want.data[..vocab]);
    assert!((got - wanted).abs() > 0.5, "{got} vs {wanted}");
}

/// `oracle/<base>` (a llama checkpoint with f32 tensors) written as llama.cpp would: GGUF names,
/// Q/K rows permuted.
fn write_llama_gguf(base: &Checkpoint) -> tempfile::TempPath {
    let c = &base.config;
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Val::Str("llama".into()))
        .kv("general.alignment", Val::U32(32))
        .kv("llama.embedding_length", Val::U32(c.hidden_size as u32))
        .kv("llama.block_count", Val::U32(c.num_hidden_layers as u32))
        .kv(
            "llama.feed_forward_length",
            Val::U32(c.intermediate_size as u32),
        )
        .kv(
            "llama.attention.head_count",
            Val::U32(c.num_attention_heads as u32),
        )
        .kv(
            "llama.attention.head_count_kv",
            Val::U32(c.num_key_value_heads as u32),
        )
        .kv("llama.rope.freq_base", Val::F32(c.rope_theta as f32))
        .kv(
            "llama.attention.layer_norm_rms_epsilon",
            Val::F32(c.rms_norm_eps as f32),
        )
        .kv(
            "llama.context_length",
            Val::U32(c.max_position_embeddings as u32),
        )
        .kv("llama.vocab_size", Val::U32(c.vocab_size as u32))
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2));
    for name in base.tensors.names() {
        let shape = base.tensors.info(&name).unwrap().shape;
        let mut data = base.load_f32(&name).unwrap();
        let gguf = match name.as_str() {
            "model.embed_tokens.weight" => "token_embd.weight".to_string(),
            "model.norm.weight" => "output_norm.weight".to_string(),
            "lm_head.weight" => "output.weight".to_string(),
            _ => {
                let rest = name.strip_prefix("model.layers.").unwrap();
                let (layer, suffix) = rest.split_once('.').unwrap();
                let g = match suffix {
                    "self_attn.q_proj.weight" => {
                        data = llama_cpp_permute(&data, shape[0], shape[1], c.num_attention_heads);
                        "attn_q.weight"
                    }
                    "self_attn.k_proj.weight" => {
                        data = llama_cpp_permute(&data, shape[0], shape[1], c.num_key_value_heads);
                        "attn_k.weight"
                    }
                    "self_attn.v_proj.weight" => "attn_v.weight",
                    "self_attn.o_proj.weight" => "attn_output.weight",
                    "mlp.gate_proj.weight" => "ffn_gate.weight",
                    "mlp.up_proj.weight" => "ffn_up.weight",
                    "mlp.down_proj.weight" => "ffn_down.weight",
                    "input_layernorm.weight" => "attn_norm.weight",
                    "post_attention_layernorm.weight" => "ffn_norm.weight",
                    other => panic!("unexpected tensor {other}"),
                };
                format!("blk.{layer}.{g}")
            }
        };
        w.tensor_f32(&gguf, &shape, &data);
    }
    gguf_support::write_temp(&w.write().0)
}

#[test]
fn merged_gguf_base_matches_peft() {
    let f = fixture("llama_gqa4_all");
    let hf = anemone_models::open_checkpoint(oracle_dir(&f.base)).unwrap();
    let gguf = write_llama_gguf(&hf);
    let base = anemone_models::open_checkpoint(&*gguf).unwrap();
    assert_eq!(base.config.hidden_size, hf.config.hidden_size);
    let merged = apply_lora(base, &f.dir).unwrap();
    check_against_peft(&merged, &f, "GGUF base + llama_gqa4_all");
}

/// A copy of fixture `name`'s adapter in a temporary directory, its config edited by `edit`.
fn edited_adapter(name: &str, edit: impl FnOnce(&mut serde_json::Value)) -> tempfile::TempDir {
    let src = lora_root().join(name);
    let tmp = tempfile::tempdir().unwrap();
    for file in ["adapter_config.json", "adapter_model.safetensors"] {
        std::fs::copy(src.join(file), tmp.path().join(file)).unwrap();
    }
    let path = tmp.path().join("adapter_config.json");
    let mut config: serde_json::Value =
        serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(&mut config);
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    tmp
}

fn lora_err(base: &str, adapter: &Path) -> String {
    let checkpoint = anemone_models::open_checkpoint(oracle_dir(base)).unwrap();
    match apply_lora(checkpoint, adapter) {
        Ok(_) => panic!("{} on {base}: expected an error", adapter.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn a_target_module_that_matches_nothing_is_named() {
    let dir = edited_adapter("qwen2_mha_subset", |c| {
        c["target_modules"]
            .as_array_mut()
            .unwrap()
            .push("c_attn".into());
    });
    let err = lora_err("qwen2_mha", dir.path());
    assert!(
        err.contains("target module `c_attn` matches no module") && err.contains("q_proj"),
        "{err}"
    );
    let dir = edited_adapter("qwen3_gqa4_rslora_regex", |c| {
        c["target_modules"] = r".*\.query_key_value".into();
    });
    let err = lora_err("qwen3_gqa4", dir.path());
    assert!(err.contains("matches no module"), "{err}");
}

#[test]
fn a_rank_that_disagrees_with_the_tensors_is_named() {
    let dir = edited_adapter("qwen2_mha_subset", |c| c["r"] = 3.into());
    let err = lora_err("qwen2_mha", dir.path());
    assert!(
        err.contains("rank mismatch") && err.contains("r = 3"),
        "{err}"
    );
}

#[test]
fn an_adapter_for_another_base_is_named() {
    // 3 layers of adapter onto a 2-layer base
    let err = lora_err("qwen2_gqa3_tied", &lora_root().join("qwen2_mha_subset"));
    assert!(
        err.contains("another base model") && err.contains("the base has 2 layers"),
        "{err}"
    );
    // hidden size 64 onto hidden size 48
    let err = lora_err(
        "qwen3_mha_tied",
        &lora_root().join("qwen3_gqa4_rslora_regex"),
    );
    assert!(
        err.contains("another base model") && err.contains("hidden size 48"),
        "{err}"
    );
    // an lm_head adapter onto a base whose LM head is the embedding matrix
    let err = lora_err("llama_mha_tied", &lora_root().join("llama_gqa4_all"));
    assert!(err.contains("lm_head"), "{err}");
}

#[test]
fn unimplemented_adapter_features_are_refused_by_name() {
    for (key, value) in [
        ("use_dora", serde_json::json!(true)),
        ("rank_pattern", serde_json::json!({"q_proj": 4})),
        ("layers_to_transform", serde_json::json!([0])),
        ("bias", serde_json::json!("all")),
        ("peft_type", serde_json::json!("IA3")),
    ] {
        let dir = edited_adapter("qwen2_mha_subset", |c| c[key] = value.clone());
        let checkpoint = anemone_models::open_checkpoint(oracle_dir("qwen2_mha")).unwrap();
        let err = apply_lora(checkpoint, dir.path()).map(|_| ()).unwrap_err();
        assert!(
            matches!(&err, CheckpointError::Unsupported { what, .. } if what.contains(key)),
            "{key}: {err}"
        );
    }
    let missing = tempfile::tempdir().unwrap();
    let err = lora_err("qwen2_mha", missing.path());
    assert!(err.contains("adapter_config.json"), "{err}");
}

/// Phi-3's fused `qkv_proj` / `gate_up_proj` are the modules an adapter targets (as PEFT sees
/// the model): the fused update `B·A` merges row-wise into the split projections; `q_proj` is
/// not a module of a Phi-3 and is named as such.
#[test]
fn phi3_adapters_on_fused_projections_merge_into_their_parts() {
    let f = fixture("phi3_fused");
    let base = anemone_models::open_checkpoint(oracle_dir(&f.base)).unwrap();
    let merged = apply_lora(base, &f.dir).unwrap();
    let tensors = merged.lora.as_ref().unwrap().merged_tensors.clone();
    for part in ["q_proj", "k_proj", "v_proj", "o_proj"] {
        assert!(
            tensors.contains(&format!("model.layers.1.self_attn.{part}.weight")),
            "{tensors:?}"
        );
    }
    for part in ["gate_proj", "up_proj", "down_proj"] {
        assert!(
            tensors.contains(&format!("model.layers.0.mlp.{part}.weight")),
            "{tensors:?}"
        );
    }
    check_against_peft(&merged, &f, "phi3_fused");

    let dir = edited_adapter("phi3_fused", |c| {
        c["target_modules"] = serde_json::json!(["q_proj"])
    });
    let err = lora_err("phi3_partial_rotary", dir.path());
    assert!(
        err.contains("target module `q_proj` matches no module") && err.contains("qkv_proj"),
        "{err}"
    );
}
