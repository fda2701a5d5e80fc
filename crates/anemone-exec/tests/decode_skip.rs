//! A decode step's heads over a KV state read only the written columns of the state (the rest
//! hold zeros and are hidden by the mask): through a whole context, after a state set from
//! outside and after a reset, every output and the state are bit for bit those of the observed
//! run, which runs every op over every column.

mod common;

use anemone_exec::{OpOutput, Precision, Tensor};
use anemone_mil::{DType, Function};
use common::*;

const D: usize = 64; // head dim
const S: usize = 200; // context slots (not a multiple of the skip step)
const HEADS: usize = 2;

/// `kv [2, 1, D, S]` (K row 0, V row 1): write k, v at `pos`, then per head the six ops over
/// windows of the updated cache (widened to f32 first when `widen`, as fp32 programs do).
fn decode(dtype: DType, widen: bool) -> Function {
    kv_attention_step("main", dtype, widen, (HEADS, D, S, 1))
}

fn bits(t: &Tensor) -> Vec<u32> {
    t.data.iter().map(|x| x.to_bits()).collect()
}

#[test]
fn decode_over_the_written_columns_gives_the_observed_values_bit_for_bit() {
    for (dtype, widen, precision) in [
        (DType::F16, false, Precision::Fp16),
        (DType::F32, true, Precision::Fp32),
        (DType::F16, false, Precision::Fp32),
    ] {
        let loaded = load(vec![decode(dtype, widen)], precision);
        let pkg = &loaded.package;
        let t = |shape: Vec<usize>, data: Vec<f32>| match dtype {
            DType::F16 => Tensor::f16(shape, data).unwrap(),
            _ => Tensor::f32(shape, data).unwrap(),
        };
        let mut state = pkg.new_state("main").unwrap();
        let mut observed_state = state.clone();
        // (first position, how the state starts): fresh; set from outside with garbage in
        // its first 40 slots and a NaN in its last (no column past the written ones may be
        // skipped); reset after a full context
        for (phase, first) in [(0, 0usize), (1, 40), (2, 0)] {
            match phase {
                1 => {
                    let mut kv = values(2 * D * S, 9, 4.0);
                    for (i, x) in kv.iter_mut().enumerate() {
                        if i % S >= first {
                            *x = 0.0;
                        }
                    }
                    // a NaN in the last V slot: every output is NaN until a step writes it
                    kv[D * S + S - 1] = f32::NAN;
                    let kv = Tensor::f16(vec![2, 1, D, S], kv).unwrap();
                    state.insert("kv", kv.clone());
                    observed_state.insert("kv", kv);
                }
                2 => {
                    state.reset();
                    observed_state.reset();
                }
                _ => {}
            }
            for position in first..S {
                let seed = (position * 7 + phase) as u64;
                let mask: Vec<f32> = (0..S)
                    .map(|j| if j <= position { 0.0 } else { -1e4 })
                    .collect();
                let mut list = vec![
                    ("k", t(vec![1, 1, D, 1], values(D, seed, 3.0))),
                    ("v", t(vec![1, 1, D, 1], values(D, seed + 1, 1.0))),
                    ("mask", t(vec![1, 1, 1, S], mask)),
                    ("pos", Tensor::i32(vec![1], &[position as i32]).unwrap()),
                ];
                let names: Vec<String> = (0..HEADS).map(|h| format!("q{h}")).collect();
                for (h, name) in names.iter().enumerate() {
                    let q = values(D, seed + 2 + h as u64, 1.5);
                    list.push((name, t(vec![1, 1, D, 1], q)));
                }
                let ins = inputs(list);
                let out = pkg.predict("main", &ins, &mut state).unwrap();
                let mut observer = |_: OpOutput<'_>| {};
                let observed = pkg
                    .predict_observed("main", &ins, &mut observed_state, &mut observer)
                    .unwrap();
                let case =
                    format!("{dtype:?} widen {widen} {precision:?} phase {phase} at {position}");
                assert_eq!(bits(&out["heads"]), bits(&observed["heads"]), "{case}");
                let kv = |s: &anemone_exec::State| bits(&s.get("kv").unwrap());
                assert!(kv(&state) == kv(&observed_state), "{case}: states differ");
            }
        }
    }
}
