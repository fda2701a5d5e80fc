//! Times the reference's prefill matrix product `matmul_t` on Qwen2.5-0.5B's projection shapes
//! (64 rows): `cargo run --release -p anemone-models --example ref_matmul -- [threads] [repeats]`.

use anemone_models::reference::kernels::matmul_t;
use anemone_testkit::cpu_time::thread_seconds;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let threads: usize = args.get(1).map_or(1, |v| v.parse().unwrap());
    let repeats: usize = args.get(2).map_or(20, |v| v.parse().unwrap());
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()
        .unwrap();
    // optional: one shape `rows n_in n_out` instead of Qwen2.5-0.5B's four at 64 rows
    let custom: Vec<usize> = args[3.min(args.len())..]
        .iter()
        .map(|v| v.parse().unwrap())
        .collect();
    let (rows, shapes) = match custom[..] {
        [rows, n_in, n_out] => (rows, vec![("custom", n_in, n_out)]),
        _ => (
            64,
            vec![
                ("qkv", 896, 1152),
                ("o", 896, 896),
                ("gate_up", 896, 9728),
                ("down", 4864, 896),
            ],
        ),
    };
    let mut total = 0.0;
    for (name, n_in, n_out) in shapes {
        let x: Vec<f32> = (0..rows * n_in).map(|i| (i % 97) as f32 * 0.01).collect();
        let w: Vec<f32> = (0..n_out * n_in).map(|i| (i % 89) as f32 * 0.01).collect();
        let mut y = vec![0f32; rows * n_out];
        let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
        pool.install(|| {
            for _ in 0..repeats {
                let (t, c) = (Instant::now(), thread_seconds());
                matmul_t(&x, &w, &mut y, rows, n_in, n_out);
                best_cpu = best_cpu.min(thread_seconds() - c);
                best = best.min(t.elapsed().as_secs_f64());
            }
        });
        total += best;
        let gflops = 2.0 * (rows * n_in * n_out) as f64 / best / 1e9;
        let cpu_gflops = 2.0 * (rows * n_in * n_out) as f64 / best_cpu / 1e9;
        println!(
            "{name:8} {n_in:5}→{n_out:5}: {:8.3} ms  {gflops:6.1} GFLOP/s (1st thread's CPU time: \
             {cpu_gflops:6.1})",
            best * 1e3
        );
    }
    println!(
        "per layer {:.3} ms, ×24 = {:.1} ms",
        total * 1e3,
        total * 24e3
    );
}
