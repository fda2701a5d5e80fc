//! The converter's per-head attention (`matmul → add mask → reduce_max → sub → softmax →
//! matmul`) over a prefill window that has filled only part of the context: the executor runs
//! it over the filled columns only, and its outputs are bit for bit those of the observed run,
//! which runs every op over every column.

mod common;

use anemone_exec::{OpOutput, Precision, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorType};
use common::*;

const D: usize = 40; // head dim
const T: usize = 8; // queries in the window
const S: usize = 200; // context slots

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

#[test]
fn a_partly_filled_window_gives_the_observed_values_bit_for_bit() {
    for (dtype, precision) in [
        (DType::F16, Precision::Fp16),
        (DType::F16, Precision::Fp32),
        (DType::F32, Precision::Fp32),
    ] {
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
            let mask: Vec<f32> = (0..T * S)
                .map(|i| if i % S <= start + i / S { 0.0 } else { -1e4 })
                .collect();
            let t = |shape: Vec<usize>, data: Vec<f32>| match dtype {
                DType::F16 => Tensor::f16(shape, data).unwrap(),
                _ => Tensor::f32(shape, data).unwrap(),
            };
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
