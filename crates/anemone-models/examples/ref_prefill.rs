//! Times the fp32 reference's prefill (and a few decode steps) on a checkpoint, the model loaded
//! once: `cargo run --release -p anemone-models --example ref_prefill -- MODEL IDS_FILE
//! [--threads N] [--repeats N] [--logits OUT]` (IDS_FILE: comma-separated prompt ids). `--logits`
//! writes the last prefill's logits as little-endian f32 (for bit-identity checks).

use anemone_models::reference::{LogitsFor, ReferenceModel, ReferenceOptions};
use anemone_testkit::cpu_time::process_seconds;
use std::time::Instant;

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let (model, ids_file) = (&args[1], &args[2]);
    let flag = |name: &str| {
        args.iter()
            .position(|a| a == name)
            .map(|i| args[i + 1].clone())
    };
    let threads = flag("--threads").map(|v| v.parse().unwrap());
    let repeats: usize = flag("--repeats").map_or(5, |v| v.parse().unwrap());
    let ids: Vec<u32> = std::fs::read_to_string(ids_file)
        .unwrap()
        .split(|c: char| c == ',' || c.is_whitespace())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().unwrap())
        .collect();
    let checkpoint = anemone_models::open_checkpoint(std::path::Path::new(model)).unwrap();
    let options = ReferenceOptions {
        threads,
        context_len: Some(4096),
        huge_pages: false,
    };
    let mut m = ReferenceModel::load(&checkpoint, &options).unwrap();
    let (mut best, mut best_cpu) = (f64::INFINITY, f64::INFINITY);
    let mut logits = Vec::new();
    for _ in 0..repeats {
        m.reset();
        let (t, c) = (Instant::now(), process_seconds());
        logits = m.forward(&ids, LogitsFor::LastPosition).unwrap();
        let s = t.elapsed().as_secs_f64();
        best_cpu = best_cpu.min(process_seconds() - c);
        best = best.min(s);
        eprintln!("prefill {:.1} tok/s", ids.len() as f64 / s);
    }
    println!(
        "best prefill {:.1} tok/s (process CPU time: {:.1} tok/s·thread)",
        ids.len() as f64 / best,
        ids.len() as f64 / best_cpu
    );
    if let Some(out) = flag("--logits") {
        let bytes: Vec<u8> = logits.iter().flat_map(|v| v.to_le_bytes()).collect();
        std::fs::write(out, bytes).unwrap();
    }
}
