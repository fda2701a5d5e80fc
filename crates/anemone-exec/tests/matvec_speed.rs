//! Throughput of the single-token weight kernels (fp16 matvec, fused int8 / int4 / LUT-4) on a
//! working set larger than the last-level cache, as a decode step streams its weights.
//! A benchmark, not a test: `cargo test --release -p anemone-exec --test matvec_speed --
//! --ignored --nocapture` (env `MATVEC_THREADS`, default 2; `MATVEC_SHAPE=rows,cols`;
//! `MATVEC_KIND=<name>` times only the compressed kind of that name, e.g. `int8 grid split`).

use std::time::Instant;

use anemone_exec::kernels::{linalg, quant, simd};
use anemone_exec::team;
use half::f16;

/// Bytes of weights per kernel's working set: `MATVEC_WS_MB`, default well above a 32 MiB L3.
fn working_set() -> usize {
    std::env::var("MATVEC_WS_MB")
        .ok()
        .and_then(|s| s.parse::<usize>().ok())
        .unwrap_or(96)
        << 20
}

fn shape() -> (usize, usize) {
    std::env::var("MATVEC_SHAPE")
        .ok()
        .and_then(|s| {
            let (r, c) = s.split_once(',')?;
            Some((r.parse().ok()?, c.parse().ok()?))
        })
        .unwrap_or((1536, 576))
}

/// Runs `step(m)` over matrices `0..count` until `min_secs` pass; returns ns per weight.
fn time(weights_per_matrix: usize, count: usize, mut step: impl FnMut(usize)) -> f64 {
    for m in 0..count {
        step(m); // warm
    }
    let mut best = f64::INFINITY;
    for _ in 0..5 {
        let t = Instant::now();
        let mut n = 0usize;
        while t.elapsed().as_secs_f64() < 0.3 {
            for m in 0..count {
                step(m);
            }
            n += count;
        }
        best = best.min(t.elapsed().as_secs_f64() * 1e9 / (n * weights_per_matrix) as f64);
    }
    best
}

#[test]
#[ignore = "benchmark"]
fn matvec_throughput() {
    let threads = std::env::var("MATVEC_THREADS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2);
    let team = team::Team::shared(threads).unwrap();
    let (rows, k) = shape();
    let n = rows * k;
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    let mut dst = vec![0.0f32; rows];
    let report = |name: &str, bytes_per_weight: f64, ns: f64| {
        println!(
            "{name:>10} {rows}x{k}: {ns:.4} ns/weight, {:.2} GB/s of weights",
            bytes_per_weight / ns
        )
    };

    // fp16
    let count = (working_set() / (2 * n)).max(1);
    let w16: Vec<f16> = (0..count * n)
        .map(|i| f16::from_f32(((i * 7919 % 2003) as f32 - 1001.0) / 9770.0))
        .collect();
    // the matvec against one row at a time in 256 KiB blocks (the session-start loop),
    // interleaved so both see the same machine load
    let dot16 = simd::dot_f16_kernel();
    let rows_per_block = ((256 << 10) / (2 * k)).clamp(1, 1024);
    let (mut new, mut old) = (f64::INFINITY, f64::INFINITY);
    for _ in 0..3 {
        new = new.min(team::with_team(&team, || {
            time(n, count, |m| {
                linalg::matvec_f16(&mut dst, &w16[m * n..(m + 1) * n], &x).unwrap()
            })
        }));
        old = old.min(time(n, count, |m| {
            let w = &w16[m * n..(m + 1) * n];
            let out = team::SharedOut::new(&mut dst);
            let run = |b: usize| {
                let first = b * rows_per_block;
                // SAFETY: disjoint row ranges of `dst`, borrowed for the region.
                let chunk = unsafe { out.slice(first..(first + rows_per_block).min(rows)) };
                for (r, d) in chunk.iter_mut().enumerate() {
                    let i = first + r;
                    *d = dot16(&w[i * k..(i + 1) * k], &x);
                }
            };
            team::for_each_block(Some(&team), rows.div_ceil(rows_per_block), &run);
        }));
    }
    report("fp16", 2.0, new);
    report("fp16 1-row", 2.0, old);

    // int8 / int4 / lut4, blocks of 32 columns
    let per = 32;
    let scales: Vec<u8> = (0..(working_set() / (n / 2) + 1) * n / per)
        .flat_map(|i| f16::from_f32(0.001 + (i % 97) as f32 * 1e-5).to_le_bytes())
        .collect();
    let palettes: Vec<f16> = (0..16 * rows)
        .map(|i| f16::from_f32(((i * 31 % 17) as f32 - 8.0) / 100.0))
        .collect();
    // grid-like fp16 offsets (non-integer, as least-squares offsets are), every block passing
    // `quant::splits` (the claim of the "split" rows)
    let offsets: Vec<u16> = (0..scales.len() / 2)
        .map(|i| f16::from_f32(-20.25 + (i % 41) as f32 * 0.75).to_bits())
        .collect();
    assert!(scales.chunks_exact(2).zip(&offsets).all(|(s, &o)| {
        let s = f16::from_le_bytes([s[0], s[1]]);
        quant::splits(true, s, None) && quant::splits(true, s, Some(f16::from_bits(o)))
    }));
    let kinds = [
        ("int8", 1.0),
        ("int8 split", 1.0),
        ("int8 grid", 1.0),
        ("int8 grid split", 1.0),
        ("int4", 0.5),
        ("lut4", 0.5),
    ];
    for (name, bytes_per_weight) in kinds {
        if std::env::var("MATVEC_KIND").is_ok_and(|k| k != name) {
            continue;
        }
        let count = (working_set() / ((n as f64 * bytes_per_weight) as usize)).max(1);
        let row_bytes = (k as f64 * bytes_per_weight) as usize;
        let codes: Vec<u8> = (0..count * rows * row_bytes)
            .map(|i| (i * 7919 % 251) as u8)
            .collect();
        let blocks = k / per;
        // every scale and offset here passes `quant::splits`
        let level = match (name.contains("split"), name.contains("grid")) {
            (false, _) => quant::Split::No,
            (true, true) => quant::Split::Rounds,
            (true, false) => quant::Split::Exact,
        };
        let levels = vec![level; rows];
        let ns = team::with_team(&team, || {
            time(n, count, |m| {
                // matrix `m` as a decode step reads a weight: whole, its rows found by arithmetic
                let (first, end) = (m * rows, (m + 1) * rows);
                let c = &codes[first * row_bytes..end * row_bytes];
                let how = quant::ShiftScale {
                    signed: true,
                    scales: &scales[2 * first * blocks..2 * end * blocks],
                    offsets: name
                        .contains("grid")
                        .then(|| quant::Offsets::F16(&offsets[first * blocks..end * blocks])),
                    round_shift: true,
                    split: quant::Split::No,
                };
                let all = match name {
                    "int4" => quant::Row::Nibbles {
                        codes: c,
                        tables: quant::Tables::ShiftScale(how),
                        per,
                    },
                    "lut4" => quant::Row::Nibbles {
                        codes: c,
                        tables: quant::Tables::Palettes(&palettes),
                        per: k,
                    },
                    _ => quant::Row::Bytes { codes: c, how, per },
                };
                let w = quant::Weight::new(all, k, 1).unwrap().with_split(&levels);
                let ok = quant::matvec_weights(&mut [(&mut dst[..], w)], &x);
                assert!(ok || !quant::available());
            })
        });
        report(name, bytes_per_weight, ns);
    }
}
