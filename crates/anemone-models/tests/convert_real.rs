//! `convert` on the real GGUF models (`$ANEMONE_MODELS`, default `<repo>/models`, fetched by
//! scripts/fetch-models.sh): packages validate, hashes match, and the fp16 bundle run by the
//! executor tracks the reference forward chunk by chunk on real weights.

use std::collections::HashMap;
use std::path::PathBuf;

use anemone_exec::{LoadedPackage, Tensor};
use anemone_models::ane::io::{causal_mask, rope_tables};
use anemone_models::ane::options::MASK_NEG;
use anemone_models::ane::{
    names, ChunkOptions, ChunkSizing, LmHeadPlacement, StateLayout, Uncompressed,
};
use anemone_models::bundle::{convert, verify_files, ConvertOptions};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_testkit::{models_dir, validate};

/// Real fp16 weights through fp16 arithmetic: per-chunk cosine floor against the fp32 reference.
const TIER_REAL_FP16_COSINE: f64 = 0.999;

fn model(file: &str) -> PathBuf {
    let p = models_dir().join(file);
    assert!(
        p.is_file(),
        "{} missing: run scripts/fetch-models.sh",
        p.display()
    );
    p
}

fn cosine(a: &[f32], b: &[f32]) -> f64 {
    let (mut d, mut na, mut nb) = (0f64, 0f64, 0f64);
    for (x, y) in a.iter().zip(b) {
        d += *x as f64 * *y as f64;
        na += (*x as f64).powi(2);
        nb += (*y as f64).powi(2);
    }
    d / (na.sqrt() * nb.sqrt())
}

fn convert_real(
    file: &str,
    layout: StateLayout,
    per_chunk: usize,
    lm_head: LmHeadPlacement,
    context: usize,
    prefill: usize,
) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let ckpt = anemone_models::open_checkpoint(model(file)).unwrap();
    let opts = ConvertOptions {
        chunk: ChunkOptions {
            context,
            prefill_len: prefill,
            state_layout: layout,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(per_chunk),
        lm_head,
        force: false,
    };
    let manifest = convert(&ckpt, &out, &opts, &Uncompressed, &mut |_| {})
        .unwrap()
        .manifest;
    assert!(verify_files(&out, &manifest).unwrap().iter().all(|c| c.ok));
    assert!(
        manifest.files.contains_key("tokenizer.json"),
        "{file}: tokenizer not bundled"
    );
    let tok = manifest.tokenizer.as_ref().unwrap();
    assert!(!tok.eos_token_ids.is_empty(), "{file}: no eos ids");
    assert_eq!(manifest.provenance[0].sha256.len(), 64);
    // validating every package of a 30-layer model takes minutes: first, last and the LM head
    let paths = manifest.package_paths();
    let mut sample = vec![paths[0], paths[paths.len() - 1]];
    if manifest.chunks.len() > 1 && lm_head == LmHeadPlacement::Package {
        sample.push(paths[paths.len() - 2]);
    }
    for rel in sample {
        validate(&out.join(rel));
    }

    // run the fp16 bundle: a 7-token prompt in one padded prefill window, then 2 decode steps
    let c = &manifest.config;
    let h = c.hidden_size;
    let packages: Vec<LoadedPackage> = manifest
        .chunks
        .iter()
        .map(|ch| LoadedPackage::load(&out.join(&ch.path), anemone_exec::Precision::Fp16).unwrap())
        .collect();
    let mut states: Vec<_> = packages
        .iter()
        .map(|p| p.new_state(names::DECODE).unwrap())
        .collect();
    let mut reference = ReferenceModel::load(
        &ckpt,
        &ReferenceOptions {
            threads: None,
            context_len: Some(context),
            huge_pages: false,
        },
    )
    .unwrap();
    let ids: Vec<u32> = vec![504, 3575, 282, 4649, 314, 12, 2, 28, 33];
    let prompt = 7;
    let mut run = |function: &str,
                   first: usize,
                   t: usize,
                   keep: usize,
                   hidden_rows: &[f32]|
     -> Vec<Vec<f32>> {
        let positions: Vec<usize> = (first..first + t).collect();
        let (cos, sin) = rope_tables(c, &positions, c.rope_factors(first + t));
        let mut x = vec![0f32; h * t];
        for p in 0..keep {
            for ch in 0..h {
                x[ch * t + p] = hidden_rows[p * h + ch];
            }
        }
        let mut inputs = HashMap::new();
        inputs.insert(
            names::COS.into(),
            Tensor::f16(vec![1, 1, c.head_dim, t], cos).unwrap(),
        );
        inputs.insert(
            names::SIN.into(),
            Tensor::f16(vec![1, 1, c.head_dim, t], sin).unwrap(),
        );
        inputs.insert(
            names::MASK.into(),
            Tensor::f16(
                vec![1, 1, t, context],
                causal_mask(context, first, t, MASK_NEG),
            )
            .unwrap(),
        );
        inputs.insert(
            names::POSITION.into(),
            Tensor::i32(vec![1], &[first as i32]).unwrap(),
        );
        let mut outs = Vec::new();
        for (pkg, state) in packages.iter().zip(states.iter_mut()) {
            inputs.insert(
                names::HIDDEN_IN.into(),
                Tensor::f16(vec![1, h, 1, t], x.clone()).unwrap(),
            );
            x = pkg.predict(function, &inputs, state).unwrap()[names::HIDDEN_OUT]
                .data
                .clone();
            let mut rows = vec![0f32; keep * h];
            for p in 0..keep {
                for ch in 0..h {
                    rows[p * h + ch] = x[ch * t + p];
                }
            }
            outs.push(rows);
        }
        outs
    };
    let trace = reference.forward_traced(&ids[..prompt]).unwrap();
    let mut steps = vec![(
        run(names::PREFILL, 0, prefill, prompt, &trace.hidden_states[0]),
        trace.hidden_states,
    )];
    let mut last_logits = Vec::new();
    for (pos, id) in ids.iter().enumerate().skip(prompt) {
        let trace = reference.forward_traced(&[*id]).unwrap();
        steps.push((
            run(names::DECODE, pos, 1, 1, &trace.hidden_states[0]),
            trace.hidden_states,
        ));
        last_logits = trace.logits;
    }
    for (step, (got, want)) in steps.iter().enumerate() {
        for ch in &manifest.chunks {
            let layer = ch.first_layer + ch.layer_count;
            let cos = cosine(&got[ch.index], &want[layer]);
            assert!(
                cos >= TIER_REAL_FP16_COSINE,
                "{file} {layout:?}: step {step}, chunk {} (after layer {}): cosine {cos:.6} < {TIER_REAL_FP16_COSINE}",
                ch.index,
                layer - 1
            );
        }
    }

    // the LM-head package (vocabulary slices) on the reference's last hidden state
    if let Some(head) = &manifest.lm_head {
        let pkg =
            LoadedPackage::load(&out.join(&head.path), anemone_exec::Precision::Fp16).unwrap();
        let (_, want_hidden) = steps.last().unwrap();
        let mut inputs = HashMap::new();
        inputs.insert(
            anemone_models::ane::lm_head::INPUT.to_string(),
            Tensor::f16(vec![1, h, 1, 1], want_hidden.last().unwrap().clone()).unwrap(),
        );
        let mut state = pkg
            .new_state(anemone_models::ane::lm_head::FUNCTION)
            .unwrap();
        let outs = pkg
            .predict(anemone_models::ane::lm_head::FUNCTION, &inputs, &mut state)
            .unwrap();
        assert!(
            head.vocab_slices.len() > 1,
            "{file}: vocabulary should need several slices"
        );
        let logits: Vec<f32> = (0..head.vocab_slices.len())
            .flat_map(|i| outs[&format!("logits_{i}")].data.clone())
            .collect();
        let cos = cosine(&logits, &last_logits);
        assert!(
            cos >= TIER_REAL_FP16_COSINE,
            "{file}: LM head logits cosine {cos:.6}"
        );
        let argmax = |v: &[f32]| {
            v.iter()
                .enumerate()
                .max_by(|a, b| a.1.total_cmp(b.1))
                .unwrap()
                .0
        };
        assert_eq!(
            argmax(&logits),
            argmax(&last_logits),
            "{file}: LM head top-1 differs"
        );
    }
}

#[test]
fn smollm2_converts_in_both_layouts_and_tracks_the_reference() {
    convert_real(
        "smollm2-135m-instruct.Q4_1.gguf",
        StateLayout::Unified,
        1,
        LmHeadPlacement::Host,
        64,
        16,
    );
    convert_real(
        "smollm2-135m-instruct.Q4_1.gguf",
        StateLayout::Split,
        3,
        LmHeadPlacement::Package,
        64,
        16,
    );
}

#[test]
fn qwen25_coder_converts_and_tracks_the_reference() {
    convert_real(
        "qwen2.5-coder-0.5b-instruct.Q4_K_M.gguf",
        StateLayout::Unified,
        2,
        LmHeadPlacement::Package,
        64,
        16,
    );
}

#[test]
fn smollm2_bundle_with_tokenizer_is_byte_reproducible() {
    let dir = tempfile::tempdir().unwrap();
    let ckpt = anemone_models::open_checkpoint(model("smollm2-135m-instruct.Q4_1.gguf")).unwrap();
    let opts = ConvertOptions {
        chunk: ChunkOptions {
            context: 64,
            prefill_len: 16,
            ..ChunkOptions::default()
        },
        sizing: ChunkSizing::LayersPerChunk(10),
        ..ConvertOptions::default()
    };
    for name in ["a", "b"] {
        convert(
            &ckpt,
            &dir.path().join(name),
            &opts,
            &Uncompressed,
            &mut |_| {},
        )
        .unwrap();
    }
    let a = anemone_testkit::tree_bytes(&dir.path().join("a"));
    let b = anemone_testkit::tree_bytes(&dir.path().join("b"));
    assert!(a.iter().any(|(p, _)| p == "tokenizer.json"));
    assert!(a.iter().any(|(p, _)| p == "chat_template.jinja"));
    assert_eq!(a.len(), b.len());
    for ((pa, ba), (pb, bb)) in a.iter().zip(&b) {
        assert_eq!(pa, pb);
        assert!(ba == bb, "{pa} differs between two conversions");
    }
}
