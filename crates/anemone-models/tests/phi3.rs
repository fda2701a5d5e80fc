//! Phi-3 import: fused projections split into the Llama names, partial rotation and LongRoPE read
//! from both config layouts (transformers 4 `rope_scaling`, 5 `rope_parameters`), the factors
//! chosen by context, and every key it does not implement refused by name. (Its numerics against
//! transformers are checked with the other oracle fixtures: `oracle.rs`, the pipeline tests.)

use anemone_checkpoint::CheckpointError;
use anemone_testkit::oracle_dir;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

fn copy_fixture(
    name: &str,
    dir: &Path,
    edit: impl FnOnce(&mut serde_json::Map<String, Value>),
) -> PathBuf {
    let src = oracle_dir(name);
    let dst = dir.join(name);
    std::fs::create_dir_all(&dst).unwrap();
    for entry in std::fs::read_dir(&src).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dst.join(entry.file_name())).unwrap();
    }
    let path = dst.join("config.json");
    let mut config: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    dst
}

#[test]
fn fused_projections_are_split_rows_of_the_fused_tensors() {
    let checkpoint = anemone_models::open_checkpoint(oracle_dir("phi3_partial_rotary")).unwrap();
    let c = &checkpoint.config;
    assert_eq!(c.architecture.name(), "phi3");
    assert_eq!((c.head_dim, c.partial_rotary_dim), (16, Some(8)));
    assert!(c.long_rope.is_none() && !c.attention_bias && !c.o_proj_bias);
    let names = checkpoint.tensors.names();
    assert!(!names
        .iter()
        .any(|n| n.contains("qkv_proj") || n.contains("gate_up_proj")));
    let raw = anemone_checkpoint::hf::SafetensorsStore::open_file(
        &oracle_dir("phi3_partial_rotary").join("model.safetensors"),
    )
    .unwrap();
    use anemone_checkpoint::TensorStore;
    let fused = raw
        .load_f32("model.layers.1.self_attn.qkv_proj.weight")
        .unwrap();
    let (q, kv, h) = (c.q_dim(), c.kv_dim(), c.hidden_size);
    let mut joined = Vec::new();
    for p in ["q_proj", "k_proj", "v_proj"] {
        let name = format!("model.layers.1.self_attn.{p}.weight");
        let info = checkpoint.tensors.info(&name).unwrap();
        assert_eq!(info.shape[1], h);
        joined.extend(checkpoint.load_f32(&name).unwrap());
    }
    assert_eq!(joined.len(), (q + 2 * kv) * h);
    assert_eq!(joined, fused);
    let gate_up = raw
        .load_f32("model.layers.0.mlp.gate_up_proj.weight")
        .unwrap();
    let mut joined = checkpoint
        .load_f32("model.layers.0.mlp.gate_proj.weight")
        .unwrap();
    joined.extend(
        checkpoint
            .load_f32("model.layers.0.mlp.up_proj.weight")
            .unwrap(),
    );
    assert_eq!(joined, gate_up);
}

#[test]
fn longrope_factors_follow_the_context() {
    let checkpoint = anemone_models::open_checkpoint(oracle_dir("phi3_longrope")).unwrap();
    let c = &checkpoint.config;
    assert_eq!(c.partial_rotary_dim, Some(12));
    let long = c.long_rope.as_ref().unwrap();
    assert_eq!(long.original_max_position_embeddings, 4);
    assert!(
        (long.attention_factor - 2.0).abs() < 1e-12,
        "{}",
        long.attention_factor
    );
    assert!(long.use_long, "max 256 > original 4");
    assert!(!c.for_context(4).long_rope.unwrap().use_long);
    assert!(c.for_context(5).long_rope.unwrap().use_long);
}

#[test]
fn transformers4_su_layout_reads_the_same() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture("phi3_longrope", tmp.path(), |c| {
        let rope = c.remove("rope_parameters").unwrap();
        c.insert("rope_theta".into(), rope["rope_theta"].clone());
        c.insert("partial_rotary_factor".into(), json!(0.75));
        c.insert("original_max_position_embeddings".into(), json!(4));
        c.insert(
            "rope_scaling".into(),
            json!({"type": "su", "short_factor": rope["short_factor"], "long_factor": rope["long_factor"]}),
        );
    });
    let v4 = anemone_models::open_checkpoint(&dir).unwrap().config;
    let v5 = anemone_models::open_checkpoint(oracle_dir("phi3_longrope"))
        .unwrap()
        .config;
    assert_eq!(v4, v5);
}

#[test]
fn a_sliding_window_shorter_than_the_model_masks_every_layer() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture("phi3_partial_rotary", tmp.path(), |c| {
        c.insert("sliding_window".into(), json!(96));
    });
    let c = anemone_models::open_checkpoint(&dir).unwrap().config;
    assert_eq!(c.max_position_embeddings, 256, "the context is not capped");
    assert_eq!(c.attention_window, Some(96));
    assert!((0..c.num_hidden_layers).all(|l| c.sliding_window(l) == Some(96)));
    // a window of the whole context hides nothing: no window
    let dir = copy_fixture("phi3_longrope", tmp.path(), |c| {
        c.insert("sliding_window".into(), json!(256));
    });
    let c = anemone_models::open_checkpoint(&dir).unwrap().config;
    assert_eq!(c.attention_window, None);
}

fn open_err(dir: &Path) -> CheckpointError {
    anemone_models::open_checkpoint(dir)
        .map(|_| ())
        .unwrap_err()
}

#[test]
fn keys_it_does_not_implement_are_refused_by_name() {
    type Edit = Box<dyn Fn(&mut serde_json::Map<String, Value>)>;
    let cases: Vec<(&str, Edit)> = vec![
        (
            "full_attn_mod",
            Box::new(|c| {
                c.insert("full_attn_mod".into(), json!(2));
            }),
        ),
        (
            "attention_bias",
            Box::new(|c| {
                c.insert("attention_bias".into(), json!(true));
            }),
        ),
        (
            "rope_parameters.beta_fast",
            Box::new(|c| {
                c["rope_parameters"]["beta_fast"] = json!(32);
            }),
        ),
        (
            "rope_parameters.rope_type",
            Box::new(|c| {
                c["rope_parameters"]["rope_type"] = json!("dynamic");
                c["rope_parameters"]["type"] = json!("dynamic");
            }),
        ),
        (
            "hidden_act",
            Box::new(|c| {
                c.insert("hidden_act".into(), json!("gelu"));
            }),
        ),
    ];
    for (key, edit) in cases {
        let tmp = tempfile::tempdir().unwrap();
        let dir = copy_fixture("phi3_longrope", tmp.path(), &*edit);
        let err = open_err(&dir);
        assert!(
            matches!(&err, CheckpointError::Unsupported { what, .. } if what.contains(key)),
            "{key}: {err}"
        );
    }
    // LongRoPE factors of the wrong length, a missing list, a fused tensor of the wrong shape
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture("phi3_longrope", tmp.path(), |c| {
        c["rope_parameters"]["short_factor"] = json!([1.0, 1.0]);
    });
    assert!(open_err(&dir).to_string().contains("short_factor"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture("phi3_longrope", tmp.path(), |c| {
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("long_factor");
    });
    assert!(open_err(&dir).to_string().contains("long_factor"));
    let tmp = tempfile::tempdir().unwrap();
    let dir = copy_fixture("phi3_partial_rotary", tmp.path(), |c| {
        c.insert("num_key_value_heads".into(), json!(4));
    });
    let err = open_err(&dir);
    assert!(
        matches!(&err, CheckpointError::ShapeMismatch { name, .. } if name.ends_with("qkv_proj.weight")),
        "{err}"
    );
}

/// `tests/fixtures/gguf/phi3_longrope.gguf`, written by llama.cpp's own `convert_hf_to_gguf.py`
/// from the `phi3_longrope` checkpoint (`tools/oracle/make_phi3_gguf_fixture.py`).
fn phi3_gguf() -> PathBuf {
    anemone_testkit::repo_root().join("tests/fixtures/gguf/phi3_longrope.gguf")
}

#[test]
fn llama_cpp_gguf_reads_as_the_hugging_face_checkpoint() {
    let gguf = anemone_models::open_checkpoint(phi3_gguf()).unwrap();
    let hf = anemone_models::open_checkpoint(oracle_dir("phi3_longrope")).unwrap();
    let (g, h) = (&gguf.config, &hf.config);
    assert_eq!(g.architecture.name(), "phi3");
    assert_eq!(
        (
            g.hidden_size,
            g.num_hidden_layers,
            g.head_dim,
            g.partial_rotary_dim
        ),
        (
            h.hidden_size,
            h.num_hidden_layers,
            h.head_dim,
            h.partial_rotary_dim
        )
    );
    assert_eq!(g.partial_rotary_dim, Some(12));
    let (gl, hl) = (g.long_rope.as_ref().unwrap(), h.long_rope.as_ref().unwrap());
    // the GGUF stores the factors as f32
    let f32s = |v: &[f64]| v.iter().map(|&x| x as f32).collect::<Vec<_>>();
    assert_eq!(f32s(&gl.long_factor), f32s(&hl.long_factor));
    assert_eq!(f32s(&gl.short_factor), f32s(&hl.short_factor));
    assert_eq!(gl.original_max_position_embeddings, 4);
    assert!((gl.attention_factor - hl.attention_factor).abs() < 1e-6);
    assert_eq!(g.attention_window, None, "sliding_window 0: none");
    for (name, _) in anemone_models::families::expected_tensors(h).unwrap() {
        assert_eq!(
            gguf.tensors.info(&name).unwrap().shape,
            hf.tensors.info(&name).unwrap().shape,
            "{name}"
        );
        // f32 GGUF: the split rows are the checkpoint's bit for bit
        assert_eq!(
            gguf.load_f32(&name).unwrap(),
            hf.load_f32(&name).unwrap(),
            "{name}"
        );
    }
}

/// The reference forward on the GGUF against llama.cpp (llama-cpp-python 0.3.36) on the same
/// file, and against transformers on the checkpoint it was converted from, at every position of
/// the oracle's prompt and greedy continuation.
#[test]
fn reference_on_the_gguf_matches_llama_cpp_and_transformers() {
    use anemone_models::reference::{LogitsFor, ReferenceModel, ReferenceOptions};
    let ckpt = anemone_models::open_checkpoint(phi3_gguf()).unwrap();
    let fixture: Value = serde_json::from_slice(
        &std::fs::read(
            anemone_testkit::repo_root().join("tests/fixtures/gguf/phi3_longrope.llamacpp.json"),
        )
        .unwrap(),
    )
    .unwrap();
    let ids: Vec<u32> = fixture["ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect();
    let mut model = ReferenceModel::load(&ckpt, &ReferenceOptions::default()).unwrap();
    let ours = model.forward(&ids, LogitsFor::AllPositions).unwrap();
    let vocab = ckpt.config.vocab_size;
    let mut worst = 0f64;
    for (p, row) in fixture["logits"].as_array().unwrap().iter().enumerate() {
        let want: Vec<f32> = row
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap() as f32)
            .collect();
        let got = &ours[p * vocab..(p + 1) * vocab];
        assert_eq!(
            anemone_testkit::argmax(got),
            anemone_testkit::argmax(&want),
            "position {p}: greedy choice vs llama.cpp"
        );
        for (g, w) in got.iter().zip(&want) {
            worst = worst.max((g - w).abs() as f64);
        }
    }
    eprintln!("worst |logit diff| vs llama.cpp: {worst:.2e}");
    // llama.cpp with an f32 K/V cache (its default fp16 cache moves these logits by 2e-2)
    assert!(worst <= 1e-3, "worst |logit diff| vs llama.cpp {worst}");

    let oracle = anemone_testkit::oracle::oracle_fixture("phi3_longrope");
    let want = anemone_backend::npy::read_f32(&oracle.logits_path())
        .unwrap()
        .data;
    let prompt = oracle.prompt_ids.len();
    let steps = oracle.greedy_ids.len();
    assert_eq!(&ids[..prompt], oracle.prompt_ids.as_slice());
    let got = &ours[(prompt - 1) * vocab..(prompt - 1 + steps) * vocab];
    anemone_testkit::assert_close(
        "vs transformers",
        got,
        &want,
        anemone_testkit::Tier::F32_MODEL,
    );
}
