//! Golden MIL text and weight.bin bytes of one small decoder chunk (Qwen2-style biases and
//! Qwen3-style QK-norm together, GQA 2:1, two layers, unified state). Update with
//! `ANEMONE_BLESS=1 cargo test -p anemone-models --test convert_golden`.

use std::path::Path;

use anemone_checkpoint::{Architecture, Checkpoint, DecoderConfig, MemoryStore};
use anemone_models::ane::{
    build_chunk_program, ChunkOptions, LayerWeights, Precision, Uncompressed,
};

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) - 0.5
        })
        .collect()
}

fn tiny_checkpoint() -> Checkpoint {
    let config = DecoderConfig {
        architecture: Architecture::new("qwen3"),
        hidden_size: 16,
        intermediate_size: 24,
        num_hidden_layers: 2,
        num_attention_heads: 4,
        num_key_value_heads: 2,
        head_dim: 8,
        vocab_size: 40,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        attention_bias: true,
        o_proj_bias: false,
        qk_norm: true,
        max_position_embeddings: 128,
        partial_rotary_dim: None,
        long_rope: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: None,
        attention_window: None,
    };
    let mut store = MemoryStore::new();
    for (i, (name, shape)) in anemone_models::families::expected_tensors(&config)
        .unwrap()
        .into_iter()
        .enumerate()
    {
        let n = shape.iter().product();
        store.insert(name, shape, values(i as u64 + 1, n));
    }
    Checkpoint {
        config,
        tensors: Box::new(store),
        tokenizer: None,
        source_paths: vec![],
        lora: None,
    }
}

fn check_golden(name: &str, bytes: &[u8]) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(name);
    anemone_testkit::assert_golden(&path, bytes);
}

#[test]
fn decoder_chunk_mil_text_and_weights_are_golden() {
    let ckpt = tiny_checkpoint();
    let options = ChunkOptions {
        context: 32,
        prefill_len: 4,
        ..ChunkOptions::default()
    };
    let layers: Vec<LayerWeights> = (0..2)
        .map(|i| LayerWeights::load(&ckpt, i, Precision::Fp16, &Uncompressed).unwrap())
        .collect();
    let program = build_chunk_program(&ckpt.config, &options, &layers).unwrap();
    check_golden(
        "decoder_chunk.mil",
        anemone_mil::print_program(&program).as_bytes(),
    );

    let dir = tempfile::tempdir().unwrap();
    let pkg = dir.path().join("chunk.mlpackage");
    anemone_mil::write_package(&program, &pkg, &Default::default()).unwrap();
    let weights = std::fs::read(pkg.join("Data/com.apple.CoreML/weights/weight.bin")).unwrap();
    check_golden("decoder_chunk.weight.bin", &weights);
}
