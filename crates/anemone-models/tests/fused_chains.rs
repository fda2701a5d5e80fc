//! The RMSNorm and RoPE op chains the chunk builder writes are the ones the executor runs as
//! one step each, and those steps give the values of the ops run one by one (the observed run)
//! bit for bit: fp16 rounding at every op boundary, one decode position or several.

use std::collections::HashMap;

use anemone_exec::{LoadedPackage, OpOutput, Precision, Tensor};
use anemone_mil::{
    write_package, DType, Function, FunctionBuilder, Program, SpecVersion, TensorData, TensorType,
    WriteOptions,
};
use anemone_models::ane::norm::rms_norm;
use anemone_models::ane::rope::RopeTables;
use anemone_models::ane::NormForm;

const HIDDEN: usize = 96;
const HEADS: usize = 3;
const HEAD_DIM: usize = 32;

/// Deterministic values in [-scale, scale].
fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    anemone_testkit::Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1).floats(n, scale)
}

/// `norm = rms_norm(x) · w` over channels and `rope = rope(rms_norm(q) · w_q)` (a per-head
/// norm over the head dimension, as Qwen3's), max-scaled norms, over `positions`.
/// With `expose`, an intermediate of each chain is a function output too.
fn norm_and_rope(dtype: DType, positions: usize, expose: bool) -> Function {
    let mut f = FunctionBuilder::new("main");
    let ty = |shape: [usize; 4]| TensorType::new(dtype, shape);
    let x = f.input("x", ty([1, HIDDEN, 1, positions])).unwrap();
    let q = f.input("q", ty([HEADS, 1, HEAD_DIM, positions])).unwrap();
    let cos = f.input("cos", ty([1, 1, HEAD_DIM, positions])).unwrap();
    let sin = f.input("sin", ty([1, 1, HEAD_DIM, positions])).unwrap();
    let weight = |n: usize, seed: u64| {
        let w = values(n, seed, 2.0);
        match dtype {
            DType::F16 => TensorData::f16_from_f32([n], &w),
            _ => TensorData::from_f32([n], &w),
        }
        .unwrap()
    };
    let form = NormForm::MaxScaled;
    let normed = rms_norm(&mut f, "norm", x, 1, &weight(HIDDEN, 5), 1e-5, form).unwrap();
    let q = rms_norm(&mut f, "q_norm", q, 2, &weight(HEAD_DIM, 6), 1e-6, form).unwrap();
    let tables = RopeTables {
        cos,
        sin,
        half: HEAD_DIM / 2,
    };
    let rotated = tables.apply(&mut f, "rope", q).unwrap();
    f.output(normed).unwrap();
    f.output(rotated).unwrap();
    if expose {
        for name in ["norm_scaled", "rope_rot_half"] {
            let v = f.function().find_value(name).unwrap();
            f.output(v).unwrap();
        }
    }
    f.finish().unwrap()
}

fn load(f: Function, precision: Precision) -> (LoadedPackage, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    let mut program = Program::new(SpecVersion::V9);
    program.add_function(f).unwrap();
    let path = dir.path().join("chains.mlpackage");
    write_package(&program, &path, &WriteOptions::default()).unwrap();
    (LoadedPackage::load(&path, precision).unwrap(), dir)
}

/// The first element whose bits differ: (index, fused, observed).
fn first_difference(fused: &Tensor, observed: &Tensor) -> Option<(usize, f32, f32)> {
    assert_eq!(fused.shape, observed.shape);
    let pairs = fused.data.iter().zip(&observed.data);
    pairs
        .enumerate()
        .find(|(_, (a, b))| a.to_bits() != b.to_bits())
        .map(|(i, (a, b))| (i, *a, *b))
}

#[test]
fn norm_and_rope_chains_run_fused_with_the_observed_values() {
    for (dtype, precision) in [
        (DType::F16, Precision::Fp16),
        (DType::F16, Precision::Fp32),
        (DType::F32, Precision::Fp32),
    ] {
        for positions in [1usize, 4] {
            let (pkg, _dir) = load(norm_and_rope(dtype, positions, false), precision);
            assert_eq!(
                pkg.fused_chains("main").unwrap(),
                ["norm_abs", "q_norm_abs", "rope_halves"],
                "both chains are recognised"
            );
            assert_fused_equals_observed(&pkg, dtype, precision, positions, &["norm", "rope"]);
        }
    }
}

/// Runs `pkg`'s `main` as is and observed (op by op) and checks the named outputs agree bit
/// for bit.
fn assert_fused_equals_observed(
    pkg: &LoadedPackage,
    dtype: DType,
    precision: Precision,
    positions: usize,
    names: &[&str],
) {
    let tensor = |shape: Vec<usize>, seed: u64, scale: f32| {
        let n = shape.iter().product();
        match dtype {
            DType::F16 => Tensor::f16(shape, values(n, seed, scale)),
            _ => Tensor::f32(shape, values(n, seed, scale)),
        }
        .unwrap()
    };
    // a large-magnitude row: the max scaling matters
    let ins: HashMap<String, Tensor> = [
        ("x", tensor(vec![1, HIDDEN, 1, positions], 1, 300.0)),
        ("q", tensor(vec![HEADS, 1, HEAD_DIM, positions], 2, 4.0)),
        ("cos", tensor(vec![1, 1, HEAD_DIM, positions], 3, 1.0)),
        ("sin", tensor(vec![1, 1, HEAD_DIM, positions], 4, 1.0)),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect();
    let mut state = pkg.new_state("main").unwrap();
    let fused = pkg.predict("main", &ins, &mut state).unwrap();
    let mut seen = 0;
    let mut observer = |_: OpOutput<'_>| seen += 1;
    let observed = pkg
        .predict_observed("main", &ins, &mut state, &mut observer)
        .unwrap();
    assert_eq!(
        seen,
        12 + 12 + 7,
        "the observed run runs every op (split has two outputs)"
    );
    for name in names {
        assert_eq!(
            first_difference(&fused[*name], &observed[*name]),
            None,
            "{name}: {dtype:?} in {precision:?}, {positions} positions (index, fused, observed)"
        );
    }
}

#[test]
fn chains_whose_intermediates_are_read_elsewhere_run_op_by_op() {
    let (dtype, precision) = (DType::F16, Precision::Fp16);
    let (pkg, _dir) = load(norm_and_rope(dtype, 1, true), precision);
    assert_eq!(
        pkg.fused_chains("main").unwrap(),
        ["q_norm_abs"],
        "only the chain with no exposed intermediate is fused"
    );
    let names = ["norm", "rope", "norm_scaled", "rope_rot_half"];
    assert_fused_equals_observed(&pkg, dtype, precision, 1, &names);
}
