//! Times every function of a package (e.g. one decoder chunk of a bundle) on zero inputs
//! (int32 inputs 0 = position 0), in both precisions, and prints per-op-type time shares.
//!
//! `cargo run --release -p anemone-exec --example bench_package -- PATH.mlpackage [ITERS] [FUNCTION]`

use std::collections::HashMap;
use std::time::Instant;

use anemone_exec::{LoadedPackage, Precision, Tensor};

fn main() {
    let mut args = std::env::args().skip(1);
    let Some(path) = args.next() else {
        eprintln!("usage: bench_package PATH.mlpackage [ITERS] [FUNCTION]");
        std::process::exit(2);
    };
    let iters: usize = args.next().and_then(|s| s.parse().ok()).unwrap_or(50);
    let only = args.next();
    for precision in [Precision::Fp32, Precision::Fp16] {
        let start = Instant::now();
        let package = match LoadedPackage::load(path.as_ref(), precision) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("{e}");
                std::process::exit(1);
            }
        };
        let load_ms = start.elapsed().as_secs_f64() * 1e3;
        let names: Vec<String> = package.function_names().map(str::to_string).collect();
        for function in names {
            if only.as_ref().is_some_and(|o| *o != function) {
                continue;
            }
            let sig = package.signature(&function).unwrap().clone();
            let inputs: HashMap<String, Tensor> = sig
                .inputs
                .iter()
                .map(|p| {
                    (
                        p.name.clone(),
                        Tensor::zeros(p.ty.dtype, p.ty.shape.clone()),
                    )
                })
                .collect();
            let mut state = package.new_state(&function).unwrap();
            let in_place = package.in_place_state_updates(&function).unwrap().len();
            for _ in 0..iters.div_ceil(10) {
                package.predict(&function, &inputs, &mut state).unwrap();
            }
            let mut times: Vec<f64> = (0..iters)
                .map(|_| {
                    let s = Instant::now();
                    package.predict(&function, &inputs, &mut state).unwrap();
                    s.elapsed().as_secs_f64() * 1e6
                })
                .collect();
            times.sort_by(|a, b| a.total_cmp(b));
            println!(
                "{precision} {function:8} p50 {:9.1} µs  min {:9.1} µs  (load {load_ms:.0} ms, {in_place} in-place state writes)",
                times[times.len() / 2],
                times[0]
            );
        }
    }
}
