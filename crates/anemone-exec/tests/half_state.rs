//! An fp16 program holds its fp16-declared KV state as fp16 (half the bytes) and computes
//! exactly what it computes over the same state held as f32: prefill (several query columns)
//! and decode steps give bit-identical outputs and states. An fp32 program's fp16-declared
//! state keeps its unrounded f32 values.

mod common;

use anemone_exec::{OpOutput, Precision, State, Tensor};
use anemone_mil::{DType, Function};
use common::*;

const D: usize = 64; // head dim
const S: usize = 150; // context slots (past two skip steps, not a multiple of one)
const HEADS: usize = 2;
const PREFILL: usize = 8;

/// `t` columns of k, v written at `pos`, then per head the six attention ops of `t` queries over
/// windows of the updated cache; an f32 `dtype` is an fp32 program over the fp16 cache.
fn step(name: &str, t: usize, dtype: DType) -> Function {
    kv_attention_step(name, dtype, dtype == DType::F32, (HEADS, D, S, t))
}

fn program(dtype: DType) -> Vec<Function> {
    vec![step("prefill", PREFILL, dtype), step("decode", 1, dtype)]
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

/// The inputs of `t` columns at `pos` (causal mask: query `i` sees columns `≤ pos + i`).
fn step_inputs(dtype: DType, t: usize, pos: usize) -> std::collections::HashMap<String, Tensor> {
    let make = |shape: Vec<usize>, data: Vec<f32>| match dtype {
        DType::F16 => Tensor::f16(shape, data).unwrap(),
        _ => Tensor::f32(shape, data).unwrap(),
    };
    let seed = pos as u64 * 13;
    let mask: Vec<f32> = (0..t * S)
        .map(|i| if i % S <= pos + i / S { 0.0 } else { -1e4 })
        .collect();
    let mut list = vec![
        ("k", make(vec![1, 1, D, t], values(D * t, seed, 3.0))),
        ("v", make(vec![1, 1, D, t], values(D * t, seed + 1, 1.0))),
        ("mask", make(vec![1, 1, t, S], mask)),
        ("pos", Tensor::i32(vec![1], &[pos as i32]).unwrap()),
    ];
    let names: Vec<String> = (0..HEADS).map(|h| format!("q{h}")).collect();
    for (h, name) in names.iter().enumerate() {
        let q = values(D * t, seed + 2 + h as u64, 1.5);
        list.push((name, make(vec![1, 1, D, t], q)));
    }
    inputs(list)
}

/// A state holding `kv` zeros as f32 (a plain `State`, as a caller builds one).
fn f32_held() -> State {
    let mut state = State::default();
    state.insert(
        "kv",
        Tensor::f16(vec![2, 1, D, S], vec![0.0; 2 * D * S]).unwrap(),
    );
    state
}

#[test]
fn an_fp16_program_holds_its_fp16_state_in_half_the_bytes() {
    let f32_bytes = 2 * D * S * 4;
    let fp16 = load(program(DType::F16), Precision::Fp16);
    let state = fp16.package.new_state("decode").unwrap();
    assert_eq!(state.holds_f32("kv"), Some(false));
    assert_eq!(state.bytes(), f32_bytes / 2);
    assert_eq!(state.holds_f32("absent"), None);
    // an fp32 program's fp16-declared state stays f32 (it holds unrounded values)
    let fp32 = load(program(DType::F16), Precision::Fp32);
    let state = fp32.package.new_state("decode").unwrap();
    assert_eq!(state.holds_f32("kv"), Some(true));
    assert_eq!(state.bytes(), f32_bytes);
    assert_eq!(f32_held().bytes(), f32_bytes);
}

/// Prefill then decode through the whole context, a reset, and again: the fp16-held state,
/// the f32-held one and the observed run (every op one by one, views materialised) give the
/// same outputs and states bit for bit, and the fp16 state stays fp16.
#[test]
fn fp16_held_state_gives_the_f32_held_results_bit_for_bit() {
    let loaded = load(program(DType::F16), Precision::Fp16);
    let pkg = &loaded.package;
    let mut half = pkg.new_state("decode").unwrap();
    let mut full = f32_held();
    let mut observed = pkg.new_state("decode").unwrap();
    for round in 0..2 {
        let mut pos = 0;
        while pos < S {
            let (function, t) = if pos == 0 {
                ("prefill", PREFILL)
            } else {
                ("decode", 1)
            };
            let ins = step_inputs(DType::F16, t, pos);
            let a = pkg.predict(function, &ins, &mut half).unwrap();
            let b = pkg.predict(function, &ins, &mut full).unwrap();
            let mut observer = |_: OpOutput<'_>| {};
            let c = pkg
                .predict_observed(function, &ins, &mut observed, &mut observer)
                .unwrap();
            let case = format!("round {round} {function} at {pos}");
            assert_eq!(bits(&a["heads"]), bits(&b["heads"]), "{case}");
            assert_eq!(bits(&a["heads"]), bits(&c["heads"]), "{case}");
            let kv = |s: &State| bits(&s.get("kv").unwrap());
            assert!(kv(&half) == kv(&full), "{case}: states differ");
            assert!(kv(&half) == kv(&observed), "{case}: states differ");
            assert!(half == full, "{case}");
            assert_eq!(half.holds_f32("kv"), Some(false), "{case}");
            assert_eq!(full.holds_f32("kv"), Some(true), "{case}");
            pos += t;
        }
        half.reset();
        full.reset();
        observed.reset();
        assert_eq!(half.holds_f32("kv"), Some(false));
    }
}

/// An fp32 program writes unrounded values into its fp16-declared state: they are kept
/// exactly, by a state it made (f32) and by one an fp16 program made (widened to f32 before
/// the first write it cannot hold).
#[test]
fn an_fp32_program_keeps_its_state_values_unrounded() {
    let fp32 = load(program(DType::F32), Precision::Fp32);
    let fp16 = load(program(DType::F32), Precision::Fp16);
    let mut own = fp32.package.new_state("decode").unwrap();
    let mut made_half = fp16.package.new_state("decode").unwrap();
    assert_eq!(made_half.holds_f32("kv"), Some(false));
    for pos in 0..4 {
        let ins = step_inputs(DType::F32, 1, pos);
        let a = fp32.package.predict("decode", &ins, &mut own).unwrap();
        let b = fp32
            .package
            .predict("decode", &ins, &mut made_half)
            .unwrap();
        assert_eq!(bits(&a["heads"]), bits(&b["heads"]), "at {pos}");
        assert_eq!(made_half.holds_f32("kv"), Some(true));
        assert!(own == made_half, "at {pos}");
    }
    let kv = own.get("kv").unwrap();
    // K row 0, column 0 holds the first step's k exactly as given
    let k0 = values(D, 0, 3.0);
    let column: Vec<f32> = (0..D).map(|i| kv.data[i * S]).collect();
    assert_eq!(column, k0);
    assert!(
        kv.data
            .iter()
            .any(|&x| half::f16::from_f32(x).to_f32() != x),
        "the fp32 program's values are not rounded to fp16"
    );
}
