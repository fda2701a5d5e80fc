//! Sliding-window layers in ring-buffer KV states (`anemone_models::ane::kv`): Gemma 3's local
//! layers and every layer of a Phi-3 with `sliding_window` keep `window + prefill_len` slots
//! (rounded to 32) instead of the context. Bundles of the random-init Gemma 3 and Phi-3 fixtures
//! (windows 3-4, context 128, prefill 8: rings of 32 slots) run
//! by the executor in fp32 and fp16 against the fp32 reference (full KV cache, the window as a
//! mask) on prompts longer than the window and the ring, generating past several wraps, fed
//! whole and in pieces whose prefill windows would straddle the ring's end.

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, ChunkSizing, LmHeadPlacement, Precision, StateLayout};
use anemone_models::reference::LogitsFor;
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anemone_runtime::{generate, GenerationOptions};
use anemone_testkit::{argmax, cosine, oracle_dir};
use pipeline_common::*;

const CONTEXT: usize = 128;
const PREFILL: usize = 8;
/// window 4 + prefill 8, rounded up to 32
const RING: usize = 32;
const PROMPT: usize = 41;
/// positions 41..121: the ring wraps at 64 and 96 during generation (and at 32 in the prompt)
const NEW_TOKENS: usize = 80;

/// fp32 graph (fp16 KV state holding f32 values in the executor) against the fp32 reference.
const FP32_TOLERANCE: f32 = 1e-3;
/// fp16 arithmetic everywhere: per step, logits cosine and max |diff| over max |logit|.
const FP16_COSINE: f64 = 0.9999;
const FP16_RELATIVE: f32 = 1e-2;

fn prompt(vocab: usize) -> Vec<u32> {
    (0..PROMPT)
        .map(|i| ((i * 37 + 11) % vocab) as u32)
        .collect()
}

fn convert(
    fixture: &str,
    precision: Precision,
    layout: StateLayout,
    per_chunk: usize,
) -> (tempfile::TempDir, std::path::PathBuf) {
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let mut options = small_options(ChunkOptions {
        context: CONTEXT,
        prefill_len: PREFILL,
        precision,
        state_layout: layout,
        ..ChunkOptions::default()
    });
    options.sizing = ChunkSizing::LayersPerChunk(per_chunk);
    options.lm_head = LmHeadPlacement::Host;
    convert_to(&oracle_dir(fixture), &out, &options);
    (tmp, out)
}

/// Ids fed after the prompt, one at a time (a random-init model's greedy continuation soon
/// repeats one token; these vary, so every step attends to a different window).
fn continuation(vocab: usize) -> Vec<u32> {
    (0..NEW_TOKENS)
        .map(|i| ((i * 91 + 29) % vocab) as u32)
        .collect()
}

/// The reference's logits after the prompt and after each id of `continuation` but the last.
fn reference_steps(fixture: &str, prompt: &[u32], continuation: &[u32]) -> Vec<Vec<f32>> {
    let mut model = reference_of(&oracle_dir(fixture), CONTEXT);
    let mut logits = vec![model.forward(prompt, LogitsFor::LastPosition).unwrap()];
    for &id in &continuation[..continuation.len() - 1] {
        logits.push(model.forward(&[id], LogitsFor::LastPosition).unwrap());
    }
    logits
}

/// The top-1/top-2 logit margin.
fn margin(logits: &[f32]) -> f32 {
    let best = argmax(logits) as usize;
    let second = logits
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != best)
        .fold(f32::MIN, |m, (_, v)| m.max(*v));
    logits[best] - second
}

/// The greedy choice agrees wherever the reference's top-1/top-2 margin exceeds `min_margin`.
fn check_top1(what: &str, got: &[f32], want: &[f32], min_margin: f32) {
    let best = argmax(want) as usize;
    if margin(want) > min_margin {
        assert_eq!(argmax(got) as usize, best, "{what}: greedy choice");
    }
}

fn check_step(what: &str, precision: Precision, got: &[f32], want: &[f32]) {
    match precision {
        Precision::Fp32 => assert_close(what, got, want, FP32_TOLERANCE),
        Precision::Fp16 => {
            let c = cosine(got, want);
            let (at, g, w) = worst(got, want);
            let peak = want.iter().fold(0f32, |m, v| m.max(v.abs()));
            let rel = (g - w).abs() / peak;
            assert!(
                c >= FP16_COSINE && rel <= FP16_RELATIVE,
                "{what}: logits cosine {c:.6}, worst |diff| {:.3e} of max |logit| {peak:.3} at \
                 {at} (got {g}, want {w})",
                (g - w).abs()
            );
        }
    }
}

#[test]
fn rings_match_the_reference_past_several_wraps() {
    for (fixture, precision, layout, per_chunk) in [
        (
            "gemma3_sliding_gqa2",
            Precision::Fp32,
            StateLayout::Unified,
            1,
        ),
        (
            "gemma3_sliding_gqa2",
            Precision::Fp32,
            StateLayout::Split,
            2,
        ),
        (
            "gemma3_sliding_gqa2",
            Precision::Fp16,
            StateLayout::Unified,
            3,
        ),
        (
            "gemma3_mqa_untied",
            Precision::Fp32,
            StateLayout::Unified,
            2,
        ),
        ("gemma3_mqa_untied", Precision::Fp16, StateLayout::Split, 1),
        // every layer slides: the ordinary states are rings
        (
            "phi3_sliding_window",
            Precision::Fp32,
            StateLayout::Split,
            1,
        ),
        (
            "phi3_sliding_window",
            Precision::Fp16,
            StateLayout::Unified,
            2,
        ),
    ] {
        let what = format!("{fixture} {precision:?} {layout:?} x{per_chunk}");
        let (_tmp, out) = convert(fixture, precision, layout, per_chunk);
        let pipeline = Pipeline::open(
            &out,
            ExecutorBackend::new(precision),
            &PipelineOptions::default(),
        )
        .unwrap_or_else(|e| panic!("{what}: {e}"));
        let m = pipeline.manifest();
        assert_eq!(m.conversion.local_kv_slots, Some(RING), "{what}");
        // the sliding layers' states hold the ring, the global layers' the context
        for chunk in &m.chunks {
            for state in &chunk.functions[0].states {
                let want = if state.name.ends_with("_local") || m.config.attention_window.is_some()
                {
                    RING
                } else {
                    CONTEXT
                };
                assert_eq!(
                    state.shape[3], want,
                    "{what}: chunk {} state {}",
                    chunk.index, state.name
                );
            }
        }
        let kv = m.kv_state_memory();
        assert!(kv.bytes < kv.full_context_bytes, "{what}: {kv:?}");

        let ids = prompt(pipeline.vocab_size());
        let next = continuation(pipeline.vocab_size());
        let want_logits = reference_steps(fixture, &ids, &next);
        let min_margin = match precision {
            Precision::Fp32 => 2.0 * FP32_TOLERANCE,
            Precision::Fp16 => 0.05,
        };

        // teacher-forced along the continuation: logits and greedy choice of every step
        let mut session = pipeline.session().unwrap();
        let mut got = session.feed(&ids).unwrap();
        for (step, want) in want_logits.iter().enumerate() {
            let at = format!("{what}: step {step} (position {})", PROMPT + step);
            check_step(&at, precision, &got, want);
            check_top1(&at, &got, want, min_margin);
            if step + 1 < want_logits.len() {
                got = session.feed(&[next[step]]).unwrap();
            }
        }
        assert_eq!(session.position(), PROMPT + NEW_TOKENS - 1);

        // the bundle's own greedy continuation through the runtime's loop equals the reference's
        let mut reference = reference_of(&oracle_dir(fixture), CONTEXT);
        let options = GenerationOptions {
            max_tokens: NEW_TOKENS,
            ..GenerationOptions::default()
        };
        let want = generate(
            &mut reference,
            &ids,
            &GenerationOptions {
                capture_logits: true,
                ..options.clone()
            },
            &mut |_| Ok(()),
        )
        .unwrap();
        let g = generate(&mut session, &ids, &options, &mut |_| Ok(()))
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // fp32: equal throughout; fp16: up to the first near-tie of the reference
        let vocab = pipeline.vocab_size();
        let agree = match precision {
            Precision::Fp32 => NEW_TOKENS,
            Precision::Fp16 => (0..NEW_TOKENS)
                .find(|&i| margin(&want.logits[i * vocab..(i + 1) * vocab]) <= min_margin)
                .unwrap_or(NEW_TOKENS),
        };
        eprintln!("{what}: greedy ids compared over {agree} of {NEW_TOKENS} steps");
        assert_eq!(
            g.generated_ids[..agree],
            want.generated_ids[..agree],
            "{what}: greedy ids (first {agree} steps)"
        );
    }
}

/// Prompt and continuation fed in pieces of every size: prefill windows start at every offset
/// of the ring, so some would straddle its end (the runtime decodes those tokens one at a time)
/// and padded windows write past the last real token. The logits after each piece equal the
/// reference's at that position.
#[test]
fn pieces_across_the_ring_end_equal_the_reference() {
    let fixture = "gemma3_sliding_gqa2";
    let (_tmp, out) = convert(fixture, Precision::Fp32, StateLayout::Unified, 1);
    let pipeline = Pipeline::open(
        &out,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions::default(),
    )
    .unwrap();
    let vocab = pipeline.vocab_size();
    let ids: Vec<u32> = (0..CONTEXT)
        .map(|i| ((i * 53 + 7) % vocab) as u32)
        .collect();
    let mut reference = reference_of(&oracle_dir(fixture), CONTEXT);
    let all = reference.forward(&ids, LogitsFor::AllPositions).unwrap();
    let mut session = pipeline.session().unwrap();
    let (mut done, mut size) = (0, 1);
    while done < CONTEXT {
        let n = size.min(CONTEXT - done);
        let got = session.feed(&ids[done..done + n]).unwrap();
        done += n;
        let want = &all[(done - 1) * vocab..done * vocab];
        assert_close(
            &format!("after {done} ids (piece of {n})"),
            &got,
            want,
            FP32_TOLERANCE,
        );
        size = size % 13 + 2;
    }
    assert_eq!(session.position(), CONTEXT, "the whole context is usable");
}

/// A manifest whose ring is too small for its prefill length is refused by name.
#[test]
fn a_ring_smaller_than_window_plus_prefill_is_refused() {
    let (_tmp, out) = convert(
        "gemma3_sliding_gqa2",
        Precision::Fp32,
        StateLayout::Unified,
        3,
    );
    let path = out.join("anemone.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let edited = text.replace("\"local_kv_slots\": 32", "\"local_kv_slots\": 8");
    assert_ne!(text, edited);
    std::fs::write(&path, edited).unwrap();
    let err = Pipeline::open(
        &out,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions {
            verify_hashes: false,
            ..PipelineOptions::default()
        },
    )
    .unwrap_err();
    assert!(err.to_string().contains("local_kv_slots 8"), "{err}");
}

/// coremltools accepts ring-state packages: Gemma chunks mixing global and local layers in both
/// state layouts, and a Phi-3 whose every layer slides.
#[test]
fn ring_packages_validate() {
    let mut bundles = Vec::new();
    for (fixture, layout, per_chunk) in [
        ("gemma3_sliding_gqa2", StateLayout::Unified, 3),
        ("gemma3_mqa_untied", StateLayout::Split, 2),
        ("phi3_sliding_window", StateLayout::Split, 2),
    ] {
        let (tmp, out) = convert(fixture, Precision::Fp16, layout, per_chunk);
        let m = anemone_models::bundle::read_manifest(&out).unwrap();
        assert_eq!(m.conversion.local_kv_slots, Some(RING), "{fixture}");
        bundles.push((tmp, out, m));
    }
    let packages: Vec<std::path::PathBuf> = bundles
        .iter()
        .flat_map(|(_, out, m)| m.chunks.iter().map(move |c| out.join(&c.path)))
        .collect();
    let refs: Vec<&std::path::Path> = packages.iter().map(|p| p.as_path()).collect();
    anemone_testkit::validate_package(&refs);
}

/// Phi-3 with `sliding_window` 3 on every layer (`tools/oracle/make_fixtures.py`), converted
/// with context 64 and prefill 4: every layer keeps a ring of 32 slots, reached through the
/// ordinary `mask`, `position` and states. Against transformers: greedy ids equal, logits of
/// every step within 1e-3.
#[test]
fn phi3_ring_bundle_matches_transformers() {
    let f = anemone_testkit::oracle::oracle_fixture("phi3_sliding_window");
    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let mut options = small_options(ChunkOptions {
        context: 64,
        prefill_len: 4,
        precision: Precision::Fp32,
        ..ChunkOptions::default()
    });
    options.sizing = ChunkSizing::LayersPerChunk(2);
    convert_to(&f.dir, &out, &options);
    let pipeline = Pipeline::open(
        &out,
        ExecutorBackend::new(Precision::Fp32),
        &PipelineOptions::default(),
    )
    .unwrap();
    let m = pipeline.manifest();
    assert_eq!(m.config.attention_window, Some(3));
    assert_eq!(m.conversion.local_kv_slots, Some(RING));
    let states = &m.chunks[0].functions[0].states;
    assert_eq!(states.len(), 1, "{states:?}");
    assert!(states.iter().all(|s| s.shape[3] == RING), "{states:?}");

    let mut session = pipeline.session().unwrap();
    let options = GenerationOptions {
        max_tokens: f.greedy_ids.len(),
        capture_logits: true,
        ..GenerationOptions::default()
    };
    let g = generate(&mut session, &f.prompt_ids, &options, &mut |_| Ok(())).unwrap();
    assert_eq!(g.generated_ids, f.greedy_ids, "greedy ids");
    let logits = anemone_runtime::npy::read_f32(&f.logits_path()).unwrap();
    assert_close("logits", &g.logits, &logits.data, FP32_TOLERANCE);
}
