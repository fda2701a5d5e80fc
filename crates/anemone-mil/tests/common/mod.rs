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

/// Compressed weights: int8 per-channel and int4 blockwise shift-scale, and grouped-channel
/// LUTs with uint4 / uint6 / uint8 indices, each feeding a 1×1 conv.
pub fn constexpr_program() -> Program {
    const O: usize = 16;
    const I: usize = 32;
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("x", TensorType::new(DType::F16, [1, I, 1, 4]))
        .unwrap();
    let codes = |seed: u64, lo: i32, hi: i32, n: usize| -> Vec<i32> {
        values(seed, n)
            .iter()
            .map(|v| lo + (((v + 1.0) / 2.0) * (hi - lo + 1) as f32) as i32)
            .map(|c| c.min(hi))
            .collect()
    };
    let int8 =
        TensorData::pack_ints(DType::I8, vec![O, I, 1, 1], &codes(20, -128, 127, O * I)).unwrap();
    let scale8 = TensorData::f16_from_f32(
        vec![O, 1, 1, 1],
        &values(21, O)
            .iter()
            .map(|v| v.abs() * 0.01 + 1e-3)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let w8 = f
        .constexpr_blockwise_shift_scale("w_int8", int8, scale8, None)
        .unwrap();
    let mut acc = f.conv1x1("y_int8", x, w8, None).unwrap();

    let block = 8;
    let int4 =
        TensorData::pack_ints(DType::I4, vec![O, I, 1, 1], &codes(22, -8, 7, O * I)).unwrap();
    let scale4 = TensorData::f16_from_f32(
        vec![O, I / block, 1, 1],
        &values(23, O * I / block)
            .iter()
            .map(|v| v.abs() * 0.1 + 1e-3)
            .collect::<Vec<_>>(),
    )
    .unwrap();
    let offset4 = TensorData::pack_ints(
        DType::I4,
        vec![O, I / block, 1, 1],
        &codes(24, -2, 2, O * I / block),
    )
    .unwrap();
    let w4 = f
        .constexpr_blockwise_shift_scale("w_int4", int4, scale4, Some(offset4))
        .unwrap();
    let y4 = f.conv1x1("y_int4", x, w4, None).unwrap();
    acc = f.add("sum_int4", acc, y4).unwrap();

    for (bits, dtype) in [(4u32, DType::U4), (6, DType::U6), (8, DType::U8)] {
        let group = 4;
        let k = 1usize << bits;
        let idx = TensorData::pack_ints(
            dtype,
            vec![O, I, 1, 1],
            &codes(30 + bits as u64, 0, k as i32 - 1, O * I),
        )
        .unwrap();
        let lut = TensorData::f16_from_f32(
            vec![O / group, 1, 1, 1, k, 1],
            &values(40 + bits as u64, O / group * k),
        )
        .unwrap();
        let w = f
            .constexpr_lut_to_dense(&format!("w_lut{bits}"), idx, lut)
            .unwrap();
        let y = f.conv1x1(&format!("y_lut{bits}"), x, w, None).unwrap();
        acc = f.add(&format!("sum_lut{bits}"), acc, y).unwrap();
    }
    let out = f.silu("out", acc).unwrap();
    f.output(out).unwrap();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    p
}

/// A BERT-style encoder layer in (S, C) layout: linear, gelu, layer_norm with beta, tanh pooler.
pub fn encoder_program() -> Program {
    const S: usize = 8;
    const H: usize = 16;
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("hidden", TensorType::new(DType::F32, [1, S, H]))
        .unwrap();
    let w = f
        .constant(
            "w_ff",
            TensorData::from_f32(vec![4 * H, H], &values(50, 4 * H * H)).unwrap(),
        )
        .unwrap();
    let b = f
        .constant(
            "b_ff",
            TensorData::from_f32(vec![4 * H], &values(51, 4 * H)).unwrap(),
        )
        .unwrap();
    let h = f.linear("ff1", x, w, Some(b)).unwrap();
    let g = f.gelu("ff_gelu", h, GeluMode::Exact).unwrap();
    let w2 = f
        .constant(
            "w_ff2",
            TensorData::from_f32(vec![H, 4 * H], &values(52, 4 * H * H)).unwrap(),
        )
        .unwrap();
    let h2 = f.linear("ff2", g, w2, None).unwrap();
    let r = f.add("res", x, h2).unwrap();
    let gamma = f
        .constant(
            "ln_g",
            TensorData::from_f32(vec![H], &values(53, H)).unwrap(),
        )
        .unwrap();
    let beta = f
        .constant(
            "ln_b",
            TensorData::from_f32(vec![H], &values(54, H)).unwrap(),
        )
        .unwrap();
    let n = f
        .layer_norm("ln", r, &[-1], Some(gamma), Some(beta), 1e-12)
        .unwrap();
    let first = f
        .slice_by_index("cls", n, &[0, 0, 0], &[1, 1, i64::MAX], None)
        .unwrap();
    let flat = f.squeeze("cls_flat", first, &[1]).unwrap();
    let pooled = f.tanh("pooler", flat).unwrap();
    let two = f.scalar("two", DType::F32, 2.0).unwrap();
    let sq = f.pow("sq", pooled, two).unwrap();
    let s = f.reduce_sum("ssum", sq, &[-1], true).unwrap();
    let nrm = f.rsqrt("inv_norm", s, 1e-12).unwrap();
    let emb = f.mul("embedding", pooled, nrm).unwrap();
    f.output(n).unwrap();
    f.output(emb).unwrap();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    p
}

/// One function using every unary/binary/reduce/shape op the crate has, so the validator
/// sees each op type at least once.
pub fn every_op_program() -> Program {
    use anemone_mil::{BinaryOp, ReduceOp, UnaryOp};
    let mut f = FunctionBuilder::new("main");
    let x = f
        .input("x", TensorType::new(DType::F16, [1, 8, 1, 6]))
        .unwrap();
    let mut acc = f.abs("x_abs", x).unwrap();
    for kind in UnaryOp::ALL {
        let y = f
            .unary(&format!("u_{}", kind.mil_type()), kind, acc)
            .unwrap();
        acc = f.add(&format!("acc_{}", kind.mil_type()), acc, y).unwrap();
    }
    let one = f.scalar("one", DType::F16, 1.0).unwrap();
    let pos = f.add("positive", acc, one).unwrap();
    for kind in BinaryOp::ALL {
        let y = f
            .binary(&format!("b_{}", kind.mil_type()), kind, pos, one)
            .unwrap();
        acc = f.add(&format!("accb_{}", kind.mil_type()), acc, y).unwrap();
    }
    for kind in ReduceOp::ALL {
        let r = f
            .reduce(&format!("r_{}", kind.mil_type()), kind, acc, &[1], true)
            .unwrap();
        acc = f.sub(&format!("accr_{}", kind.mil_type()), acc, r).unwrap();
    }
    let g = f
        .gelu("gelu_sig", acc, GeluMode::SigmoidApproximation)
        .unwrap();
    let rs = f.rsqrt("rs", pos, 1e-6).unwrap();
    let m = f.mul("gm", g, rs).unwrap();
    let t = f.transpose("tr", m, &[0, 3, 2, 1]).unwrap(); // [1, 6, 1, 8]
    let parts = f.split("halves", t, &[2, 4], 1).unwrap();
    let cat = f.concat("recat", &[parts[1], parts[0]], 1).unwrap();
    let sq = f.squeeze("sq", cat, &[0, 2]).unwrap(); // [6, 8]
    let ex = f.expand_dims("ex", sq, &[0]).unwrap(); // [1, 6, 8]
    let w = f
        .constant(
            "lin_w",
            TensorData::f16_from_f32(vec![5, 8], &values(60, 40)).unwrap(),
        )
        .unwrap();
    let lin = f.linear("lin", ex, w, None).unwrap(); // [1, 6, 5]
    let mm = f.matmul("mm", lin, lin, true, false).unwrap(); // [1, 5, 5]
    let sm = f.softmax("sm", mm, -1).unwrap();
    let sl = f
        .slice_by_index("sl", sm, &[0, 1, 0], &[1, 5, 5], Some(&[1, 2, 1]))
        .unwrap(); // [1, 2, 5]
    let rsh = f.reshape("rsh", sl, &[10]).unwrap();
    let out = f.cast("out", rsh, DType::F32).unwrap();
    let idx = f.cast("as_int", rsh, DType::I32).unwrap();
    let idx2 = f.maximum("int_max", idx, idx).unwrap();
    f.output(out).unwrap();
    f.output(idx2).unwrap();
    let mut p = Program::new(SpecVersion::V9);
    p.add_function(f.finish().unwrap()).unwrap();
    p
}
