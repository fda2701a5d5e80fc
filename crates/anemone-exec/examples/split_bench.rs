//! Throughput of the fused int8 and int4 / uint4 matvecs with and without splitting,
//! symmetric and with fp16 offsets, on a weight that stays in cache (the kernel's arithmetic, not
//! memory): the minimum over interleaved trials, robust to other load on the machine. The rows
//! are spread over rayon's pool: set `RAYON_NUM_THREADS=1` for one core's figure.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p anemone-exec --example split_bench [rows cols [trials]]`

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
    // 4-bit codes (two a byte) and offsets within uint4's range, integers and halves (as
    // block-quantized sources give: the kernels' `Split::Rounds` rows)
    let nibbles: Vec<u8> = (0..rows * k / 2).map(|i| (i * 7919 % 253) as u8).collect();
    let offsets4: Vec<u16> = (0..rows * blocks)
        .map(|i| f16::from_f32((i % 31) as f32 * 0.5).to_bits())
        .collect();
    let split = quant::split_used();
    // name, 4-bit (uint4 with offsets / int4 without), offsets, split
    let kinds = [
        ("int8", false, false, false),
        ("int8 split", false, false, true),
        ("grid", false, true, false),
        ("grid split", false, true, true),
        ("int4", true, false, false),
        ("int4 split", true, false, true),
        ("uint4 grid", true, true, false),
        ("uint4 split", true, true, true),
    ];
    for &(_, four, grid, _) in &kinds {
        let offs = if four { &offsets4 } else { &offsets };
        let bits = if four {
            quant::Bits::Four
        } else {
            quant::Bits::Eight
        };
        let ok = scales.chunks_exact(2).zip(offs).all(|(s, &o)| {
            let s = f16::from_le_bytes([s[0], s[1]]);
            let o = grid.then(|| f16::from_bits(o));
            quant::split_level_of(bits, !(four && grid), s, o) != quant::Split::No
        });
        assert!(ok, "every block passes `split_level_of`");
    }
    let mut dst = vec![0.0f32; rows];
    let mut best = [f64::INFINITY; 8];
    let mut sums = [0.0f32; 8];
    for _ in 0..trials {
        for (n, &(_, four, grid, s)) in kinds.iter().enumerate() {
            let t = Instant::now();
            for _ in 0..10 {
                let ok = quant::matvec(&mut dst, &x, |i| {
                    let b = i * blocks..(i + 1) * blocks;
                    let how = quant::ShiftScale {
                        signed: !(four && grid),
                        scales: scales.get(2 * b.start..2 * b.end)?,
                        offsets: grid.then(|| {
                            quant::Offsets::F16(if four { &offsets4[b] } else { &offsets[b] })
                        }),
                        round_shift: true,
                        split: match (s && split, grid) {
                            (false, _) => quant::Split::No,
                            (true, true) => quant::Split::Rounds,
                            (true, false) => quant::Split::Exact,
                        },
                    };
                    Some(match four {
                        false => quant::Row::Bytes {
                            codes: codes.get(i * k..(i + 1) * k)?,
                            how,
                            per,
                        },
                        true => quant::Row::Nibbles {
                            codes: nibbles.get(i * k / 2..(i + 1) * k / 2)?,
                            tables: quant::Tables::ShiftScale(how),
                            per,
                        },
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
    for pair in sums.chunks_exact(2) {
        assert_eq!(
            pair[0].to_bits(),
            pair[1].to_bits(),
            "split changes the dots"
        );
    }
}
