//! The converter's per-head attention (`matmul → add mask → reduce_max → sub → softmax →
//! matmul`) over a prefill window that has filled only part of the context: the executor runs
//! it over the filled columns only, and its outputs are bit for bit those of the observed run,
//! which runs every op over every column.

mod common;

use anemone_backend::Backend;
use anemone_exec::{ExecutorBackend, OpOutput, Precision, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorType};
use common::*;

const D: usize = 40; // head dim
const T: usize = 8; // queries in the window
const S: usize = 200; // context slots
const HEADS: usize = 3; // query heads per KV head in the multi-head program

fn attention(dtype: DType) -> Function {
    let mut f = FunctionBuilder::new("main");
    let mut input =
        |name: &str, shape: [usize; 4]| f.input(name, TensorType::new(dtype, shape)).unwrap();
    let q = input("q", [1, 1, D, T]);
    let k = input("k", [1, 1, D, S]);
    let v = input("v", [1, 1, D, S]);
    let mask = input("mask", [1, 1, T, S]);
    let scores = f.matmul("scores", q, k, true, false).unwrap();
    let masked = f.add("masked", scores, mask).unwrap();
    let row_max = f.reduce_max("row_max", masked, &[-1], true).unwrap();
    let shifted = f.sub("shifted", masked, row_max).unwrap();
    let probs = f.softmax("probs", shifted, -1).unwrap();
    let out = f.matmul("attn", v, probs, false, true).unwrap();
    f.output(out).unwrap();
    f.finish().unwrap()
}

/// (the programs' dtype, the executor's precision)
const MODES: [(DType, Precision); 3] = [
    (DType::F16, Precision::Fp16),
    (DType::F16, Precision::Fp32),
    (DType::F32, Precision::Fp32),
];

/// The window's causal mask `[T × S]`, its first query at slot `start`.
fn causal_mask(start: usize) -> Vec<f32> {
    Dims::WIDE.causal_mask(start)
}

/// A multi-head program's head dim, queries in the window and context slots.
#[derive(Clone, Copy, Debug)]
struct Dims {
    d: usize,
    t: usize,
    s: usize,
}

impl Dims {
    const WIDE: Dims = Dims { d: D, t: T, s: S };
    /// Heads whose output product (`d·t ≤ 256` values, probabilities read along their rows)
    /// takes `gemm`'s horizontal kernels in the program.
    const SMALL: Dims = Dims { d: 16, t: 4, s: 40 };

    fn causal_mask(self, start: usize) -> Vec<f32> {
        let Dims { t, s, .. } = self;
        (0..t * s)
            .map(|i| if i % s <= start + i / s { 0.0 } else { -1e4 })
            .collect()
    }
}

/// An input tensor of the program's dtype.
fn typed(dtype: DType, shape: Vec<usize>, data: Vec<f32>) -> Tensor {
    match dtype {
        DType::F16 => Tensor::f16(shape, data).unwrap(),
        _ => Tensor::f32(shape, data).unwrap(),
    }
}

#[test]
fn a_partly_filled_window_gives_the_observed_values_bit_for_bit() {
    for (dtype, precision) in MODES {
        let loaded = load(vec![attention(dtype)], precision);
        let pkg = &loaded.package;
        // (first filled position of the window, stale values beyond it)
        for (start, stale) in [(0usize, false), (20, true), (57, true)] {
            let mut k = values(D * S, 1, 2.0);
            let mut v = values(D * S, 2, 1.0);
            if !stale {
                for i in 0..D {
                    k[i * S + start + T..(i + 1) * S].fill(0.0);
                    v[i * S + start + T..(i + 1) * S].fill(0.0);
                }
            }
            let mask = causal_mask(start);
            let t = |shape: Vec<usize>, data: Vec<f32>| typed(dtype, shape, data);
            let ins = inputs(vec![
                ("q", t(vec![1, 1, D, T], values(D * T, 3, 1.5))),
                ("k", t(vec![1, 1, D, S], k)),
                ("v", t(vec![1, 1, D, S], v)),
                ("mask", t(vec![1, 1, T, S], mask)),
            ]);
            let mut state = pkg.new_state("main").unwrap();
            let out = pkg.predict("main", &ins, &mut state).unwrap();
            let mut seen = 0;
            let mut observer = |_: OpOutput<'_>| seen += 1;
            let observed = pkg
                .predict_observed("main", &ins, &mut state, &mut observer)
                .unwrap();
            assert_eq!(seen, 6, "the observed run runs every op");
            let bits = |t: &Tensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&out["attn"]),
                bits(&observed["attn"]),
                "{dtype:?} {precision:?} window at {start}"
            );
        }
    }
}

/// Two KV heads of [`HEADS`] query heads each, as the converter writes a prefill step's
/// attention (the heads' outputs concatenated along channels).
fn grouped_attention(dtype: DType, dims: Dims) -> Function {
    let Dims { d, t, s } = dims;
    let mut f = FunctionBuilder::new("main");
    let mut input =
        |name: &str, shape: [usize; 4]| f.input(name, TensorType::new(dtype, shape)).unwrap();
    let mask = input("mask", [1, 1, t, s]);
    let mut kv_heads = Vec::new();
    for g in 0..2 {
        let k = input(&format!("k{g}"), [1, 1, d, s]);
        let v = input(&format!("v{g}"), [1, 1, d, s]);
        let qs: Vec<_> = (0..HEADS)
            .map(|h| input(&format!("q{g}_{h}"), [1, 1, d, t]))
            .collect();
        kv_heads.push((qs, k, v));
    }
    let mut outs = Vec::new();
    for (g, (qs, k, v)) in kv_heads.into_iter().enumerate() {
        outs.extend(attention_heads_named(
            &mut f,
            &format!("g{g}h"),
            &qs,
            k,
            v,
            mask,
        ));
    }
    let all = f.concat("heads", &outs, 2).unwrap();
    f.output(all).unwrap();
    f.finish().unwrap()
}

#[test]
fn prefill_heads_side_by_side_give_the_observed_values_bit_for_bit() {
    // first position of the window: filled columns only (0, 57), or every column (the visible
    // ones round up to all: 192; and every window of the small heads, whose output product
    // keeps them off the filled columns)
    for (dims, starts) in [
        (Dims::WIDE, &[0usize, 57, 192][..]),
        (Dims::SMALL, &[0, 20]),
    ] {
        for (dtype, precision) in MODES {
            for &start in starts {
                heads_side_by_side_match_the_observed_run(dims, dtype, precision, start);
            }
        }
    }
}

fn heads_side_by_side_match_the_observed_run(
    dims: Dims,
    dtype: DType,
    precision: Precision,
    start: usize,
) {
    let Dims { d, t, s } = dims;
    let loaded = load(vec![grouped_attention(dtype, dims)], precision);
    let pkg = &loaded.package;
    let backend = ExecutorBackend::with_threads(precision, 2).unwrap();
    let typed = |shape: Vec<usize>, data: Vec<f32>| typed(dtype, shape, data);
    let mut named = vec![(
        "mask".to_string(),
        typed(vec![1, 1, t, s], dims.causal_mask(start)),
    )];
    for g in 0..2u64 {
        let k = typed(vec![1, 1, d, s], values(d * s, 1 + g, 2.0));
        named.push((format!("k{g}"), k));
        let v = typed(vec![1, 1, d, s], values(d * s, 3 + g, 1.0));
        named.push((format!("v{g}"), v));
        for h in 0..HEADS as u64 {
            let q = values(d * t, 10 + 4 * g + h, 1.5);
            named.push((format!("q{g}_{h}"), typed(vec![1, 1, d, t], q)));
        }
    }
    let ins = inputs(named.iter().map(|(n, t)| (n.as_str(), t.clone())).collect());
    let mut state = pkg.new_state("main").unwrap();
    let via_team = backend.predict(pkg, "main", &ins, &mut state).unwrap();
    let mut seen = 0;
    let mut observer = |_: OpOutput<'_>| seen += 1;
    let observed = pkg
        .predict_observed("main", &ins, &mut state, &mut observer)
        .unwrap();
    assert_eq!(seen, 6 * 2 * HEADS + 1, "the observed run runs every op");
    let bits = |t: &Tensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&via_team["heads"]),
        bits(&observed["heads"]),
        "{dims:?} {dtype:?} {precision:?} window at {start}"
    );
}
