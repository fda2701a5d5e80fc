//! Elementwise ops against naive references: broadcasting, activations, casts, fp16 rounding.

mod common;

use anemone_exec::{Precision, Tensor};
use anemone_mil::{BinaryOp, DType, FunctionBuilder, GeluMode, TensorType, UnaryOp};
use common::*;

fn binary_program(
    kind: BinaryOp,
    dtype: DType,
    xs: &[usize],
    ys: &[usize],
) -> anemone_mil::Function {
    let mut f = FunctionBuilder::new("main");
    let x = f.input("x", TensorType::new(dtype, xs.to_vec())).unwrap();
    let y = f.input("y", TensorType::new(dtype, ys.to_vec())).unwrap();
    let z = f.binary("z", kind, x, y).unwrap();
    f.output(z).unwrap();
    f.finish().unwrap()
}

/// numpy broadcasting by index arithmetic, independent of the executor's stride walk.
fn naive_broadcast(
    x: &[f32],
    xs: &[usize],
    y: &[f32],
    ys: &[usize],
    f: impl Fn(f64, f64) -> f64,
) -> (Vec<usize>, Vec<f32>) {
    let rank = xs.len().max(ys.len());
    let pad = |s: &[usize]| -> Vec<usize> {
        std::iter::repeat_n(1, rank - s.len())
            .chain(s.iter().copied())
            .collect()
    };
    let (px, py) = (pad(xs), pad(ys));
    let out: Vec<usize> = px.iter().zip(&py).map(|(a, b)| *a.max(b)).collect();
    let data = indices(&out)
        .iter()
        .map(|idx| {
            let ix: Vec<usize> = idx
                .iter()
                .zip(&px)
                .map(|(i, d)| if *d == 1 { 0 } else { *i })
                .collect();
            let iy: Vec<usize> = idx
                .iter()
                .zip(&py)
                .map(|(i, d)| if *d == 1 { 0 } else { *i })
                .collect();
            f(x[flat(&ix, &px)] as f64, y[flat(&iy, &py)] as f64) as f32
        })
        .collect();
    (out, data)
}

#[test]
fn binary_ops_broadcast_like_numpy() {
    let shapes: [(&[usize], &[usize]); 5] = [
        (&[2, 3, 4], &[2, 3, 4]),
        (&[2, 3, 4], &[3, 1]),
        (&[2, 3, 4], &[4]),
        (&[1, 3, 1], &[2, 1, 5]),
        (&[2, 3, 4], &[1]),
    ];
    for kind in BinaryOp::ALL {
        for (xs, ys) in shapes {
            let nx: usize = xs.iter().product();
            let ny: usize = ys.iter().product();
            let mut x = values(nx, 1, 2.0);
            let y = values(ny, 2, 2.0);
            if kind == BinaryOp::Pow {
                x.iter_mut().for_each(|v| *v = v.abs() + 0.1);
            }
            let reference = |a: f64, b: f64| match kind {
                BinaryOp::Add => a + b,
                BinaryOp::Sub => a - b,
                BinaryOp::Mul => a * b,
                BinaryOp::RealDiv => a / b,
                BinaryOp::Maximum => a.max(b),
                BinaryOp::Minimum => a.min(b),
                BinaryOp::Pow => a.powf(b),
            };
            let (out_shape, want) = naive_broadcast(&x, xs, &y, ys, reference);
            let out = run(
                binary_program(kind, DType::F32, xs, ys),
                vec![
                    ("x", Tensor::f32(xs.to_vec(), x).unwrap()),
                    ("y", Tensor::f32(ys.to_vec(), y).unwrap()),
                ],
                Precision::Fp32,
            );
            assert_eq!(out["z"].shape, out_shape, "{kind:?} {xs:?} {ys:?}");
            assert_close(
                &format!("{kind:?} {xs:?}∘{ys:?}"),
                &out["z"].data,
                &want,
                F32_SUM,
            );
        }
    }
}

#[test]
fn int32_arithmetic_is_exact() {
    let out = run(
        binary_program(BinaryOp::Add, DType::I32, &[4], &[1]),
        vec![
            ("x", Tensor::i32(vec![4], &[0, 5, -7, 1 << 20]).unwrap()),
            ("y", Tensor::i32(vec![1], &[3]).unwrap()),
        ],
        Precision::Fp16,
    );
    assert_eq!(out["z"].dtype, DType::I32);
    assert_eq!(out["z"].to_i32_vec(), vec![3, 8, -4, (1 << 20) + 3]);
}

fn erf_ref(x: f64) -> f64 {
    // Maclaurin series, ample for |x| <= 3 in f64
    let mut term = x;
    let mut sum = x;
    for n in 1..80 {
        term *= -x * x / n as f64;
        sum += term / (2 * n + 1) as f64;
    }
    sum * 2.0 / std::f64::consts::PI.sqrt()
}

#[test]
fn unary_activations_match_formulas() {
    let x = values(64, 3, 3.0);
    for kind in UnaryOp::ALL {
        let mut f = FunctionBuilder::new("main");
        let xin = f.input("x", TensorType::new(DType::F32, [64])).unwrap();
        let src = if kind == UnaryOp::Sqrt {
            f.abs("a", xin).unwrap()
        } else {
            xin
        };
        let y = f.unary("y", kind, src).unwrap();
        f.output(y).unwrap();
        let out = run(
            f.finish().unwrap(),
            vec![("x", Tensor::f32(vec![64], x.clone()).unwrap())],
            Precision::Fp32,
        );
        let want: Vec<f32> = x
            .iter()
            .map(|&v| {
                let v = v as f64;
                (match kind {
                    UnaryOp::Sqrt => v.abs().sqrt(),
                    UnaryOp::Exp => v.exp(),
                    UnaryOp::Silu => v / (1.0 + (-v).exp()),
                    UnaryOp::Tanh => v.tanh(),
                    UnaryOp::Square => v * v,
                    UnaryOp::Abs => v.abs(),
                }) as f32
            })
            .collect();
        assert_close(
            &format!("{kind:?}"),
            &out["y"].data,
            &want,
            F32_TRANSCENDENTAL,
        );
    }
}

#[test]
fn rsqrt_and_gelu_modes_match_formulas() {
    let x = values(64, 4, 3.0);
    let mut f = FunctionBuilder::new("main");
    let xin = f.input("x", TensorType::new(DType::F32, [64])).unwrap();
    let sq = f.square("sq", xin).unwrap();
    let r = f.rsqrt("r", sq, 1e-3).unwrap();
    let ge = f.gelu("ge", xin, GeluMode::Exact).unwrap();
    let gt = f.gelu("gt", xin, GeluMode::TanhApproximation).unwrap();
    let gs = f.gelu("gs", xin, GeluMode::SigmoidApproximation).unwrap();
    for v in [r, ge, gt, gs] {
        f.output(v).unwrap();
    }
    let out = run(
        f.finish().unwrap(),
        vec![("x", Tensor::f32(vec![64], x.clone()).unwrap())],
        Precision::Fp32,
    );
    let map =
        |g: &dyn Fn(f64) -> f64| -> Vec<f32> { x.iter().map(|&v| g(v as f64) as f32).collect() };
    let c = (2.0 / std::f64::consts::PI).sqrt();
    assert_close(
        "rsqrt",
        &out["r"].data,
        &map(&|v| 1.0 / (v * v + 1e-3f32 as f64).sqrt()),
        F32_SUM,
    );
    assert_close(
        "gelu exact",
        &out["ge"].data,
        &map(&|v| 0.5 * v * (1.0 + erf_ref(v / 2f64.sqrt()))),
        F32_TRANSCENDENTAL,
    );
    assert_close(
        "gelu tanh",
        &out["gt"].data,
        &map(&|v| 0.5 * v * (1.0 + (c * (v + 0.044715 * v * v * v)).tanh())),
        F32_TRANSCENDENTAL,
    );
    assert_close(
        "gelu sigmoid",
        &out["gs"].data,
        &map(&|v| v / (1.0 + (-1.702 * v).exp())),
        F32_TRANSCENDENTAL,
    );
}

#[test]
fn casts_between_fp32_fp16_int32_and_bool() {
    let x = vec![1.5, -2.7, 0.0, 65519.0, 65520.0, 1.0001, -0.4, 300.9];
    let mut f = FunctionBuilder::new("main");
    let xin = f.input("x", TensorType::new(DType::F32, [8])).unwrap();
    let h = f.cast("h", xin, DType::F16).unwrap();
    let i = f.cast("i", xin, DType::I32).unwrap();
    let b = f.cast("b", xin, DType::Bool).unwrap();
    let back = f.cast("back", i, DType::F32).unwrap();
    let hf = f.cast("hf", h, DType::F32).unwrap();
    for v in [h, i, back, hf] {
        f.output(v).unwrap();
    }
    let bf = f.cast("bf", b, DType::F32).unwrap();
    f.output(bf).unwrap();
    for precision in [Precision::Fp32, Precision::Fp16] {
        let out = run(
            f_clone(&f),
            vec![("x", Tensor::f32(vec![8], x.clone()).unwrap())],
            precision,
        );
        let f16 = |v: f32| half::f16::from_f32(v).to_f32();
        // fp32 mode rounds nothing, not even an explicit cast to fp16
        let h_want: Vec<f32> = match precision {
            Precision::Fp16 => x.iter().map(|&v| f16(v)).collect(),
            Precision::Fp32 => x.clone(),
        };
        assert_close("cast fp16", &out["h"].data, &h_want, EXACT);
        if precision == Precision::Fp16 {
            assert_eq!(
                out["h"].data[3], 65504.0,
                "65519 rounds to the largest fp16"
            );
            assert_eq!(out["h"].data[4], f32::INFINITY, "65520 overflows to inf");
        }
        assert_eq!(
            out["i"].to_i32_vec(),
            vec![1, -2, 0, 65519, 65520, 1, 0, 300],
            "truncation toward zero"
        );
        assert_eq!(
            out["back"].data,
            vec![1.0, -2.0, 0.0, 65519.0, 65520.0, 1.0, 0.0, 300.0]
        );
        assert_eq!(out["hf"].data, h_want);
        assert_eq!(out["bf"].data, vec![1.0, 1.0, 0.0, 1.0, 1.0, 1.0, 1.0, 1.0]);
    }
}

#[test]
fn cast_of_inf_to_int32_is_an_error_naming_the_op() {
    let mut f = FunctionBuilder::new("main");
    let x = f.input("x", TensorType::new(DType::F16, [2])).unwrap();
    let i = f.cast("to_int", x, DType::I32).unwrap();
    f.output(i).unwrap();
    let loaded = load(vec![f.finish().unwrap()], Precision::Fp16);
    let ok = loaded
        .package
        .predict(
            "main",
            &inputs(vec![("x", Tensor::f16(vec![2], vec![2.9, -2.9]).unwrap())]),
            &mut Default::default(),
        )
        .unwrap();
    assert_eq!(ok["to_int"].to_i32_vec(), vec![2, -2]);
    let err = loaded
        .package
        .predict(
            "main",
            &inputs(vec![("x", Tensor::f16(vec![2], vec![1e6, 0.0]).unwrap())]),
            &mut Default::default(),
        )
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("to_int") && err.contains("cast") && err.contains("test.mlpackage"),
        "{err}"
    );
}

fn f_clone(f: &FunctionBuilder) -> anemone_mil::Function {
    f.function().clone()
}

#[test]
fn fp16_mode_rounds_outputs_and_overflows_to_inf() {
    let mut f = FunctionBuilder::new("main");
    let x = f.input("x", TensorType::new(DType::F16, [4])).unwrap();
    let y = f.mul("y", x, x).unwrap();
    let z = f.real_div("z", x, x).unwrap(); // 300/300 = 1 exactly in both modes
    let third = f.const_f16("three", &[1], &[3.0]).unwrap();
    let w = f.real_div("w", x, third).unwrap();
    for v in [y, z, w] {
        f.output(v).unwrap();
    }
    let func = f.finish().unwrap();
    let x = vec![300.0, -300.0, 2.0, 255.875];
    let fp16 = run(
        func.clone(),
        vec![("x", Tensor::f16(vec![4], x.clone()).unwrap())],
        Precision::Fp16,
    );
    assert_eq!(
        fp16["y"].data[..2],
        [f32::INFINITY, f32::INFINITY],
        "90000 is beyond fp16"
    );
    assert_eq!(fp16["y"].data[2], 4.0);
    assert_eq!(
        fp16["y"].data[3],
        half::f16::from_f32(255.875f32 * 255.875).to_f32()
    );
    let w16: Vec<f32> = x
        .iter()
        .map(|v| half::f16::from_f32(v / 3.0).to_f32())
        .collect();
    assert_close("fp16 division rounded", &fp16["w"].data, &w16, EXACT);
    let fp32 = run(
        func,
        vec![("x", Tensor::f16(vec![4], x.clone()).unwrap())],
        Precision::Fp32,
    );
    assert_eq!(
        fp32["y"].data[0], 90000.0,
        "fp32 mode keeps the f32 product"
    );
    assert_eq!(fp32["w"].data[0], 100.0);
    assert_close(
        "fp32 division",
        &fp32["w"].data,
        &x.iter().map(|v| v / 3.0).collect::<Vec<_>>(),
        EXACT,
    );
}
