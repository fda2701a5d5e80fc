//! Linear quantization of weights from block-quantized sources: the default (`Auto`) mode
//! finds the source's per-block affine grids (GGUF Q4_1 / Q6_K style) and stores them exactly,
//! and falls back to symmetric per-channel quantization on weights without such grids.

mod common;

use anemone_compress::{compress, LinearBits, LinearMode, Payload, Scheme};
use common::{naive_decode, naive_error, q4_1_like, Rng};
use half::f16;

/// Tolerance tier for a weight stored on its own grid: two fp16 roundings (of `data − offset`
/// and of the product) plus the fp16 scale's deviation from the step, relative to the weight.
const GRID_REL_RMS: f64 = 6e-4;

/// `[rows, cols]` dequantized like GGUF Q4_1 (blocks of 32).
fn q4_1_weight(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    q4_1_like(rng, rows * cols, 32, 0.001, 0.01)
}

/// `[rows, cols]` dequantized like GGUF Q6_K: per 16 values `d·sc·(q − 32)`, q in 0..63, with
/// an int8 sub-block scale `sc` (so 32-value blocks span two grids).
fn q6_k_weight(rng: &mut Rng, rows: usize, cols: usize) -> Vec<f32> {
    let mut w = Vec::with_capacity(rows * cols);
    let d = f16::from_f64(1.3e-4).to_f32();
    for _ in 0..rows * cols / 16 {
        let sc = (rng.uniform() * 100.0) as i32 + 20;
        for _ in 0..16 {
            let q = (rng.uniform() * 64.0).floor().min(63.0) as i32;
            w.push(d * sc as f32 * (q - 32) as f32);
        }
    }
    w
}

fn linear(bits: LinearBits, block_size: Option<usize>, mode: LinearMode) -> Scheme {
    Scheme::Linear {
        bits,
        block_size,
        mode,
    }
}

fn offsets_of(c: &anemone_compress::Compressed) -> Option<Vec<f32>> {
    match c.payload() {
        Payload::BlockwiseShiftScale { offset, .. } => offset.as_ref().map(|o| o.to_f32_vec()),
        other => panic!("expected shift-scale payload, got {other:?}"),
    }
}

#[test]
fn q4_1_sources_are_stored_on_their_grid_by_int8_and_int4() {
    let mut rng = Rng::new(7);
    let (o, i) = (48, 128);
    let w = q4_1_weight(&mut rng, o, i);
    for (bits, bytes_per_weight) in [(LinearBits::Int8, 1.0), (LinearBits::Int4, 0.5)] {
        let requested = linear(bits, None, LinearMode::Auto);
        let c = compress(
            "model.layers.0.mlp.up_proj.weight",
            &w,
            &[o, i, 1, 1],
            &requested,
        )
        .unwrap();
        assert_eq!(
            *c.scheme(),
            linear(bits, Some(32), LinearMode::Grid),
            "{requested} resolves to the source's 32-value grid"
        );
        let decoded = naive_decode(&c);
        assert_eq!(decoded, c.decompress(), "{requested}: decompress vs naive");
        let (rel, _) = naive_error(&w, &decoded);
        assert!(rel < GRID_REL_RMS, "{requested}: relative RMS {rel}");
        assert!((c.stats().relative_rms - rel).abs() <= 1e-6 + 1e-3 * rel);
        // data + one fp16 scale and one fp16 offset per 32 weights
        let want = (o * i) as f64 * bytes_per_weight + (o * i / 32 * 4) as f64;
        assert_eq!(c.payload_bytes() as f64, want, "{requested}: payload bytes");
        let offsets = offsets_of(&c).expect("grid blocks carry an offset");
        assert_eq!(offsets.len(), o * i / 32);
    }
    // the same weight under symmetric int8 per block: at least 10x the grid's error
    let sym = compress(
        "w",
        &w,
        &[o, i],
        &linear(LinearBits::Int8, Some(32), LinearMode::Symmetric),
    )
    .unwrap();
    let grid = compress("w", &w, &[o, i], &Scheme::int8()).unwrap();
    assert!(
        sym.stats().relative_rms > 10.0 * grid.stats().relative_rms,
        "symmetric {} vs grid {}",
        sym.stats().relative_rms,
        grid.stats().relative_rms
    );
    assert_eq!(offsets_of(&sym), None);
}

#[test]
fn q6_k_sources_resolve_to_16_value_blocks() {
    let mut rng = Rng::new(11);
    let (o, i) = (32, 256);
    let w = q6_k_weight(&mut rng, o, i);
    let c = compress("down_proj", &w, &[o, i], &Scheme::int8()).unwrap();
    assert_eq!(
        *c.scheme(),
        linear(LinearBits::Int8, Some(16), LinearMode::Grid)
    );
    let (rel, _) = naive_error(&w, &naive_decode(&c));
    assert!(rel < GRID_REL_RMS, "relative RMS {rel}");
    // grids through zero keep an integer offset (exact `data − offset`, zero stays zero)
    // although a least-squares one a few 1e-4 away reconstructs some blocks marginally closer
    let offsets = offsets_of(&c).expect("grid blocks carry an offset");
    let fractional: Vec<_> = offsets.iter().filter(|o| o.fract() != 0.0).collect();
    assert!(fractional.is_empty(), "fractional offsets {fractional:?}");
    // 64 levels do not fit int4: no grid, so Auto stays symmetric per channel
    let c4 = compress("down_proj", &w, &[o, i], &Scheme::int4()).unwrap();
    assert_eq!(
        *c4.scheme(),
        linear(LinearBits::Int4, None, LinearMode::Symmetric)
    );
}

#[test]
fn weights_without_grids_stay_symmetric_per_channel() {
    let mut rng = Rng::new(3);
    let (o, i) = (64, 96);
    let w = rng.normals(o * i, 0.02);
    let auto = compress("w", &w, &[o, i], &Scheme::int8()).unwrap();
    let symmetric = compress(
        "w",
        &w,
        &[o, i],
        &linear(LinearBits::Int8, None, LinearMode::Symmetric),
    )
    .unwrap();
    assert_eq!(*auto.scheme(), *symmetric.scheme());
    assert_eq!(auto.payload(), symmetric.payload());
    assert_eq!(auto.scheme().to_string(), "int8:symmetric");
}

#[test]
fn grid_mode_falls_back_per_block_and_decodes_exactly_as_written() {
    let mut rng = Rng::new(5);
    let (o, i) = (16, 64);
    // even rows from a Q4_1 source, odd rows Gaussian: half the blocks have a grid
    let grid_rows = q4_1_weight(&mut rng, o, i);
    let noise = rng.normals(o * i, 0.02);
    let w: Vec<f32> = (0..o * i)
        .map(|k| {
            if (k / i) % 2 == 0 {
                grid_rows[k]
            } else {
                noise[k]
            }
        })
        .collect();
    // Auto needs 90% of blocks on a grid: this weight stays symmetric
    let auto = compress("w", &w, &[o, i], &Scheme::int8()).unwrap();
    assert_eq!(auto.scheme().to_string(), "int8:symmetric");
    // asked for explicitly, the grid blocks are exact and the others symmetric (offset 0)
    let c = compress("w", &w, &[o, i], &"int8:grid".parse().unwrap()).unwrap();
    assert_eq!(c.scheme().to_string(), "int8:grid:block=32");
    let decoded = naive_decode(&c);
    assert_eq!(decoded, c.decompress());
    let offsets = offsets_of(&c).unwrap();
    for row in 0..o {
        let (rel, _) = naive_error(&w[row * i..(row + 1) * i], &decoded[row * i..(row + 1) * i]);
        let row_offsets = &offsets[row * 2..row * 2 + 2];
        if row % 2 == 0 {
            assert!(rel < GRID_REL_RMS, "grid row {row}: relative RMS {rel}");
        } else {
            assert_eq!(row_offsets, [0.0, 0.0], "symmetric row {row}");
            assert!(rel < 0.01, "symmetric row {row}: relative RMS {rel}");
        }
    }
}

#[test]
fn an_explicit_block_size_is_kept() {
    let mut rng = Rng::new(9);
    let (o, i) = (8, 128);
    let w = q4_1_weight(&mut rng, o, i);
    // blocks of 64 span two Q4_1 grids: Auto falls back to symmetric at the size asked for
    let c = compress("w", &w, &[o, i], &"int8:block=64".parse().unwrap()).unwrap();
    assert_eq!(c.scheme().to_string(), "int8:symmetric:block=64");
    let c = compress("w", &w, &[o, i], &"int4:block=32".parse().unwrap()).unwrap();
    assert_eq!(c.scheme().to_string(), "int4:grid:block=32");
}

#[test]
fn source_picks_the_narrowest_width_holding_the_grid() {
    let mut rng = Rng::new(13);
    let source = Scheme::Source { block_size: None };
    let (o, i) = (32, 256);
    let cases = [
        (q4_1_weight(&mut rng, o, i), "int4:grid:block=32"),
        (q6_k_weight(&mut rng, o, i), "int8:grid:block=16"),
        (rng.normals(o * i, 0.02), "int8:symmetric"),
    ];
    for (w, want) in cases {
        let c = compress("w", &w, &[o, i], &source).unwrap();
        assert_eq!(c.scheme().to_string(), want);
        let same = compress("w", &w, &[o, i], &want.parse().unwrap()).unwrap();
        assert_eq!(c.payload(), same.payload(), "{want}");
    }
    assert!(compress(
        "w",
        &[0.0; 24],
        &[2, 12],
        &"source:block=8".parse().unwrap()
    )
    .unwrap_err()
    .to_string()
    .contains("block size 8 does not divide 12"));
}
