//! Tiny synthetic GGUF decoders written by the test writer: config mapping, Hugging Face names
//! and shapes, q/k row un-permutation, and the errors a checkpoint we cannot run must give.

mod gguf_support;

use anemone_checkpoint::{Architecture, Checkpoint, CheckpointError};
use gguf_support::*;

fn open(w: &GgufWriter) -> Result<Checkpoint, CheckpointError> {
    let (bytes, _) = w.write();
    let path = write_temp(&bytes);
    anemone_models::open_checkpoint(&path)
}

#[test]
fn tiny_llama_config_names_and_shapes() {
    let (w, _, _) = tiny_llama();
    let ckpt = open(&w).unwrap();
    let c = &ckpt.config;
    assert_eq!(c.architecture, Architecture::new("llama"));
    assert_eq!(
        (
            c.hidden_size,
            c.intermediate_size,
            c.num_hidden_layers,
            c.vocab_size
        ),
        (HIDDEN, FFN, LAYERS, VOCAB)
    );
    assert_eq!(
        (c.num_attention_heads, c.num_key_value_heads, c.head_dim),
        (HEADS, KV_HEADS, HEAD_DIM)
    );
    assert_eq!((c.rope_theta, c.rms_norm_eps), (50000.0, 1e-5));
    assert_eq!(c.max_position_embeddings, 256);
    assert!(c.tie_word_embeddings && !c.attention_bias && !c.qk_norm);
    assert_eq!(
        (c.bos_token_id, c.eos_token_ids.clone()),
        (Some(1), vec![2])
    );
    assert!(ckpt.tokenizer.is_none());
    let expected: Vec<String> = anemone_models::families::expected_tensors(c)
        .unwrap()
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    let mut expected_sorted = expected.clone();
    expected_sorted.sort();
    assert_eq!(ckpt.tensors.names(), expected_sorted);
    let info = ckpt
        .tensors
        .info("model.layers.1.mlp.down_proj.weight")
        .unwrap();
    assert_eq!(info.shape, vec![HIDDEN, FFN]);
    assert_eq!(
        ckpt.tensors
            .info("model.layers.0.self_attn.v_proj.weight")
            .unwrap()
            .dtype,
        "Q8_0"
    );
    // Unpermuted tensors come back exactly as written, whatever their on-disk type.
    assert_eq!(
        ckpt.load_f32("model.layers.0.self_attn.v_proj.weight")
            .unwrap(),
        values(12, KV_HEADS * HEAD_DIM * HIDDEN)
    );
    assert_eq!(
        ckpt.load_f32("model.layers.1.mlp.down_proj.weight")
            .unwrap(),
        values(26, HIDDEN * FFN)
    );
}

#[test]
fn llama_q_and_k_rows_come_back_in_hugging_face_order() {
    let (w, q_hf, k_hf) = tiny_llama();
    let ckpt = open(&w).unwrap();
    assert_eq!(
        ckpt.load_f32("model.layers.0.self_attn.q_proj.weight")
            .unwrap(),
        q_hf
    );
    assert_eq!(
        ckpt.load_f32("model.layers.0.self_attn.k_proj.weight")
            .unwrap(),
        k_hf
    );
}

#[test]
fn qwen3_is_not_permuted_and_reads_explicit_head_dim_and_qk_norm() {
    let (mut w, _, _) = tiny_llama();
    // Qwen3: head_dim 16 ≠ hidden/heads, q/k norms, an lm_head, no permutation.
    let head_dim = 16;
    let (q, kv) = (HEADS * head_dim, KV_HEADS * head_dim);
    let renamed: Vec<(String, Val)> = std::mem::take(&mut w.kvs)
        .into_iter()
        .map(|(k, v)| (k.replacen("llama.", "qwen3.", 1), v))
        .collect();
    w.kvs = renamed;
    w.kv("general.architecture", Val::Str("qwen3".into()))
        .kv("qwen3.attention.key_length", Val::U32(head_dim as u32))
        .kv("qwen3.attention.value_length", Val::U32(head_dim as u32));
    for l in 0..LAYERS {
        for (name, rows, cols) in [
            ("attn_q", q, HIDDEN),
            ("attn_k", kv, HIDDEN),
            ("attn_v", kv, HIDDEN),
            ("attn_output", HIDDEN, q),
        ] {
            let full = format!("blk.{l}.{name}.weight");
            w.remove_tensor(&full);
            w.tensor_f32(&full, &[rows, cols], &values(100 + l, rows * cols));
        }
        w.tensor_f32(
            &format!("blk.{l}.attn_q_norm.weight"),
            &[head_dim],
            &values(7, head_dim),
        )
        .tensor_f32(
            &format!("blk.{l}.attn_k_norm.weight"),
            &[head_dim],
            &values(8, head_dim),
        );
    }
    w.tensor_f32(
        "output.weight",
        &[VOCAB, HIDDEN],
        &values(9, VOCAB * HIDDEN),
    );
    let ckpt = open(&w).unwrap();
    let c = &ckpt.config;
    assert_eq!(c.architecture, Architecture::new("qwen3"));
    assert_eq!(c.head_dim, head_dim);
    assert!(c.qk_norm && !c.tie_word_embeddings);
    assert_eq!(
        ckpt.load_f32("model.layers.0.self_attn.q_proj.weight")
            .unwrap(),
        values(100, q * HIDDEN),
        "qwen3 rows are stored unpermuted"
    );
    assert_eq!(
        ckpt.load_f32("model.layers.1.self_attn.k_norm.weight")
            .unwrap(),
        values(8, head_dim)
    );
}

#[test]
fn version_2_files_open() {
    let (mut w, _, _) = tiny_llama();
    w.version = 2;
    open(&w).unwrap();
}

#[test]
fn unknown_architecture_is_named() {
    let (mut w, _, _) = tiny_llama();
    w.kv("general.architecture", Val::Str("mamba".into()));
    match open(&w) {
        Err(CheckpointError::UnknownArchitecture { arch, .. }) => assert_eq!(arch, "mamba"),
        other => panic!("expected UnknownArchitecture, got {other:?}"),
    }
}

#[test]
fn missing_required_key_is_named() {
    for key in [
        "llama.embedding_length",
        "llama.block_count",
        "llama.attention.layer_norm_rms_epsilon",
        "llama.context_length",
        "general.architecture",
    ] {
        let (mut w, _, _) = tiny_llama();
        w.remove_kv(key);
        match open(&w) {
            Err(CheckpointError::BadField { field, .. }) => assert_eq!(field, key),
            other => panic!("without {key}: expected BadField, got {other:?}"),
        }
    }
}

#[test]
fn wrongly_typed_key_is_named() {
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.block_count", Val::Str("two".into()));
    match open(&w) {
        Err(CheckpointError::BadField { field, problem, .. }) => {
            assert_eq!(field, "llama.block_count");
            assert!(problem.contains("string"), "{problem}");
        }
        other => panic!("expected BadField, got {other:?}"),
    }
}

#[test]
fn rope_scaling_is_refused() {
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.rope.scaling.type", Val::Str("yarn".into()))
        .kv("llama.rope.scaling.factor", Val::F32(4.0));
    match open(&w) {
        Err(CheckpointError::Unsupported { what, .. }) => assert!(what.contains("yarn"), "{what}"),
        other => panic!("expected Unsupported, got {other:?}"),
    }
    let (mut w, _, _) = tiny_llama();
    w.tensor_f32(
        "rope_freqs.weight",
        &[HEAD_DIM / 2],
        &values(3, HEAD_DIM / 2),
    );
    match open(&w) {
        Err(CheckpointError::Unsupported { what, .. }) => {
            assert!(what.contains("rope_freqs.weight"), "{what}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
    // An explicit "none" is fine.
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.rope.scaling.type", Val::Str("none".into()));
    open(&w).unwrap();
}

#[test]
fn partial_rotary_is_refused() {
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.rope.dimension_count", Val::U32(4));
    assert!(matches!(open(&w), Err(CheckpointError::Unsupported { .. })));
}

#[test]
fn unsupported_quantization_names_tensor_and_type() {
    let (w, _, _) = tiny_llama();
    let (mut bytes, layout) = w.write();
    let at = layout.tensor_type_at["blk.0.ffn_up.weight"];
    bytes[at..at + 4].copy_from_slice(&16u32.to_le_bytes()); // IQ2_XXS
    let path = write_temp(&bytes);
    match anemone_models::open_checkpoint(&path) {
        Err(CheckpointError::UnsupportedDtype { tensor, dtype, .. }) => {
            assert_eq!(
                (tensor.as_str(), dtype.as_str()),
                ("blk.0.ffn_up.weight", "IQ2_XXS")
            );
        }
        other => panic!("expected UnsupportedDtype, got {other:?}"),
    }
}

#[test]
fn unknown_tensor_is_refused_not_ignored() {
    let (mut w, _, _) = tiny_llama();
    w.tensor_f32(
        "blk.0.attn_qkv.weight",
        &[2, HIDDEN],
        &values(4, 2 * HIDDEN),
    );
    match open(&w) {
        Err(CheckpointError::Unsupported { what, .. }) => {
            assert!(what.contains("blk.0.attn_qkv.weight"), "{what}")
        }
        other => panic!("expected Unsupported, got {other:?}"),
    }
}

#[test]
fn missing_and_misshapen_tensors_are_named() {
    let (mut w, _, _) = tiny_llama();
    w.remove_tensor("blk.1.ffn_norm.weight");
    match open(&w) {
        Err(CheckpointError::MissingTensor { name }) => {
            assert_eq!(name, "model.layers.1.post_attention_layernorm.weight")
        }
        other => panic!("expected MissingTensor, got {other:?}"),
    }
    let (mut w, _, _) = tiny_llama();
    w.remove_tensor("blk.0.ffn_up.weight");
    w.tensor_f32(
        "blk.0.ffn_up.weight",
        &[FFN / 2, HIDDEN],
        &values(5, FFN / 2 * HIDDEN),
    );
    match open(&w) {
        Err(CheckpointError::ShapeMismatch {
            name,
            expected,
            found,
        }) => {
            assert_eq!(name, "model.layers.0.mlp.up_proj.weight");
            assert_eq!(
                (expected, found),
                (vec![FFN, HIDDEN], vec![FFN / 2, HIDDEN])
            );
        }
        other => panic!("expected ShapeMismatch, got {other:?}"),
    }
}

#[test]
fn lying_layer_and_head_counts_are_refused_cheaply() {
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.block_count", Val::U32(u32::MAX));
    match open(&w) {
        Err(CheckpointError::BadField { field, .. }) => assert_eq!(field, "llama.block_count"),
        other => panic!("expected BadField, got {other:?}"),
    }
    let (mut w, _, _) = tiny_llama();
    w.kv("llama.attention.head_count", Val::U32(u32::MAX))
        .kv("llama.attention.head_count_kv", Val::U32(1))
        .kv("llama.attention.key_length", Val::U32(u32::MAX));
    match open(&w) {
        Err(CheckpointError::BadField { field, .. }) => {
            assert_eq!(field, "llama.attention.head_count")
        }
        other => panic!("expected BadField, got {other:?}"),
    }
}

#[test]
fn llama_q_and_k_biases_are_unpermuted_too() {
    // llama.cpp's converter permutes q_proj/k_proj biases exactly like their weights.
    let (mut w, _, _) = tiny_llama();
    let (q, kv) = (HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM);
    let mut hf = Vec::new();
    for l in 0..LAYERS {
        let (qb, kb, vb) = (values(60 + l, q), values(70 + l, kv), values(80 + l, kv));
        w.tensor_f32(
            &format!("blk.{l}.attn_q.bias"),
            &[q],
            &llama_cpp_permute(&qb, q, 1, HEADS),
        )
        .tensor_f32(
            &format!("blk.{l}.attn_k.bias"),
            &[kv],
            &llama_cpp_permute(&kb, kv, 1, KV_HEADS),
        )
        .tensor_f32(&format!("blk.{l}.attn_v.bias"), &[kv], &vb);
        hf.push((qb, kb, vb));
    }
    let ckpt = open(&w).unwrap();
    assert!(ckpt.config.attention_bias);
    let (qb, kb, vb) = &hf[1];
    assert_eq!(
        &ckpt
            .load_f32("model.layers.1.self_attn.q_proj.bias")
            .unwrap(),
        qb
    );
    assert_eq!(
        &ckpt
            .load_f32("model.layers.1.self_attn.k_proj.bias")
            .unwrap(),
        kb
    );
    assert_eq!(
        &ckpt
            .load_f32("model.layers.1.self_attn.v_proj.bias")
            .unwrap(),
        vb
    );
}

/// Adds a byte-level BPE tokenizer: every byte spelled GPT-2's way, a few merges, specials.
fn with_tokenizer(w: &mut GgufWriter, pre: Option<&str>, add_bos: bool) -> Vec<String> {
    let spelling = anemone_checkpoint::gguf::tokenizer::byte_spelling();
    let mut tokens: Vec<String> = vec![
        "<|endoftext|>".into(),
        "<|im_start|>".into(),
        "<|im_end|>".into(),
        "<think>".into(),
    ];
    let mut types = vec![3, 3, 3, 4];
    tokens.extend(spelling.iter().map(|c| c.to_string()));
    types.extend(std::iter::repeat_n(1, 256));
    let merges = ["h e", "l l", "he ll", "Ġ w", "o r"];
    for m in merges {
        tokens.push(m.replace(' ', ""));
        types.push(1);
    }
    let n = tokens.len();
    w.kv("tokenizer.ggml.model", Val::Str("gpt2".into()))
        .kv("tokenizer.ggml.tokens", Val::StrArr(tokens.clone()))
        .kv("tokenizer.ggml.token_type", Val::I32Arr(types))
        .kv(
            "tokenizer.ggml.merges",
            Val::StrArr(merges.map(String::from).to_vec()),
        )
        .kv("tokenizer.ggml.bos_token_id", Val::U32(1))
        .kv("tokenizer.ggml.eos_token_id", Val::U32(2))
        .kv("tokenizer.ggml.add_bos_token", Val::Bool(add_bos))
        .kv("tokenizer.chat_template", Val::Str("{{ messages }}".into()))
        .remove_kv("llama.vocab_size");
    if let Some(pre) = pre {
        w.kv("tokenizer.ggml.pre", Val::Str(pre.into()));
    }
    w.remove_tensor("token_embd.weight");
    w.tensor_f32("token_embd.weight", &[n, HIDDEN], &values(1, n * HIDDEN));
    tokens
}

#[test]
fn synthetic_tokenizer_merges_specials_bos_and_round_trip() {
    let (mut w, _, _) = tiny_llama();
    let tokens = with_tokenizer(&mut w, Some("smollm"), true);
    let ckpt = open(&w).unwrap();
    assert_eq!(ckpt.config.vocab_size, tokens.len());
    assert_eq!(ckpt.config.eos_token_ids, vec![2, 0]);
    let bundle = ckpt.tokenizer.as_ref().unwrap();
    assert!(bundle.add_bos);
    assert_eq!(bundle.bos_token.as_deref(), Some("<|im_start|>"));
    assert_eq!(bundle.chat_template.as_deref(), Some("{{ messages }}"));
    let id = |t: &str| tokens.iter().position(|x| x == t).unwrap() as u32;
    let text = "hello world<|im_end|><think>12";
    let ids = bundle
        .tokenizer
        .encode(text, true)
        .unwrap()
        .get_ids()
        .to_vec();
    let expected: Vec<u32> = vec![
        1, // BOS, because add_bos_token
        id("hell"),
        id("o"),
        id("Ġw"),
        id("or"),
        id("l"),
        id("d"),
        2,
        3,
        id("1"),
        id("2"),
    ];
    assert_eq!(ids, expected);
    assert_eq!(bundle.tokenizer.decode(&ids[1..], false).unwrap(), text);
}

#[test]
fn unsupported_tokenizers_are_named() {
    let (mut w, _, _) = tiny_llama();
    with_tokenizer(&mut w, Some("chatglm-bpe"), false);
    match open(&w) {
        Err(CheckpointError::Tokenizer { problem }) => {
            assert!(problem.contains("chatglm-bpe"), "{problem}")
        }
        other => panic!("expected Tokenizer error, got {other:?}"),
    }
    let (mut w, _, _) = tiny_llama();
    with_tokenizer(&mut w, None, false);
    w.kv("tokenizer.ggml.model", Val::Str("rwkv".into()));
    match open(&w) {
        Err(CheckpointError::Tokenizer { problem }) => {
            assert!(problem.contains("`rwkv`"), "{problem}")
        }
        other => panic!("expected Tokenizer error, got {other:?}"),
    }
    // a SentencePiece vocabulary without its scores is named by the missing key
    let (mut w, _, _) = tiny_llama();
    with_tokenizer(&mut w, None, false);
    w.kv("tokenizer.ggml.model", Val::Str("llama".into()));
    let err = open(&w).unwrap_err().to_string();
    assert!(err.contains("tokenizer.ggml.scores"), "{err}");
}
