//! Hand-built tiny Hugging Face directories for the `hf_*` tests: a config.json written as JSON
//! text and tensors written with the `safetensors` crate, each value a known function of its
//! tensor and position so loads can be checked exactly.

#![allow(dead_code)]

use safetensors::tensor::TensorView;
use safetensors::Dtype;
use serde_json::{json, Value};
use std::path::{Path, PathBuf};

/// Shape of a tiny model: 2 layers, hidden 16, 4 heads of 4, 2 KV heads, vocab 32.
pub const HIDDEN: usize = 16;
pub const INTERMEDIATE: usize = 24;
pub const LAYERS: usize = 2;
pub const HEADS: usize = 4;
pub const KV_HEADS: usize = 2;
pub const HEAD_DIM: usize = 4;
pub const VOCAB: usize = 32;

/// A config.json for `model_type` with the tiny shape (fields as transformers 4 writes them;
/// Qwen3 configs always carry `head_dim`).
pub fn tiny_config(model_type: &str) -> Value {
    let mut config = json!({
        "architectures": ["X"],
        "model_type": model_type,
        "hidden_size": HIDDEN,
        "intermediate_size": INTERMEDIATE,
        "num_hidden_layers": LAYERS,
        "num_attention_heads": HEADS,
        "num_key_value_heads": KV_HEADS,
        "vocab_size": VOCAB,
        "rope_theta": 12345.0,
        "rms_norm_eps": 1e-5,
        "tie_word_embeddings": false,
        "max_position_embeddings": 128,
        "hidden_act": "silu",
        "bos_token_id": 0,
        "eos_token_id": 1,
    });
    if model_type == "qwen3" {
        config["head_dim"] = json!(HEAD_DIM);
    }
    config
}

/// The tensors a tiny model of `model_type` has, written out independently of the crate's
/// `expected_tensors` (names and shapes as transformers saves them).
pub fn tiny_tensor_shapes(model_type: &str, tied: bool) -> Vec<(String, Vec<usize>)> {
    let (h, i, q, kv) = (HIDDEN, INTERMEDIATE, HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut out = vec![
        ("model.embed_tokens.weight".to_string(), vec![VOCAB, h]),
        ("model.norm.weight".to_string(), vec![h]),
    ];
    if !tied {
        out.push(("lm_head.weight".to_string(), vec![VOCAB, h]));
    }
    for l in 0..LAYERS {
        let p = |s: &str| format!("model.layers.{l}.{s}");
        out.push((p("input_layernorm.weight"), vec![h]));
        out.push((p("post_attention_layernorm.weight"), vec![h]));
        out.push((p("self_attn.q_proj.weight"), vec![q, h]));
        out.push((p("self_attn.k_proj.weight"), vec![kv, h]));
        out.push((p("self_attn.v_proj.weight"), vec![kv, h]));
        out.push((p("self_attn.o_proj.weight"), vec![h, q]));
        if model_type == "qwen2" {
            out.push((p("self_attn.q_proj.bias"), vec![q]));
            out.push((p("self_attn.k_proj.bias"), vec![kv]));
            out.push((p("self_attn.v_proj.bias"), vec![kv]));
        }
        if model_type == "qwen3" {
            out.push((p("self_attn.q_norm.weight"), vec![HEAD_DIM]));
            out.push((p("self_attn.k_norm.weight"), vec![HEAD_DIM]));
        }
        out.push((p("mlp.gate_proj.weight"), vec![i, h]));
        out.push((p("mlp.up_proj.weight"), vec![i, h]));
        out.push((p("mlp.down_proj.weight"), vec![h, i]));
    }
    out
}

/// The value stored at `index` of the tensor `tensor_number`: exactly representable in f16 and
/// bf16 (a multiple of 1/8 below 64), so every dtype round-trips exactly.
pub fn value(tensor_number: usize, index: usize) -> f32 {
    (((tensor_number * 7 + index * 3) % 256) as f32 - 128.0) / 8.0
}

pub fn values(tensor_number: usize, numel: usize) -> Vec<f32> {
    (0..numel).map(|i| value(tensor_number, i)).collect()
}

/// Encodes f32 values as little-endian `dtype` bytes (F32, F16 or BF16).
pub fn encode(dtype: Dtype, data: &[f32]) -> Vec<u8> {
    match dtype {
        Dtype::F32 => data.iter().flat_map(|v| v.to_le_bytes()).collect(),
        Dtype::F16 => data
            .iter()
            .flat_map(|v| half::f16::from_f32(*v).to_le_bytes())
            .collect(),
        Dtype::BF16 => data
            .iter()
            .flat_map(|v| half::bf16::from_f32(*v).to_le_bytes())
            .collect(),
        other => panic!("test helper cannot encode {other:?}"),
    }
}

/// One tensor to write: name, dtype, shape, raw bytes.
pub type RawTensor = (String, Dtype, Vec<usize>, Vec<u8>);

/// The tiny model's tensors, numbered in order, all in `dtype`.
pub fn tiny_tensors(model_type: &str, tied: bool, dtype: Dtype) -> Vec<RawTensor> {
    tiny_tensor_shapes(model_type, tied)
        .into_iter()
        .enumerate()
        .map(|(n, (name, shape))| {
            let data = values(n, shape.iter().product());
            (name, dtype, shape, encode(dtype, &data))
        })
        .collect()
}

/// Writes tensors to one safetensors file with the `safetensors` crate.
pub fn write_safetensors(path: &Path, tensors: &[RawTensor]) {
    let views: Vec<(String, TensorView)> = tensors
        .iter()
        .map(|(name, dtype, shape, bytes)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), bytes).expect("valid test tensor"),
            )
        })
        .collect();
    safetensors::serialize_to_file(views, None, path).expect("write safetensors");
}

pub fn write_json(path: &Path, value: &Value) {
    std::fs::write(path, serde_json::to_string_pretty(value).unwrap()).unwrap();
}

/// A complete tiny directory (config.json + model.safetensors) in a fresh temp dir.
pub struct TinyDir {
    pub dir: tempfile::TempDir,
}

impl TinyDir {
    pub fn new(model_type: &str) -> Self {
        Self::with(
            tiny_config(model_type),
            &tiny_tensors(model_type, false, Dtype::F32),
        )
    }

    pub fn with(config: Value, tensors: &[RawTensor]) -> Self {
        let dir = tempfile::tempdir().unwrap();
        write_json(&dir.path().join("config.json"), &config);
        write_safetensors(&dir.path().join("model.safetensors"), tensors);
        Self { dir }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn file(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    pub fn write_config(&self, config: &Value) {
        write_json(&self.file("config.json"), config);
    }
}

/// Writes the tiny model split over `shards` files plus an index, round-robin by tensor.
pub fn write_sharded(dir: &Path, model_type: &str, shards: usize) -> Vec<String> {
    let tensors = tiny_tensors(model_type, false, Dtype::F32);
    let names: Vec<String> = (1..=shards)
        .map(|i| format!("model-{i:05}-of-{shards:05}.safetensors"))
        .collect();
    let mut weight_map = serde_json::Map::new();
    for (s, shard_name) in names.iter().enumerate() {
        let part: Vec<RawTensor> = tensors
            .iter()
            .enumerate()
            .filter(|(n, _)| n % shards == s)
            .map(|(_, t)| t.clone())
            .collect();
        for t in &part {
            weight_map.insert(t.0.clone(), json!(shard_name));
        }
        write_safetensors(&dir.join(shard_name), &part);
    }
    write_json(&dir.join("config.json"), &tiny_config(model_type));
    write_json(
        &dir.join("model.safetensors.index.json"),
        &json!({"metadata": {"total_size": 0}, "weight_map": weight_map}),
    );
    names
}

/// Root of the repository (for committed fixtures).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Directory of the real models: `$ANEMONE_MODELS`, else `<repo>/models`.
pub fn models_dir() -> PathBuf {
    std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("models"))
}
