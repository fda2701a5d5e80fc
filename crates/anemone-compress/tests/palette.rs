//! Palettization against naive references: LUT and index layout, nearest-entry assignment,
//! optimality on tiny groups (brute force), degenerate groups, uniform spacing, importance.

mod common;

use anemone_compress::{
    compress, compress_with, CompressOptions, Compressed, KmeansAlgorithm, PaletteMode, Payload,
    Scheme,
};
use anemone_mil::DType;
use common::{assert_close, naive_decode, naive_error, Rng};

fn lut_scheme(bits: u8, mode: PaletteMode, group_size: usize) -> Scheme {
    Scheme::Palettize {
        bits,
        mode,
        group_size,
    }
}

fn parts(c: &Compressed) -> (Vec<i32>, Vec<f32>, Vec<usize>, DType) {
    match c.payload() {
        Payload::LutToDense { indices, lut } => (
            indices.to_i32_vec().unwrap(),
            lut.to_f32_vec(),
            lut.shape().to_vec(),
            indices.dtype(),
        ),
        other => panic!("expected LUT payload, got {other:?}"),
    }
}

#[test]
fn layout_indices_and_nearest_assignment_for_every_width() {
    let mut rng = Rng::new(21);
    let (o, i) = (16, 40);
    let w = rng.normals(o * i, 0.02);
    for (bits, dtype) in [
        (1, DType::U1),
        (2, DType::U2),
        (3, DType::U3),
        (4, DType::U4),
        (6, DType::U6),
        (8, DType::U8),
    ] {
        for mode in [PaletteMode::Kmeans, PaletteMode::Uniform] {
            for (shape, group) in [
                (vec![o, i], 4),
                (vec![o, i, 1, 1], 0),
                (vec![o, i, 1, 1], 16),
            ] {
                let s = lut_scheme(bits, mode, group);
                let c = compress("w", &w, &shape, &s).unwrap();
                let (idx, lut, lshape, idtype) = parts(&c);
                assert_eq!(idtype, dtype, "{s}");
                let groups = o.checked_div(group).unwrap_or(1);
                let mut want = vec![1; shape.len() + 2];
                want[0] = groups;
                want[shape.len()] = 1 << bits;
                assert_eq!(lshape, want, "{s} {shape:?}: lut shape");
                assert!(idx.iter().all(|&k| (0..1 << bits).contains(&k)), "{s}");
                let decoded = naive_decode(&c);
                assert_eq!(decoded, c.decompress(), "{s}: decompress vs naive decoder");
                // every weight maps to a nearest entry of its group's LUT
                let per_group = o * i / groups;
                for (k, &x) in w.iter().enumerate() {
                    let table = &lut[(k / per_group) << bits..((k / per_group) + 1) << bits];
                    let best = table
                        .iter()
                        .map(|&e| (e - x).abs())
                        .fold(f32::INFINITY, f32::min);
                    assert!(
                        (decoded[k] - x).abs() <= best,
                        "{s}: element {k} not nearest"
                    );
                }
                let (rel, max) = naive_error(&w, &decoded);
                assert!(
                    (c.stats().relative_rms - rel).abs() <= 1e-12 * rel.max(1e-30),
                    "{s}"
                );
                assert_eq!(c.stats().max_abs, max, "{s}");
            }
        }
    }
}

/// Minimum SSE over every assignment of `values` to `k` fp16-representable centroids placed at
/// cluster means (brute force over labels).
fn brute_force_sse(values: &[f32], k: usize) -> f64 {
    let n = values.len();
    let mut labels = vec![0usize; n];
    let mut best = f64::INFINITY;
    loop {
        let mut sse = 0.0;
        for c in 0..k {
            let members: Vec<f64> = values
                .iter()
                .zip(&labels)
                .filter(|(_, &l)| l == c)
                .map(|(&v, _)| v as f64)
                .collect();
            if !members.is_empty() {
                let mean = members.iter().sum::<f64>() / members.len() as f64;
                sse += members.iter().map(|v| (v - mean).powi(2)).sum::<f64>();
            }
        }
        best = best.min(sse);
        let mut i = 0;
        loop {
            if i == n {
                return best;
            }
            labels[i] += 1;
            if labels[i] < k {
                break;
            }
            labels[i] = 0;
            i += 1;
        }
    }
}

#[test]
fn kmeans_reaches_the_brute_force_optimum_on_tiny_groups() {
    let mut rng = Rng::new(33);
    for trial in 0..20 {
        let w: Vec<f32> = rng.normals(8, 1.0).iter().map(|v| v.powi(3)).collect();
        let scale: f64 = w.iter().map(|&v| (v as f64).powi(2)).sum();
        for algorithm in [KmeansAlgorithm::Optimal, KmeansAlgorithm::LLOYD] {
            let opts = CompressOptions {
                importance: None,
                kmeans: algorithm,
            };
            let c = compress_with(
                "w",
                &w,
                &[2, 4],
                &lut_scheme(2, PaletteMode::Kmeans, 0),
                &opts,
            )
            .unwrap();
            let got: f64 = w
                .iter()
                .zip(c.decompress())
                .map(|(&a, b)| (a as f64 - b as f64).powi(2))
                .sum();
            let want = brute_force_sse(&w, 4);
            // fp16 centroids cost at most a few fp16 ulps per value on top of the optimum
            assert!(
                got <= want + 1e-5 * scale,
                "trial {trial} {algorithm:?}: SSE {got} above the optimum {want}; w = {w:?}"
            );
        }
    }
}

#[test]
fn few_distinct_values_and_constant_groups_are_exact() {
    // 3 distinct fp16 values per group, 16-entry LUT: every value gets its own entry
    let w: Vec<f32> = (0..64)
        .map(|k| [0.25f32, -0.5, 1.0][k % 3] * if k < 32 { 1.0 } else { 2.0 })
        .collect();
    let c = compress("w", &w, &[8, 8], &lut_scheme(4, PaletteMode::Kmeans, 4)).unwrap();
    assert_eq!(c.decompress(), w);
    assert_eq!(c.stats().relative_rms, 0.0);
    let (idx, lut, _, _) = parts(&c);
    assert!(idx.iter().all(|&k| k < 16));
    // padding repeats a used value, so the LUT stays sorted
    assert!(lut[..16].windows(2).all(|p| p[0] <= p[1]), "{lut:?}");
    for mode in [PaletteMode::Kmeans, PaletteMode::Uniform] {
        let c = compress("c", &[0.125f32; 32], &[4, 8], &lut_scheme(3, mode, 2)).unwrap();
        assert_eq!(c.decompress(), vec![0.125f32; 32], "{mode:?}");
        let z = compress("z", &[0.0f32; 32], &[4, 8], &lut_scheme(6, mode, 0)).unwrap();
        assert_eq!(z.stats().relative_rms, 0.0);
        assert!(z.decompress().iter().all(|&v| v == 0.0));
    }
}

#[test]
fn uniform_lut_is_evenly_spaced_from_min_to_max() {
    let mut rng = Rng::new(8);
    let w = rng.normals(4 * 32, 1.0);
    let c = compress("w", &w, &[4, 32], &lut_scheme(3, PaletteMode::Uniform, 2)).unwrap();
    let (_, lut, _, _) = parts(&c);
    for g in 0..2 {
        let values = &w[g * 64..(g + 1) * 64];
        let lo = values.iter().copied().fold(f32::INFINITY, f32::min);
        let hi = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let want: Vec<f32> = (0..8)
            .map(|k| {
                half::f16::from_f64(lo as f64 + (hi as f64 - lo as f64) * k as f64 / 7.0).to_f32()
            })
            .collect();
        assert_close(
            &format!("group {g} lut"),
            &lut[g * 8..(g + 1) * 8],
            &want,
            0.0,
        );
    }
}

#[test]
fn kmeans_beats_uniform_and_int4_on_gaussian_weights() {
    let mut rng = Rng::new(13);
    let w = rng.normals(64 * 128, 0.02);
    let km = compress("w", &w, &[64, 128], &Scheme::kmeans(4)).unwrap();
    let un = compress(
        "w",
        &w,
        &[64, 128],
        &lut_scheme(4, PaletteMode::Uniform, 32),
    )
    .unwrap();
    let i4 = compress("w", &w, &[64, 128], &Scheme::int4()).unwrap();
    assert!(
        km.stats().relative_rms < un.stats().relative_rms,
        "{:?} vs {:?}",
        km.stats(),
        un.stats()
    );
    assert!(km.stats().relative_rms < i4.stats().relative_rms);
    // Lloyd–Max for a Gaussian at 4 bits: relative RMS 0.0975 in the limit
    assert!(
        (0.09..0.1).contains(&km.stats().relative_rms),
        "{:?}",
        km.stats()
    );
}

#[test]
fn importance_pulls_the_palette_towards_important_weights() {
    let mut rng = Rng::new(17);
    let w = rng.normals(2 * 64, 1.0);
    let mut importance = vec![1.0f32; w.len()];
    // make a handful of mid-range weights overwhelmingly important
    let hot = [3usize, 40, 77, 100];
    for &h in &hot {
        importance[h] = 1e6;
    }
    let s = lut_scheme(2, PaletteMode::Kmeans, 0);
    let plain = compress("w", &w, &[2, 64], &s).unwrap();
    let weighted = compress_with(
        "w",
        &w,
        &[2, 64],
        &s,
        &CompressOptions {
            importance: Some(&importance),
            kmeans: KmeansAlgorithm::Optimal,
        },
    )
    .unwrap();
    let hot_err = |c: &Compressed| {
        let d = c.decompress();
        hot.iter().map(|&h| (w[h] - d[h]).abs() as f64).sum::<f64>()
    };
    assert!(
        hot_err(&weighted) < 0.01,
        "important weights off by {}",
        hot_err(&weighted)
    );
    assert!(hot_err(&weighted) < hot_err(&plain));
    assert!(weighted.stats().relative_rms >= plain.stats().relative_rms * 0.999);

    let bad = compress_with(
        "w",
        &w,
        &[2, 64],
        &s,
        &CompressOptions {
            importance: Some(&importance[..10]),
            kmeans: KmeansAlgorithm::LLOYD,
        },
    )
    .unwrap_err();
    assert!(bad.to_string().contains("importance"), "{bad}");
    importance[5] = -1.0;
    let bad = compress_with(
        "w",
        &w,
        &[2, 64],
        &s,
        &CompressOptions {
            importance: Some(&importance),
            kmeans: KmeansAlgorithm::LLOYD,
        },
    )
    .unwrap_err();
    assert!(bad.to_string().contains("element 5"), "{bad}");
}

#[test]
fn group_size_must_divide_output_channels() {
    let w = vec![0.1f32; 12 * 4];
    let e = compress("layers.3.mlp.up", &w, &[12, 4], &Scheme::kmeans(4)).unwrap_err();
    let text = e.to_string();
    assert!(
        text.contains("layers.3.mlp.up") && text.contains("group size 32"),
        "{text}"
    );
    let e = compress("w", &w, &[12, 4], &lut_scheme(5, PaletteMode::Kmeans, 4)).unwrap_err();
    assert!(e.to_string().contains("palette bits"), "{e}");
}
