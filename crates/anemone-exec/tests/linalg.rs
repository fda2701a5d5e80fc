//! Conv, matmul and linear against naive loops (f64 accumulation).

mod common;

use anemone_exec::{Precision, Tensor};
use anemone_mil::{ConvParams, DType, FunctionBuilder, TensorData, TensorType};
use common::*;

#[allow(clippy::too_many_arguments)]
fn naive_conv(
    x: &[f32],
    xs: [usize; 4],
    w: &[f32],
    ws: [usize; 4],
    bias: Option<&[f32]>,
    p: &ConvParams,
) -> (Vec<usize>, Vec<f32>) {
    let [n, c, h, wd] = xs;
    let [o, cpg, kh, kw] = ws;
    let oh = (h + p.pad[0] + p.pad[1] - (p.dilations[0] * (kh - 1) + 1)) / p.strides[0] + 1;
    let ow = (wd + p.pad[2] + p.pad[3] - (p.dilations[1] * (kw - 1) + 1)) / p.strides[1] + 1;
    let opg = o / p.groups;
    let mut out = vec![0.0f32; n * o * oh * ow];
    for b in 0..n {
        for oc in 0..o {
            let g = oc / opg;
            for y in 0..oh {
                for xo in 0..ow {
                    let mut acc = bias.map_or(0.0, |bb| bb[oc] as f64);
                    for ci in 0..cpg {
                        for i in 0..kh {
                            for j in 0..kw {
                                let iy = (y * p.strides[0] + i * p.dilations[0]) as i64
                                    - p.pad[0] as i64;
                                let ix = (xo * p.strides[1] + j * p.dilations[1]) as i64
                                    - p.pad[2] as i64;
                                if iy < 0 || ix < 0 || iy >= h as i64 || ix >= wd as i64 {
                                    continue;
                                }
                                let xv = x
                                    [((b * c + g * cpg + ci) * h + iy as usize) * wd + ix as usize];
                                acc += xv as f64 * w[((oc * cpg + ci) * kh + i) * kw + j] as f64;
                            }
                        }
                    }
                    out[((b * o + oc) * oh + y) * ow + xo] = acc as f32;
                }
            }
        }
    }
    (vec![n, o, oh, ow], out)
}

fn conv_case(
    xs: [usize; 4],
    ws: [usize; 4],
    params: ConvParams,
    with_bias: bool,
    precision: Precision,
) {
    let x = values(xs.iter().product(), 11, 1.0);
    let w = values(ws.iter().product(), 12, 0.5);
    let b = values(ws[0], 13, 0.5);
    let dtype = if precision == Precision::Fp16 {
        DType::F16
    } else {
        DType::F32
    };
    let data = |shape: Vec<usize>, v: &[f32]| match dtype {
        DType::F16 => TensorData::f16_from_f32(shape, v).unwrap(),
        _ => TensorData::from_f32(shape, v).unwrap(),
    };
    let r16 = |v: &[f32]| -> Vec<f32> {
        v.iter()
            .map(|&a| {
                if dtype == DType::F16 {
                    half::f16::from_f32(a).to_f32()
                } else {
                    a
                }
            })
            .collect()
    };
    let mut f = FunctionBuilder::new("main");
    let xin = f.input("x", TensorType::new(dtype, xs)).unwrap();
    let wv = f.constant("w", data(ws.to_vec(), &w)).unwrap();
    let bv = with_bias.then(|| f.constant("b", data(vec![ws[0]], &b)).unwrap());
    let y = f.conv("y", xin, wv, bv, params).unwrap();
    f.output(y).unwrap();
    let out = run(
        f.finish().unwrap(),
        vec![("x", Tensor::new(dtype, xs.to_vec(), x.clone()).unwrap())],
        precision,
    );
    let (shape, mut want) = naive_conv(
        &r16(&x),
        xs,
        &r16(&w),
        ws,
        with_bias.then_some(&r16(&b)[..]),
        &params,
    );
    assert_eq!(out["y"].shape, shape);
    let tol = if dtype == DType::F16 {
        want = r16(&want);

        F16_ROUNDED_SUM
    } else {
        F32_SUM
    };
    assert_close(
        &format!("conv {xs:?} * {ws:?} {params:?}"),
        &out["y"].data,
        &want,
        tol,
    );
}

#[test]
fn pointwise_conv_decode_and_prefill() {
    // T = 1 (matvec path) and T = 64 (gemm path), large enough to run multi-threaded
    conv_case(
        [1, 96, 1, 1],
        [4000, 96, 1, 1],
        ConvParams::default(),
        true,
        Precision::Fp32,
    );
    conv_case(
        [1, 96, 1, 64],
        [200, 96, 1, 1],
        ConvParams::default(),
        false,
        Precision::Fp32,
    );
    conv_case(
        [2, 32, 1, 5],
        [48, 32, 1, 1],
        ConvParams::default(),
        true,
        Precision::Fp16,
    );
    // fp16 weights, T = 1: the fp16-weight matvec path
    conv_case(
        [1, 300, 1, 1],
        [2000, 300, 1, 1],
        ConvParams::default(),
        true,
        Precision::Fp16,
    );
    conv_case(
        [1, 7, 1, 1],
        [5, 7, 1, 1],
        ConvParams::default(),
        false,
        Precision::Fp16,
    );
}

#[test]
fn fp16_linear_single_row_matches_naive() {
    let (inf, outf) = (40usize, 300usize);
    let r16 = |v: Vec<f32>| -> Vec<f32> {
        v.into_iter()
            .map(|a| half::f16::from_f32(a).to_f32())
            .collect()
    };
    let x = r16(values(inf, 34, 1.0));
    let w = r16(values(outf * inf, 35, 0.5));
    let b = r16(values(outf, 36, 0.5));
    let mut f = FunctionBuilder::new("main");
    let xi = f.input("x", TensorType::new(DType::F16, [1, inf])).unwrap();
    let wv = f.const_f16("w", &[outf, inf], &w).unwrap();
    let bv = f.const_f16("b", &[outf], &b).unwrap();
    let y = f.linear("y", xi, wv, Some(bv)).unwrap();
    f.output(y).unwrap();
    let out = run(
        f.finish().unwrap(),
        vec![("x", Tensor::f16(vec![1, inf], x.clone()).unwrap())],
        Precision::Fp16,
    );
    let want: Vec<f32> = (0..outf)
        .map(|o| {
            let s: f64 = (0..inf)
                .map(|i| x[i] as f64 * w[o * inf + i] as f64)
                .sum::<f64>()
                + b[o] as f64;
            half::f16::from_f64(s).to_f32()
        })
        .collect();
    assert_close("fp16 linear", &out["y"].data, &want, F16_ROUNDED_SUM);
}

#[test]
fn conv_with_groups_strides_padding_dilation() {
    let p = ConvParams {
        strides: [2, 1],
        pad: [1, 0, 2, 1],
        dilations: [1, 2],
        groups: 2,
    };
    conv_case([2, 4, 7, 9], [6, 2, 3, 3], p, true, Precision::Fp32);
    let p = ConvParams {
        strides: [1, 1],
        pad: [0, 0, 0, 0],
        dilations: [1, 1],
        groups: 4,
    };
    conv_case([1, 8, 1, 3], [8, 2, 1, 1], p, false, Precision::Fp32); // grouped 1x1
    let p = ConvParams {
        strides: [3, 2],
        pad: [1, 1, 1, 1],
        dilations: [1, 1],
        groups: 1,
    };
    conv_case([1, 3, 6, 6], [5, 3, 2, 2], p, true, Precision::Fp16);
}

fn naive_matmul(
    x: &[f32],
    xs: &[usize],
    y: &[f32],
    ys: &[usize],
    tx: bool,
    ty: bool,
) -> (Vec<usize>, Vec<f32>) {
    let (xr, yr) = (xs.len(), ys.len());
    let (m, k) = if tx {
        (xs[xr - 1], xs[xr - 2])
    } else {
        (xs[xr - 2], xs[xr - 1])
    };
    let n = if ty { ys[yr - 2] } else { ys[yr - 1] };
    let rank = xr.max(yr);
    let bx: Vec<usize> = std::iter::repeat_n(1, rank - xr)
        .chain(xs[..xr - 2].iter().copied())
        .collect();
    let by: Vec<usize> = std::iter::repeat_n(1, rank - yr)
        .chain(ys[..yr - 2].iter().copied())
        .collect();
    let bo: Vec<usize> = bx.iter().zip(&by).map(|(a, b)| *a.max(b)).collect();
    let mut shape = bo.clone();
    shape.extend([m, n]);
    let mut out = Vec::new();
    for bidx in indices(&bo) {
        let xb = flat(
            &bidx
                .iter()
                .zip(&bx)
                .map(|(i, d)| if *d == 1 { 0 } else { *i })
                .collect::<Vec<_>>(),
            &bx,
        );
        let yb = flat(
            &bidx
                .iter()
                .zip(&by)
                .map(|(i, d)| if *d == 1 { 0 } else { *i })
                .collect::<Vec<_>>(),
            &by,
        );
        let (xm, ym) = (xs[xr - 2] * xs[xr - 1], ys[yr - 2] * ys[yr - 1]);
        for i in 0..m {
            for j in 0..n {
                let mut acc = 0.0f64;
                for l in 0..k {
                    let xv = if tx {
                        x[xb * xm + l * m + i]
                    } else {
                        x[xb * xm + i * k + l]
                    };
                    let yv = if ty {
                        y[yb * ym + j * k + l]
                    } else {
                        y[yb * ym + l * n + j]
                    };
                    acc += xv as f64 * yv as f64;
                }
                out.push(acc as f32);
            }
        }
    }
    (shape, out)
}

#[test]
fn matmul_transposes_and_batch_broadcast() {
    let cases: [(&[usize], &[usize], bool, bool); 5] = [
        (&[3, 4], &[4, 5], false, false),
        (&[2, 4, 3], &[2, 5, 4], true, true),
        (&[1, 14, 1, 64], &[1, 14, 40, 64], false, true), // decode attention scores q·Kᵀ
        (&[2, 1, 3, 4], &[5, 4, 6], false, false),        // batch broadcast
        (&[1, 2, 8, 3], &[1, 2, 8, 7], true, false),
    ];
    for (xs, ys, tx, ty) in cases {
        let x = values(xs.iter().product(), 21, 1.0);
        let y = values(ys.iter().product(), 22, 1.0);
        let mut f = FunctionBuilder::new("main");
        let xi = f
            .input("x", TensorType::new(DType::F32, xs.to_vec()))
            .unwrap();
        let yi = f
            .input("y", TensorType::new(DType::F32, ys.to_vec()))
            .unwrap();
        let z = f.matmul("z", xi, yi, tx, ty).unwrap();
        f.output(z).unwrap();
        let out = run(
            f.finish().unwrap(),
            vec![
                ("x", Tensor::f32(xs.to_vec(), x.clone()).unwrap()),
                ("y", Tensor::f32(ys.to_vec(), y.clone()).unwrap()),
            ],
            Precision::Fp32,
        );
        let (shape, want) = naive_matmul(&x, xs, &y, ys, tx, ty);
        assert_eq!(out["z"].shape, shape, "{xs:?} {ys:?}");
        assert_close(
            &format!("matmul {xs:?}·{ys:?} tx={tx} ty={ty}"),
            &out["z"].data,
            &want,
            F32_SUM,
        );
    }
}

#[test]
fn linear_with_and_without_bias() {
    for (rows, with_bias) in [(1usize, true), (3, false), (7, true)] {
        let (inf, outf) = (24usize, 10usize);
        let x = values(rows * inf, 31, 1.0);
        let w = values(outf * inf, 32, 1.0);
        let b = values(outf, 33, 1.0);
        let mut f = FunctionBuilder::new("main");
        let xi = f
            .input("x", TensorType::new(DType::F32, [rows, inf]))
            .unwrap();
        let wv = f.const_f32("w", &[outf, inf], &w).unwrap();
        let bv = with_bias.then(|| f.const_f32("b", &[outf], &b).unwrap());
        let y = f.linear("y", xi, wv, bv).unwrap();
        f.output(y).unwrap();
        let out = run(
            f.finish().unwrap(),
            vec![("x", Tensor::f32(vec![rows, inf], x.clone()).unwrap())],
            Precision::Fp32,
        );
        let want: Vec<f32> = (0..rows)
            .flat_map(|r| {
                let (x, w, b) = (&x, &w, &b);
                (0..outf).map(move |o| {
                    let s: f64 = (0..inf)
                        .map(|i| x[r * inf + i] as f64 * w[o * inf + i] as f64)
                        .sum();
                    (s + if with_bias { b[o] as f64 } else { 0.0 }) as f32
                })
            })
            .collect();
        assert_close(
            &format!("linear rows={rows}"),
            &out["y"].data,
            &want,
            F32_SUM,
        );
    }
}
