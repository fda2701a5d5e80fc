//! A decode step's per-head attention (one query: `matmul → add mask → reduce_max → sub →
//! softmax → matmul`, several heads over shared K/V): the executor runs the heads as one
//! kernel each over its team, and its outputs are bit for bit those of the observed run, which
//! runs every op.

mod common;

use anemone_backend::Backend;
use anemone_exec::{ExecutorBackend, OpOutput, Precision, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorType};
use common::*;

const D: usize = 64; // head dim
const S: usize = 160; // context slots
const HEADS: usize = 3;

fn attention(dtype: DType) -> Function {
    let mut f = FunctionBuilder::new("main");
    let mut input =
        |name: &str, shape: [usize; 4]| f.input(name, TensorType::new(dtype, shape)).unwrap();
    let qs: Vec<_> = (0..HEADS)
        .map(|h| input(&format!("q{h}"), [1, 1, D, 1]))
        .collect();
    let k = input("k", [1, 1, D, S]);
    let v = input("v", [1, 1, D, S]);
    let mask = input("mask", [1, 1, 1, S]);
    let outs = attention_heads(&mut f, &qs, k, v, mask);
    let all = f.concat("heads", &outs, 2).unwrap();
    f.output(all).unwrap();
    f.finish().unwrap()
}

#[test]
fn decode_heads_give_the_observed_values_bit_for_bit() {
    for (dtype, precision) in [
        (DType::F16, Precision::Fp16),
        (DType::F16, Precision::Fp32),
        (DType::F32, Precision::Fp32),
    ] {
        let loaded = load(vec![attention(dtype)], precision);
        let pkg = &loaded.package;
        for position in [0usize, 37, 100, S - 1] {
            let k = values(D * S, 1, 2.0);
            let v = values(D * S, 2, 1.0);
            let mask: Vec<f32> = (0..S)
                .map(|j| if j <= position { 0.0 } else { -1e4 })
                .collect();
            let t = |shape: Vec<usize>, data: Vec<f32>| match dtype {
                DType::F16 => Tensor::f16(shape, data).unwrap(),
                _ => Tensor::f32(shape, data).unwrap(),
            };
            let mut list = vec![
                ("k", t(vec![1, 1, D, S], k)),
                ("v", t(vec![1, 1, D, S], v)),
                ("mask", t(vec![1, 1, 1, S], mask)),
            ];
            let names: Vec<String> = (0..HEADS).map(|h| format!("q{h}")).collect();
            for (h, name) in names.iter().enumerate() {
                list.push((name, t(vec![1, 1, D, 1], values(D, 3 + h as u64, 1.5))));
            }
            let ins = inputs(list);
            let mut state = pkg.new_state("main").unwrap();
            let out = pkg.predict("main", &ins, &mut state).unwrap();
            let mut seen = 0;
            let mut observer = |_: OpOutput<'_>| seen += 1;
            let observed = pkg
                .predict_observed("main", &ins, &mut state, &mut observer)
                .unwrap();
            assert_eq!(seen, 6 * HEADS + 1, "the observed run runs every op");
            let bits = |t: &Tensor| t.data.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(
                bits(&out["heads"]),
                bits(&observed["heads"]),
                "{dtype:?} {precision:?} position {position}"
            );
            // the same through a two-thread backend (the heads spread over its team)
            let backend = ExecutorBackend::with_threads(precision, 2).unwrap();
            let via_backend = backend.predict(pkg, "main", &ins, &mut state).unwrap();
            assert_eq!(bits(&via_backend["heads"]), bits(&observed["heads"]));
        }
    }
}

#[test]
fn only_functions_that_never_fork_run_without_the_pool() {
    let loaded = load(vec![attention(DType::F16)], Precision::Fp16);
    assert!(loaded.package.runs_without_pool("main").unwrap());
    let mut f = FunctionBuilder::new("main");
    let a = f
        .input("a", TensorType::new(DType::F16, [1, 1, 64, 512]))
        .unwrap();
    let b = f
        .input("b", TensorType::new(DType::F16, [1, 1, 512, 64]))
        .unwrap();
    let wide = f.matmul("wide", a, b, false, false).unwrap();
    f.output(wide).unwrap();
    let loaded = load(vec![f.finish().unwrap()], Precision::Fp16);
    assert!(!loaded.package.runs_without_pool("main").unwrap());
}
