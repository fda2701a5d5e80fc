//! The converter's attention pattern: a KV chain whose updated value is also read (sliced per
//! head for matmuls, summed) before the state is written back. The chain runs in place, the
//! slices are windows of the state, and every result equals the naive computation and the
//! observed run (which materialises every value).

mod common;

use anemone_exec::{OpOutput, Precision, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorType};
use common::*;

const D: usize = 4; // head dim
const S: usize = 8; // context

/// `kv [2, 1, D, S]` (K row 0, V row 1): write k, v at `pos`, then per head
/// `out = V · (qᵀ · K)ᵀ` over the whole context and `total = Σ kv`; `widen` casts q and the
/// slices to f32 first, as fp32 programs do.
fn attention(widen: bool) -> Function {
    let mut f = FunctionBuilder::new("main");
    let col = |f: &mut FunctionBuilder, name: &str| {
        f.input(name, TensorType::new(DType::F16, [1, 1, D, 1]))
            .unwrap()
    };
    let (q, k, v) = (col(&mut f, "q"), col(&mut f, "k"), col(&mut f, "v"));
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let kv = f
        .state("kv", TensorType::new(DType::F16, [2, 1, D, S]))
        .unwrap();
    let with_v = kv_update(&mut f, kv, k, v, pos, D, 1);
    let (d, s) = (D as i64, S as i64);
    let ks = f
        .slice_by_index("ks", with_v, &[0, 0, 0, 0], &[1, 1, d, s], None)
        .unwrap();
    let vs = f
        .slice_by_index("vs", with_v, &[1, 0, 0, 0], &[2, 1, d, s], None)
        .unwrap();
    let (q, ks, vs) = if widen {
        (
            f.cast("q32", q, DType::F32).unwrap(),
            f.cast("ks32", ks, DType::F32).unwrap(),
            f.cast("vs32", vs, DType::F32).unwrap(),
        )
    } else {
        (q, ks, vs)
    };
    let scores = f.matmul("scores", q, ks, true, false).unwrap();
    let out = f.matmul("out", vs, scores, false, true).unwrap();
    let total = f.reduce_sum("total", with_v, &[0, 1, 2, 3], false).unwrap();
    f.write_state("write", kv, with_v).unwrap();
    f.output(out).unwrap();
    f.output(total).unwrap();
    f.finish().unwrap()
}

#[test]
fn chain_readers_and_state_windows_match_the_naive_cache() {
    for (widen, precision) in [
        (false, Precision::Fp16),
        (true, Precision::Fp16),
        (true, Precision::Fp32),
    ] {
        check(widen, precision);
    }
}

fn check(widen: bool, precision: Precision) {
    let loaded = load(vec![attention(widen)], precision);
    let pkg = &loaded.package;
    assert_eq!(
        pkg.in_place_state_updates("main").unwrap(),
        vec!["k_upd", "v_upd"],
        "the chain is read before the write, and still runs in place"
    );
    let mut state = pkg.new_state("main").unwrap();
    let mut observed_state = state.clone();
    // small multiples of 1/4: every product and sum is exact in fp16 and f32
    let (mut kc, mut vc) = (vec![[0.0f32; D]; S], vec![[0.0f32; D]; S]);
    for p in 0..S {
        let vals = |seed: usize| -> Vec<f32> {
            (0..D)
                .map(|i| ((seed * 7 + i * 3 + p * 5) % 9) as f32 * 0.25 - 1.0)
                .collect()
        };
        let (q, k, v) = (vals(1), vals(2), vals(3));
        kc[p].copy_from_slice(&k);
        vc[p].copy_from_slice(&v);
        let ins = inputs(vec![
            ("q", Tensor::f16(vec![1, 1, D, 1], q.clone()).unwrap()),
            ("k", Tensor::f16(vec![1, 1, D, 1], k).unwrap()),
            ("v", Tensor::f16(vec![1, 1, D, 1], v).unwrap()),
            ("pos", Tensor::i32(vec![1], &[p as i32]).unwrap()),
        ]);
        let scores: Vec<f32> = (0..S)
            .map(|j| (0..D).map(|i| q[i] * kc[j][i]).sum())
            .collect();
        let want: Vec<f32> = (0..D)
            .map(|i| (0..S).map(|j| vc[j][i] * scores[j]).sum())
            .collect();
        let out = pkg.predict("main", &ins, &mut state).unwrap();
        assert_eq!(out["out"].data, want, "position {p}");
        let total: f32 = kc.iter().chain(&vc).flatten().sum();
        assert_eq!(out["total"].data, vec![total], "position {p}");
        // the observed run materialises the windows: same outputs, same state
        let mut seen = Vec::new();
        let mut observer = |o: OpOutput<'_>| seen.push(o.op.to_string());
        let observed = pkg
            .predict_observed("main", &ins, &mut observed_state, &mut observer)
            .unwrap();
        assert_eq!(observed["out"].data, out["out"].data, "position {p}");
        assert_eq!(observed_state, state, "position {p}");
        assert!(seen.iter().any(|s| s == "ks"), "{seen:?}");
    }
    let mut want_kv = vec![0.0f32; 2 * D * S];
    for p in 0..S {
        for i in 0..D {
            want_kv[i * S + p] = kc[p][i];
            want_kv[D * S + i * S + p] = vc[p][i];
        }
    }
    assert_eq!(state.get("kv").unwrap().data, want_kv);
}
