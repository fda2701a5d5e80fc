//! Single-thread throughput of the fused int8 matvec with and without splitting, symmetric and
//! with fp16 offsets, on a weight that stays in cache (the kernel's arithmetic, not memory):
//! the minimum over interleaved trials, robust to other load on the machine.
//!
//! `cargo run --release -p anemone-exec --example split_bench [rows cols [trials]]`

use std::time::Instant;

use anemone_exec::kernels::quant;
use half::f16;

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, k, trials) = match args[..] {
        [r, c, t, ..] => (r, c, t),
        [r, c] => (r, c, 200),
        _ => (256, 576, 200),
    };
    let per = 32;
    let blocks = k / per;
    let codes: Vec<u8> = (0..rows * k).map(|i| (i * 7919 % 251) as u8).collect();
    let scales: Vec<u8> = (0..rows * blocks)
        .flat_map(|i| f16::from_f32(0.001 + (i % 97) as f32 * 1e-5).to_le_bytes())
        .collect();
    let offsets: Vec<u16> = (0..rows * blocks)
        .map(|i| f16::from_f32(-20.25 + (i % 41) as f32 * 0.75).to_bits())
        .collect();
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let split = quant::split_used();
    let kinds = [
        ("int8", false, false),
        ("int8 split", false, true),
        ("grid", true, false),
        ("grid split", true, true),
    ];
    for &(_, grid, _) in &kinds {
        let ok = scales.chunks_exact(2).zip(&offsets).all(|(s, &o)| {
            let s = f16::from_le_bytes([s[0], s[1]]);
            quant::splits(true, s, grid.then(|| f16::from_bits(o)))
        });
        assert!(ok, "every block passes `splits`");
    }
    let mut dst = vec![0.0f32; rows];
    let mut best = [f64::INFINITY; 4];
    let mut sums = [0.0f32; 4];
    for _ in 0..trials {
        for (n, &(_, grid, s)) in kinds.iter().enumerate() {
            let t = Instant::now();
            for _ in 0..10 {
                let ok = quant::matvec(&mut dst, &x, |i| {
                    Some(quant::Row::Bytes {
                        codes: codes.get(i * k..(i + 1) * k)?,
                        how: quant::ShiftScale {
                            signed: true,
                            scales: scales.get(2 * i * blocks..2 * (i + 1) * blocks)?,
                            offsets: grid.then(|| {
                                quant::Offsets::F16(&offsets[i * blocks..(i + 1) * blocks])
                            }),
                            round_shift: true,
                            split: match (s && split, grid) {
                                (false, _) => quant::Split::No,
                                (true, true) => quant::Split::Rounds,
                                (true, false) => quant::Split::Exact,
                            },
                        },
                        per,
                    })
                });
                assert!(ok);
            }
            best[n] = best[n].min(t.elapsed().as_secs_f64() * 1e9 / (10 * rows * k) as f64);
            sums[n] = dst.iter().sum();
        }
    }
    for (n, (name, ..)) in kinds.iter().enumerate() {
        println!(
            "{name:>11} {rows}x{k}: {:.4} ns/weight (sum {})",
            best[n], sums[n]
        );
    }
    assert_eq!(
        sums[0].to_bits(),
        sums[1].to_bits(),
        "split changes the symmetric dots"
    );
    assert_eq!(
        sums[2].to_bits(),
        sums[3].to_bits(),
        "split changes the offset dots"
    );
}
