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
