//! Times the executor on a Qwen2.5-0.5B-sized MLP projection (1×1 conv 896 → 4864), decode
//! (T = 1) and prefill (T = 64), in both precisions, from a package written to disk.
//!
//! `cargo run --release -p anemone-exec --example bench_conv`

use std::collections::HashMap;
use std::time::Instant;

use anemone_exec::{LoadedPackage, Precision, Tensor};
use anemone_mil::{
    write_package, DType, FunctionBuilder, Program, SpecVersion, TensorData, TensorType,
    WriteOptions,
};

const C_IN: usize = 896;
const C_OUT: usize = 4864;

fn function(name: &str, t: usize, w: &TensorData) -> anemone_mil::Function {
    let mut f = FunctionBuilder::new(name);
    let x = f
        .input("x", TensorType::new(DType::F16, [1, C_IN, 1, t]))
        .unwrap();
    let wv = f.constant("w", w.clone()).unwrap();
    let y = f.conv1x1("y", x, wv, None).unwrap();
    f.output(y).unwrap();
    f.finish().unwrap()
}

fn main() {
    let weights: Vec<f32> = (0..C_IN * C_OUT)
        .map(|i| ((i * 7919 % 1000) as f32 - 500.0) * 1e-4)
        .collect();
    let w = TensorData::f16_from_f32(vec![C_OUT, C_IN, 1, 1], &weights).unwrap();
    let mut program = Program::new(SpecVersion::V9);
    program.add_function(function("decode", 1, &w)).unwrap();
    program.add_function(function("prefill", 64, &w)).unwrap();
    let dir = std::env::temp_dir().join(format!("anemone-bench-{}", std::process::id()));
    let path = dir.join("conv.mlpackage");
    write_package(&program, &path, &WriteOptions::default()).unwrap();
    for precision in [Precision::Fp32, Precision::Fp16] {
        let start = Instant::now();
        let package = LoadedPackage::load(&path, precision).unwrap();
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        for (function, t, iters) in [("decode", 1usize, 400), ("prefill", 64, 40)] {
            let x = Tensor::f16(
                vec![1, C_IN, 1, t],
                (0..C_IN * t).map(|i| (i % 13) as f32 * 0.1).collect(),
            )
            .unwrap();
            let inputs: HashMap<String, Tensor> = [("x".to_string(), x)].into();
            let mut state = package.new_state(function).unwrap();
            for _ in 0..iters / 10 {
                package.predict(function, &inputs, &mut state).unwrap();
            }
            let mut times: Vec<f64> = (0..iters)
                .map(|_| {
                    let s = Instant::now();
                    package.predict(function, &inputs, &mut state).unwrap();
                    s.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            times.sort_by(|a, b| a.partial_cmp(b).unwrap());
            let p50 = times[times.len() / 2];
            let gflops = 2.0 * (C_IN * C_OUT * t) as f64 / p50 / 1e3;
            let gbs = (C_IN * C_OUT * 2) as f64 / p50 / 1e3; // fp16 weights
            println!(
                "{precision} {function:7} T={t:<3} p50 {p50:9.1} µs  min {:9.1} µs  {gflops:6.1} GFLOP/s  weights {gbs:5.1} GB/s  (load {load_ms:.0} ms)",
                times[0]
            );
        }
    }
    std::fs::remove_dir_all(&dir).ok();
}
