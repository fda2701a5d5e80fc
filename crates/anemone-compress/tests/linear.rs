//! Symmetric int8/int4 quantization against a naive decoder: half-step round trip, exact
//! scales, ties to even, zero rows, packing, error stats, and named errors on bad input.

mod common;

use anemone_compress::{compress, CompressError, LinearBits, LinearMode, Payload, Scheme};
use anemone_mil::DType;
use common::{assert_close, naive_decode, naive_error, Rng};
use half::f16;

/// Tolerance tier for [`ErrorStats`](anemone_compress::ErrorStats) against a naive f64
/// measurement: linear quantization sums squares in 8 f32 lanes per block (vectorized), then
/// in f64 across blocks.
const STATS_REL_TOL: f64 = 1e-5;

fn scheme(bits: LinearBits, block_size: Option<usize>) -> Scheme {
    Scheme::Linear {
        bits,
        block_size,
        mode: LinearMode::Symmetric,
    }
}

fn scales_of(c: &anemone_compress::Compressed) -> (Vec<i32>, Vec<f32>, Vec<usize>) {
    match c.payload() {
        Payload::BlockwiseShiftScale { data, scale, .. } => (
            data.to_i32_vec().unwrap(),
            scale.to_f32_vec(),
            scale.shape().to_vec(),
        ),
        other => panic!("expected shift-scale payload, got {other:?}"),
    }
}

#[test]
fn round_trip_is_within_half_a_step_for_every_scheme() {
    let mut rng = Rng::new(1);
    let (o, i) = (24, 64);
    let w = rng.normals(o * i, 0.02);
    for bits in [LinearBits::Int8, LinearBits::Int4] {
        for block in [None, Some(8), Some(32), Some(64)] {
            for shape in [vec![o, i], vec![o, i, 1, 1]] {
                let s = scheme(bits, block);
                let c = compress("w", &w, &shape, &s).unwrap();
                let (q, scales, sshape) = scales_of(&c);
                let b = block.unwrap_or(i);
                let mut want_sshape = vec![1; shape.len()];
                want_sshape[0] = o;
                want_sshape[1] = i / b;
                assert_eq!(sshape, want_sshape, "{s} {shape:?}: scale shape");
                let qmax = bits.qmax();
                assert!(q.iter().all(|&v| (-qmax..=qmax).contains(&v)), "{s}: range");
                let decoded = naive_decode(&c);
                assert_eq!(decoded, c.decompress(), "{s}: decompress vs naive decoder");
                for (k, (&x, &y)) in w.iter().zip(&decoded).enumerate() {
                    let step = scales[(k / i) * (i / b) + (k % i) / b];
                    // half a quantization step, plus the fp16 rounding of the product
                    let tol = step as f64 / 2.0 + f16::EPSILON.to_f64() * x.abs() as f64;
                    assert!(
                        ((x - y) as f64).abs() <= tol,
                        "{s} {shape:?}: element {k}: {x} decoded as {y} (step {step})"
                    );
                }
                // the scale is the smallest fp16 >= max|w| / qmax of its block
                for (blk, &step) in scales.iter().enumerate() {
                    let (row, col) = (blk / (i / b), blk % (i / b));
                    let max_abs = w[row * i + col * b..row * i + (col + 1) * b]
                        .iter()
                        .fold(0f32, |m, v| m.max(v.abs()));
                    let exact = max_abs / qmax as f32;
                    let below = f16::from_bits(f16::from_f32(step).to_bits() - 1).to_f32();
                    assert!(
                        step >= exact && below < exact,
                        "{s}: block {blk} scale {step}"
                    );
                }
            }
        }
    }
}

#[test]
fn rounds_half_to_even() {
    // max |w| = 127 gives scale exactly 1, so w/s = w
    let w = [127.0, 2.5, 3.5, -2.5, -3.5, 0.5, 1.5, -0.5];
    let c = compress("w", &w, &[1, 8], &Scheme::int8()).unwrap();
    let (q, scales, _) = scales_of(&c);
    assert_eq!(scales, vec![1.0]);
    assert_eq!(q, vec![127, 2, 4, -2, -4, 0, 2, 0]);
}

#[test]
fn zero_rows_decode_to_exact_zeros() {
    let mut w = vec![0f32; 4 * 16];
    w[16..32]
        .iter_mut()
        .enumerate()
        .for_each(|(k, v)| *v = k as f32 - 7.0);
    for s in [
        Scheme::int8(),
        Scheme::int4(),
        scheme(LinearBits::Int4, Some(4)),
    ] {
        let c = compress("w", &w, &[4, 16], &s).unwrap();
        let d = c.decompress();
        assert!(d.iter().all(|v| v.is_finite()), "{s}: non-finite");
        assert!(d[..16].iter().chain(&d[32..]).all(|&v| v == 0.0), "{s}");
        let all_zero = compress("z", &[0.0; 32], &[2, 16], &s).unwrap();
        assert_eq!(all_zero.stats().relative_rms, 0.0);
        assert_eq!(all_zero.stats().max_abs, 0.0);
        assert!(all_zero.decompress().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn int4_packing_matches_the_mil_packer() {
    let mut rng = Rng::new(5);
    // odd element count: the last byte holds one nibble
    let w = rng.normals(3 * 5, 1.0);
    let c = compress("w", &w, &[3, 5], &Scheme::int4()).unwrap();
    let Payload::BlockwiseShiftScale { data, .. } = c.payload() else {
        panic!()
    };
    assert_eq!(data.dtype(), DType::I4);
    let q = data.to_i32_vec().unwrap();
    let reference = anemone_mil::TensorData::pack_ints(DType::I4, vec![3, 5], &q).unwrap();
    assert_eq!(data.bytes(), reference.bytes());
    assert_eq!(data.bytes().len(), 8);
}

#[test]
fn error_stats_match_a_naive_measurement() {
    let mut rng = Rng::new(9);
    let w = rng.normals(32 * 48, 0.05);
    for s in [
        Scheme::int8(),
        Scheme::int4(),
        scheme(LinearBits::Int8, Some(16)),
    ] {
        let c = compress("w", &w, &[32, 48], &s).unwrap();
        let (rel, max) = naive_error(&w, &naive_decode(&c));
        assert!(
            (c.stats().relative_rms - rel).abs() <= STATS_REL_TOL * rel,
            "{s}: {} vs {rel}",
            c.stats().relative_rms
        );
        assert_eq!(c.stats().max_abs, max, "{s}");
    }
    // int8 keeps a Gaussian weight within ~1% relative RMS, int4 within ~15%
    let i8 = compress("w", &w, &[32, 48], &Scheme::int8()).unwrap();
    let i4 = compress("w", &w, &[32, 48], &Scheme::int4()).unwrap();
    assert!(i8.stats().relative_rms < 0.012, "{:?}", i8.stats());
    assert!(
        i4.stats().relative_rms < 0.16 && i4.stats().relative_rms > 10.0 * i8.stats().relative_rms
    );
}

#[test]
fn large_and_tiny_magnitudes() {
    // tiny rows need subnormal fp16 scales; large ones must still fit fp16
    let w = [1e-7, -3e-8, 0.0, 2e-7, 60000.0, -1000.0, 3.0, 0.5];
    let c = compress("w", &w, &[2, 4], &Scheme::int8()).unwrap();
    assert_close("tiny/large", &c.decompress(), &naive_decode(&c), 0.0);
    let d = c.decompress();
    assert!((d[4] - 60000.0).abs() <= 60000.0 / 127.0 / 2.0 + 32.0);
    let err = compress("huge", &[1e30, 0.0], &[1, 2], &Scheme::int8()).unwrap_err();
    assert!(
        matches!(err, CompressError::ScaleOverflow { ref tensor, .. } if tensor == "huge"),
        "{err}"
    );
}

#[test]
fn bad_input_gives_named_errors() {
    let w = vec![0.5f32; 12];
    let e = compress("layers.0.q", &w, &[3, 5], &Scheme::int8()).unwrap_err();
    assert!(matches!(e, CompressError::LengthMismatch { .. }), "{e}");
    assert!(e.to_string().contains("layers.0.q"), "{e}");
    let e = compress("b", &w, &[3, 4], &scheme(LinearBits::Int8, Some(3))).unwrap_err();
    assert!(matches!(e, CompressError::ShapeMismatch { .. }), "{e}");
    assert!(e.to_string().contains("block size 3"), "{e}");
    let e = compress("r", &w, &[12], &Scheme::int8()).unwrap_err();
    assert!(matches!(e, CompressError::ShapeMismatch { .. }), "{e}");
    // every scheme names the first non-finite weight (linear ones look for it only when the
    // quantization shows one)
    for value in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
        for index in [0, 7, 11] {
            let mut bad = w.clone();
            bad[index] = value;
            for text in [
                "int8",
                "int8:symmetric",
                "int8:grid",
                "int4:block=2",
                "source",
                "lut2",
            ] {
                let e = compress("n", &bad, &[3, 4], &text.parse().unwrap()).unwrap_err();
                assert!(
                    matches!(e, CompressError::NonFinite { index: i, .. } if i == index),
                    "{text}, {value} at {index}: {e}"
                );
            }
        }
    }
    let e = compress("z", &w, &[3, 4], &scheme(LinearBits::Int4, Some(0))).unwrap_err();
    assert!(matches!(e, CompressError::InvalidScheme { .. }), "{e}");
}
