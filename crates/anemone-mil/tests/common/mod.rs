//! Programs shared by the integration tests.
#![allow(dead_code)]

use anemone_mil::{
    ConvParams, DType, FunctionBuilder, GeluMode, Program, SpecVersion, TensorData, TensorType,
};

/// Deterministic pseudo-random values in [-1, 1) (xorshift), so tests need no RNG crate.
pub fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut s = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 7;
            s ^= s << 17;
            ((s >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

pub const C: usize = 32;
pub const CTX: usize = 64;

/// Shared weights of the KV-cache test block.
pub struct Weights {
    pub wk: TensorData,
    pub wv: TensorData,
    pub norm: TensorData,
}

pub fn weights() -> Weights {
    Weights {
        wk: TensorData::f16_from_f32(vec![C, C, 1, 1], &values(1, C * C)).unwrap(),
        wv: TensorData::f16_from_f32(vec![C, C, 1, 1], &values(2, C * C)).unwrap(),
        norm: TensorData::f16_from_f32(vec![C], &values(3, C)).unwrap(),
    }
}

/// A stateful KV-cache update function with `t` tokens: projections as 1×1 conv, the K/V
/// window written at `pos` with slice_update + write_state, attention over the cache.
pub fn kv_function(name: &str, t: usize, w: &Weights) -> anemone_mil::Function {
    let mut f = FunctionBuilder::new(name);
    let x = f
        .input("x", TensorType::new(DType::F16, [1, C, 1, t]))
        .unwrap();
    let pos = f.input("pos", TensorType::new(DType::I32, [1])).unwrap();
    let mask = f
        .input("mask", TensorType::new(DType::F16, [1, 1, t, CTX]))
        .unwrap();
    let k_cache = f
        .state("k_cache", TensorType::new(DType::F16, [1, C, 1, CTX]))
        .unwrap();
    let v_cache = f
        .state("v_cache", TensorType::new(DType::F16, [1, C, 1, CTX]))
        .unwrap();

    let gamma = f.constant("norm_w", w.norm.clone()).unwrap();
    let h = f
        .layer_norm("ln", x, &[1], Some(gamma), None, 1e-5)
        .unwrap();
    let wk = f.constant("wk", w.wk.clone()).unwrap();
    let wv = f.constant("wv", w.wv.clone()).unwrap();
    let k = f.conv1x1("k_proj", h, wk, None).unwrap();
    let v = f.conv1x1("v_proj", h, wv, None).unwrap();

    let zeros = f.const_i32("kv_begin_head", &[3], &[0, 0, 0]).unwrap();
    let begin = f.concat("kv_begin", &[zeros, pos], 0).unwrap();
    let extent = f
        .const_i32("kv_extent", &[4], &[1, C as i32, 1, t as i32])
        .unwrap();
    let end = f.add("kv_end", begin, extent).unwrap();
    let k_old = f.read_state("k_old", k_cache).unwrap();
    let k_new = f.slice_update("k_new", k_old, k, begin, end).unwrap();
    f.write_state("k_write", k_cache, k_new).unwrap();
    let v_old = f.read_state("v_old", v_cache).unwrap();
    let v_new = f.slice_update("v_new", v_old, v, begin, end).unwrap();
    f.write_state("v_write", v_cache, v_new).unwrap();

    // scores [1, 1, t, CTX] = q^T k over channels, q = h
    let q2 = f.reshape("q2", h, &[1, 1, C as i64, t as i64]).unwrap();
    let k2 = f
        .reshape("k2", k_new, &[1, 1, C as i64, CTX as i64])
        .unwrap();
    let scores = f.matmul("scores", q2, k2, true, false).unwrap();
    let masked = f.add("masked", scores, mask).unwrap();
    let m = f.reduce_max("row_max", masked, &[-1], true).unwrap();
    let shifted = f.sub("shifted", masked, m).unwrap();
    let p = f.softmax("probs", shifted, -1).unwrap();
    let v2 = f
        .reshape("v2", v_new, &[1, 1, C as i64, CTX as i64])
        .unwrap();
    let attn = f.matmul("attn", v2, p, false, true).unwrap(); // [1, 1, C, t]
    let out = f
        .reshape("attn_out", attn, &[1, C as i64, 1, t as i64])
        .unwrap();
    let y = f.add("residual", x, out).unwrap();
    f.output(y).unwrap();
    f.finish().unwrap()
}

/// `decode` (T=1) and `prefill` (T=8) sharing one copy of the weights.
pub fn two_function_program() -> Program {
    let w = weights();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(kv_function("decode", 1, &w)).unwrap();
    p.add_function(kv_function("prefill", 8, &w)).unwrap();
    p.metadata.insert("anemone.test".into(), "kv".into());
    p
}

/// A conv-heavy block: 3×3 conv with pads, strided conv, grouped conv, gelu, tanh, cast.
pub fn conv_program() -> Program {
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("image", TensorType::new(DType::F32, [1, 8, 16, 16]))
        .unwrap();
    let xh = f.cast("x16", x, DType::F16).unwrap();
    let w1 = f
        .constant(
            "w1",
            TensorData::f16_from_f32(vec![16, 8, 3, 3], &values(10, 16 * 8 * 9)).unwrap(),
        )
        .unwrap();
    let b1 = f
        .constant(
            "b1",
            TensorData::f16_from_f32(vec![16], &values(11, 16)).unwrap(),
        )
        .unwrap();
    let pad = ConvParams {
        pad: [1, 1, 1, 1],
        ..Default::default()
    };
    let c1 = f.conv("conv3x3", xh, w1, Some(b1), pad).unwrap();
    let g1 = f.gelu("gelu", c1, GeluMode::TanhApproximation).unwrap();
    let w2 = f
        .constant(
            "w2",
            TensorData::f16_from_f32(vec![16, 4, 3, 3], &values(12, 16 * 4 * 9)).unwrap(),
        )
        .unwrap();
    let strided = ConvParams {
        strides: [2, 2],
        pad: [1, 0, 1, 0],
        groups: 4,
        ..Default::default()
    };
    let c2 = f.conv("grouped_stride2", g1, w2, None, strided).unwrap();
    let t = f.tanh("tanh", c2).unwrap();
    let w3 = f
        .constant(
            "w3",
            TensorData::f16_from_f32(vec![4, 16, 1, 1], &values(13, 64)).unwrap(),
        )
        .unwrap();
    let c3 = f.conv1x1("pointwise", t, w3, None).unwrap();
    let out = f.cast("out", c3, DType::F32).unwrap();
    f.output(out).unwrap();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    p
}
