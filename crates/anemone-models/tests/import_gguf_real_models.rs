//! The two real GGUF models (fetched by `scripts/fetch-models.sh`): config, tensor shapes,
//! dequantized values against the gguf python package, tokenizer ids against transformers' GGUF
//! tokenizer conversion, and the time to load every tensor.

use anemone_checkpoint::{Architecture, Checkpoint};
use std::path::PathBuf;
use std::time::Instant;

const SMOLLM: &str = "smollm2-135m-instruct.Q4_1.gguf";
const QWEN: &str = "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf";

/// Our dequantizers do ggml's float operations in ggml's order; numpy's only differ by rounding.
const DEQUANT_TOL: f64 = 1e-6;
/// Whole-tensor sums accumulate in f64 on both sides, over different orders.
const SUM_REL_TOL: f64 = 1e-9;

fn model(file: &str) -> PathBuf {
    let dir = std::env::var_os("ANEMONE_MODELS")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../models"));
    let path = dir.join(file);
    assert!(
        path.is_file(),
        "{} is missing: run `scripts/fetch-models.sh` (or set ANEMONE_MODELS to the models directory)",
        path.display()
    );
    path
}

fn open(file: &str) -> Checkpoint {
    anemone_models::open_checkpoint(model(file)).unwrap_or_else(|e| panic!("opening {file}: {e}"))
}

#[test]
fn smollm2_config() {
    let ckpt = open(SMOLLM);
    let c = &ckpt.config;
    assert_eq!(c.architecture, Architecture::new("llama"));
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (576, 1536, 30)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (9, 3, 64)
    );
    assert_eq!(c.vocab_size, 49152);
    assert_eq!(c.rope_theta, 100000.0);
    assert_eq!(c.rms_norm_eps, 1e-5);
    assert_eq!(c.max_position_embeddings, 8192);
    assert!(c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
    assert_eq!(c.bos_token_id, Some(1));
    // EOS = <|im_end|> (2), then <|endoftext|> (0), which llama.cpp also stops on.
    assert_eq!(c.eos_token_ids, vec![2, 0]);
    anemone_models::validate_checkpoint(&ckpt).unwrap();
    assert_eq!(ckpt.tensors.names().len(), 272);
    assert!(ckpt.tensors.info("lm_head.weight").is_none());
    let tok = ckpt.tokenizer.as_ref().expect("tokenizer");
    assert_eq!(tok.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token.as_deref(), Some("<|im_end|>"));
    assert!(!tok.add_bos);
    assert!(tok
        .chat_template
        .as_deref()
        .unwrap()
        .contains("<|im_start|>"));
}

#[test]
fn qwen2_5_config() {
    let ckpt = open(QWEN);
    let c = &ckpt.config;
    assert_eq!(c.architecture, Architecture::new("qwen2"));
    assert_eq!(
        (c.hidden_size, c.intermediate_size, c.num_hidden_layers),
        (896, 4864, 24)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (14, 2, 64)
    );
    assert_eq!(c.vocab_size, 151936);
    assert_eq!(c.rope_theta, 1_000_000.0);
    assert_eq!(c.rms_norm_eps, 1e-6);
    assert_eq!(c.max_position_embeddings, 32768);
    assert!(!c.tie_word_embeddings && c.attention_bias && !c.qk_norm);
    assert_eq!(c.bos_token_id, Some(151643));
    // EOS = <|im_end|>, then <|endoftext|> (Qwen's generation_config.json lists both).
    assert_eq!(c.eos_token_ids, vec![151645, 151643]);
    anemone_models::validate_checkpoint(&ckpt).unwrap();
    assert_eq!(ckpt.tensors.names().len(), 291);
    let info = ckpt.tensors.info("lm_head.weight").unwrap();
    assert_eq!(
        (info.shape, info.dtype.as_str()),
        (vec![151936, 896], "Q8_0")
    );
    let info = ckpt
        .tensors
        .info("model.layers.0.self_attn.k_proj.bias")
        .unwrap();
    assert_eq!(info.shape, vec![128]);
}

#[test]
fn tensor_values_match_gguf_python() {
    let text = include_str!("../../../tests/fixtures/gguf/gguf_tensor_slices.json");
    let fixture: serde_json::Value = serde_json::from_str(text).unwrap();
    let mut dtypes = std::collections::BTreeSet::new();
    for (file, entries) in fixture.as_object().unwrap() {
        let ckpt = open(file);
        for e in entries.as_array().unwrap() {
            let name = e["name"].as_str().unwrap();
            let shape: Vec<usize> = e["shape"]
                .as_array()
                .unwrap()
                .iter()
                .map(|d| d.as_u64().unwrap() as usize)
                .collect();
            let info = ckpt.tensors.info(name).unwrap();
            assert_eq!(info.shape, shape, "{file} {name}: shape");
            assert_eq!(info.dtype, e["dtype"].as_str().unwrap(), "{file} {name}");
            dtypes.insert(info.dtype.clone());
            let data = ckpt.load_f32(name).unwrap();
            let cols = data.len() / shape[0];
            for (row, want) in e["rows"].as_object().unwrap() {
                let row: usize = row.parse().unwrap();
                for (i, w) in want.as_array().unwrap().iter().enumerate() {
                    let (got, w) = (data[row * cols + i] as f64, w.as_f64().unwrap());
                    assert!(
                        (got - w).abs() <= DEQUANT_TOL * w.abs().max(1.0),
                        "{file} {name}[{row}, {i}]: got {got}, gguf python {w}"
                    );
                }
            }
            let sum: f64 = data.iter().map(|&x| x as f64).sum();
            let abs_sum: f64 = data.iter().map(|&x| (x as f64).abs()).sum();
            for (what, got, want) in [("sum", sum, &e["sum"]), ("abs_sum", abs_sum, &e["abs_sum"])]
            {
                let want = want.as_f64().unwrap();
                assert!(
                    (got - want).abs() <= SUM_REL_TOL * want.abs().max(1.0),
                    "{file} {name}: {what} {got} vs gguf python {want}"
                );
            }
        }
    }
    for needed in ["Q4_1", "Q4_K", "Q6_K", "Q5_0", "Q8_0", "F32"] {
        assert!(dtypes.contains(needed), "fixture covers {needed}");
    }
}

#[test]
fn tokenizer_matches_transformers_gguf_conversion() {
    let text = include_str!("../../../tests/fixtures/gguf/gguf_tokenizer_ids.json");
    let fixture: serde_json::Value = serde_json::from_str(text).unwrap();
    for (file, cases) in fixture.as_object().unwrap() {
        let ckpt = open(file);
        let tok = &ckpt.tokenizer.as_ref().unwrap().tokenizer;
        for case in cases.as_array().unwrap() {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = tok.encode(text, true).unwrap().get_ids().to_vec();
            assert_eq!(got, want, "{file}: ids of {text:?}");
            let decoded = tok.decode(&got, false).unwrap();
            assert_eq!(decoded, text, "{file}: decode(encode({text:?}))");
        }
    }
}

/// Not a correctness check: prints how long opening and dequantizing every tensor takes.
#[test]
fn load_every_tensor_and_report_time() {
    for file in [SMOLLM, QWEN] {
        let started = Instant::now();
        let ckpt = open(file);
        let opened = started.elapsed();
        let mut elements = 0usize;
        for name in ckpt.tensors.names() {
            let info = ckpt.tensors.info(&name).unwrap();
            let data = ckpt.load_f32(&name).unwrap();
            assert_eq!(data.len(), info.numel(), "{name}");
            assert!(
                data.iter().all(|x| x.is_finite()),
                "{file} {name}: non-finite value"
            );
            elements += data.len();
        }
        eprintln!(
            "{file}: open {:.2?}, open + dequantize all {} tensors ({:.1}M elements) {:.2?}",
            opened,
            ckpt.tensors.names().len(),
            elements as f64 / 1e6,
            started.elapsed()
        );
    }
}
