//! The AVX-512 prefill product against the path it replaced (session 9's 4×4 tiles over the
//! unaligned x, one `_mm512_reduce_add_ps` per output), bit for bit.

use super::*;
use crate::reference::kernels::dot;

fn pseudo_random(n: usize, seed: u32) -> Vec<f32> {
    let mut s = seed.wrapping_mul(2654435761).wrapping_add(1);
    (0..n)
        .map(|_| {
            s ^= s << 13;
            s ^= s >> 17;
            s ^= s << 5;
            (s as f32 / u32::MAX as f32) - 0.5
        })
        .collect()
}

/// The replaced kernel, verbatim but for its names: 4×4 tiles, tasks of 32 columns.
fn replaced(x: &[f32], w: &[f32], y: &mut [f32], rows: usize, n_in: usize, n_out: usize) {
    #[derive(Clone, Copy)]
    struct Out(*mut f32);
    // SAFETY: every task writes a disjoint set of output columns.
    unsafe impl Send for Out {}
    unsafe impl Sync for Out {}

    #[target_feature(enable = "avx512f")]
    #[allow(clippy::needless_range_loop)]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const R: usize, const C: usize>(
        x: &[f32],
        w: &[f32],
        out: Out,
        n_in: usize,
        n_out: usize,
        s0: usize,
        o0: usize,
    ) {
        let full = n_in / 16 * 16;
        let tail_mask: __mmask16 = ((1u32 << (n_in % 16)) - 1) as __mmask16;
        let xr: [*const f32; R] = std::array::from_fn(|i| x.as_ptr().add((s0 + i) * n_in));
        let wr: [*const f32; C] = std::array::from_fn(|j| w.as_ptr().add((o0 + j) * n_in));
        let mut acc = [[_mm512_setzero_ps(); C]; R];
        let mut k = 0;
        while k < full {
            let wv: [__m512; C] = std::array::from_fn(|j| _mm512_loadu_ps(wr[j].add(k)));
            for i in 0..R {
                let xv = _mm512_loadu_ps(xr[i].add(k));
                for j in 0..C {
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
            k += 16;
        }
        if full < n_in {
            let wv: [__m512; C] =
                std::array::from_fn(|j| _mm512_maskz_loadu_ps(tail_mask, wr[j].add(full)));
            for i in 0..R {
                let xv = _mm512_maskz_loadu_ps(tail_mask, xr[i].add(full));
                for j in 0..C {
                    acc[i][j] = _mm512_fmadd_ps(xv, wv[j], acc[i][j]);
                }
            }
        }
        for i in 0..R {
            for j in 0..C {
                *out.0.add((s0 + i) * n_out + o0 + j) = _mm512_reduce_add_ps(acc[i][j]);
            }
        }
    }

    let out = Out(y.as_mut_ptr());
    let block_rows = rows / 4 * 4;
    let block_columns = n_out / 4 * 4;
    (0..n_out.div_ceil(32)).into_par_iter().for_each(|task| {
        let first = task * 32;
        let last = (first + 32).min(n_out);
        let tiled_end = last.min(block_columns);
        // SAFETY: AVX-512F is present (checked by the test); tiles stay inside x, w and y.
        unsafe {
            let mut o = first;
            while o + 4 <= tiled_end {
                for s in (0..block_rows).step_by(4) {
                    tile::<4, 4>(x, w, out, n_in, n_out, s, o);
                }
                o += 4;
            }
            for o in o..tiled_end {
                for s in (0..block_rows).step_by(4) {
                    tile::<4, 1>(x, w, out, n_in, n_out, s, o);
                }
            }
            for o in first..last {
                let wo = &w[o * n_in..(o + 1) * n_in];
                let dot_rows = if o < block_columns { block_rows } else { 0 };
                for s in dot_rows..rows {
                    *out.0.add(s * n_out + o) = dot(&x[s * n_in..(s + 1) * n_in], wo);
                }
            }
        }
    });
}

/// Every output equals the replaced kernel's to the bit: row counts around the 6-, 4- and 2-row
/// tiles, column counts around the 4-column tiles and the 32-column tasks, widths with and
/// without a masked tail, with one and several k chunks (a tail in the last), x aligned or not
/// (the aligned copy), on one thread and two.
#[test]
fn tiles_chunks_and_the_aligned_copy_keep_the_replaced_kernels_bits() {
    if !has_avx512() {
        return;
    }
    let two = rayon::ThreadPoolBuilder::new()
        .num_threads(2)
        .build()
        .unwrap();
    let one = rayon::ThreadPoolBuilder::new()
        .num_threads(1)
        .build()
        .unwrap();
    for (rows, n_in, n_out) in [
        (64, 896, 1152),
        (64, 4864, 40),
        (9, 577, 103),
        (4, 16, 4),
        (13, 40, 97),
        (6, 2100, 36),
        (8, 2048, 8),
        (10, 1040, 70),
        (22, 33, 35),
        (3, 64, 64),
        (7, 1, 9),
        (5, 0, 8),
    ] {
        let x = pseudo_random(rows * n_in + 1, 5);
        let w = pseudo_random(n_out * n_in, 6);
        for offset in [0usize, 1] {
            // an aligned buffer is borrowed, a misaligned slice copied
            let (aligned, _) = AlignedBuf::rows_from(&x[offset..], rows, n_in);
            let x: &[f32] = if offset == 0 && n_in % 16 == 0 {
                &aligned[..rows * n_in]
            } else {
                &x[offset..offset + rows * n_in]
            };
            let mut want = vec![f32::NAN; rows * n_out];
            replaced(x, &w, &mut want, rows, n_in, n_out);
            for pool in [&one, &two] {
                let mut got = vec![f32::NAN; rows * n_out];
                pool.install(|| matmul_t_avx512(x, &w, &mut got, rows, n_in, n_out));
                let differing = (0..rows * n_out).find(|&i| got[i].to_bits() != want[i].to_bits());
                assert_eq!(
                    differing,
                    None,
                    "({rows},{n_in},{n_out}), x offset {offset}, {} thread(s): first differing \
                     output",
                    pool.current_num_threads()
                );
            }
        }
    }
}

/// [`reduce4`] is `_mm512_reduce_add_ps` of each register, to the bit, on values whose sums
/// depend on the order of the additions.
#[test]
fn reduce4_is_four_reduce_add_ps() {
    if !has_avx512() {
        return;
    }
    for seed in 0..200u32 {
        let v: Vec<f32> = pseudo_random(64, seed)
            .iter()
            .enumerate()
            .map(|(i, x)| x * (1u32 << (i % 23)) as f32)
            .collect();
        // SAFETY: AVX-512F/VL detected above; v holds 64 values.
        unsafe {
            let r: [__m512; 4] = std::array::from_fn(|j| _mm512_loadu_ps(v[16 * j..].as_ptr()));
            let mut got = [0f32; 4];
            _mm_storeu_ps(got.as_mut_ptr(), reduce4(r[0], r[1], r[2], r[3]));
            for j in 0..4 {
                assert_eq!(
                    got[j].to_bits(),
                    _mm512_reduce_add_ps(r[j]).to_bits(),
                    "seed {seed}, register {j}"
                );
            }
        }
    }
}
