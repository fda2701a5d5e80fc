//! Shared test helpers: build → write to disk → load → run, and named tolerance tiers.
#![allow(dead_code)]

use std::collections::HashMap;

use anemone_exec::{LoadedPackage, Precision, State, Tensor};
use anemone_mil::{write_package, Function, Program, SpecVersion, WriteOptions};

use anemone_testkit::Tier;

/// The workspace's tolerance tiers (`anemone_testkit::Tier`), scaled by max(1, |want|) here.
pub const EXACT: f32 = Tier::EXACT.abs;
pub const F32_SUM: f32 = Tier::F32_SUM.abs;
pub const F32_TRANSCENDENTAL: f32 = Tier::F32_TRANSCENDENTAL.abs;
pub const F16_ONE_ROUNDING: f32 = Tier::F16_ONE_ROUNDING.abs;
pub const F16_ROUNDED_SUM: f32 = Tier::F16_ROUNDED_SUM.abs;

/// A temporary package holding `functions`, loaded in `precision`.
pub struct Loaded {
    pub package: LoadedPackage,
    _dir: tempfile::TempDir,
}

pub fn load(functions: Vec<Function>, precision: Precision) -> Loaded {
    let mut program = Program::new(SpecVersion::V9);
    for f in functions {
        program.add_function(f).expect("function verifies");
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let path = dir.path().join("test.mlpackage");
    write_package(&program, &path, &WriteOptions::default()).expect("package writes");
    Loaded {
        package: LoadedPackage::load(&path, precision).expect("package loads"),
        _dir: dir,
    }
}

pub fn inputs(list: Vec<(&str, Tensor)>) -> HashMap<String, Tensor> {
    list.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
}

/// Runs a one-function program once (fresh state) and returns its outputs.
pub fn run(
    f: Function,
    list: Vec<(&str, Tensor)>,
    precision: Precision,
) -> HashMap<String, Tensor> {
    let name = f.name().to_string();
    let loaded = load(vec![f], precision);
    let mut state: State = loaded.package.new_state(&name).expect("state");
    loaded
        .package
        .predict(&name, &inputs(list), &mut state)
        .expect("predict")
}

/// Asserts |got - want| ≤ tol · max(1, |want|) elementwise, naming the worst element.
pub fn assert_close(what: &str, got: &[f32], want: &[f32], tol: f32) {
    anemone_testkit::assert_close_scaled(what, got, want, Tier::custom("exec test", tol));
}

/// Deterministic pseudo-random values in [-scale, scale) (xorshift; no shared RNG state).
pub fn values(n: usize, seed: u64, scale: f32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32 * 2.0 - 1.0) * scale
        })
        .collect()
}

/// Row-major strides.
pub fn strides(shape: &[usize]) -> Vec<usize> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// Every multi-index of `shape` in row-major order.
pub fn indices(shape: &[usize]) -> Vec<Vec<usize>> {
    let n: usize = shape.iter().product();
    (0..n)
        .map(|mut flat| {
            let mut idx = vec![0; shape.len()];
            for a in (0..shape.len()).rev() {
                idx[a] = flat % shape[a];
                flat /= shape[a];
            }
            idx
        })
        .collect()
}

pub fn flat(idx: &[usize], shape: &[usize]) -> usize {
    idx.iter().zip(strides(shape)).map(|(i, s)| i * s).sum()
}

/// The converter's KV write: `kv [2, 1, d, S]` (K row 0, V row 1) read, `k` and `v`
/// (`[1, 1, d, cols]`, fp16) written at columns `pos..pos + cols` by two `slice_update`s;
/// returns the updated value (the state itself is written back by the caller).
pub fn kv_update(
    f: &mut anemone_mil::FunctionBuilder,
    kv: anemone_mil::Var,
    k: anemone_mil::Var,
    v: anemone_mil::Var,
    pos: anemone_mil::Var,
    d: usize,
    cols: usize,
) -> anemone_mil::Var {
    let k_row = f.const_i32("k_row", &[3], &[0, 0, 0]).unwrap();
    let v_row = f.const_i32("v_row", &[3], &[1, 0, 0]).unwrap();
    let extent = f
        .const_i32("extent", &[4], &[1, 1, d as i32, cols as i32])
        .unwrap();
    let k_begin = f.concat("k_begin", &[k_row, pos], 0).unwrap();
    let v_begin = f.concat("v_begin", &[v_row, pos], 0).unwrap();
    let k_end = f.add("k_end", k_begin, extent).unwrap();
    let v_end = f.add("v_end", v_begin, extent).unwrap();
    let old = f.read_state("old", kv).unwrap();
    let with_k = f.slice_update("k_upd", old, k, k_begin, k_end).unwrap();
    f.slice_update("v_upd", with_k, v, v_begin, v_end).unwrap()
}

/// One query's attention per head as the converter writes it, `matmul → add mask → reduce_max
/// → sub → softmax → matmul`, over shared `k`/`v` (`[1, 1, d, S]`); head 1 adds the mask first
/// (the operand order must not matter).
pub fn attention_heads(
    f: &mut anemone_mil::FunctionBuilder,
    qs: &[anemone_mil::Var],
    k: anemone_mil::Var,
    v: anemone_mil::Var,
    mask: anemone_mil::Var,
) -> Vec<anemone_mil::Var> {
    attention_heads_named(f, "h", qs, k, v, mask)
}

/// [`attention_heads`] with op names starting `{prefix}{h}_` (several KV heads in one program).
pub fn attention_heads_named(
    f: &mut anemone_mil::FunctionBuilder,
    prefix: &str,
    qs: &[anemone_mil::Var],
    k: anemone_mil::Var,
    v: anemone_mil::Var,
    mask: anemone_mil::Var,
) -> Vec<anemone_mil::Var> {
    let mut outs = Vec::new();
    for (h, &q) in qs.iter().enumerate() {
        let second = h == 1;
        let h = format!("{prefix}{h}");
        let scores = f.matmul(&format!("{h}_scores"), q, k, true, false).unwrap();
        let masked = if second {
            f.add(&format!("{h}_masked"), mask, scores).unwrap()
        } else {
            f.add(&format!("{h}_masked"), scores, mask).unwrap()
        };
        let row_max = f
            .reduce_max(&format!("{h}_max"), masked, &[-1], true)
            .unwrap();
        let shifted = f.sub(&format!("{h}_shifted"), masked, row_max).unwrap();
        let probs = f.softmax(&format!("{h}_probs"), shifted, -1).unwrap();
        outs.push(
            f.matmul(&format!("{h}_attn"), v, probs, false, true)
                .unwrap(),
        );
    }
    outs
}

/// A KV-cached attention step as the converter writes it: the cache `kv [2, 1, d, slots]`
/// (K in row 0, V in row 1) gets `cols` columns of `k`, `v` written at `pos`, then `heads`
/// query heads of `cols` columns each run the six attention ops over windows of the updated
/// cache (widened to f32 first when `widen`, as fp32 programs do). Inputs `q0…`, `k`, `v`,
/// `mask`, `pos` of `dtype` (k, v cast to the cache's fp16 when f32); output the heads
/// concatenated.
pub fn kv_attention_step(
    name: &str,
    dtype: anemone_mil::DType,
    widen: bool,
    (heads, d, slots, cols): (usize, usize, usize, usize),
) -> anemone_mil::Function {
    use anemone_mil::{DType, FunctionBuilder, TensorType};
    let mut f = FunctionBuilder::new(name);
    let columns = |f: &mut FunctionBuilder, name: &str| {
        f.input(name, TensorType::new(dtype, [1, 1, d, cols]))
            .unwrap()
    };
    let qs: Vec<_> = (0..heads)
        .map(|h| columns(&mut f, &format!("q{h}")))
        .collect();
    let (k, v) = (columns(&mut f, "k"), columns(&mut f, "v"));
    let mask = f
        .input("mask", TensorType::new(dtype, [1, 1, cols, slots]))
        .unwrap();
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let kv = f
        .state("kv", TensorType::new(DType::F16, [2, 1, d, slots]))
        .unwrap();
    let (k, v) = if dtype == DType::F16 {
        (k, v)
    } else {
        (
            f.cast("k16", k, DType::F16).unwrap(),
            f.cast("v16", v, DType::F16).unwrap(),
        )
    };
    let with_v = kv_update(&mut f, kv, k, v, pos, d, cols);
    let (d, s) = (d as i64, slots as i64);
    let mut ks = f
        .slice_by_index("ks", with_v, &[0, 0, 0, 0], &[1, 1, d, s], None)
        .unwrap();
    let mut vs = f
        .slice_by_index("vs", with_v, &[1, 0, 0, 0], &[2, 1, d, s], None)
        .unwrap();
    if widen {
        ks = f.cast("ks32", ks, DType::F32).unwrap();
        vs = f.cast("vs32", vs, DType::F32).unwrap();
    }
    let outs = attention_heads(&mut f, &qs, ks, vs, mask);
    let all = f.concat("heads", &outs, 2).unwrap();
    f.write_state("write", kv, with_v).unwrap();
    f.output(all).unwrap();
    f.finish().unwrap()
}
