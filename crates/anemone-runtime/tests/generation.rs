//! The generation loop on a transformers-verified random-init checkpoint: EOS stop, teacher
//! forcing, logits capture, context overflow; incremental detokenization on a real tokenizer.

use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_runtime::{
    generate, Generation, GenerationOptions, LogitsModel, RuntimeError, StopReason, TextStream,
};

/// The `qwen3_gqa4` oracle fixture: `(model, prompt_ids, greedy_ids)`.
fn fixture_model(context_len: Option<usize>) -> (ReferenceModel, Vec<u32>, Vec<u32>) {
    let fixture = anemone_testkit::oracle::oracle_fixture("qwen3_gqa4");
    let checkpoint = anemone_models::open_checkpoint(&fixture.dir).unwrap();
    let options = ReferenceOptions {
        threads: Some(2),
        context_len,
        huge_pages: false,
    };
    let model = ReferenceModel::load(&checkpoint, &options).unwrap();
    (model, fixture.prompt_ids, fixture.greedy_ids)
}

fn run(model: &mut ReferenceModel, prompt: &[u32], options: &GenerationOptions) -> Generation {
    let mut seen = Vec::new();
    let g = generate(model, prompt, options, &mut |id| {
        seen.push(id);
        Ok(())
    })
    .unwrap();
    assert_eq!(
        seen, g.generated_ids,
        "every token is reported as it is chosen"
    );
    g
}

#[test]
fn greedy_stops_at_eos_and_keeps_it() {
    let (mut model, prompt, greedy) = fixture_model(None);
    let options = GenerationOptions {
        max_tokens: greedy.len(),
        stop_ids: vec![greedy[3]],
        capture_logits: true,
        ..Default::default()
    };
    let g = run(&mut model, &prompt, &options);
    let first_stop = greedy.iter().position(|&t| t == greedy[3]).unwrap();
    assert_eq!(g.generated_ids, greedy[..=first_stop]);
    assert_eq!(g.stop_reason, StopReason::Eos);
    assert_eq!(g.logits.len(), g.generated_ids.len() * g.vocab_size);
    assert_eq!(g.decode_steps, first_stop);

    let g = run(
        &mut model,
        &prompt,
        &GenerationOptions {
            max_tokens: 5,
            ..Default::default()
        },
    );
    assert_eq!(g.generated_ids, greedy[..5]);
    assert_eq!(g.stop_reason, StopReason::MaxTokens);
    assert!(g.logits.is_empty(), "logits are kept only on request");
}

#[test]
fn forcing_feeds_the_given_ids_and_ignores_eos() {
    let (mut model, prompt, greedy) = fixture_model(None);
    let forced: Vec<u32> = greedy.iter().rev().copied().collect();
    let options = GenerationOptions {
        max_tokens: 1,
        force_ids: Some(forced.clone()),
        stop_ids: forced.clone(),
        capture_logits: true,
        ..Default::default()
    };
    let g = run(&mut model, &prompt, &options);
    assert_eq!(g.generated_ids, forced);
    assert_eq!(g.stop_reason, StopReason::ForcedIds);
    // Row i must equal the logits after prompt + forced[..i], computed independently.
    let v = g.vocab_size;
    for i in 0..forced.len() {
        model.reset();
        let mut context = prompt.clone();
        context.extend(&forced[..i]);
        let want = model.feed(&context).unwrap();
        let row = &g.logits[i * v..(i + 1) * v];
        let err = row
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f32::max);
        assert!(err < 1e-4, "step {i}: max abs difference {err}");
    }
}

#[test]
fn prompt_plus_max_tokens_beyond_the_context_is_an_error() {
    let (mut model, prompt, _) = fixture_model(Some(12));
    let options = |max_tokens| GenerationOptions {
        max_tokens,
        ..Default::default()
    };
    let err = generate(
        &mut model,
        &prompt,
        &options(12 - prompt.len() + 1),
        &mut |_| Ok(()),
    )
    .unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::ContextOverflow {
                context_len: 12,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(model.position(), 0, "nothing ran");
    let g = run(&mut model, &prompt, &options(12 - prompt.len()));
    assert_eq!(g.generated_ids.len(), 12 - prompt.len());
    assert!(matches!(
        generate(&mut model, &[], &options(1), &mut |_| Ok(())),
        Err(RuntimeError::EmptyPrompt)
    ));
}

#[test]
fn streamed_text_never_splits_a_character_and_adds_up() {
    let path = anemone_testkit::model("qwen3-tokenizer/tokenizer.json");
    let tokenizer = tokenizers::Tokenizer::from_file(&path).unwrap();
    let text = "Crème brûlée 🦀🦀 naïve 你好，世界 — ∑ done";
    let ids = tokenizer.encode(text, false).unwrap().get_ids().to_vec();
    let mut stream = TextStream::new(&tokenizer);
    let mut pieces = Vec::new();
    let mut held_back = 0;
    for &id in &ids {
        match stream.push(id).unwrap() {
            Some(piece) => pieces.push(piece),
            None => held_back += 1,
        }
    }
    pieces.extend(stream.finish().unwrap());
    assert!(
        held_back > 0,
        "some token ends inside a multi-byte character"
    );
    assert!(pieces.iter().all(|p| !p.contains('\u{FFFD}')), "{pieces:?}");
    assert_eq!(pieces.concat(), text);
    assert_eq!(stream.text().unwrap(), text);
}
