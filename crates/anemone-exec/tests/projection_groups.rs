//! Adjacent single-token projections of one input (a layer's q/k/v, gate/up) run as one
//! parallel region: every output equals, bit for bit, its own dot per row plus its bias,
//! rounded as its op's output, on the team (several widths) or not, observed or not.

mod common;

use std::collections::HashMap;

use anemone_backend::Backend;
use anemone_exec::kernels::simd::{dot_f16_kernel, dot_f32_kernel};
use anemone_exec::{ExecutorBackend, Precision, Tensor};
use anemone_mil::{DType, Function, FunctionBuilder, TensorType};
use common::*;

const C: usize = 267; // input width (not a multiple of 8)
const ROWS: [usize; 3] = [400, 300, 333]; // q, k, v: together above the parallel threshold
const LIN: usize = 700; // rows of the two linears

struct Weights {
    qkv: [Vec<f32>; 3],
    bias: [Vec<f32>; 2], // of q and v
    out: Vec<f32>,       // a projection of q (another input: not grouped with q/k/v)
    lin: [Vec<f32>; 2],
}

fn weights(precision: Precision) -> Weights {
    let r = |v: Vec<f32>| -> Vec<f32> {
        match precision {
            Precision::Fp16 => v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect(),
            Precision::Fp32 => v,
        }
    };
    Weights {
        qkv: [0, 1, 2].map(|i| r(values(ROWS[i] * C, 40 + i as u64, 0.3))),
        bias: [r(values(ROWS[0], 50, 0.5)), r(values(ROWS[2], 51, 0.5))],
        out: r(values(C * ROWS[0], 52, 0.1)),
        lin: [0, 1].map(|i| r(values(LIN * C, 60 + i as u64, 0.3))),
    }
}

/// q/k/v 1×1 convs of `x`, a conv of q, and (fp16 only) two fp16 linears of `x2`.
fn program(w: &Weights, precision: Precision) -> Function {
    let dtype = match precision {
        Precision::Fp16 => DType::F16,
        Precision::Fp32 => DType::F32,
    };
    let mut f = FunctionBuilder::new("main");
    let x = f.input("x", TensorType::new(dtype, [1, C, 1, 1])).unwrap();
    let konst = |f: &mut FunctionBuilder, name: &str, shape: &[usize], v: &[f32]| match dtype {
        DType::F16 => f.const_f16(name, shape, v).unwrap(),
        _ => f.const_f32(name, shape, v).unwrap(),
    };
    let names = ["q", "k", "v"];
    let mut outs = Vec::new();
    for i in 0..3 {
        let wv = konst(&mut f, &format!("w{i}"), &[ROWS[i], C, 1, 1], &w.qkv[i]);
        let bv = match i {
            0 => Some(konst(&mut f, "bq", &[ROWS[0]], &w.bias[0])),
            2 => Some(konst(&mut f, "bv", &[ROWS[2]], &w.bias[1])),
            _ => None,
        };
        outs.push(f.conv1x1(names[i], x, wv, bv).unwrap());
    }
    let wo = konst(&mut f, "wo", &[C, ROWS[0], 1, 1], &w.out);
    let o = f.conv1x1("o", outs[0], wo, None).unwrap();
    for v in outs.into_iter().chain([o]) {
        f.output(v).unwrap();
    }
    if dtype == DType::F16 {
        let x2 = f.input("x2", TensorType::new(dtype, [1, C])).unwrap();
        for i in 0..2 {
            let wl = konst(&mut f, &format!("wl{i}"), &[LIN, C], &w.lin[i]);
            let y = f.linear(&format!("l{i}"), x2, wl, None).unwrap();
            f.output(y).unwrap();
        }
    }
    f.finish().unwrap()
}

/// Each projection as its own step computes it: one dot per row, the bias added, rounded.
fn expected(w: &Weights, x: &[f32], x2: &[f32], precision: Precision) -> HashMap<String, Vec<f32>> {
    let round = |v: f32| match precision {
        Precision::Fp16 => half::f16::from_f32(v).to_f32(),
        Precision::Fp32 => v,
    };
    let project = |weight: &[f32], rows: usize, x: &[f32], bias: Option<&[f32]>| -> Vec<f32> {
        let k = x.len();
        (0..rows)
            .map(|r| {
                let row = &weight[r * k..(r + 1) * k];
                let dot = match precision {
                    Precision::Fp16 => {
                        let h: Vec<half::f16> =
                            row.iter().map(|&v| half::f16::from_f32(v)).collect();
                        dot_f16_kernel()(&h, x)
                    }
                    Precision::Fp32 => dot_f32_kernel()(row, x),
                };
                round(dot + bias.map_or(0.0, |b| b[r]))
            })
            .collect()
    };
    let mut want = HashMap::new();
    let q = project(&w.qkv[0], ROWS[0], x, Some(&w.bias[0]));
    want.insert("o".to_string(), project(&w.out, C, &q, None));
    want.insert("q".to_string(), q);
    want.insert("k".to_string(), project(&w.qkv[1], ROWS[1], x, None));
    want.insert(
        "v".to_string(),
        project(&w.qkv[2], ROWS[2], x, Some(&w.bias[1])),
    );
    if precision == Precision::Fp16 {
        for i in 0..2 {
            want.insert(format!("l{i}"), project(&w.lin[i], LIN, x2, None));
        }
    }
    want
}

#[test]
fn grouped_projections_equal_their_own_steps_bit_for_bit() {
    for precision in [Precision::Fp16, Precision::Fp32] {
        let w = weights(precision);
        let round = |v: Vec<f32>| -> Vec<f32> {
            match precision {
                Precision::Fp16 => v.iter().map(|&a| half::f16::from_f32(a).to_f32()).collect(),
                Precision::Fp32 => v,
            }
        };
        let (x, x2) = (round(values(C, 70, 1.0)), round(values(C, 71, 1.0)));
        let want = expected(&w, &x, &x2, precision);
        let loaded = load(vec![program(&w, precision)], precision);
        let dtype = match precision {
            Precision::Fp16 => DType::F16,
            Precision::Fp32 => DType::F32,
        };
        let mut list = vec![(
            "x",
            Tensor::new(dtype, vec![1, C, 1, 1], x.clone()).unwrap(),
        )];
        if precision == Precision::Fp16 {
            list.push(("x2", Tensor::new(dtype, vec![1, C], x2.clone()).unwrap()));
        }
        let feed = inputs(list);
        let check = |what: &str, out: &HashMap<String, Tensor>| {
            for (name, values) in &want {
                let got = &out[name].data;
                let same = got.len() == values.len()
                    && got
                        .iter()
                        .zip(values)
                        .all(|(a, b)| a.to_bits() == b.to_bits());
                assert!(same, "{precision:?} {what}: output {name} differs");
            }
        };
        let mut state = loaded.package.new_state("main").unwrap();
        check(
            "predict",
            &loaded.package.predict("main", &feed, &mut state).unwrap(),
        );
        let observed = loaded
            .package
            .predict_observed("main", &feed, &mut state, &mut |_| {})
            .unwrap();
        check("observed", &observed);
        for threads in [1, 2, 3] {
            let backend = ExecutorBackend::with_threads(precision, threads).unwrap();
            let mut state = backend.new_state(&loaded.package, "main").unwrap();
            let out = backend
                .predict(&loaded.package, "main", &feed, &mut state)
                .unwrap();
            check(&format!("{threads} threads"), &out);
        }
    }
}
