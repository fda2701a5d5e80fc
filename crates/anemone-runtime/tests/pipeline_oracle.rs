//! Bundles of the random-init oracle checkpoints, converted with `--precision fp32` and run by
//! the executor in fp32, against Hugging Face transformers: greedy ids equal, logits and every
//! chunk's output within 1e-3, across chunk layouts (split/unified state, several layers per
//! chunk, the LM-head package, prefill windows with padding). `ANEMONE_ORACLE_DIR` runs the same
//! checks on a held-out set (`tools/oracle/make_fixtures.py --holdout DIR`).

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Precision, StateLayout};
use anemone_models::bundle::ConvertOptions;
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anemone_runtime::{generate, npy, GenerationOptions};
use pipeline_common::*;

/// fp32 graph against fp32 transformers with other summation orders. The KV state is declared
/// fp16 (Core ML states are); the executor's fp32 mode keeps f32 values in it (measured worst
/// differences ~3e-5).
const FP32_TOLERANCE: f32 = 1e-3;

/// A different layout per fixture, so every layout meets several architectures.
fn layout_for(index: usize) -> (&'static str, ConvertOptions) {
    let chunk = ChunkOptions {
        context: 64,
        // 7-token prompts: one full window and one padded window
        prefill_len: 4,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    };
    let mut options = small_options(chunk);
    match index % 4 {
        0 => ("1 layer per chunk, unified state", options),
        1 => {
            options.chunk.state_layout = StateLayout::Split;
            options.sizing = ChunkSizing::LayersPerChunk(2);
            ("2 layers per chunk, split state", options)
        }
        2 => {
            options.lm_head = LmHeadPlacement::Package;
            options.sizing = ChunkSizing::LayersPerChunk(2);
            ("2 layers per chunk, LM-head package", options)
        }
        _ => {
            options.chunk.prefill_len = 32;
            (
                "1 layer per chunk, prompt shorter than the prefill window",
                options,
            )
        }
    }
}

#[test]
fn fp32_bundles_match_transformers() {
    for (index, f) in oracle_fixtures().iter().enumerate() {
        let (layout, options) = layout_for(index);
        let what = format!("{} ({layout})", f.name);
        let tmp = tempfile::tempdir().unwrap();
        let out = tmp.path().join("bundle");
        convert_to(&f.dir, &out, &options);
        let pipeline = Pipeline::open(
            &out,
            ExecutorBackend::new(Precision::Fp32),
            &PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));

        // every chunk's output over the prompt against transformers' residual stream
        let hidden = npy::read_f32(&f.dir.join("hidden_states.npy")).unwrap();
        let (layers_plus_one, positions, h) = (hidden.shape[0], hidden.shape[1], hidden.shape[2]);
        assert_eq!(positions, f.prompt_ids.len());
        let mut session = pipeline.session().unwrap();
        let trace = session.feed_traced(&f.prompt_ids).unwrap();
        for (chunk, depth) in pipeline.chunk_depths().into_iter().enumerate() {
            assert!(depth < layers_plus_one);
            let want = &hidden.data[depth * positions * h..(depth + 1) * positions * h];
            assert_close(
                &format!("{what}: chunk {chunk} output (after layer {})", depth - 1),
                &trace.chunk_outputs[chunk],
                want,
                FP32_TOLERANCE,
            );
        }

        // greedy generation through the runtime's loop, logits of every step
        let options = GenerationOptions {
            max_tokens: f.greedy_ids.len(),
            capture_logits: true,
            ..GenerationOptions::default()
        };
        let g = generate(&mut session, &f.prompt_ids, &options, &mut |_| Ok(()))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(g.generated_ids, f.greedy_ids, "{what}: greedy ids");
        let logits = npy::read_f32(&f.dir.join("logits.npy")).unwrap();
        assert_eq!(
            logits.shape,
            vec![f.greedy_ids.len(), pipeline.vocab_size()]
        );
        let (at, got, want) = worst(&g.logits, &logits.data);
        eprintln!(
            "{what}: worst logit |diff| {:.2e} (element {at})",
            (got - want).abs()
        );
        assert_close(
            &format!("{what}: logits"),
            &g.logits,
            &logits.data,
            FP32_TOLERANCE,
        );
    }
}

/// Feeding a sequence in pieces (prefill windows, single decode steps, a tail near the end of
/// the context that no longer fits a prefill window) gives the logits of feeding it at once.
#[test]
fn feeding_in_pieces_equals_feeding_at_once() {
    let f = &oracle_fixtures()[0];
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let chunk = ChunkOptions {
        context: 32,
        prefill_len: 8,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    };
    convert_to(&f.dir, &out, &small_options(chunk));
    let pipeline = Pipeline::open(
        &out,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions::default(),
    )
    .unwrap();
    // 30 ids: at once = 3 prefill windows + the last 6 through decode (24 + 8 > 32)
    let ids: Vec<u32> = (0..30).map(|i| 4 + (i * 37 % 200) as u32).collect();
    let mut whole = pipeline.session().unwrap();
    let at_once = whole.feed(&ids).unwrap();
    assert_eq!(whole.position(), 30);

    let mut pieces = pipeline.session().unwrap();
    let mut last = Vec::new();
    for piece in [&ids[..5], &ids[5..6], &ids[6..19], &ids[19..29], &ids[29..]] {
        last = pieces.feed(piece).unwrap();
    }
    assert_close("pieces vs at once", &last, &at_once, 1e-4);

    // reset starts over: the same logits again
    pieces.reset();
    assert_eq!(pieces.position(), 0);
    let again = pieces.feed(&ids).unwrap();
    assert_close("after reset", &again, &at_once, 0.0);
}

fn small_bundle(dir: &std::path::Path) -> std::path::PathBuf {
    let f = &oracle_fixtures()[0];
    let out = dir.join("bundle");
    let chunk = ChunkOptions {
        context: 32,
        prefill_len: 8,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    };
    convert_to(&f.dir, &out, &small_options(chunk));
    out
}

/// Prompt plus new tokens beyond the bundle's context is an error before anything runs; a
/// session never truncates or wraps.
#[test]
fn context_overflow_is_an_error_never_a_truncation() {
    use anemone_runtime::pipeline::PipelineError;
    use anemone_runtime::RuntimeError;
    let tmp = tempfile::tempdir().unwrap();
    let pipeline = Pipeline::open(
        &small_bundle(tmp.path()),
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions::default(),
    )
    .unwrap();
    let ids: Vec<u32> = (0..33).map(|i| 4 + i as u32).collect();
    let mut session = pipeline.session().unwrap();
    let err = session.feed(&ids).unwrap_err();
    assert!(
        matches!(
            err,
            PipelineError::ContextOverflow {
                position: 0,
                requested: 33,
                context: 32
            }
        ),
        "{err}"
    );
    assert_eq!(session.position(), 0, "a refused feed changes nothing");
    session.feed(&ids[..30]).unwrap();
    let err = session.feed(&ids[30..33]).unwrap_err();
    assert!(err.to_string().contains("context of 32"), "{err}");
    assert_eq!(session.position(), 30);
    session.feed(&ids[30..32]).unwrap();
    assert_eq!(
        session.position(),
        32,
        "the context is usable to its last slot"
    );

    let options = GenerationOptions {
        max_tokens: 5,
        ..GenerationOptions::default()
    };
    let err = generate(&mut session, &ids[..30], &options, &mut |_| Ok(())).unwrap_err();
    assert!(
        matches!(
            err,
            RuntimeError::ContextOverflow {
                prompt_len: 30,
                new_tokens: 5,
                context_len: 32
            }
        ),
        "{err}"
    );

    session.reset();
    let err = session.feed(&[10_000]).unwrap_err();
    assert!(
        matches!(err, PipelineError::TokenOutOfRange { token: 10_000, .. }),
        "{err}"
    );
    assert!(matches!(
        session.feed(&[]).unwrap_err(),
        PipelineError::EmptyInput
    ));
}

/// A file missing from, or added to, a bundle is named before anything loads.
#[test]
fn bundle_files_are_checked_against_the_manifest() {
    use anemone_runtime::pipeline::PipelineError;
    let tmp = tempfile::tempdir().unwrap();
    let bundle = small_bundle(tmp.path());
    let open = || {
        Pipeline::open(
            &bundle,
            ExecutorBackend::new(Precision::Fp32),
            &PipelineOptions::default(),
        )
    };
    let weights = bundle.join("chunks/chunk-01.mlpackage/Data/com.apple.CoreML/weights/weight.bin");
    let saved = std::fs::read(&weights).unwrap();
    std::fs::remove_file(&weights).unwrap();
    let err = open().unwrap_err();
    assert!(
        matches!(err, PipelineError::Verify { .. })
            && err.to_string().contains(
                "chunks/chunk-01.mlpackage/Data/com.apple.CoreML/weights/weight.bin is missing"
            ),
        "{err}"
    );
    std::fs::write(&weights, saved).unwrap();
    std::fs::write(bundle.join("extra.txt"), "x").unwrap();
    let err = open().unwrap_err();
    assert!(err.to_string().contains("extra.txt is not listed"), "{err}");
    // verification off: the extra file does not matter, the bundle runs
    let pipeline = Pipeline::open(
        &bundle,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions {
            verify_hashes: false,
            ..PipelineOptions::default()
        },
    )
    .unwrap();
    assert_eq!(
        pipeline.session().unwrap().feed(&[5, 6]).unwrap().len(),
        pipeline.vocab_size()
    );
}
