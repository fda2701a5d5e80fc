//! Softmax, layer_norm, reductions and data movement against naive references.

mod common;

use anemone_exec::{Precision, Tensor};
use anemone_mil::{DType, FunctionBuilder, ReduceOp, TensorType};
use common::*;

fn one_input(
    shape: &[usize],
    build: impl FnOnce(&mut FunctionBuilder, anemone_mil::Var) -> Vec<anemone_mil::Var>,
) -> anemone_mil::Function {
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("x", TensorType::new(DType::F32, shape.to_vec()))
        .unwrap();
    for v in build(&mut f, x) {
        f.output(v).unwrap();
    }
    f.finish().unwrap()
}

fn naive_softmax(row: &[f64]) -> Vec<f32> {
    let m = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
    let e: Vec<f64> = row.iter().map(|v| (v - m).exp()).collect();
    let s: f64 = e.iter().sum();
    e.iter().map(|v| (v / s) as f32).collect()
}

#[test]
fn softmax_with_masked_rows() {
    // [1, heads=2, q=3, k=5] scores with a causal mask of -1e4 and one fully masked row
    let shape = [1usize, 2, 3, 5];
    let mut x = values(30, 41, 4.0);
    for h in 0..2 {
        for q in 0..3 {
            for k in 0..5 {
                if k > q + 2 || (h == 1 && q == 2) {
                    x[(h * 3 + q) * 5 + k] += -1e4;
                }
            }
        }
    }
    let func = one_input(&shape, |f, x| {
        vec![
            f.softmax("y", x, -1).unwrap(),
            f.softmax("y1", x, 1).unwrap(),
        ]
    });
    let out = run(
        func,
        vec![("x", Tensor::f32(shape.to_vec(), x.clone()).unwrap())],
        Precision::Fp32,
    );
    let want: Vec<f32> = x
        .chunks(5)
        .flat_map(|r| naive_softmax(&r.iter().map(|&v| v as f64).collect::<Vec<_>>()))
        .collect();
    assert_close("softmax last axis", &out["y"].data, &want, F32_SUM);
    // the masked columns carry no weight, the fully masked row is still a distribution
    assert!(out["y"].data[3] == 0.0 && out["y"].data[4] == 0.0 && out["y"].data[2] > 0.0);
    let full_row = &out["y"].data[25..30];
    assert!(
        (full_row.iter().sum::<f32>() - 1.0).abs() < 1e-6,
        "{full_row:?}"
    );
    let mut want1 = vec![0.0f32; 30];
    for q in 0..3 {
        for k in 0..5 {
            let col: Vec<f64> = (0..2).map(|h| x[(h * 3 + q) * 5 + k] as f64).collect();
            for (h, p) in naive_softmax(&col).into_iter().enumerate() {
                want1[(h * 3 + q) * 5 + k] = p;
            }
        }
    }
    assert_close("softmax axis 1", &out["y1"].data, &want1, F32_SUM);
    // fp16: the row maximum is subtracted, so large logits do not overflow exp
    let mut f = FunctionBuilder::new("main");
    let xi = f.input("x", TensorType::new(DType::F16, [1, 4])).unwrap();
    let y = f.softmax("y", xi, -1).unwrap();
    f.output(y).unwrap();
    let out = run(
        f.finish().unwrap(),
        vec![(
            "x",
            Tensor::f16(vec![1, 4], vec![60000.0, 60000.0, -1e4, 59008.0]).unwrap(),
        )],
        Precision::Fp16,
    );
    assert_eq!(out["y"].data, vec![0.5, 0.5, 0.0, 0.0]);
}

fn naive_layer_norm(
    x: &[f32],
    shape: &[usize],
    axes: &[usize],
    gamma: Option<&[f32]>,
    beta: Option<&[f32]>,
    eps: f64,
) -> Vec<f32> {
    let mut out = vec![0.0f32; x.len()];
    let rest: Vec<usize> = (0..shape.len()).filter(|a| !axes.contains(a)).collect();
    let rest_shape: Vec<usize> = rest.iter().map(|&a| shape[a]).collect();
    let norm_shape: Vec<usize> = axes.iter().map(|&a| shape[a]).collect();
    for r in indices(&rest_shape) {
        let members: Vec<(usize, usize)> = indices(&norm_shape)
            .into_iter()
            .enumerate()
            .map(|(j, n)| {
                let mut idx = vec![0; shape.len()];
                for (k, &a) in rest.iter().enumerate() {
                    idx[a] = r[k];
                }
                for (k, &a) in axes.iter().enumerate() {
                    idx[a] = n[k];
                }
                (j, flat(&idx, shape))
            })
            .collect();
        let n = members.len() as f64;
        let mean = members.iter().map(|&(_, i)| x[i] as f64).sum::<f64>() / n;
        let var = members
            .iter()
            .map(|&(_, i)| (x[i] as f64 - mean).powi(2))
            .sum::<f64>()
            / n;
        for &(j, i) in &members {
            let mut y = (x[i] as f64 - mean) / (var + eps).sqrt();
            if let Some(g) = gamma {
                y *= g[j] as f64;
            }
            if let Some(b) = beta {
                y += b[j] as f64;
            }
            out[i] = y as f32;
        }
    }
    out
}

#[test]
fn layer_norm_with_and_without_gamma_beta() {
    // BC1S layout normalizes over channels (axis 1); also the last axis and two axes
    let cases: [(&[usize], &[i64]); 3] = [
        (&[1, 16, 1, 3], &[1]),
        (&[2, 3, 8], &[-1]),
        (&[2, 3, 4], &[2, 1]),
    ];
    for (shape, axes) in cases {
        let n: usize = shape.iter().product();
        let x = values(n, 51, 3.0);
        let norm_axes: Vec<usize> = axes
            .iter()
            .map(|&a| {
                if a < 0 {
                    (shape.len() as i64 + a) as usize
                } else {
                    a as usize
                }
            })
            .collect();
        let norm_shape: Vec<usize> = norm_axes.iter().map(|&a| shape[a]).collect();
        let m: usize = norm_shape.iter().product();
        let g = values(m, 52, 1.0);
        let b = values(m, 53, 1.0);
        let func = one_input(shape, |f, x| {
            let gv = f.const_f32("g", &norm_shape, &g).unwrap();
            let bv = f.const_f32("b", &norm_shape, &b).unwrap();
            vec![
                f.layer_norm("plain", x, axes, None, None, 1e-5).unwrap(),
                f.layer_norm("affine", x, axes, Some(gv), Some(bv), 1e-5)
                    .unwrap(),
                f.layer_norm("scaled", x, axes, Some(gv), None, 1e-5)
                    .unwrap(),
            ]
        });
        let out = run(
            func,
            vec![("x", Tensor::f32(shape.to_vec(), x.clone()).unwrap())],
            Precision::Fp32,
        );
        let ctx = format!("{shape:?} axes {axes:?}");
        assert_close(
            &ctx,
            &out["plain"].data,
            &naive_layer_norm(&x, shape, &norm_axes, None, None, 1e-5),
            F32_SUM,
        );
        assert_close(
            &ctx,
            &out["affine"].data,
            &naive_layer_norm(&x, shape, &norm_axes, Some(&g), Some(&b), 1e-5),
            F32_SUM,
        );
        assert_close(
            &ctx,
            &out["scaled"].data,
            &naive_layer_norm(&x, shape, &norm_axes, Some(&g), None, 1e-5),
            F32_SUM,
        );
    }
}

#[test]
fn reductions_with_and_without_keep_dims() {
    let shape = [2usize, 3, 4];
    let x = values(24, 61, 2.0);
    for kind in ReduceOp::ALL {
        for (axes, keep) in [
            (vec![1i64], true),
            (vec![1], false),
            (vec![0, 2], true),
            (vec![-1, 0], false),
        ] {
            let func = one_input(&shape, |f, x| {
                vec![f.reduce("y", kind, x, &axes, keep).unwrap()]
            });
            let out = run(
                func,
                vec![("x", Tensor::f32(shape.to_vec(), x.clone()).unwrap())],
                Precision::Fp32,
            );
            let red: Vec<usize> = axes
                .iter()
                .map(|&a| if a < 0 { (3 + a) as usize } else { a as usize })
                .collect();
            let kept_shape: Vec<usize> = (0..3)
                .map(|a| if red.contains(&a) { 1 } else { shape[a] })
                .collect();
            let mut want = Vec::new();
            for k in indices(&kept_shape) {
                let members: Vec<f64> = indices(&shape)
                    .into_iter()
                    .filter(|i| (0..3).all(|a| red.contains(&a) || i[a] == k[a]))
                    .map(|i| x[flat(&i, &shape)] as f64)
                    .collect();
                want.push(match kind {
                    ReduceOp::Sum => members.iter().sum::<f64>(),
                    ReduceOp::Mean => members.iter().sum::<f64>() / members.len() as f64,
                    ReduceOp::Max => members.iter().cloned().fold(f64::NEG_INFINITY, f64::max),
                } as f32);
            }
            let want_shape: Vec<usize> = if keep {
                kept_shape.clone()
            } else {
                (0..3)
                    .filter(|a| !red.contains(a))
                    .map(|a| shape[a])
                    .collect()
            };
            assert_eq!(out["y"].shape, want_shape, "{kind:?} {axes:?} keep={keep}");
            assert_close(
                &format!("{kind:?} {axes:?} keep={keep}"),
                &out["y"].data,
                &want,
                F32_SUM,
            );
        }
    }
}

#[test]
fn gqa_head_indexing_via_slice_by_index() {
    // K cache [1, kv_heads*dim, 1, S] in BC1S; query head h reads kv head h / (heads / kv_heads)
    let (heads, kv_heads, dim, s) = (4usize, 2usize, 3usize, 5usize);
    let k = values(kv_heads * dim * s, 71, 1.0);
    let shape = [1, kv_heads * dim, 1, s];
    let func = one_input(&shape, |f, x| {
        let mut outs: Vec<_> = (0..heads)
            .map(|h| {
                let g = h / (heads / kv_heads);
                let b = (g * dim) as i64;
                f.slice_by_index(
                    &format!("k_head{h}"),
                    x,
                    &[0, b, 0, 0],
                    &[1, b + dim as i64, 1, i64::MAX],
                    None,
                )
                .unwrap()
            })
            .collect();
        outs.push(
            f.slice_by_index(
                "strided",
                x,
                &[0, 1, 0, -4],
                &[1, 6, 1, 5],
                Some(&[1, 2, 1, 3]),
            )
            .unwrap(),
        );
        outs
    });
    let out = run(
        func,
        vec![("x", Tensor::f32(shape.to_vec(), k.clone()).unwrap())],
        Precision::Fp32,
    );
    for h in 0..heads {
        let g = h / 2;
        let want: Vec<f32> = (0..dim)
            .flat_map(|d| (0..s).map(move |t| (d, t)))
            .map(|(d, t)| k[(g * dim + d) * s + t])
            .collect();
        assert_eq!(
            out[&format!("k_head{h}")].data,
            want,
            "head {h} reads kv head {g}"
        );
    }
    let want: Vec<f32> = [1usize, 3, 5]
        .iter()
        .flat_map(|&c| [1usize, 4].map(|t| k[c * s + t]))
        .collect();
    assert_eq!(out["strided"].shape, vec![1, 3, 1, 2]);
    assert_eq!(out["strided"].data, want);
}

#[test]
fn concat_split_reshape_transpose_expand_squeeze() {
    let shape = [2usize, 3, 4];
    let x = values(24, 81, 1.0);
    let func = one_input(&shape, |f, x| {
        let parts = f.split("parts", x, &[1, 3], 2).unwrap();
        let cat = f.concat("cat", &[parts[1], parts[0], x], 2).unwrap();
        let r = f.reshape("r", x, &[4, -1]).unwrap();
        let t = f.transpose("t", x, &[2, 0, 1]).unwrap();
        let e = f.expand_dims("e", x, &[0, 3]).unwrap();
        let sq = f.squeeze("sq", e, &[0, 3]).unwrap();
        vec![parts[0], parts[1], cat, r, t, e, sq]
    });
    let out = run(
        func,
        vec![("x", Tensor::f32(shape.to_vec(), x.clone()).unwrap())],
        Precision::Fp32,
    );
    let at = |i: usize, j: usize, k: usize| x[(i * 3 + j) * 4 + k];
    let mut p0 = vec![];
    let mut p1 = vec![];
    let mut cat = vec![];
    for i in 0..2 {
        for j in 0..3 {
            p0.push(at(i, j, 0));
            p1.extend((1..4).map(|k| at(i, j, k)));
            cat.extend((1..4).map(|k| at(i, j, k)));
            cat.push(at(i, j, 0));
            cat.extend((0..4).map(|k| at(i, j, k)));
        }
    }
    assert_eq!(
        (out["parts_0"].shape.clone(), out["parts_0"].data.clone()),
        (vec![2, 3, 1], p0)
    );
    assert_eq!(out["parts_1"].data, p1);
    assert_eq!(
        (out["cat"].shape.clone(), out["cat"].data.clone()),
        (vec![2, 3, 8], cat)
    );
    assert_eq!((out["r"].shape.clone(), &out["r"].data), (vec![4, 6], &x));
    let mut t = vec![];
    for k in 0..4 {
        for i in 0..2 {
            for j in 0..3 {
                t.push(at(i, j, k));
            }
        }
    }
    assert_eq!(
        (out["t"].shape.clone(), out["t"].data.clone()),
        (vec![4, 2, 3], t)
    );
    assert_eq!(
        (out["e"].shape.clone(), &out["e"].data),
        (vec![1, 2, 3, 1, 4], &x)
    );
    assert_eq!(
        (out["sq"].shape.clone(), &out["sq"].data),
        (shape.to_vec(), &x)
    );
}
