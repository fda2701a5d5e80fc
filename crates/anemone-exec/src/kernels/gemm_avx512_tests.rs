//! The AVX-512 products against `gemm` itself, bit for bit.

use std::sync::Arc;

use half::f16;

use super::*;
use crate::kernels::gemm_f16::{matmul_f16_lhs, matmul_f16_lhs_gemm};
use crate::kernels::linalg::gemm_product;
use crate::team::{self, Team};

/// Values of many magnitudes and both signs, with exact zeros (signed-zero sums).
fn values(n: usize, seed: u32) -> Vec<f32> {
    (0..n)
        .map(|i| {
            let h = (i as u32)
                .wrapping_mul(2654435761)
                .wrapping_add(seed.wrapping_mul(40503));
            match (h >> 4) % 23 {
                0 => 0.0,
                1 => -0.0,
                r => ((h >> 8) % 20011) as f32 / 20011.0 - 0.5 + r as f32 * 1e-4,
            }
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// CPUs without AVX-512 keep `gemm` (nothing to compare); on the others the once-per-process
/// check must pass (else the kernel would silently never run).
fn skip() -> bool {
    if !(is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("fma")) {
        eprintln!("no AVX-512: the kernel is not used here");
        return true;
    }
    assert!(available(), "the AVX-512 product disagrees with gemm");
    false
}

/// f32 products across both block rules, block boundaries (k around 512 and gemm's equal
/// splits above 1024), row and column tails, strided operands, accumulation on and off.
#[test]
fn f32_products_equal_gemm_bit_for_bit() {
    if skip() {
        return;
    }
    let ms = [2usize, 5, 6, 7, 13, 64, 65, 131];
    let ns = [2usize, 3, 15, 16, 17, 33, 64, 65, 130];
    let ks = [3usize, 4, 97, 511, 512, 513, 1024, 1025, 1537, 2100];
    let mut checked = 0;
    for (i, &m) in ms.iter().enumerate() {
        for (j, &n) in ns.iter().enumerate() {
            for (l, &k) in ks.iter().enumerate() {
                // a subset of the grid, every value of each axis with several of the others
                if (i + 2 * j + 3 * l) % 4 != 0 {
                    continue;
                }
                // row strides beyond the row (a view of a wider matrix) on some
                let (a_rs, b_rs) = if (i + j + l) % 3 == 0 {
                    (k + 3, n + 5)
                } else {
                    (k, n)
                };
                let a_data = values((m - 1) * a_rs + k, 1);
                let b_data = values((k - 1) * b_rs + n, 2);
                let a = MatRef {
                    data: &a_data,
                    rows: m,
                    cols: k,
                    rs: a_rs,
                    cs: 1,
                };
                let b = MatRef {
                    data: &b_data,
                    rows: k,
                    cols: n,
                    rs: b_rs,
                    cs: 1,
                };
                if !applies(m, n, k, 1, &b) {
                    continue;
                }
                for accumulate in [false, true] {
                    let start = values(m * n, 3);
                    let mut want = start.clone();
                    gemm_product(&mut want, a, b, accumulate, false);
                    let mut got = start.clone();
                    let lhs = Lhs::F32 {
                        data: &a_data,
                        rs: a_rs,
                    };
                    matmul(&mut got, lhs, m, k, b, accumulate, false).unwrap();
                    assert_eq!(bits(&got), bits(&want), "{m}×{k}·{k}×{n} acc {accumulate}");
                    checked += 1;
                }
            }
        }
    }
    assert!(checked > 100, "{checked}");
}

/// fp16 weights: the same values as the widened panels through `gemm`, on the projection
/// shapes of SmolLM2 and Qwen2.5 (64-token prefill) and awkward ones.
#[test]
fn f16_products_equal_gemm_bit_for_bit() {
    if skip() {
        return;
    }
    for (m, k, n) in [
        (576, 576, 64),
        (1536, 576, 64),
        (576, 1536, 64),
        (128, 896, 64),
        (4864, 896, 64),
        (896, 4864, 64),
        (300, 577, 7),
        (193, 1100, 2),
        (130, 3, 64),
        (40, 1030, 33),
        (17, 70, 100),
    ] {
        let w: Vec<f16> = values(m * k, 4).iter().map(|&v| f16::from_f32(v)).collect();
        let x = values(k * n, 5);
        let b = MatRef::row_major(&x, k, n);
        // one gemm call on the whole widened weight, and gemm on panels (what ran before)
        let wf: Vec<f32> = w.iter().map(|v| v.to_f32()).collect();
        let mut want = vec![0.0f32; m * n];
        gemm_product(&mut want, MatRef::row_major(&wf, m, k), b, false, false);
        let mut panels = vec![0.0f32; m * n];
        matmul_f16_lhs_gemm(&mut panels, &w, m, k, b).unwrap();
        let mut got = vec![1.0f32; m * n];
        matmul_f16_lhs(&mut got, &w, m, k, b).unwrap();
        assert_eq!(bits(&got), bits(&want), "{m}×{k}·{k}×{n}");
        assert_eq!(bits(&panels), bits(&want), "{m}×{k}·{k}×{n}, panels");
    }
}

/// Spread over a team of any width (blocks of rows claimed by whichever thread), the values
/// are the single thread's.
#[test]
fn parallel_products_equal_gemm_bit_for_bit() {
    if skip() {
        return;
    }
    let (m, k, n) = (1000, 1300, 64);
    let a = values(m * k, 6);
    let w: Vec<f16> = a.iter().map(|&v| f16::from_f32(v)).collect();
    let x = values(k * n, 7);
    let b = MatRef::row_major(&x, k, n);
    let mut want = values(m * n, 8);
    gemm_product(&mut want, MatRef::row_major(&a, m, k), b, true, true);
    let mut want16 = vec![0.0f32; m * n];
    matmul_f16_lhs_gemm(&mut want16, &w, m, k, b).unwrap();
    for threads in [1, 2, 3] {
        let team = Arc::new(Team::new(threads).unwrap());
        let mut got = values(m * n, 8);
        let lhs = Lhs::F32 { data: &a, rs: k };
        team::with_team(&team, || matmul(&mut got, lhs, m, k, b, true, true)).unwrap();
        assert_eq!(bits(&got), bits(&want), "f32, {threads} threads");
        let mut got16 = vec![0.0f32; m * n];
        team::with_team(&team, || matmul_f16_lhs(&mut got16, &w, m, k, b)).unwrap();
        assert_eq!(bits(&got16), bits(&want16), "fp16, {threads} threads");
    }
}

/// Both loop orders (row groups outermost, depth blocks outermost) give `gemm`'s values,
/// whichever this CPU's L2 picks: fp16 and f32 weights, strided ones, a row range inside the
/// weight, tails, accumulation on and off.
#[test]
fn both_loop_orders_equal_gemm_bit_for_bit() {
    if skip() {
        return;
    }
    for (m, k, n, a_rs) in [
        (40, 4864, 64, 4864),
        (13, 1100, 33, 1103),
        (70, 2100, 17, 2100),
    ] {
        let a = values((m - 1) * a_rs + k, 11);
        let wf: Vec<f32> = (0..m * k).map(|i| a[i / k * a_rs + i % k]).collect();
        let w16: Vec<f16> = wf.iter().map(|&v| f16::from_f32(v)).collect();
        let w16f: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
        let x = values(k * n, 12);
        let b = MatRef::row_major(&x, k, n);
        let kc = block_len(m, n, k);
        assert!(k > kc, "{m}×{k}·{k}×{n}: one block");
        let (r0, r1) = (5, m - 2);
        for accumulate in [false, true] {
            let start = values(m * n, 13);
            for (lhs, dense) in [
                (Lhs::F32 { data: &a, rs: a_rs }, &wf),
                (Lhs::F16(&w16), &w16f),
            ] {
                let mut want = start.clone();
                gemm_product(
                    &mut want,
                    MatRef::row_major(dense, m, k),
                    b,
                    accumulate,
                    false,
                );
                let want = &want[r0 * n..r1 * n];
                let (mut by_rows, mut by_depth) = (start.clone(), start.clone());
                let mut scratch = Vec::new();
                // SAFETY: AVX-512F and FMA (skip checked); operands sized as above.
                unsafe {
                    let d = &mut by_rows[r0 * n..r1 * n];
                    rows(d, lhs, m, r0, r1, k, b, kc, accumulate, &mut scratch);
                    let d = &mut by_depth[r0 * n..r1 * n];
                    rows_depth_outer(d, lhs, r0, r1, k, b, kc, accumulate, &mut scratch);
                }
                let case = format!("{m}×{k}·{k}×{n} acc {accumulate}");
                assert_eq!(bits(&by_rows[r0 * n..r1 * n]), bits(want), "rows, {case}");
                assert_eq!(bits(&by_depth[r0 * n..r1 * n]), bits(want), "depth, {case}");
            }
        }
    }
}

/// Shapes `gemm` runs on other paths, and operands of other layouts, are not taken; operands
/// that do not fit are refused.
#[test]
fn other_shapes_and_layouts_are_left_to_gemm() {
    let x = vec![0.0f32; 8192];
    let b = |rows, cols| MatRef::row_major(&x[..rows * cols], rows, cols);
    assert!(!applies(1, 64, 100, 1, &b(100, 64)));
    assert!(!applies(64, 1, 100, 1, &b(100, 1)));
    assert!(!applies(64, 64, 2, 1, &b(2, 64)));
    assert!(!applies(64, 64, 30, 2, &b(30, 64)));
    assert!(!applies(64, 30, 64, 1, &b(30, 64).transposed()));
    // a horizontal-kernel shape: bᵀ contiguous along k and m·n ≤ 256
    let bt = MatRef::row_major(&x[..16 * 40], 16, 40).transposed();
    assert!(!applies(16, 16, 40, 1, &bt));
    if available() {
        assert!(applies(64, 64, 30, 1, &b(30, 64)));
        let mut dst = vec![0.0f32; 64 * 64];
        let short = Lhs::F32 {
            data: &x[..64 * 30 - 1],
            rs: 30,
        };
        assert!(matmul(&mut dst, short, 64, 30, b(30, 64), false, false).is_err());
    }
}

/// Single-thread CPU time of the projections of a 64-token prefill (SmolLM2, Qwen2.5), `gemm`
/// against this kernel, weights cycled over a working set beyond the L2 as a forward pass
/// streams them. A benchmark: `cargo test --release -p anemone-exec --lib prefill_product_speed
/// -- --ignored --nocapture` (`GEMM_BENCH_SHAPES=m,k;m,k` for other shapes).
#[cfg(target_os = "linux")]
#[test]
#[ignore = "benchmark"]
fn prefill_product_speed() {
    if skip() {
        return;
    }
    // everything on one thread (gemm's fp16 panels would go to the rayon pool)
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    pool.install(prefill_product_speed_on_one_thread);
}

#[cfg(target_os = "linux")]
fn prefill_product_speed_on_one_thread() {
    let n = 64;
    let time = |count: usize, f: &mut dyn FnMut(usize)| {
        (0..count).for_each(&mut *f);
        let mut best = f64::INFINITY;
        for _ in 0..7 {
            let t = anemone_testkit::cpu_time::process_seconds();
            let mut runs = 0;
            while anemone_testkit::cpu_time::process_seconds() - t < 0.1 {
                (0..count).for_each(&mut *f);
                runs += count;
            }
            best = best.min((anemone_testkit::cpu_time::process_seconds() - t) / runs as f64);
        }
        best * 1e6
    };
    let shapes: Vec<(usize, usize)> = match std::env::var("GEMM_BENCH_SHAPES") {
        Ok(s) => s
            .split(';')
            .filter_map(|p| {
                let (m, k) = p.split_once(',')?;
                Some((m.parse().ok()?, k.parse().ok()?))
            })
            .collect(),
        Err(_) => vec![
            (576, 576),
            (1536, 576),
            (576, 1536),
            (896, 896),
            (4864, 896),
            (896, 4864),
        ],
    };
    for (m, k) in shapes {
        let ws_mb = std::env::var("GEMM_BENCH_WS_MB").map_or(64usize, |s| s.parse().unwrap());
        let count = (ws_mb << 20).div_ceil(4 * m * k).max(1);
        let ws: Vec<Vec<f32>> = (0..count).map(|i| values(m * k, 10 + i as u32)).collect();
        let ws16: Vec<Vec<f16>> = ws
            .iter()
            .map(|w| w.iter().map(|&v| f16::from_f32(v)).collect())
            .collect();
        let x = values(k * n, 9);
        let b = MatRef::row_major(&x, k, n);
        let mut dst = vec![0.0f32; m * n];
        let g32 = time(count, &mut |i| {
            gemm_product(&mut dst, MatRef::row_major(&ws[i], m, k), b, false, false)
        });
        let o32 = time(count, &mut |i| {
            let lhs = Lhs::F32 {
                data: &ws[i],
                rs: k,
            };
            matmul(&mut dst, lhs, m, k, b, false, false).unwrap()
        });
        let g16 = time(count, &mut |i| {
            matmul_f16_lhs_gemm(&mut dst, &ws16[i], m, k, b).unwrap()
        });
        let o16 = time(count, &mut |i| {
            matmul(&mut dst, Lhs::F16(&ws16[i]), m, k, b, false, false).unwrap()
        });
        let gf = |us: f64| 2.0 * (m * n * k) as f64 / us / 1e3;
        println!(
            "{m:5}×{k:5}·{n}: f32 gemm {g32:6.0} µs ({:5.1} GF/s) ours {o32:6.0} ({:5.1}) ×{:.2} | \
             f16 gemm {g16:6.0} ({:5.1}) ours {o16:6.0} ({:5.1}) ×{:.2}",
            gf(g32),
            gf(o32),
            g32 / o32,
            gf(g16),
            gf(o16),
            g16 / o16
        );
    }
}
