//! Every transformers-made fixture under tests/fixtures/oracle opens, validates, and maps to the
//! config its config.json states (read here independently, as plain JSON).
//! `ANEMONE_ORACLE_DIR=/tmp/holdout` runs the same checks on a `make_fixtures.py --holdout` set.

mod hf_support;

use anemone_checkpoint::Architecture;
use hf_support::repo_root;
use serde_json::Value;
use std::path::Path;

fn read(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap()
}

fn uint(v: &Value, field: &str) -> usize {
    v[field]
        .as_u64()
        .unwrap_or_else(|| panic!("{field} in fixture")) as usize
}

/// Number of f32 elements an `.npy` file of shape `shape` holds, checked against its header.
fn npy_shape(path: &Path) -> Vec<usize> {
    let bytes = std::fs::read(path).unwrap();
    assert_eq!(&bytes[..6], b"\x93NUMPY", "{}", path.display());
    let header_len = u16::from_le_bytes([bytes[8], bytes[9]]) as usize;
    let header = std::str::from_utf8(&bytes[10..10 + header_len]).unwrap();
    assert!(header.contains("'descr': '<f4'"), "{header}");
    assert!(header.contains("'fortran_order': False"), "{header}");
    let start = header.find("'shape': (").unwrap() + "'shape': (".len();
    let end = start + header[start..].find(')').unwrap();
    let shape: Vec<usize> = header[start..end]
        .split(',')
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.trim().parse().unwrap())
        .collect();
    assert_eq!(
        bytes.len() - 10 - header_len,
        4 * shape.iter().product::<usize>(),
        "{}",
        path.display()
    );
    shape
}

#[test]
fn every_oracle_fixture_opens_and_matches_its_config_json() {
    let root = std::env::var_os("ANEMONE_ORACLE_DIR")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| repo_root().join("tests/fixtures/oracle"));
    let mut dirs: Vec<_> = std::fs::read_dir(&root)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    dirs.sort();
    let mut seen = std::collections::HashSet::new();
    let mut sharded = 0;
    for dir in &dirs {
        let name = dir.file_name().unwrap().to_string_lossy().to_string();
        let mut json = read(&dir.join("config.json"));
        if json["model_type"] == "gemma3" {
            // a multimodal Gemma 3: its text decoder's config (the top level ties the head)
            let tie = json["tie_word_embeddings"].clone();
            json = json["text_config"].clone();
            json["tie_word_embeddings"] = tie;
        }
        let checkpoint =
            anemone_models::open_checkpoint(dir).unwrap_or_else(|e| panic!("{name}: {e}"));
        anemone_models::validate_checkpoint(&checkpoint).unwrap();
        let c = &checkpoint.config;
        seen.insert(c.architecture.clone());
        if dir.join("model.safetensors.index.json").is_file() {
            sharded += 1;
            let shards = checkpoint
                .source_paths
                .iter()
                .filter(|p| p.extension().is_some_and(|e| e == "safetensors"))
                .count();
            assert!(shards > 1, "{name}: sharded fixture read {shards} shard(s)");
        }

        let model_type = json["model_type"].as_str().unwrap();
        let arch = Architecture::new(
            anemone_models::families::by_hf_model_type(model_type)
                .unwrap()
                .name(),
        );
        let gemma = arch == Architecture::new("gemma3");
        assert_eq!(c.architecture, arch, "{name}");
        assert_eq!(c.hidden_size, uint(&json, "hidden_size"), "{name}");
        assert_eq!(
            c.intermediate_size,
            uint(&json, "intermediate_size"),
            "{name}"
        );
        assert_eq!(
            c.num_hidden_layers,
            uint(&json, "num_hidden_layers"),
            "{name}"
        );
        assert_eq!(
            c.num_attention_heads,
            uint(&json, "num_attention_heads"),
            "{name}"
        );
        assert_eq!(
            c.num_key_value_heads,
            uint(&json, "num_key_value_heads"),
            "{name}"
        );
        assert_eq!(c.head_dim, uint(&json, "head_dim"), "{name}");
        assert_eq!(c.vocab_size, uint(&json, "vocab_size"), "{name}");
        assert_eq!(
            c.max_position_embeddings,
            uint(&json, "max_position_embeddings"),
            "{name}"
        );
        // Gemma: per layer type; the global layers' base is the config's
        let rope = if gemma {
            &json["rope_parameters"]["full_attention"]
        } else {
            &json["rope_parameters"]
        };
        assert_eq!(Some(c.rope_theta), rope["rope_theta"].as_f64(), "{name}");
        if let Some(g) = &c.gemma {
            assert_eq!(
                Some(g.rope_local_theta),
                json["rope_parameters"]["sliding_attention"]["rope_theta"].as_f64(),
                "{name}"
            );
            assert_eq!(
                Some(g.sliding_window as u64),
                json["sliding_window"].as_u64(),
                "{name}"
            );
            let sliding: Vec<bool> = json["layer_types"]
                .as_array()
                .unwrap()
                .iter()
                .map(|t| t.as_str() == Some("sliding_attention"))
                .collect();
            assert_eq!(g.sliding_layers, sliding, "{name}");
        }
        assert_eq!(
            Some(c.rms_norm_eps),
            json["rms_norm_eps"].as_f64(),
            "{name}"
        );
        assert_eq!(
            Some(c.tie_word_embeddings),
            json["tie_word_embeddings"].as_bool(),
            "{name}"
        );
        let bias_field = json["attention_bias"].as_bool() == Some(true);
        assert_eq!(
            c.attention_bias,
            arch == Architecture::new("qwen2") || bias_field,
            "{name}"
        );
        assert_eq!(c.o_proj_bias, bias_field, "{name}");
        assert_eq!(
            c.qk_norm,
            arch == Architecture::new("qwen3") || gemma,
            "{name}"
        );
        assert_eq!(
            c.bos_token_id,
            Some(uint(&json, "bos_token_id") as u32),
            "{name}"
        );
        let generation = read(&dir.join("generation_config.json"));
        let eos: Vec<u32> = match &generation["eos_token_id"] {
            Value::Array(ids) => ids.iter().map(|v| v.as_u64().unwrap() as u32).collect(),
            v => vec![v.as_u64().unwrap() as u32],
        };
        assert_eq!(c.eos_token_ids, eos, "{name}");
        assert_eq!(
            checkpoint.tensors.info("lm_head.weight").is_some(),
            !c.tie_word_embeddings,
            "{name}"
        );

        // Every tensor loads, finite, with the shape the config implies.
        for (tensor, shape) in anemone_models::families::expected_tensors(c).unwrap() {
            let data = checkpoint.load_f32(&tensor).unwrap();
            assert_eq!(
                data.len(),
                shape.iter().product::<usize>(),
                "{name}: {tensor}"
            );
            assert!(data.iter().all(|v| v.is_finite()), "{name}: {tensor}");
        }

        // The oracle outputs agree with the config (the reference-forward tests rely on this).
        let oracle = read(&dir.join("oracle.json"));
        let prompt = oracle["prompt_ids"].as_array().unwrap();
        let greedy = oracle["greedy_ids"].as_array().unwrap();
        assert!(prompt
            .iter()
            .chain(greedy)
            .all(|id| (id.as_u64().unwrap() as usize) < c.vocab_size));
        assert_eq!(
            npy_shape(&dir.join("logits.npy")),
            vec![greedy.len(), c.vocab_size],
            "{name}"
        );
        assert_eq!(
            npy_shape(&dir.join("hidden_states.npy")),
            vec![c.num_hidden_layers + 1, prompt.len(), c.hidden_size],
            "{name}"
        );
    }
    assert!(
        dirs.len() >= 6,
        "expected at least 6 fixtures, found {}",
        dirs.len()
    );
    assert_eq!(
        seen.len(),
        anemone_models::families::FAMILIES.len(),
        "every architecture has fixtures: {seen:?}"
    );
    assert!(
        sharded >= 1,
        "at least one fixture is saved sharded by transformers"
    );
}
