//! Gemma 3 270M (`scripts/fetch-models.sh --only gemma3`) with its local layers' KV in rings of
//! window 512 + prefill 64 = 576 slots, in an fp16 bundle of context 1024 run by the executor in
//! fp16, against the fp32 reference (full KV cache, the window as a mask) on a prompt longer than
//! the window and the ring: logits cosine ≥ 0.999 and the same greedy choice at every step whose
//! margin allows, teacher-forced along the reference's greedy continuation. Skipped, saying so,
//! when the model is absent.

mod pipeline_common;

use anemone_exec::ExecutorBackend;
use anemone_models::ane::{ChunkOptions, Precision, Uncompressed};
use anemone_models::bundle::convert;
use anemone_models::reference::{LogitsFor, ReferenceModel, ReferenceOptions};
use anemone_runtime::pipeline::{Pipeline, PipelineOptions};
use anemone_testkit::argmax;
use pipeline_common::*;

const MODEL: &str = "gemma-3-270m-q4_k_m.gguf";
const CONTEXT: usize = 1024;
const PREFILL: usize = 64;
const RING: usize = 576;
const STEPS: usize = 12;
/// The bar for fp16 bundles in fp16 arithmetic.
const MIN_LOGITS_COSINE: f64 = 0.999;
/// Steps whose reference top-1/top-2 margin is at most this are near-ties.
const NEAR_TIE: f32 = 0.5;

/// A text of ~860 tokens whose last sentence asks for a fact stated more than 512 tokens back
/// (only the global layers reach them; the local layers see their last 512).
fn long_prompt() -> String {
    let mut text = String::from(
        "The archive of the lighthouse keeper lists, for each year, the name of the ship that \
         first entered the harbour in spring.\n",
    );
    let ships = [
        "Albatross",
        "Boreas",
        "Calypso",
        "Dauntless",
        "Endeavour",
        "Fortuna",
        "Gannet",
        "Halcyon",
        "Intrepid",
        "Juniper",
        "Kestrel",
        "Lodestar",
        "Meridian",
        "Nautilus",
        "Osprey",
        "Pelican",
        "Quest",
        "Resolute",
        "Seafarer",
        "Tempest",
    ];
    for (i, ship) in ships.iter().enumerate() {
        text.push_str(&format!(
            "In {}, the first ship to enter the harbour was the {ship}, which carried timber, \
             salt and letters from the northern coast, and its captain signed the register at \
             dawn.\n",
            1801 + i
        ));
    }
    text.push_str("To recall the register: in 1801 the first ship was the");
    text
}

/// fp16 (the ANE's arithmetic); `ANEMONE_RING_FP32=1`: an fp32 bundle in fp32.
fn precision() -> Precision {
    if std::env::var_os("ANEMONE_RING_FP32").is_some() {
        Precision::Fp32
    } else {
        Precision::Fp16
    }
}

#[test]
fn local_layer_rings_follow_the_reference_past_the_window() {
    let gguf = models_dir().join(MODEL);
    if !gguf.is_file() {
        eprintln!(
            "skipped: {} is missing (scripts/fetch-models.sh --only gemma3, or set ANEMONE_MODELS)",
            gguf.display()
        );
        return;
    }
    let mut checkpoint = anemone_models::open_checkpoint(&gguf).unwrap();
    // as `anemone convert --precision fp16` does: the residual stream carried scaled
    if precision() == Precision::Fp16 {
        let (scale, _) = anemone_models::families::gemma3::fp16_residual_scale(&checkpoint)
            .unwrap()
            .expect("Gemma's stream needs a scale");
        checkpoint.config.gemma.as_mut().unwrap().residual_scale = scale;
    }
    let tokenizer = checkpoint
        .tokenizer
        .as_ref()
        .expect("the GGUF has a tokenizer");
    let ids = tokenizer
        .tokenizer
        .encode(long_prompt(), true)
        .unwrap()
        .get_ids()
        .to_vec();
    assert!(
        ids.len() > RING && ids.len() + STEPS <= CONTEXT,
        "{} ids",
        ids.len()
    );

    let tmp = tempfile::tempdir().unwrap();
    let out = tmp.path().join("bundle");
    let chunk = ChunkOptions {
        context: CONTEXT,
        prefill_len: PREFILL,
        precision: precision(),
        ..ChunkOptions::default()
    };
    let mut options = small_options(chunk);
    options.sizing = anemone_models::ane::ChunkSizing::LayersPerChunk(6);
    let manifest = convert(&checkpoint, &out, &options, &Uncompressed, &mut |_| {})
        .unwrap()
        .manifest;
    assert_eq!(manifest.conversion.local_kv_slots, Some(RING));
    let kv = manifest.kv_state_memory();
    // 15 of 18 layers slide: (3·1024 + 15·576) / (18·1024) of the full-context bytes
    assert_eq!(
        kv.bytes * 18 * 1024,
        kv.full_context_bytes * (3 * 1024 + 15 * 576) as u64
    );
    eprintln!(
        "KV state {} bytes (full context: {} bytes)",
        kv.bytes, kv.full_context_bytes
    );

    let pipeline = Pipeline::open(
        &out,
        ExecutorBackend::new(precision()),
        &PipelineOptions::default(),
    )
    .unwrap();
    let mut reference = ReferenceModel::load(
        &checkpoint,
        &ReferenceOptions {
            threads: None,
            context_len: Some(CONTEXT),
            huge_pages: false,
        },
    )
    .unwrap();
    let mut session = pipeline.session().unwrap();
    let mut want = reference.forward(&ids, LogitsFor::LastPosition).unwrap();
    let mut got = session.feed(&ids).unwrap();
    let mut compared = 0;
    for step in 0..STEPS {
        let what = format!("step {step} (position {})", ids.len() + step);
        let cos = cosine(&got, &want);
        let best = argmax(&want);
        let margin = want[best as usize]
            - want
                .iter()
                .enumerate()
                .filter(|(i, _)| *i != best as usize)
                .fold(f32::MIN, |m, (_, v)| m.max(*v));
        eprintln!("{what}: cosine {cos:.6}, reference top-1 {best} margin {margin:.2}");
        assert!(cos >= MIN_LOGITS_COSINE, "{what}: logits cosine {cos:.6}");
        if margin > NEAR_TIE {
            assert_eq!(argmax(&got), best, "{what}: greedy choice");
            compared += 1;
        }
        want = reference.forward(&[best], LogitsFor::LastPosition).unwrap();
        got = session.feed(&[best]).unwrap();
    }
    assert!(compared >= STEPS / 2, "only {compared} steps had a margin");
}
