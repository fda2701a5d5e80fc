//! Loading the reference model from an inconsistent checkpoint fails with an error naming the
//! tensor or config field, never a panic.

use anemone_checkpoint::{Architecture, Checkpoint, DecoderConfig, MemoryStore};
use anemone_models::reference::{ForwardError, ReferenceModel, ReferenceOptions};

fn config() -> DecoderConfig {
    DecoderConfig {
        architecture: Architecture::new("llama"),
        hidden_size: 8,
        intermediate_size: 12,
        num_hidden_layers: 1,
        num_attention_heads: 2,
        num_key_value_heads: 1,
        head_dim: 4,
        vocab_size: 10,
        rope_theta: 10000.0,
        rms_norm_eps: 1e-6,
        tie_word_embeddings: true,
        attention_bias: false,
        o_proj_bias: false,
        qk_norm: false,
        max_position_embeddings: 32,
        partial_rotary_dim: None,
        long_rope: None,
        bos_token_id: None,
        eos_token_ids: vec![],
        gemma: None,
        attention_window: None,
    }
}

fn checkpoint(
    config: DecoderConfig,
    skip: &str,
    reshape: Option<(&str, Vec<usize>)>,
) -> Checkpoint {
    let mut store = MemoryStore::new();
    for (name, mut shape) in anemone_models::families::expected_tensors(&config).unwrap() {
        if name == skip {
            continue;
        }
        if let Some((target, new_shape)) = &reshape {
            if name == *target {
                shape = new_shape.clone();
            }
        }
        let n: usize = shape.iter().product();
        store.insert(name, shape, (0..n).map(|i| (i % 5) as f32 * 0.1).collect());
    }
    Checkpoint {
        config,
        tensors: Box::new(store),
        tokenizer: None,
        source_paths: vec![],
        lora: None,
    }
}

fn load(checkpoint: &Checkpoint) -> Result<ReferenceModel, ForwardError> {
    ReferenceModel::load(checkpoint, &ReferenceOptions::default())
}

#[test]
fn a_complete_checkpoint_loads_and_runs() {
    let mut model = load(&checkpoint(config(), "", None)).unwrap();
    let logits = model
        .forward(
            &[1, 2, 3],
            anemone_models::reference::LogitsFor::LastPosition,
        )
        .unwrap();
    assert_eq!(logits.len(), 10);
    assert!(logits.iter().all(|v| v.is_finite()));
}

#[test]
fn wrong_shape_names_the_tensor() {
    let name = "model.layers.0.self_attn.k_proj.weight";
    let err = load(&checkpoint(config(), "", Some((name, vec![8, 8])))).unwrap_err();
    assert!(
        matches!(&err, ForwardError::TensorShape { tensor, expected, found }
            if tensor == name && expected == &vec![4, 8] && found == &vec![8, 8]),
        "{err}"
    );
    assert!(err.to_string().contains(name));
}

#[test]
fn missing_tensor_names_the_tensor() {
    let name = "model.layers.0.mlp.down_proj.weight";
    let err = load(&checkpoint(config(), name, None)).unwrap_err();
    assert!(err.to_string().contains(name), "{err}");
}

#[test]
fn inconsistent_configs_are_rejected() {
    let mut c = config();
    c.num_key_value_heads = 3;
    let err = load(&checkpoint(c, "", None)).unwrap_err();
    assert!(matches!(err, ForwardError::Config { .. }), "{err}");
    let mut c = config();
    c.head_dim = 3;
    assert!(matches!(
        load(&checkpoint(c, "", None)),
        Err(ForwardError::Config { .. })
    ));
    let mut c = config();
    c.rope_theta = f64::NAN;
    assert!(matches!(
        load(&checkpoint(c, "", None)),
        Err(ForwardError::Config { .. })
    ));
}
