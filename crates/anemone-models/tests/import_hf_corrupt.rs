//! Every broken Hugging Face directory gives a named error, never a panic: bad configs, corrupt
//! or truncated safetensors, broken shard indexes, tensors that disagree with the config.

mod hf_support;

use anemone_checkpoint::CheckpointError;
use hf_support::*;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::path::Path;

fn open_err(path: &Path) -> CheckpointError {
    match anemone_models::open_checkpoint(path) {
        Ok(c) => panic!("expected an error, opened {c:?}"),
        Err(e) => e,
    }
}

/// Opens the tiny llama dir after `edit` changed its config.json.
fn config_err(edit: impl FnOnce(&mut serde_json::Map<String, Value>)) -> CheckpointError {
    let dir = TinyDir::new("llama");
    let mut config = tiny_config("llama");
    edit(config.as_object_mut().unwrap());
    dir.write_config(&config);
    open_err(dir.path())
}

fn assert_bad_field(err: &CheckpointError, want_field: &str) {
    match err {
        CheckpointError::BadField { path, field, .. } => {
            assert_eq!(field, want_field, "{err}");
            assert!(path.ends_with("config.json"), "{err}");
        }
        other => panic!("expected BadField({want_field}), got {other}"),
    }
}

fn assert_unsupported(err: &CheckpointError, field: &str) {
    match err {
        CheckpointError::Unsupported { path, what } => {
            assert!(what.contains(&format!("`{field}`")), "{err}");
            assert!(path.ends_with("config.json"), "{err}");
        }
        other => panic!("expected Unsupported({field}), got {other}"),
    }
}

#[test]
fn unknown_model_type_is_named() {
    let err = config_err(|c| {
        c.insert("model_type".into(), json!("gpt_neox"));
    });
    assert!(
        matches!(&err, CheckpointError::UnknownArchitecture { arch, .. } if arch == "gpt_neox"),
        "{err}"
    );
}

#[test]
fn missing_and_ill_typed_fields_name_file_and_field() {
    for field in [
        "model_type",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "vocab_size",
        "max_position_embeddings",
    ] {
        let err = config_err(|c| {
            c.remove(field);
        });
        assert_bad_field(&err, field);
    }
    let cases: &[(&str, Value)] = &[
        ("hidden_size", json!("16")),
        ("hidden_size", json!(-16)),
        ("hidden_size", json!(16.5)),
        ("hidden_size", json!(0)),
        ("num_key_value_heads", json!(3)), // does not divide 4 heads
        ("num_key_value_heads", json!(0)),
        ("head_dim", json!(5)), // odd
        ("rms_norm_eps", json!("1e-5")),
        ("rms_norm_eps", json!(0.0)),
        ("rope_theta", json!(-1.0)),
        ("tie_word_embeddings", json!("false")),
        ("eos_token_id", json!("</s>")),
        ("eos_token_id", json!([1, "x"])),
        ("bos_token_id", json!(5_000_000_000u64)),
        ("layer_types", json!("full_attention")),
    ];
    for (field, value) in cases {
        let err = config_err(|c| {
            c.insert(field.to_string(), value.clone());
        });
        assert_bad_field(&err, field);
    }
    let err = config_err(|c| {
        c.insert("rope_parameters".into(), json!({"rope_theta": "big"}));
    });
    assert_bad_field(&err, "rope_parameters.rope_theta");
}

#[test]
fn features_we_do_not_implement_are_refused_by_field() {
    let cases: &[(&str, Value, &str)] = &[
        (
            "rope_scaling",
            json!({"rope_type": "llama3", "factor": 8.0}),
            "rope_scaling.rope_type",
        ),
        (
            "rope_scaling",
            json!({"type": "linear", "factor": 2.0}),
            "rope_scaling.rope_type",
        ),
        ("rope_scaling", json!({"factor": 2.0}), "rope_scaling"),
        (
            "rope_parameters",
            json!({"rope_type": "yarn", "rope_theta": 10000.0}),
            "rope_parameters.rope_type",
        ),
        ("use_sliding_window", json!(true), "use_sliding_window"),
        (
            "layer_types",
            json!(["full_attention", "sliding_attention"]),
            "layer_types",
        ),
        ("mlp_bias", json!(true), "mlp_bias"),
        ("hidden_act", json!("gelu"), "hidden_act"),
        ("partial_rotary_factor", json!(0.5), "partial_rotary_factor"),
        (
            "rope_parameters",
            json!({"rope_type": "default", "partial_rotary_factor": 0.25}),
            "rope_parameters.partial_rotary_factor",
        ),
        ("rotary_dim", json!(2), "rotary_dim"),
        (
            "final_logit_softcapping",
            json!(30.0),
            "final_logit_softcapping",
        ),
        (
            "attn_logit_softcapping",
            json!(50.0),
            "attn_logit_softcapping",
        ),
        ("residual_multiplier", json!(0.22), "residual_multiplier"),
        ("logits_scaling", json!(8.0), "logits_scaling"),
        ("mrope_section", json!([16, 24, 24]), "mrope_section"),
    ];
    for (field, value, named) in cases {
        let err = config_err(|c| {
            c.insert(field.to_string(), value.clone());
        });
        assert_unsupported(&err, named);
    }
    // Explicitly disabled features and the default rope type are fine.
    let dir = TinyDir::new("llama");
    let mut config = tiny_config("llama");
    let c = config.as_object_mut().unwrap();
    c.insert("rope_scaling".into(), json!(null));
    c.insert("attention_bias".into(), json!(false));
    c.insert("mlp_bias".into(), json!(false));
    c.insert("use_sliding_window".into(), json!(false));
    c.insert("sliding_window".into(), json!(4096));
    c.insert("rope_parameters".into(), json!({"rope_type": "default"}));
    c.insert("partial_rotary_factor".into(), json!(1.0));
    c.insert("final_logit_softcapping".into(), json!(null));
    c.insert("embedding_multiplier".into(), json!(1.0));
    dir.write_config(&config);
    anemone_models::open_checkpoint(dir.path()).unwrap();
}

#[test]
fn missing_files_and_bad_json_are_named() {
    let dir = TinyDir::new("llama");
    std::fs::remove_file(dir.file("model.safetensors")).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::MissingFile { what, .. } if what.contains("model.safetensors")),
        "{err}"
    );

    std::fs::remove_file(dir.file("config.json")).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::MissingFile { what, .. } if what == "config.json"),
        "{err}"
    );

    let dir = TinyDir::new("llama");
    std::fs::write(dir.file("config.json"), "{\"model_type\": \"llama\",").unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::Json { path, .. } if path.ends_with("config.json")),
        "{err}"
    );

    let dir = TinyDir::new("llama");
    std::fs::write(dir.file("generation_config.json"), "[1,").unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::Json { path, .. } if path.ends_with("generation_config.json")),
        "{err}"
    );

    let err = open_err(&dir.file("no-such-dir"));
    assert!(matches!(err, CheckpointError::NotFound { .. }), "{err}");
}

fn assert_corrupt(err: &CheckpointError, file: &str, needle: &str) {
    match err {
        CheckpointError::Corrupt { path, problem, .. } => {
            assert!(path.ends_with(file), "{err}");
            assert!(
                problem.to_lowercase().contains(needle),
                "`{needle}` not in: {err}"
            );
        }
        other => panic!("expected Corrupt({file}), got {other}"),
    }
}

/// The tiny llama's model.safetensors bytes and the length of its JSON header.
fn valid_file() -> (TinyDir, Vec<u8>, usize) {
    let dir = TinyDir::new("llama");
    let bytes = std::fs::read(dir.file("model.safetensors")).unwrap();
    let n = u64::from_le_bytes(bytes[..8].try_into().unwrap()) as usize;
    (dir, bytes, n)
}

/// Rewrites model.safetensors with `header` (padded to 8 bytes) in front of the original data.
fn with_header(dir: &TinyDir, header: &str, data: &[u8]) {
    let mut header = header.as_bytes().to_vec();
    while !header.len().is_multiple_of(8) {
        header.push(b' ');
    }
    let mut out = (header.len() as u64).to_le_bytes().to_vec();
    out.extend(header);
    out.extend_from_slice(data);
    std::fs::write(dir.file("model.safetensors"), out).unwrap();
}

#[test]
fn corrupt_safetensors_headers_are_named() {
    let (dir, bytes, n) = valid_file();
    let header = std::str::from_utf8(&bytes[8..8 + n]).unwrap().to_string();
    let data = bytes[8 + n..].to_vec();
    let file = "model.safetensors";

    // Header length pointing past the end of the file.
    let mut lying = bytes.clone();
    lying[..8].copy_from_slice(&(bytes.len() as u64).to_le_bytes());
    std::fs::write(dir.file(file), &lying).unwrap();
    assert_corrupt(&open_err(dir.path()), file, "header");

    // Absurd header length (would be a huge allocation if trusted).
    lying[..8].copy_from_slice(&u64::MAX.to_le_bytes());
    std::fs::write(dir.file(file), &lying).unwrap();
    assert_corrupt(&open_err(dir.path()), file, "header");

    // Empty file and a file shorter than the length prefix.
    std::fs::write(dir.file(file), b"").unwrap();
    assert_corrupt(&open_err(dir.path()), file, "header");
    std::fs::write(dir.file(file), b"\x10\x00\x00").unwrap();
    assert_corrupt(&open_err(dir.path()), file, "header");

    // Bad JSON header.
    with_header(&dir, "{\"a\": {\"dtype\": \"F32\", \"shape\": [1], ", &data);
    assert_corrupt(&open_err(dir.path()), file, "header");

    // Header that is not UTF-8.
    let mut not_utf8 = bytes.clone();
    not_utf8[8 + 2] = 0xff;
    std::fs::write(dir.file(file), &not_utf8).unwrap();
    assert_corrupt(&open_err(dir.path()), file, "header");

    // Offsets that run past the data section: grow the last tensor's end offset.
    let data_len = data.len();
    let grown = header.replace(&format!(",{data_len}]"), &format!(",{}]", data_len + 4096));
    assert_ne!(grown, header, "test must find the last end offset");
    with_header(&dir, &grown, &data);
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::Corrupt { .. }
    ));

    // A shape that disagrees with the byte range.
    let reshaped = header.replacen("\"shape\":[16]", "\"shape\":[17]", 1);
    assert_ne!(reshaped, header, "test must find a [16] shape");
    with_header(&dir, &reshaped, &data);
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::Corrupt { .. }
    ));
}

#[test]
fn truncated_safetensors_is_named() {
    let (dir, bytes, n) = valid_file();
    for cut in [1, 4, bytes.len() - 8 - n - 1] {
        std::fs::write(dir.file("model.safetensors"), &bytes[..bytes.len() - cut]).unwrap();
        let err = open_err(dir.path());
        assert!(
            matches!(err, CheckpointError::Corrupt { .. }),
            "cut {cut}: {err}"
        );
    }
    // Trailing garbage after the data section is also refused (the header would be lying).
    let mut longer = bytes.clone();
    longer.extend_from_slice(&[0; 16]);
    std::fs::write(dir.file("model.safetensors"), &longer).unwrap();
    assert!(matches!(
        open_err(dir.path()),
        CheckpointError::Corrupt { .. }
    ));
}

#[test]
fn random_corruption_never_panics() {
    // Deterministic xorshift: flip bytes in the header region, truncate at many lengths.
    let (dir, bytes, n) = valid_file();
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut errors = 0;
    for round in 0..400 {
        let mut mutated = bytes.clone();
        if round % 2 == 0 {
            for _ in 0..1 + next() % 4 {
                let at = (next() as usize) % (8 + n);
                mutated[at] = next() as u8;
            }
        } else {
            mutated.truncate((next() as usize) % bytes.len());
        }
        std::fs::write(dir.file("model.safetensors"), &mutated).unwrap();
        match anemone_models::open_checkpoint(dir.path()) {
            Ok(c) => {
                // A harmless mutation (e.g. inside a name's padding) must still load cleanly.
                for name in c.tensors.names() {
                    let _ = c.load_f32(&name);
                }
            }
            Err(_) => errors += 1,
        }
    }
    assert!(
        errors > 300,
        "most corruptions must be detected, only {errors} were"
    );
}

#[test]
fn index_naming_a_missing_shard_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_sharded(dir.path(), "llama", 2);
    std::fs::remove_file(dir.path().join(&shards[1])).unwrap();
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::MissingFile { path, what }
            if path.ends_with("model.safetensors.index.json") && what.contains(&shards[1])),
        "{err}"
    );
}

fn rewrite_index(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("model.safetensors.index.json");
    let mut index: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    edit(index["weight_map"].as_object_mut().unwrap());
    write_json(&path, &index);
}

#[test]
fn tensor_in_two_shards_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_sharded(dir.path(), "llama", 2);
    // Rewrite shard 2 with an extra copy of a tensor that shard 1 holds.
    let all = tiny_tensors("llama", false, Dtype::F32);
    let mut second: Vec<RawTensor> = all.iter().skip(1).step_by(2).cloned().collect();
    second.push(all[0].clone());
    write_safetensors(&dir.path().join(&shards[1]), &second);
    let err = open_err(dir.path());
    match &err {
        CheckpointError::DuplicateTensor {
            name,
            first,
            second,
        } => {
            assert_eq!(name, &all[0].0);
            assert!(
                first.ends_with(&shards[0]) && second.ends_with(&shards[1]),
                "{err}"
            );
        }
        other => panic!("expected DuplicateTensor, got {other}"),
    }
}

#[test]
fn index_disagreeing_with_shards_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_sharded(dir.path(), "llama", 2);
    let moved = tiny_tensors("llama", false, Dtype::F32)[0].0.clone();
    rewrite_index(dir.path(), |m| {
        m.insert(moved.clone(), json!(shards[1]));
    });
    let err = open_err(dir.path());
    assert_corrupt(&err, "model.safetensors.index.json", &moved);

    rewrite_index(dir.path(), |m| {
        m.insert(moved.clone(), json!(shards[0]));
        m.insert("model.ghost.weight".into(), json!(shards[0]));
    });
    assert_corrupt(
        &open_err(dir.path()),
        "model.safetensors.index.json",
        "model.ghost.weight",
    );
}

#[test]
fn malformed_index_is_named() {
    let dir = tempfile::tempdir().unwrap();
    write_sharded(dir.path(), "llama", 2);
    let bad_field = |err: CheckpointError| match err {
        CheckpointError::BadField { field, path, .. } => {
            assert_eq!(field, "weight_map");
            assert!(path.ends_with("model.safetensors.index.json"));
        }
        other => panic!("expected BadField(weight_map), got {other}"),
    };
    for shard in [
        json!("../model-00001-of-00002.safetensors"),
        json!("/etc/passwd"),
        json!(3),
    ] {
        rewrite_index(dir.path(), |m| {
            m.insert("model.norm.weight".into(), shard.clone());
        });
        bad_field(open_err(dir.path()));
    }
    write_json(
        &dir.path().join("model.safetensors.index.json"),
        &json!({"weight_map": {}}),
    );
    bad_field(open_err(dir.path()));
    write_json(
        &dir.path().join("model.safetensors.index.json"),
        &json!({"metadata": {}}),
    );
    bad_field(open_err(dir.path()));
    std::fs::write(dir.path().join("model.safetensors.index.json"), "{").unwrap();
    assert!(matches!(open_err(dir.path()), CheckpointError::Json { .. }));
}

#[test]
fn tensors_disagreeing_with_config_are_named() {
    let mut config = tiny_config("llama");
    config["intermediate_size"] = json!(INTERMEDIATE + 8);
    let dir = TinyDir::with(config, &tiny_tensors("llama", false, Dtype::F32));
    match open_err(dir.path()) {
        CheckpointError::ShapeMismatch {
            name,
            expected,
            found,
        } => {
            assert_eq!(name, "model.layers.0.mlp.gate_proj.weight");
            assert_eq!(expected, vec![INTERMEDIATE + 8, HIDDEN]);
            assert_eq!(found, vec![INTERMEDIATE, HIDDEN]);
        }
        other => panic!("expected ShapeMismatch, got {other}"),
    }

    let mut config = tiny_config("llama");
    config["num_hidden_layers"] = json!(LAYERS + 1);
    let dir = TinyDir::with(config, &tiny_tensors("llama", false, Dtype::F32));
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::MissingTensor { name } if name.starts_with(&format!("model.layers.{LAYERS}."))),
        "{err}"
    );

    // Untied config, but the file has no lm_head.
    let dir = TinyDir::with(
        tiny_config("llama"),
        &tiny_tensors("llama", true, Dtype::F32),
    );
    let err = open_err(dir.path());
    assert!(
        matches!(&err, CheckpointError::MissingTensor { name } if name == "lm_head.weight"),
        "{err}"
    );
}
