//! Throughput of 8-bit palettized weights (`constexpr_lut_to_dense`, one 256-entry fp16
//! palette per 32 rows) on this CPU, in weights per second (minimum time over interleaved
//! trials, robust to other load): the look-up alone (`lut::form`: indices → fp16 values), and
//! the one-token matvec — `lut::matvec8` (what the executor runs: the next four rows looked up
//! while four are dotted), the rows formed four at a time and then dotted
//! (`quant::matvec_by_formed_rows`, its fallback) — beside the fp16 matvec
//! (`linalg::matvec_f16`) of the same shape — on the
//! first 128 rows of one weight, which stay in cache (the arithmetic), and on `mats` weights
//! streamed from memory (what a decode step sees). Rows are spread over rayon's pool:
//! `RAYON_NUM_THREADS=1` for one core's figure.
//!
//! `RAYON_NUM_THREADS=1 cargo run --release -p anemone-exec --example lut_bench [rows cols mats [trials]]`
//! (default 4864 896 20 6: Qwen2.5-0.5B's MLP up projection, 87 MB of indices streamed)

use std::hint::black_box;
use std::time::Instant;

use anemone_exec::kernels::{linalg, lut, quant};
use half::f16;

const PALETTE_ROWS: usize = 32;

/// One weight: its 8-bit indices and the same values as fp16.
struct Weight {
    indices: Vec<u8>,
    halves: Vec<f16>,
}

fn main() {
    let args: Vec<usize> = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse().ok())
        .collect();
    let (rows, k, mats, trials) = match args[..] {
        [r, c, m, t, ..] => (r, c, m, t),
        [r, c, m] => (r, c, m, 6),
        _ => (4864, 896, 20, 6),
    };
    let palettes: Vec<f16> = (0..256 * rows.div_ceil(PALETTE_ROWS))
        .map(|i| f16::from_f32((i % 509) as f32 / 256.0 - 1.0))
        .collect();
    let weights: Vec<Weight> = (0..mats.max(1))
        .map(|m| weight(rows, k, m, &palettes))
        .collect();
    let x: Vec<f32> = (0..k)
        .map(|i| ((i * 37 % 101) as f32 - 50.0) / 64.0)
        .collect();
    println!("{rows} × {k}, palettes of {PALETTE_ROWS} rows; giga-weights per second");
    // the first rows (at most 128: 112 KiB of indices for 896 columns) again and again
    let in_cache = weight(rows.min(128), k, 0, &palettes);
    println!(
        "look-up alone, in cache: {:.2}",
        look_up_rate(&in_cache, k, &palettes)
    );
    let hot = matvec_rates(std::slice::from_ref(&in_cache), &x, &palettes, 400 * trials);
    println!(
        "matvec, in cache:        lut8 {:.2} (formed first {:.2})  fp16 {:.2}",
        hot.lut8, hot.formed, hot.half
    );
    let streamed = matvec_rates(&weights, &x, &palettes, trials);
    println!(
        "matvec, {} weights streamed: lut8 {:.2} (formed first {:.2})  fp16 {:.2}",
        weights.len(),
        streamed.lut8,
        streamed.formed,
        streamed.half
    );
}

/// Weight `m`: indices spread over the palette, the fp16 values they stand for.
fn weight(rows: usize, k: usize, m: usize, palettes: &[f16]) -> Weight {
    let indices: Vec<u8> = (0..rows * k)
        .map(|i| ((i * 7919 + m * 13) % 256) as u8)
        .collect();
    let halves = indices
        .iter()
        .enumerate()
        .map(|(i, &e)| palettes[i / k / PALETTE_ROWS * 256 + e as usize])
        .collect();
    Weight { indices, halves }
}

/// Rows from `first` that fill `out`, one run of indices a palette.
fn form_rows(indices: &[u8], palettes: &[f16], k: usize, first: usize, out: &mut [f16]) {
    let rows = out.len() / k;
    let mut r = 0;
    while r < rows {
        let g = (first + r) / PALETTE_ROWS;
        let end = ((g + 1) * PALETTE_ROWS - first).min(rows);
        let palette = &palettes[g * 256..(g + 1) * 256];
        lut::form(
            indices,
            8,
            (first + r) * k,
            palette,
            &mut out[r * k..end * k],
        );
        r = end;
    }
}

/// Four rows formed again and again from one palette.
fn look_up_rate(w: &Weight, k: usize, palettes: &[f16]) -> f64 {
    let run = 4 * k;
    let mut out = vec![f16::ZERO; run];
    let mut best = f64::INFINITY;
    for _ in 0..200 {
        let t = Instant::now();
        for _ in 0..100 {
            lut::form(black_box(&w.indices), 8, 0, &palettes[..256], &mut out);
            black_box(&out);
        }
        best = best.min(t.elapsed().as_secs_f64());
    }
    (100 * run) as f64 / best / 1e9
}

/// The three matvecs over every weight in turn, `trials` times interleaved; checks they agree.
fn matvec_rates(weights: &[Weight], x: &[f32], palettes: &[f16], trials: usize) -> Rates {
    let k = x.len();
    let rows = weights[0].indices.len() / k;
    let (mut lut_out, mut half_out) = (vec![0.0f32; rows], vec![0.0f32; rows]);
    let mut lut8_out = vec![0.0f32; rows];
    let (mut best_lut, mut best_half) = (f64::INFINITY, f64::INFINITY);
    let mut best_lut8 = f64::INFINITY;
    for _ in 0..trials {
        let t = Instant::now();
        for w in weights {
            quant::matvec_by_formed_rows(&mut lut_out, x, k, |i, out| {
                form_rows(&w.indices, palettes, k, i, out)
            });
            black_box(&lut_out);
        }
        best_lut = best_lut.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for w in weights {
            linalg::matvec_f16(&mut half_out, &w.halves, x).expect("shapes agree");
            black_box(&half_out);
        }
        best_half = best_half.min(t.elapsed().as_secs_f64());
        let t = Instant::now();
        for w in weights {
            let taken = lut::matvec8(&mut lut8_out, x, &w.indices, palettes, PALETTE_ROWS);
            assert!(taken, "lut::matvec8 does not run on this CPU");
            black_box(&lut8_out);
        }
        best_lut8 = best_lut8.min(t.elapsed().as_secs_f64());
    }
    let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
    assert_eq!(
        bits(&lut_out),
        bits(&half_out),
        "the formed-rows matvec differs from fp16"
    );
    assert_eq!(
        bits(&lut8_out),
        bits(&half_out),
        "lut::matvec8 differs from fp16"
    );
    let n = (weights.len() * rows * k) as f64;
    Rates {
        lut8: n / best_lut8 / 1e9,
        formed: n / best_lut / 1e9,
        half: n / best_half / 1e9,
    }
}

/// Giga-weights per second of the three matvecs.
struct Rates {
    lut8: f64,
    formed: f64,
    half: f64,
}
