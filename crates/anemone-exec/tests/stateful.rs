//! End to end: a stateful two-function package (prefill + decode sharing a KV cache, weights
//! compressed with both constexprs) written to disk, run step by step against a naive model.

mod common;

use anemone_exec::{ExecError, Precision, State, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorData, TensorType};
use common::*;

const D: usize = 8; // channels = head dim (one head)
const S: usize = 8; // context
const PREFILL: usize = 4;

/// fp16 chains of a few ops (projection, softmax, weighted sum) against f64: a few fp16 ulps.
const F16_CHAIN: f32 = 8e-3;

struct Weights {
    wq: Vec<f32>,
    wk_q: Vec<i32>,
    wk_scale: Vec<f32>,
    wv_idx: Vec<i32>,
    wv_lut: Vec<f32>,
}

impl Weights {
    fn new() -> Self {
        let r16 = |v: f32| half::f16::from_f32(v).to_f32();
        let wq: Vec<f32> = values(D * D, 91, 0.5).into_iter().map(r16).collect();
        // int8 per-output-channel quantization of a random matrix, by hand
        let wk = values(D * D, 92, 0.5);
        let mut wk_q = vec![];
        let mut wk_scale = vec![];
        for o in 0..D {
            let row = &wk[o * D..(o + 1) * D];
            let s = r16(row.iter().fold(0.0f32, |m, v| m.max(v.abs())) / 127.0);
            wk_scale.push(s);
            wk_q.extend(
                row.iter()
                    .map(|v| (v / s).round().clamp(-128.0, 127.0) as i32),
            );
        }
        // 4-bit palette per half of the output channels
        let wv_idx: Vec<i32> = values(D * D, 93, 1.0)
            .iter()
            .map(|v| ((v + 1.0) * 8.0).floor().clamp(0.0, 15.0) as i32)
            .collect();
        let wv_lut: Vec<f32> = (0..32).map(|i| r16((i as f32 - 15.5) * 0.03)).collect();
        Weights {
            wq,
            wk_q,
            wk_scale,
            wv_idx,
            wv_lut,
        }
    }

    /// The dense weights the package should decode to, computed independently.
    fn dense(&self) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
        let wk = (0..D * D)
            .map(|i| half::f16::from_f32(self.wk_q[i] as f32 * self.wk_scale[i / D]).to_f32())
            .collect();
        let wv = (0..D * D)
            .map(|i| self.wv_lut[(i / D) / (D / 2) * 16 + self.wv_idx[i] as usize])
            .collect();
        (self.wq.clone(), wk, wv)
    }
}

fn attention_function(name: &str, t: usize, w: &Weights) -> Function {
    let mut f = FunctionBuilder::new(name);
    let x = f
        .input("x", TensorType::new(DType::F16, [1, D, 1, t]))
        .unwrap();
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let mask = f
        .input("mask", TensorType::new(DType::F16, [1, t, S]))
        .unwrap();
    let k_cache = f
        .state("k_cache", TensorType::new(DType::F16, [1, D, 1, S]))
        .unwrap();
    let v_cache = f
        .state("v_cache", TensorType::new(DType::F16, [1, D, 1, S]))
        .unwrap();
    let wq = f
        .constant(
            "wq",
            TensorData::f16_from_f32(vec![D, D, 1, 1], &w.wq).unwrap(),
        )
        .unwrap();
    let wk = f
        .constexpr_blockwise_shift_scale(
            "wk",
            TensorData::pack_ints(DType::I8, vec![D, D, 1, 1], &w.wk_q).unwrap(),
            TensorData::f16_from_f32(vec![D, 1, 1, 1], &w.wk_scale).unwrap(),
            None,
        )
        .unwrap();
    let wv = f
        .constexpr_lut_to_dense(
            "wv",
            TensorData::pack_ints(DType::U4, vec![D, D, 1, 1], &w.wv_idx).unwrap(),
            TensorData::f16_from_f32(vec![2, 1, 1, 1, 16, 1], &w.wv_lut).unwrap(),
        )
        .unwrap();
    let q = f.conv1x1("q", x, wq, None).unwrap();
    let k = f.conv1x1("k", x, wk, None).unwrap();
    let v = f.conv1x1("v", x, wv, None).unwrap();
    let zeros = f.const_i32("zeros", &[3], &[0, 0, 0]).unwrap();
    let begin = f.concat("begin", &[zeros, pos], 0).unwrap();
    let extent = f
        .const_i32("extent", &[4], &[1, D as i32, 1, t as i32])
        .unwrap();
    let end = f.add("end", begin, extent).unwrap();
    for (cache, new, tag) in [(k_cache, k, "k"), (v_cache, v, "v")] {
        let old = f.read_state(&format!("{tag}_old"), cache).unwrap();
        let upd = f
            .slice_update(&format!("{tag}_upd"), old, new, begin, end)
            .unwrap();
        f.write_state(&format!("{tag}_write"), cache, upd).unwrap();
    }
    let kc = f.read_state("k_all", k_cache).unwrap();
    let vc = f.read_state("v_all", v_cache).unwrap();
    let k3 = f.reshape("k3", kc, &[1, D as i64, S as i64]).unwrap();
    let v3 = f.reshape("v3", vc, &[1, D as i64, S as i64]).unwrap();
    let q3 = f.reshape("q3", q, &[1, D as i64, t as i64]).unwrap();
    let scores = f.matmul("scores", q3, k3, true, false).unwrap(); // [1, t, S]
    let scale = f
        .const_f16("scale", &[1], &[1.0 / (D as f32).sqrt()])
        .unwrap();
    let scaled = f.mul("scaled", scores, scale).unwrap();
    let masked = f.add("masked", scaled, mask).unwrap();
    let probs = f.softmax("probs", masked, -1).unwrap();
    let ctx = f.matmul("ctx", v3, probs, false, true).unwrap(); // [1, D, t]
    let y = f.reshape("y", ctx, &[1, D as i64, 1, t as i64]).unwrap();
    f.output(y).unwrap();
    f.finish().unwrap()
}

fn causal_mask(start: usize, t: usize) -> Vec<f32> {
    (0..t)
        .flat_map(|i| (0..S).map(move |j| if j <= start + i { 0.0 } else { -1e4 }))
        .collect()
}

/// Naive single-head attention over a growing cache, in f64 (values rounded to fp16 where
/// the package stores fp16 and the precision rounds).
struct Naive {
    k: Vec<Vec<f64>>,
    v: Vec<Vec<f64>>,
    round: bool,
}

impl Naive {
    fn r(&self, v: f64) -> f64 {
        if self.round {
            half::f16::from_f64(v).to_f64()
        } else {
            v
        }
    }
    fn step(&mut self, x: &[f32], t: usize, dense: &(Vec<f32>, Vec<f32>, Vec<f32>)) -> Vec<f32> {
        let proj = |w: &[f32], tok: usize| -> Vec<f64> {
            (0..D)
                .map(|o| {
                    (0..D)
                        .map(|c| w[o * D + c] as f64 * x[c * t + tok] as f64)
                        .sum()
                })
                .collect()
        };
        let mut out = vec![0.0f32; D * t];
        for tok in 0..t {
            let k = proj(&dense.1, tok).into_iter().map(|v| self.r(v)).collect();
            let v = proj(&dense.2, tok).into_iter().map(|v| self.r(v)).collect();
            self.k.push(k);
            self.v.push(v);
        }
        let start = self.k.len() - t;
        // the package holds 1/sqrt(D) as an fp16 const
        let scale = half::f16::from_f64(1.0 / (D as f64).sqrt()).to_f64();
        for tok in 0..t {
            let q = proj(&dense.0, tok);
            let visible = start + tok + 1;
            let scores: Vec<f64> = (0..visible)
                .map(|j| q.iter().zip(&self.k[j]).map(|(a, b)| a * b).sum::<f64>() * scale)
                .collect();
            let m = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let e: Vec<f64> = scores.iter().map(|s| (s - m).exp()).collect();
            let z: f64 = e.iter().sum();
            for d in 0..D {
                out[d * t + tok] =
                    (0..visible).map(|j| e[j] / z * self.v[j][d]).sum::<f64>() as f32;
            }
        }
        out
    }
}

fn run_inputs(x: &[f32], t: usize, pos: usize) -> std::collections::HashMap<String, Tensor> {
    inputs(vec![
        ("x", Tensor::f16(vec![1, D, 1, t], x.to_vec()).unwrap()),
        ("pos", Tensor::i32(vec![1], &[pos as i32]).unwrap()),
        (
            "mask",
            Tensor::f16(vec![1, t, S], causal_mask(pos, t)).unwrap(),
        ),
    ])
}

fn decode_through_the_whole_context(precision: Precision, tol: f32) {
    let w = Weights::new();
    let dense = w.dense();
    let loaded = load(
        vec![
            attention_function("prefill", PREFILL, &w),
            attention_function("decode", 1, &w),
        ],
        precision,
    );
    let pkg = &loaded.package;
    for function in ["prefill", "decode"] {
        assert_eq!(
            pkg.in_place_state_updates(function).unwrap(),
            vec!["k_upd", "v_upd"]
        );
    }
    let mut state: State = pkg.new_state("prefill").unwrap();
    assert_eq!(
        state.get("k_cache").unwrap().data,
        vec![0.0; D * S],
        "fresh state is zeros"
    );
    let mut naive = Naive {
        k: vec![],
        v: vec![],
        round: precision == Precision::Fp16,
    };
    let r16 = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|a| half::f16::from_f32(a).to_f32())
            .collect()
    };
    let x = r16(values(D * PREFILL, 94, 1.0));
    let out = pkg
        .predict("prefill", &run_inputs(&x, PREFILL, 0), &mut state)
        .unwrap();
    assert_close(
        &format!("{precision} prefill"),
        &out["y"].data,
        &naive.step(&x, PREFILL, &dense),
        tol,
    );
    // decode through to the last slot of the context (slice_update at the very end)
    for pos in PREFILL..S {
        let x = r16(values(D, 100 + pos as u64, 1.0));
        let out = pkg
            .predict("decode", &run_inputs(&x, 1, pos), &mut state)
            .unwrap();
        assert_close(
            &format!("{precision} decode pos {pos}"),
            &out["y"].data,
            &naive.step(&x, 1, &dense),
            tol,
        );
    }
    // the cache holds every key, channel-major [1, D, 1, S]
    let want_k: Vec<f32> = (0..D)
        .flat_map(|d| naive.k.iter().map(move |k| k[d] as f32))
        .collect();
    assert_close(
        &format!("{precision} k cache"),
        &state.get("k_cache").unwrap().data,
        &want_k,
        tol,
    );
    if precision == Precision::Fp16 {
        let k = &state.get("k_cache").unwrap().data;
        assert!(
            k.iter().all(|&v| half::f16::from_f32(v).to_f32() == v),
            "states hold fp16 values"
        );
    }
    // one past the end: a named error, never a silent truncation
    let x = vec![0.0; D];
    let before = state.clone();
    let err = pkg
        .predict("decode", &run_inputs(&x, 1, S), &mut state)
        .unwrap_err();
    assert_eq!(state, before, "a failed write leaves the cache as it was");
    let msg = err.to_string();
    assert!(matches!(err, ExecError::Op { .. }), "{msg}");
    assert!(
        msg.contains("k_upd")
            && msg.contains("slice_update")
            && msg.contains("decode")
            && msg.contains("test.mlpackage"),
        "{msg}"
    );
}

#[test]
fn stateful_prefill_then_decode_fp32() {
    decode_through_the_whole_context(Precision::Fp32, F32_SUM);
}

#[test]
fn stateful_prefill_then_decode_fp16() {
    decode_through_the_whole_context(Precision::Fp16, F16_CHAIN);
}

#[test]
fn signature_errors_name_the_input_function_and_package() {
    let w = Weights::new();
    let loaded = load(vec![attention_function("decode", 1, &w)], Precision::Fp16);
    let pkg = &loaded.package;
    let mut state = pkg.new_state("decode").unwrap();
    let good = run_inputs(&[0.0; D], 1, 0);
    let check = |err: ExecError, needles: &[&str]| {
        let msg = err.to_string();
        for n in needles {
            assert!(msg.contains(n), "`{n}` missing from: {msg}");
        }
    };
    let mut missing = good.clone();
    missing.remove("pos");
    check(
        pkg.predict("decode", &missing, &mut state).unwrap_err(),
        &["missing input `pos`", "decode", "test.mlpackage"],
    );
    let mut wrong_shape = good.clone();
    wrong_shape.insert(
        "x".into(),
        Tensor::f16(vec![1, D, 1, 2], vec![0.0; 2 * D]).unwrap(),
    );
    check(
        pkg.predict("decode", &wrong_shape, &mut state).unwrap_err(),
        &["input `x`", "[1, 8, 1, 2]", "decode"],
    );
    let mut wrong_dtype = good.clone();
    wrong_dtype.insert(
        "x".into(),
        Tensor::f32(vec![1, D, 1, 1], vec![0.0; D]).unwrap(),
    );
    check(
        pkg.predict("decode", &wrong_dtype, &mut state).unwrap_err(),
        &["input `x`", "fp32", "fp16"],
    );
    let mut extra = good.clone();
    extra.insert("tokens".into(), Tensor::i32(vec![1], &[3]).unwrap());
    check(
        pkg.predict("decode", &extra, &mut state).unwrap_err(),
        &["unexpected input `tokens`"],
    );
    check(
        pkg.predict("prefill", &good, &mut state).unwrap_err(),
        &["no function `prefill`", "decode"],
    );
    check(
        pkg.new_state("prefill").unwrap_err(),
        &["no function `prefill`"],
    );
    let mut bad_pos = good.clone();
    bad_pos.insert(
        "pos".into(),
        Tensor {
            dtype: DType::I32,
            shape: vec![1],
            data: vec![0.5],
        },
    );
    check(
        pkg.predict("decode", &bad_pos, &mut state).unwrap_err(),
        &["input `pos`", "not an exact int32"],
    );
    check(
        pkg.predict("decode", &good, &mut State::default())
            .unwrap_err(),
        &["state `k_cache`", "absent"],
    );
    let mut small = State::default();
    small.insert("k_cache", Tensor::zeros(DType::F16, vec![1, D, 1, 4]));
    small.insert("v_cache", Tensor::zeros(DType::F16, vec![1, D, 1, S]));
    check(
        pkg.predict("decode", &good, &mut small).unwrap_err(),
        &["state `k_cache`", "[1, 8, 1, 4]"],
    );
    // negative positions are out of range too
    let err = pkg
        .predict(
            "decode",
            &run_inputs(&[0.0; D], 1, 0)
                .into_iter()
                .map(|(k, v)| {
                    if k == "pos" {
                        (k, Tensor::i32(vec![1], &[-1]).unwrap())
                    } else {
                        (k, v)
                    }
                })
                .collect(),
            &mut state,
        )
        .unwrap_err();
    check(err, &["slice_update", "[0, 0, 0, -1]"]);
}

#[test]
fn missing_package_is_a_load_error_naming_the_path() {
    let err = match anemone_exec::LoadedPackage::load(
        "/nonexistent/chunk.mlpackage".as_ref(),
        Precision::Fp16,
    ) {
        Err(e) => e,
        Ok(_) => panic!("loading a missing package succeeded"),
    };
    assert!(matches!(err, ExecError::Load { .. }));
    assert!(
        err.to_string().contains("/nonexistent/chunk.mlpackage"),
        "{err}"
    );
}

/// A cache write whose old value is also used elsewhere runs unfused (copy, update, write)
/// and gives the same state as the fused in-place path.
#[test]
fn unfused_slice_update_keeps_the_old_value_for_its_other_users() {
    let mut f = FunctionBuilder::new("main");
    let upd = f
        .input("upd", TensorType::new(DType::F16, [1, 4, 1, 1]))
        .unwrap();
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let cache = f
        .state("cache", TensorType::new(DType::F16, [1, 4, 1, 8]))
        .unwrap();
    let zeros = f.const_i32("zeros", &[3], &[0, 0, 0]).unwrap();
    let begin = f.concat("begin", &[zeros, pos], 0).unwrap();
    let extent = f.const_i32("extent", &[4], &[1, 4, 1, 1]).unwrap();
    let end = f.add("end", begin, extent).unwrap();
    let old = f.read_state("old", cache).unwrap();
    let new = f.slice_update("new", old, upd, begin, end).unwrap();
    f.write_state("write", cache, new).unwrap();
    let old_sum = f.reduce_sum("old_sum", old, &[1, 3], false).unwrap();
    f.output(old_sum).unwrap();
    f.output(new).unwrap();
    let loaded = load(vec![f.finish().unwrap()], Precision::Fp16);
    let pkg = &loaded.package;
    assert!(pkg.in_place_state_updates("main").unwrap().is_empty());
    let mut state = pkg.new_state("main").unwrap();
    let mut want = vec![0.0f32; 32];
    for (step, p) in [3usize, 7, 0].into_iter().enumerate() {
        let u: Vec<f32> = (0..4).map(|c| (step * 4 + c) as f32 + 0.5).collect();
        let old_total: f32 = want.iter().sum();
        for c in 0..4 {
            want[c * 8 + p] = u[c];
        }
        let ins = inputs(vec![
            ("upd", Tensor::f16(vec![1, 4, 1, 1], u).unwrap()),
            ("pos", Tensor::i32(vec![1], &[p as i32]).unwrap()),
        ]);
        let out = pkg.predict("main", &ins, &mut state).unwrap();
        assert_eq!(
            out["old_sum"].data,
            vec![old_total],
            "step {step}: the old value is intact"
        );
        assert_eq!(out["new"].data, want, "step {step}");
        assert_eq!(state.get("cache").unwrap().data, want, "step {step}");
    }
    let ins = inputs(vec![
        ("upd", Tensor::f16(vec![1, 4, 1, 1], vec![1.0; 4]).unwrap()),
        ("pos", Tensor::i32(vec![1], &[8]).unwrap()),
    ]);
    let err = pkg
        .predict("main", &ins, &mut state)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("`new` (slice_update)") && err.contains("[0, 0, 0, 8]"),
        "{err}"
    );
    assert_eq!(state.get("cache").unwrap().data, want);
}

/// One state holding K and V (`[2, C, 1, S]`) written by two chained slice_updates, as the
/// converter's unified layout does: both run in place, and match a naive cache.
#[test]
fn chained_writes_into_a_unified_state_run_in_place() {
    let mut f = FunctionBuilder::new("main");
    let k = f
        .input("k", TensorType::new(DType::F16, [1, 4, 1, 1]))
        .unwrap();
    let v = f
        .input("v", TensorType::new(DType::F16, [1, 4, 1, 1]))
        .unwrap();
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let kv = f
        .state("kv", TensorType::new(DType::F16, [2, 4, 1, 8]))
        .unwrap();
    let zeros = f.const_i32("zeros", &[3], &[0, 0, 0]).unwrap();
    let ones = f.const_i32("ones", &[3], &[1, 0, 0]).unwrap();
    let extent = f.const_i32("extent", &[4], &[1, 4, 1, 1]).unwrap();
    let k_begin = f.concat("k_begin", &[zeros, pos], 0).unwrap();
    let v_begin = f.concat("v_begin", &[ones, pos], 0).unwrap();
    let k_end = f.add("k_end", k_begin, extent).unwrap();
    let v_end = f.add("v_end", v_begin, extent).unwrap();
    let old = f.read_state("old", kv).unwrap();
    let with_k = f.slice_update("k_upd", old, k, k_begin, k_end).unwrap();
    let with_v = f.slice_update("v_upd", with_k, v, v_begin, v_end).unwrap();
    f.write_state("write", kv, with_v).unwrap();
    let all = f.read_state("all", kv).unwrap();
    let total = f.reduce_sum("total", all, &[0, 1, 2, 3], false).unwrap();
    f.output(total).unwrap();
    let loaded = load(vec![f.finish().unwrap()], Precision::Fp16);
    let pkg = &loaded.package;
    assert_eq!(
        pkg.in_place_state_updates("main").unwrap(),
        vec!["k_upd", "v_upd"]
    );
    let mut state = pkg.new_state("main").unwrap();
    let mut want = vec![0.0f32; 64];
    for p in 0..8usize {
        let kv_vals: Vec<f32> = (0..8).map(|i| (p * 8 + i) as f32 * 0.25).collect();
        for c in 0..4 {
            want[c * 8 + p] = kv_vals[c];
            want[32 + c * 8 + p] = kv_vals[4 + c];
        }
        let ins = inputs(vec![
            (
                "k",
                Tensor::f16(vec![1, 4, 1, 1], kv_vals[..4].to_vec()).unwrap(),
            ),
            (
                "v",
                Tensor::f16(vec![1, 4, 1, 1], kv_vals[4..].to_vec()).unwrap(),
            ),
            ("pos", Tensor::i32(vec![1], &[p as i32]).unwrap()),
        ]);
        let out = pkg.predict("main", &ins, &mut state).unwrap();
        assert_eq!(state.get("kv").unwrap().data, want, "position {p}");
        assert_eq!(
            out["total"].data,
            vec![want.iter().sum::<f32>()],
            "position {p}"
        );
    }
}
