//! The real proof the chunk graph is right: bundles written to disk, run by the MIL executor
//! (`anemone-exec`), chained chunk after chunk through a padded prefill window and several decode
//! steps, against the fp32 reference forward's residual stream after every chunk.

use std::collections::HashMap;

use anemone_exec::{LoadedPackage, Tensor};
use anemone_models::ane::io::{causal_mask, chunk_inputs, rope_tables};
use anemone_models::ane::options::MASK_NEG;
use anemone_models::ane::{
    names, ChunkOptions, ChunkSizing, LmHeadPlacement, NormForm, Precision, StateLayout,
    Uncompressed,
};
use anemone_models::bundle::{convert, ConvertOptions, Manifest};
use anemone_models::reference::{ReferenceModel, ReferenceOptions};
use anemone_testkit::oracle_dir as oracle_fixture;

const CONTEXT: usize = 32;
const PREFILL: usize = 8;

/// Named tolerance tiers: (minimum cosine, maximum |error| relative to max |reference|).
/// fp32 compute keeps K/V in an fp16 state (Core ML states are fp16), so it is not bit-exact.
const TIER_FP32_GRAPH: (f64, f64) = (0.999_999, 2e-3);
/// fp16 arithmetic everywhere (executor rounding every op output like the ANE).
const TIER_FP16_GRAPH: (f64, f64) = (0.9999, 1e-2);

/// `[positions, hidden]` row-major ↔ `[1, hidden, 1, positions]`.
fn to_bc1s(rows: &[f32], hidden: usize, t: usize) -> Vec<f32> {
    let mut out = vec![0f32; hidden * t];
    for p in 0..rows.len() / hidden {
        for c in 0..hidden {
            out[c * t + p] = rows[p * hidden + c];
        }
    }
    out
}

fn from_bc1s(x: &[f32], hidden: usize, t: usize, keep: usize) -> Vec<f32> {
    let mut out = vec![0f32; keep * hidden];
    for p in 0..keep {
        for c in 0..hidden {
            out[p * hidden + c] = x[c * t + p];
        }
    }
    out
}

/// (cosine, max |a − b| / max |b|, index of the worst element).
fn compare(got: &[f32], want: &[f32]) -> (f64, f64, usize) {
    let (mut dot, mut ng, mut nw, mut worst, mut at, mut peak) = (0f64, 0f64, 0f64, 0f64, 0, 0f64);
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        let (g, w) = (*g as f64, *w as f64);
        dot += g * w;
        ng += g * g;
        nw += w * w;
        peak = peak.max(w.abs());
        if (g - w).abs() > worst || !g.is_finite() {
            worst = if g.is_finite() {
                (g - w).abs()
            } else {
                f64::INFINITY
            };
            at = i;
        }
    }
    (dot / (ng.sqrt() * nw.sqrt()), worst / peak.max(1e-30), at)
}

struct Run<'a> {
    manifest: &'a Manifest,
    packages: Vec<LoadedPackage>,
    states: Vec<anemone_exec::State>,
}

impl Run<'_> {
    /// Runs `function` over every chunk for `t` positions starting at `first`; returns the input
    /// hidden of each chunk boundary (`[1, hidden, 1, t]`): index i = output of chunk i - 1.
    fn step(&mut self, function: &str, x: Vec<f32>, first: usize, t: usize) -> Vec<Vec<f32>> {
        let c = &self.manifest.config;
        let dtype = self.manifest.conversion.precision.dtype();
        let mut inputs = HashMap::new();
        // the LongRoPE fixtures' prompts already pass original_max_position_embeddings
        let factors = c.rope_factors(first + t);
        for i in chunk_inputs(c, &self.manifest.kv_layout(), first, t, factors, MASK_NEG) {
            let dtype = if i.int32 {
                anemone_mil::DType::I32
            } else {
                dtype
            };
            inputs.insert(
                i.name.to_string(),
                Tensor::new(dtype, i.shape, i.values).unwrap(),
            );
        }
        let mut boundary = vec![x];
        for (pkg, state) in self.packages.iter().zip(&mut self.states) {
            let hidden = boundary.last().unwrap().clone();
            inputs.insert(
                names::HIDDEN_IN.to_string(),
                Tensor::new(dtype, vec![1, c.hidden_size, 1, t], hidden).unwrap(),
            );
            let out = pkg.predict(function, &inputs, state).unwrap();
            boundary.push(out[names::HIDDEN_OUT].data.clone());
        }
        boundary
    }
}

/// Converts `fixture`, then feeds `prompt` (padded to one prefill window) and decodes the rest
/// of `ids` one at a time, comparing every chunk boundary with the reference.
fn check_against_reference(
    fixture: &str,
    precision: Precision,
    norm: NormForm,
    layout: StateLayout,
    per_chunk: usize,
    tier: (f64, f64),
) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let ckpt = anemone_models::open_checkpoint(oracle_fixture(fixture)).unwrap();
    let opts = ConvertOptions {
        chunk: ChunkOptions {
            context: CONTEXT,
            prefill_len: PREFILL,
            precision,
            norm,
            state_layout: layout,
        },
        sizing: ChunkSizing::LayersPerChunk(per_chunk),
        lm_head: LmHeadPlacement::Host,
        force: false,
    };
    let manifest = convert(&ckpt, &out, &opts, &Uncompressed, &mut |_| {})
        .unwrap()
        .manifest;
    let packages: Vec<LoadedPackage> = manifest
        .chunks
        .iter()
        .map(|c| LoadedPackage::load(&out.join(&c.path), precision).unwrap())
        .collect();
    let states = packages
        .iter()
        .map(|p| p.new_state(names::DECODE).unwrap())
        .collect();
    let mut run = Run {
        manifest: &manifest,
        packages,
        states,
    };

    let c = &manifest.config;
    let h = c.hidden_size;
    let vocab = c.vocab_size as u32;
    let ids: Vec<u32> = (0..11).map(|i| (i * 37 + 5) % vocab).collect();
    let prompt = 5; // < PREFILL: the window is padded and the pad rows' K/V are overwritten later
    let mut reference = ReferenceModel::load(
        &ckpt,
        &ReferenceOptions {
            threads: Some(1),
            context_len: Some(CONTEXT),
            huge_pages: false,
        },
    )
    .unwrap();

    let check = |what: &str, got: &[Vec<f32>], want: &[Vec<f32>], t: usize, keep: usize| {
        for chunk in &manifest.chunks {
            let boundary = chunk.index + 1;
            let layer = chunk.first_layer + chunk.layer_count;
            let g = from_bc1s(&got[boundary], h, t, keep);
            let (cos, rel, at) = compare(&g, &want[layer]);
            assert!(
                cos >= tier.0 && rel <= tier.1,
                "{fixture} {precision:?} {norm:?} {layout:?} x{per_chunk} {what}: chunk {} (after layer {}) \
                 cosine {cos:.7}, max rel error {rel:.2e} at element {at} (position {}, channel {}): got {} want {}",
                chunk.index, layer - 1, at / h, at % h, g[at], want[layer][at]
            );
        }
    };

    let trace = reference.forward_traced(&ids[..prompt]).unwrap();
    let mut x = to_bc1s(&trace.hidden_states[0], h, PREFILL);
    x.iter_mut()
        .enumerate()
        .filter(|(i, _)| i % PREFILL >= prompt)
        .for_each(|(_, v)| *v = 0.0);
    let got = run.step(names::PREFILL, x, 0, PREFILL);
    check("prefill", &got, &trace.hidden_states, PREFILL, prompt);
    for (pos, id) in ids.iter().enumerate().skip(prompt) {
        let trace = reference.forward_traced(&[*id]).unwrap();
        let got = run.step(names::DECODE, trace.hidden_states[0].clone(), pos, 1);
        check(
            &format!("decode at {pos}"),
            &got,
            &trace.hidden_states,
            1,
            1,
        );
    }
}

#[test]
fn fp32_chunks_match_the_reference_for_every_architecture_and_layout() {
    for fixture in [
        "llama_gqa4",
        "qwen2_mha",
        "qwen2_gqa3_tied",
        "qwen3_gqa4",
        "qwen3_gqa2_headdim24",
        "gemma3_sliding_gqa2",
        "gemma3_mqa_untied",
    ] {
        for (layout, per) in [
            (StateLayout::Unified, 1),
            (StateLayout::Unified, 2),
            (StateLayout::Split, 2),
        ] {
            check_against_reference(
                fixture,
                Precision::Fp32,
                NormForm::LayernormTrick,
                layout,
                per,
                TIER_FP32_GRAPH,
            );
        }
    }
}

#[test]
fn every_norm_form_matches_the_reference() {
    for norm in [
        NormForm::Naive,
        NormForm::MaxScaled,
        NormForm::LayernormTrick,
    ] {
        check_against_reference(
            "qwen3_gqa4",
            Precision::Fp32,
            norm,
            StateLayout::Unified,
            1,
            TIER_FP32_GRAPH,
        );
    }
}

#[test]
fn fp16_chunks_stay_close_to_the_reference() {
    for norm in [
        NormForm::Naive,
        NormForm::MaxScaled,
        NormForm::LayernormTrick,
    ] {
        check_against_reference(
            "qwen3_gqa4",
            Precision::Fp16,
            norm,
            StateLayout::Unified,
            2,
            TIER_FP16_GRAPH,
        );
        check_against_reference(
            "llama_gqa4",
            Precision::Fp16,
            norm,
            StateLayout::Split,
            1,
            TIER_FP16_GRAPH,
        );
        check_against_reference(
            "gemma3_mqa_untied",
            Precision::Fp16,
            norm,
            StateLayout::Unified,
            2,
            TIER_FP16_GRAPH,
        );
    }
}

/// The LM-head package (final norm + vocabulary slices) against the reference logits.
#[test]
fn lm_head_package_matches_the_reference_logits() {
    /// fp32 weights and compute end to end: only summation order differs.
    const TIER_FP32_HEAD: (f64, f64) = (0.999_999_9, 1e-4);
    for fixture in ["llama_gqa4", "qwen3_mha_tied", "gemma3_sliding_gqa2"] {
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("bundle");
        let ckpt = anemone_models::open_checkpoint(oracle_fixture(fixture)).unwrap();
        let opts = ConvertOptions {
            chunk: ChunkOptions {
                context: CONTEXT,
                prefill_len: PREFILL,
                precision: Precision::Fp32,
                ..ChunkOptions::default()
            },
            lm_head: LmHeadPlacement::Package,
            ..ConvertOptions::default()
        };
        let manifest = convert(&ckpt, &out, &opts, &Uncompressed, &mut |_| {})
            .unwrap()
            .manifest;
        let head = manifest.lm_head.as_ref().unwrap();
        let pkg =
            LoadedPackage::load(&out.join(&head.path), anemone_exec::Precision::Fp32).unwrap();
        let mut reference = ReferenceModel::load(
            &ckpt,
            &ReferenceOptions {
                threads: Some(1),
                context_len: Some(CONTEXT),
                huge_pages: false,
            },
        )
        .unwrap();
        let trace = reference.forward_traced(&[3, 1, 4, 1, 5]).unwrap();
        let (h, vocab) = (manifest.config.hidden_size, manifest.config.vocab_size);
        let last_hidden = &trace.hidden_states.last().unwrap()[4 * h..5 * h];
        let mut inputs = HashMap::new();
        inputs.insert(
            anemone_models::ane::lm_head::INPUT.to_string(),
            Tensor::f32(vec![1, h, 1, 1], last_hidden.to_vec()).unwrap(),
        );
        let mut state = pkg
            .new_state(anemone_models::ane::lm_head::FUNCTION)
            .unwrap();
        let outs = pkg
            .predict(anemone_models::ane::lm_head::FUNCTION, &inputs, &mut state)
            .unwrap();
        let mut logits = Vec::with_capacity(vocab);
        for (i, (first, len)) in head.vocab_slices.iter().enumerate() {
            let slice = &outs[&format!("logits_{i}")];
            assert_eq!(slice.shape, vec![1, *len, 1, 1]);
            assert_eq!(logits.len(), *first);
            logits.extend_from_slice(&slice.data);
        }
        let want = &trace.logits[4 * vocab..5 * vocab];
        let (cos, rel, at) = compare(&logits, want);
        assert!(
            cos >= TIER_FP32_HEAD.0 && rel <= TIER_FP32_HEAD.1,
            "{fixture}: LM head cosine {cos:.9}, max rel error {rel:.2e} at token {at}: got {} want {}",
            logits[at],
            want[at]
        );
    }
}

/// A naive symmetric int8 per-output-channel quantizer, to prove the compression hook: its
/// weights become `constexpr_blockwise_shift_scale` ops, the package validates, runs, stays near
/// the reference, and the manifest records what the compressor says.
struct NaiveInt8 {
    tensors: std::sync::Mutex<Vec<String>>,
}

impl anemone_models::ane::WeightCompressor for NaiveInt8 {
    fn compress(
        &self,
        tensor: &str,
        shape: &[usize],
        values: &[f32],
        precision: Precision,
    ) -> Result<Option<anemone_models::ane::PreparedWeight>, anemone_models::ane::AneError> {
        assert_eq!(precision, Precision::Fp16);
        let (rows, cols) = (shape[0], shape[1]);
        let mut data = Vec::with_capacity(values.len());
        let mut scales = Vec::with_capacity(rows);
        for row in values.chunks_exact(cols) {
            let max = row.iter().fold(0f32, |m, v| m.max(v.abs())).max(1e-8);
            let scale = max / 127.0;
            scales.push(scale);
            data.extend(row.iter().map(|v| (v / scale).round() as i32));
        }
        self.tensors.lock().unwrap().push(tensor.to_string());
        Ok(Some(
            anemone_models::ane::PreparedWeight::BlockwiseShiftScale {
                data: anemone_mil::TensorData::pack_ints(
                    anemone_mil::DType::I8,
                    shape.to_vec(),
                    &data,
                )
                .unwrap(),
                scale: anemone_mil::TensorData::f16_from_f32(vec![rows, 1, 1, 1], &scales).unwrap(),
                offset: None,
            },
        ))
    }

    fn describe(&self) -> Option<serde_json::Value> {
        Some(
            serde_json::json!({"scheme": "int8-per-channel", "tensors": self.tensors.lock().unwrap().len()}),
        )
    }
}

#[test]
fn a_weight_compressor_plugs_into_convert() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("bundle");
    let ckpt = anemone_models::open_checkpoint(oracle_fixture("qwen3_gqa4")).unwrap();
    let opts = ConvertOptions {
        chunk: ChunkOptions {
            context: CONTEXT,
            prefill_len: PREFILL,
            ..ChunkOptions::default()
        },
        lm_head: LmHeadPlacement::Package,
        ..ConvertOptions::default()
    };
    let compressor = NaiveInt8 {
        tensors: Default::default(),
    };
    let manifest = convert(&ckpt, &out, &opts, &compressor, &mut |_| {})
        .unwrap()
        .manifest;
    // 7 projections per layer, 2 layers, 1 LM-head slice
    assert_eq!(
        manifest.compression,
        Some(serde_json::json!({"scheme": "int8-per-channel", "tensors": 15}))
    );
    let chunk = out.join(&manifest.chunks[0].path);
    anemone_testkit::validate(&chunk);
    anemone_testkit::validate(&out.join(&manifest.lm_head.as_ref().unwrap().path));
    let program = anemone_mil::read_package(&chunk).unwrap();
    let decode = program.function(names::DECODE).unwrap();
    let constexprs = decode
        .operations()
        .iter()
        .filter(|op| op.op.mil_type() == "constexpr_blockwise_shift_scale")
        .count();
    assert_eq!(constexprs, 7);

    let pkg = LoadedPackage::load(&chunk, anemone_exec::Precision::Fp16).unwrap();
    let mut state = pkg.new_state(names::DECODE).unwrap();
    let mut reference = ReferenceModel::load(
        &ckpt,
        &ReferenceOptions {
            threads: Some(1),
            context_len: Some(CONTEXT),
            huge_pages: false,
        },
    )
    .unwrap();
    let trace = reference.forward_traced(&[7]).unwrap();
    let c = &manifest.config;
    let (cos, sin) = rope_tables(c, &[0], c.rope_factors(1));
    let mut inputs = HashMap::new();
    inputs.insert(
        names::HIDDEN_IN.to_string(),
        Tensor::f16(vec![1, c.hidden_size, 1, 1], trace.hidden_states[0].clone()).unwrap(),
    );
    inputs.insert(
        names::COS.to_string(),
        Tensor::f16(vec![1, 1, c.head_dim, 1], cos).unwrap(),
    );
    inputs.insert(
        names::SIN.to_string(),
        Tensor::f16(vec![1, 1, c.head_dim, 1], sin).unwrap(),
    );
    inputs.insert(
        names::MASK.to_string(),
        Tensor::f16(vec![1, 1, 1, CONTEXT], causal_mask(CONTEXT, 0, 1, MASK_NEG)).unwrap(),
    );
    inputs.insert(
        names::POSITION.to_string(),
        Tensor::i32(vec![1], &[0]).unwrap(),
    );
    let got = pkg.predict(names::DECODE, &inputs, &mut state).unwrap();
    let (cosine, _, _) = compare(&got[names::HIDDEN_OUT].data, &trace.hidden_states[1]);
    // int8 weights: close, but not fp16-close
    assert!(cosine >= 0.999, "int8 chunk cosine {cosine:.6}");
}
