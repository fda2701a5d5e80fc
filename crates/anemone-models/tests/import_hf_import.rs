//! Hugging Face directory import on hand-built tiny directories: config mapping, dtypes, sharding,
//! special-token ids and the files recorded as sources.

mod hf_support;

use anemone_checkpoint::{Architecture, Checkpoint, CheckpointError};
use hf_support::*;
use safetensors::Dtype;
use serde_json::json;

fn assert_loads_exactly(checkpoint: &Checkpoint, model_type: &str, tied: bool) {
    for (n, (name, shape)) in tiny_tensor_shapes(model_type, tied).into_iter().enumerate() {
        let info = checkpoint.tensors.info(&name).expect(&name);
        assert_eq!(info.shape, shape, "{name}");
        let loaded = checkpoint.load_f32(&name).unwrap();
        let expected = values(n, shape.iter().product());
        assert_eq!(loaded, expected, "{name} differs from what was written");
    }
}

#[test]
fn llama_dir_maps_config_and_loads_every_tensor_exactly() {
    let dir = TinyDir::new("llama");
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let c = &checkpoint.config;
    assert_eq!(c.architecture, Architecture::new("llama"));
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (HIDDEN, INTERMEDIATE, LAYERS)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads),
        (HEADS, KV_HEADS)
    );
    assert_eq!((c.head_dim, c.vocab_size), (HEAD_DIM, VOCAB));
    assert_eq!(c.rope_theta, 12345.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert!(!c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
    assert_eq!(c.max_position_embeddings, 128);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(0), vec![1])
    );
    assert!(checkpoint.tokenizer.is_none());
    assert_loads_exactly(&checkpoint, "llama", false);
    assert_eq!(
        checkpoint.source_paths,
        vec![dir.file("config.json"), dir.file("model.safetensors")]
    );
    let provenance = checkpoint.provenance().unwrap();
    assert_eq!(provenance.len(), 2);
    assert_eq!(
        provenance[1].bytes,
        std::fs::metadata(dir.file("model.safetensors"))
            .unwrap()
            .len()
    );
}

#[test]
fn qwen2_has_qkv_bias_without_a_config_field() {
    let dir = TinyDir::new("qwen2");
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert_eq!(checkpoint.config.architecture, Architecture::new("qwen2"));
    assert!(checkpoint.config.attention_bias && !checkpoint.config.qk_norm);
    assert_loads_exactly(&checkpoint, "qwen2", false);
}

#[test]
fn qwen2_without_its_biases_is_missing_a_tensor() {
    // A llama-shaped tensor set under a qwen2 config: q_proj.bias is required.
    let dir = TinyDir::with(
        tiny_config("qwen2"),
        &tiny_tensors("llama", false, Dtype::F32),
    );
    let err = anemone_models::open_checkpoint(dir.path()).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::MissingTensor { name } if name.ends_with("q_proj.bias")),
        "{err}"
    );
}

#[test]
fn qwen3_transformers5_config_with_rope_parameters_and_explicit_head_dim() {
    // transformers 5 layout: rope_theta under rope_parameters, layer_types, explicit head_dim.
    let mut config = tiny_config("qwen3");
    let obj = config.as_object_mut().unwrap();
    obj.remove("rope_theta");
    obj.insert(
        "rope_parameters".into(),
        json!({"rope_theta": 1000000.0, "rope_type": "default"}),
    );
    obj.insert(
        "layer_types".into(),
        json!(["full_attention", "full_attention"]),
    );
    obj.insert("use_sliding_window".into(), json!(false));
    obj.insert("sliding_window".into(), json!(null));
    obj.insert("head_dim".into(), json!(HEAD_DIM));
    obj.insert("tie_word_embeddings".into(), json!(true));
    let dir = TinyDir::with(config, &tiny_tensors("qwen3", true, Dtype::F32));
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let c = &checkpoint.config;
    assert_eq!(c.architecture, Architecture::new("qwen3"));
    assert!(c.qk_norm && !c.attention_bias && c.tie_word_embeddings);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert!(checkpoint.tensors.info("lm_head.weight").is_none());
    assert_loads_exactly(&checkpoint, "qwen3", true);
}

#[test]
fn defaults_kv_heads_head_dim_and_rope_theta() {
    let mut config = tiny_config("llama");
    let obj = config.as_object_mut().unwrap();
    obj.remove("num_key_value_heads");
    obj.remove("rope_theta");
    obj.remove("bos_token_id");
    obj.remove("eos_token_id");
    // MHA: K/V projections are as wide as Q.
    let tensors: Vec<RawTensor> = tiny_tensor_shapes("llama", false)
        .into_iter()
        .map(|(name, mut shape)| {
            if name.contains("k_proj") || name.contains("v_proj") {
                shape[0] = HEADS * HEAD_DIM;
            }
            let bytes = encode(Dtype::F32, &values(0, shape.iter().product()));
            (name, Dtype::F32, shape, bytes)
        })
        .collect();
    let dir = TinyDir::with(config, &tensors);
    let c = anemone_models::open_checkpoint(dir.path()).unwrap().config;
    assert_eq!(c.num_key_value_heads, HEADS);
    assert_eq!(c.head_dim, HIDDEN / HEADS);
    assert_eq!(c.rope_theta, 10_000.0);
    assert_eq!(c.bos_token_id, None);
    assert!(c.eos_token_ids.is_empty());
}

#[test]
fn qwen3_without_head_dim_uses_transformers_default_of_128() {
    // Qwen3Config's head_dim defaults to 128, not hidden / heads (4 here): a config without it
    // describes 128-wide heads, which these tensors do not have.
    let mut config = tiny_config("qwen3");
    config.as_object_mut().unwrap().remove("head_dim");
    let dir = TinyDir::with(config, &tiny_tensors("qwen3", false, Dtype::F32));
    match anemone_models::open_checkpoint(dir.path()).unwrap_err() {
        CheckpointError::ShapeMismatch { name, expected, .. } => {
            assert_eq!(name, "model.layers.0.self_attn.q_proj.weight");
            assert_eq!(expected, vec![HEADS * 128, HIDDEN]);
        }
        other => panic!("expected ShapeMismatch, got {other}"),
    }
}

#[test]
fn f16_and_bf16_are_widened_exactly() {
    for dtype in [Dtype::F16, Dtype::BF16] {
        let dir = TinyDir::with(tiny_config("llama"), &tiny_tensors("llama", false, dtype));
        let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
        let info = checkpoint.tensors.info("model.norm.weight").unwrap();
        assert_eq!(info.dtype, dtype.to_string());
        assert_loads_exactly(&checkpoint, "llama", false);
    }
}

#[test]
fn bf16_widening_matches_the_bit_pattern() {
    // Values not representable in f16: bf16 keeps f32's exponent range.
    let data = [1.0e30_f32, -3.0e-30, 65504.0 * 4.0, 0.0];
    let raw = vec![(
        "x".to_string(),
        Dtype::BF16,
        vec![4],
        encode(Dtype::BF16, &data),
    )];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x.safetensors");
    write_safetensors(&path, &raw);
    let store = anemone_checkpoint::hf::SafetensorsStore::open_file(&path).unwrap();
    use anemone_checkpoint::TensorStore;
    let loaded = store.load_f32("x").unwrap();
    for (got, want) in loaded.iter().zip(data) {
        // bf16 is the top 16 bits of f32 (round to nearest even).
        let expected = half::bf16::from_f32(want).to_f32();
        assert_eq!(got.to_bits(), expected.to_bits());
        assert!((got - want).abs() <= want.abs() / 128.0);
    }
}

#[test]
fn unsupported_dtype_is_named_on_load() {
    let mut tensors = tiny_tensors("llama", false, Dtype::F32);
    tensors.push((
        "model.rotary_emb.inv_freq_ids".into(),
        Dtype::I32,
        vec![2],
        [7i32, 9].iter().flat_map(|v| v.to_le_bytes()).collect(),
    ));
    let dir = TinyDir::with(tiny_config("llama"), &tensors);
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    let err = checkpoint
        .load_f32("model.rotary_emb.inv_freq_ids")
        .unwrap_err();
    assert!(
        matches!(&err, CheckpointError::UnsupportedDtype { tensor, dtype, .. }
            if tensor == "model.rotary_emb.inv_freq_ids" && dtype == "I32"),
        "{err}"
    );
    let missing = checkpoint.load_f32("no.such.tensor").unwrap_err();
    assert!(matches!(missing, CheckpointError::MissingTensor { .. }));
}

#[test]
fn sharded_checkpoint_loads_from_every_shard() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_sharded(dir.path(), "qwen3", 3);
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert_loads_exactly(&checkpoint, "qwen3", false);
    let mut expected = vec![
        dir.path().join("config.json"),
        dir.path().join("model.safetensors.index.json"),
    ];
    expected.extend(shards.iter().map(|s| dir.path().join(s)));
    assert_eq!(checkpoint.source_paths, expected);
}

#[test]
fn generation_config_eos_list_wins_over_config_json() {
    let dir = TinyDir::new("llama");
    write_json(
        &dir.file("generation_config.json"),
        &json!({"bos_token_id": 0, "eos_token_id": [1, 7, 9], "do_sample": true}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert_eq!(checkpoint.config.eos_token_ids, vec![1, 7, 9]);
    assert!(checkpoint
        .source_paths
        .contains(&dir.file("generation_config.json")));

    write_json(
        &dir.file("generation_config.json"),
        &json!({"eos_token_id": 5}),
    );
    let checkpoint = anemone_models::open_checkpoint(dir.path()).unwrap();
    assert_eq!(checkpoint.config.eos_token_ids, vec![5]);
}

#[test]
fn config_eos_list_is_accepted() {
    let dir = TinyDir::new("llama");
    let mut config = tiny_config("llama");
    config["eos_token_id"] = json!([1, 2]);
    dir.write_config(&config);
    assert_eq!(
        anemone_models::open_checkpoint(dir.path())
            .unwrap()
            .config
            .eos_token_ids,
        vec![1, 2]
    );
}

#[test]
fn real_bert_directory_is_refused_as_a_decoder_and_its_safetensors_read() {
    // all-minilm-l6-v2 (fetched by scripts/fetch-models.sh): a real transformers-written file.
    let dir = models_dir().join("all-minilm-l6-v2");
    assert!(
        dir.join("model.safetensors").is_file(),
        "{} is missing: run scripts/fetch-models.sh",
        dir.display()
    );
    let err = anemone_models::open_checkpoint(&dir).unwrap_err();
    assert!(
        matches!(&err, CheckpointError::BadField { field, problem, .. }
            if field == "model_type" && problem.contains("\"bert\" is an encoder")),
        "{err}"
    );

    use anemone_checkpoint::TensorStore;
    let store = anemone_checkpoint::hf::SafetensorsStore::open_file(&dir.join("model.safetensors"))
        .unwrap();
    assert_eq!(store.names().len(), 104);
    let name = "embeddings.word_embeddings.weight";
    let info = store.info(name).unwrap();
    assert_eq!(
        (info.shape.clone(), info.dtype.as_str()),
        (vec![30522, 384], "F32")
    );
    let data = store.load_f32(name).unwrap();
    // Values read with the Python `safetensors` package (numpy) from the same file.
    let first: Vec<f64> = data[..4].iter().map(|&v| f64::from(v)).collect();
    let want: [f64; 4] = [
        -0.019989013671875,
        -0.0034027099609375,
        -0.014678955078125,
        0.0117034912109375,
    ];
    assert_eq!(first, want);
    let sum: f64 = data.iter().map(|&v| f64::from(v)).sum();
    assert!((sum - 138.05072214923618).abs() < 1e-6, "sum {sum}");
}
