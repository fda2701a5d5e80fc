//! Gemma 3 270M (Q4_K_M GGUF, `scripts/fetch-models.sh --only gemma3`) against llama.cpp, GGUF's
//! reference implementation: the SentencePiece tokenizer's ids, the config read from the
//! metadata, and the fp32 reference's greedy choices step by step along llama.cpp's greedy
//! continuations (tools/oracle/make_llamacpp_greedy_fixture.py). Skipped, saying so, when the
//! model is absent.

use std::path::PathBuf;

use anemone_models::reference::{LogitsFor, ReferenceModel, ReferenceOptions};
use anemone_testkit::{argmax, models_dir, real_fixture};
use serde_json::Value;

const MODEL: &str = "gemma-3-270m-q4_k_m.gguf";
/// llama.cpp multiplies quantized weights by 8-bit-quantized activations; our reference
/// dequantizes to f32. A step is compared where llama.cpp's top-1/top-2 margin exceeds this.
const MIN_MARGIN: f64 = 0.3;
/// The logits of llama.cpp's top 8 tokens, ours against theirs (logits reach ≈ 30).
const LOGIT_TOLERANCE: f64 = 1.0;

fn model() -> Option<PathBuf> {
    let path = models_dir().join(MODEL);
    if path.is_file() {
        Some(path)
    } else {
        eprintln!(
            "skipped: {} is missing (scripts/fetch-models.sh --only gemma3, or set ANEMONE_MODELS)",
            path.display()
        );
        None
    }
}

fn fixture(name: &str) -> Value {
    let path = real_fixture(name);
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap()
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|i| i.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn spm_tokenizer_ids_equal_llama_cpp() {
    let Some(path) = model() else { return };
    let ckpt = anemone_models::open_checkpoint(&path).unwrap();
    let bundle = ckpt.tokenizer.expect("the GGUF carries a tokenizer");
    assert!(bundle.add_bos);
    let expected = fixture("gemma3_spm_tokenizer.json");
    let mut failures = Vec::new();
    for case in expected["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let want = ids(&case["ids"]);
        let got = bundle
            .tokenizer
            .encode(text, true)
            .unwrap()
            .get_ids()
            .to_vec();
        if got != want {
            failures.push(format!("{text:?}: ours {got:?}, llama.cpp {want:?}"));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

#[test]
fn config_is_read_from_the_metadata() {
    let Some(path) = model() else { return };
    let c = anemone_models::open_checkpoint(&path).unwrap().config;
    assert_eq!(c.architecture.name(), "gemma3");
    assert_eq!(
        (c.hidden_size, c.num_hidden_layers, c.num_attention_heads),
        (640, 18, 4)
    );
    assert_eq!(
        (c.num_key_value_heads, c.head_dim, c.vocab_size),
        (1, 256, 262_144)
    );
    assert!(c.tie_word_embeddings && c.qk_norm);
    let g = c.gemma.as_ref().unwrap();
    assert_eq!(g.sliding_window, 512);
    let global: Vec<usize> = (0..18).filter(|&i| !g.sliding_layers[i]).collect();
    assert_eq!(global, vec![5, 11, 17]);
    assert_eq!((c.rope_theta, g.rope_local_theta), (1e6, 1e4));
    assert_eq!(c.embedding_scale(), (640f64).sqrt() as f32);
}

#[test]
fn reference_follows_llama_cpp_greedy_continuations() {
    let Some(path) = model() else { return };
    let ckpt = anemone_models::open_checkpoint(&path).unwrap();
    let mut model = ReferenceModel::load(
        &ckpt,
        &ReferenceOptions {
            threads: None,
            context_len: Some(256),
            huge_pages: false,
        },
    )
    .unwrap();
    let expected = fixture("gemma3-270m.llamacpp.json");
    let (mut compared, mut skipped, mut worst) = (0, 0, 0f64);
    for case in expected["cases"].as_array().unwrap() {
        let prompt = ids(&case["prompt_ids"]);
        let greedy = ids(&case["greedy_ids"]);
        model.reset();
        let mut logits = model.forward(&prompt, LogitsFor::LastPosition).unwrap();
        for (step, (s, &want)) in case["steps"]
            .as_array()
            .unwrap()
            .iter()
            .zip(&greedy)
            .enumerate()
        {
            let top: Vec<(usize, f64)> = s["top"]
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap() as usize, p[1].as_f64().unwrap()))
                .collect();
            for &(id, theirs) in &top {
                let ours = logits[id] as f64;
                worst = worst.max((ours - theirs).abs());
                assert!(
                    (ours - theirs).abs() <= LOGIT_TOLERANCE,
                    "{:?} step {step}: logit of token {id}: ours {ours}, llama.cpp {theirs}",
                    case["prompt"]
                );
            }
            if top[0].1 - top[1].1 >= MIN_MARGIN {
                assert_eq!(
                    argmax(&logits),
                    want,
                    "{:?} step {step}: greedy token",
                    case["prompt"]
                );
                compared += 1;
            } else {
                skipped += 1;
            }
            // teacher-forced along llama.cpp's continuation
            logits = model.forward(&[want], LogitsFor::LastPosition).unwrap();
        }
    }
    eprintln!(
        "greedy steps compared: {compared}, skipped for a narrow margin: {skipped}; \
         worst top-8 logit difference {worst:.3}"
    );
    assert!(compared >= 30, "only {compared} steps had a wide margin");
}

/// Why Gemma needs the residual scale: its stream passes fp16's 65,504 on ordinary text; the
/// scale chosen at conversion brings every layer's stream under half of it.
#[test]
fn residual_stream_exceeds_fp16_and_the_scale_brings_it_back() {
    let Some(path) = model() else { return };
    let ckpt = anemone_models::open_checkpoint(&path).unwrap();
    let (scale, bound) = anemone_models::families::gemma3::fp16_residual_scale(&ckpt)
        .unwrap()
        .unwrap();
    assert_eq!(scale, 1.0 / 16.0, "bound {bound}");
    let mut model = ReferenceModel::load(
        &ckpt,
        &ReferenceOptions {
            threads: None,
            context_len: Some(256),
            huge_pages: false,
        },
    )
    .unwrap();
    let case = &fixture("gemma3-270m.llamacpp.json")["cases"][0];
    let mut seq = ids(&case["prompt_ids"]);
    seq.extend(ids(&case["greedy_ids"]));
    let trace = model.forward_traced(&seq).unwrap();
    let per_layer: Vec<f32> = trace
        .hidden_states
        .iter()
        .map(|h| h.iter().fold(0f32, |m, v| m.max(v.abs())))
        .collect();
    let peak = per_layer.iter().copied().fold(0f32, f32::max) as f64;
    eprintln!("max |residual| per layer: {per_layer:?}");
    assert!(peak > 65_504.0, "peak {peak}");
    assert!(peak <= bound, "peak {peak} above the bound {bound}");
    assert!(peak * scale < 32_768.0, "scaled peak {}", peak * scale);
}
