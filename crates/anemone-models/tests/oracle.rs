//! The reference forward against Hugging Face transformers on every random-init checkpoint in
//! tests/fixtures/oracle: same greedy ids, logits and per-layer residual stream within tolerance.

use anemone_backend::npy;
use anemone_models::reference::{ForwardError, LogitsFor, ReferenceModel, ReferenceOptions};
use anemone_testkit::{argmax, oracle_fixtures as fixtures, worst};
use std::path::Path;

/// fp32 against fp32 with different summation orders: logits (the bar) and hidden states.
const LOGITS_TOLERANCE: f32 = 1e-3;
const HIDDEN_TOLERANCE: f32 = 1e-3;

fn load(dir: &Path, context_len: Option<usize>) -> ReferenceModel {
    let checkpoint =
        anemone_models::open_checkpoint(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
    let options = ReferenceOptions {
        threads: Some(2),
        context_len,
        huge_pages: false,
    };
    ReferenceModel::load(&checkpoint, &options).unwrap()
}

#[test]
fn greedy_logits_and_hidden_states_match_transformers() {
    for f in fixtures() {
        let logits = npy::read_f32(&f.logits_path()).unwrap();
        let hidden = npy::read_f32(&f.hidden_states_path()).unwrap();
        let mut model = load(&f.dir, None);
        let vocab = model.config().vocab_size;
        let (layers, hidden_size) = (model.config().num_hidden_layers, model.config().hidden_size);
        assert_eq!(logits.shape, vec![f.greedy_ids.len(), vocab], "{}", f.name);
        assert_eq!(
            hidden.shape,
            vec![layers + 1, f.prompt_ids.len(), hidden_size],
            "{}",
            f.name
        );

        let trace = model.forward_traced(&f.prompt_ids).unwrap();
        let per_layer = f.prompt_ids.len() * hidden_size;
        for (layer, ours) in trace.hidden_states.iter().enumerate() {
            let want = &hidden.data[layer * per_layer..(layer + 1) * per_layer];
            let (i, g, w) = worst(ours, want);
            assert!(
                (g - w).abs() <= HIDDEN_TOLERANCE,
                "{}: hidden state {layer}, position {}, channel {}: ours {g}, transformers {w}",
                f.name,
                i / hidden_size,
                i % hidden_size
            );
        }

        let mut step_logits = trace.logits[(f.prompt_ids.len() - 1) * vocab..].to_vec();
        for (step, &want_id) in f.greedy_ids.iter().enumerate() {
            let want = &logits.data[step * vocab..(step + 1) * vocab];
            let (i, g, w) = worst(&step_logits, want);
            assert!(
                (g - w).abs() <= LOGITS_TOLERANCE,
                "{}: step {step}, token {i}: ours {g}, transformers {w}",
                f.name
            );
            assert_eq!(
                argmax(&step_logits),
                want_id,
                "{}: greedy step {step}",
                f.name
            );
            step_logits = model.forward(&[want_id], LogitsFor::LastPosition).unwrap();
        }
    }
}

#[test]
fn one_prefill_equals_prefill_then_decode() {
    for f in fixtures() {
        let mut model = load(&f.dir, None);
        let vocab = model.config().vocab_size;
        let sequence: Vec<u32> = f.prompt_ids.iter().chain(&f.greedy_ids).copied().collect();
        let all = model.forward(&sequence, LogitsFor::AllPositions).unwrap();
        assert_eq!(all.len(), sequence.len() * vocab);
        model.reset();
        assert_eq!(model.position(), 0);
        let split = f.prompt_ids.len();
        let first = model
            .forward(&sequence[..split], LogitsFor::LastPosition)
            .unwrap();
        let mut rows = vec![first];
        for &id in &sequence[split..] {
            rows.push(model.forward(&[id], LogitsFor::LastPosition).unwrap());
        }
        let config = model.config().clone();
        let mut fresh = load(&f.dir, None);
        for (k, row) in rows.iter().enumerate() {
            let position = split - 1 + k;
            // LongRoPE: a batched row uses the factors of the whole batch; a row before the
            // switch to the long ones equals the batched forward of its own prefix instead
            let prefix;
            let want = if config.rope_factors(position + 1) == config.rope_factors(sequence.len()) {
                &all[position * vocab..(position + 1) * vocab]
            } else {
                fresh.reset();
                prefix = fresh
                    .forward(&sequence[..=position], LogitsFor::LastPosition)
                    .unwrap();
                &prefix[..]
            };
            let (i, g, w) = worst(row, want);
            assert!(
                (g - w).abs() <= 1e-4,
                "{}: position {position}, token {i}: incremental {g}, batched {w}",
                f.name
            );
        }
        assert_eq!(model.position(), sequence.len());
    }
}

#[test]
fn context_overflow_and_bad_tokens_are_errors() {
    let f = &fixtures()[0];
    let n = f.prompt_ids.len();
    let mut model = load(&f.dir, Some(n + 1));
    assert_eq!(model.context_len(), n + 1);
    model
        .forward(&f.prompt_ids, LogitsFor::LastPosition)
        .unwrap();
    let err = model.forward(&[1, 2], LogitsFor::LastPosition).unwrap_err();
    assert!(
        matches!(
            err,
            ForwardError::ContextOverflow { position, requested: 2, context_len }
                if position == n && context_len == n + 1
        ),
        "{err}"
    );
    assert_eq!(
        model.position(),
        n,
        "a rejected forward leaves the cache unchanged"
    );
    model.forward(&[1], LogitsFor::LastPosition).unwrap();

    model.reset();
    let vocab = model.config().vocab_size as u32;
    assert!(matches!(
        model.forward(&[0, vocab], LogitsFor::LastPosition),
        Err(ForwardError::TokenOutOfRange { token, .. }) if token == vocab
    ));
    assert!(matches!(
        model.forward(&[], LogitsFor::LastPosition),
        Err(ForwardError::EmptyInput)
    ));

    let checkpoint = anemone_models::open_checkpoint(&f.dir).unwrap();
    let too_long = checkpoint.config.max_position_embeddings + 1;
    let options = ReferenceOptions {
        threads: Some(1),
        context_len: Some(too_long),
        huge_pages: false,
    };
    assert!(matches!(
        ReferenceModel::load(&checkpoint, &options),
        Err(ForwardError::Config { .. })
    ));
}
