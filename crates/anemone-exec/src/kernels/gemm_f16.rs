//! Wide (multi-token) products over fp16 weights: the weight is widened panel by panel, each
//! panel into a per-thread buffer that stays in L2, and the panels are spread over the team
//! ([`crate::team`], the threads of every other wide product), each one a single-threaded
//! `gemm` call.
//!
//! Same values as one `gemm` call on an f32 copy of the whole weight: widening is exact, and a
//! panel of rows of the left operand changes nothing in how any output element is summed.
//! `gemm` sums each element along k in blocks whose length depends only on k (and the cache
//! sizes) once the product is not "small" (`m ≤ 64 && n ≤ 64`, blocks of 512) nor on its
//! horizontal (`m·n ≤ 256`), matrix-vector (`m` or `n` ≤ 1) or outer-product (`k ≤ 2`) paths;
//! so the whole product and every panel must have more than 64 rows, `n ≥ 2` and `k ≥ 3`.
//! Other shapes take the whole weight widened at once ([`super::linalg::with_widened`]).
//! A panel of 80–256 rows is sized to hold about 256 KiB of f32 weight. Compressed weights
//! ([`matmul_rows_by`]) are expanded the same way, a panel of rows at a time, never whole when
//! the product splits.

use anemone_mil::ConvParams;
use half::f16;

use super::gemm_avx512::Lhs;
use super::linalg::{gemm_product, matmul_into, matmul_on, with_widened, MatRef, PARALLEL_WORK};
use super::quant::{fill_by_rows, with_filled};

/// Bytes of widened weight per panel aimed at: a quarter of a 1 MiB L2, leaving room for the
/// packed operands.
const PANEL_BYTES: usize = 256 << 10;

/// Rows of each panel (the last may be shorter), or `None` when the shape must not be split.
fn panel_rows(m: usize, n: usize, k: usize) -> Option<usize> {
    if n < 2 || k < 3 {
        return None;
    }
    let target = (PANEL_BYTES / (4 * k)).clamp(80, 256);
    // multiples of 16 above 64 (so every panel stays off gemm's small path), nearest first
    let mut sizes: Vec<usize> = (80..=256).step_by(16).filter(|&r| r < m).collect();
    sizes.sort_by_key(|&r| r.abs_diff(target));
    sizes
        .into_iter()
        .find(|&rows| m - rows * (m.div_ceil(rows) - 1) > 64)
}

/// Exact fp16 → f32 widening of `src` into `dst` (of the same length): AVX-512F's 16-wide
/// conversion where the CPU has it, else `half`'s.
pub fn widen(src: &[f16], dst: &mut [f32]) {
    #[cfg(target_arch = "x86_64")]
    if std::arch::is_x86_feature_detected!("avx512f") {
        // SAFETY: AVX-512F was detected at run time.
        unsafe { widen_avx512(src, dst) };
        return;
    }
    use half::slice::HalfFloatSliceExt;
    src.convert_to_f32_slice(dst);
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f")]
unsafe fn widen_avx512(src: &[f16], dst: &mut [f32]) {
    use std::arch::x86_64::{__m256i, _mm256_loadu_si256, _mm512_cvtph_ps, _mm512_storeu_ps};
    let n = src.len().min(dst.len());
    let whole = n / 16 * 16;
    let (s, d) = (src.as_ptr(), dst.as_mut_ptr());
    let mut i = 0;
    while i < whole {
        // SAFETY: i + 16 <= n, within both slices; unaligned loads and stores.
        unsafe {
            let h = _mm256_loadu_si256(s.add(i) as *const __m256i);
            _mm512_storeu_ps(d.add(i), _mm512_cvtph_ps(h));
        }
        i += 16;
    }
    for j in whole..n {
        dst[j] = src[j].to_f32();
    }
}

/// `dst [m × n] = W [m × k] · b` for an fp16 row-major `W`, the values of `matmul_into` on an
/// f32 copy of `W`: [`super::gemm_avx512`] where it applies (widening six rows at a time, the
/// values of one `gemm` call on the whole product, which the panels below equal), else `gemm`
/// on panels.
pub fn matmul_f16_lhs(
    dst: &mut [f32],
    w: &[f16],
    m: usize,
    k: usize,
    b: MatRef,
) -> Result<(), String> {
    let n = b.cols;
    if w.len() != m * k || b.rows != k || dst.len() != m * n {
        return Err(format!(
            "fp16 product: weight of {} values for {m}×{k}, operand {}×{}, {} outputs",
            w.len(),
            b.rows,
            b.cols,
            dst.len()
        ));
    }
    if super::gemm_avx512::applies(m, n, k, 1, &b) {
        let parallel = m * n * k >= PARALLEL_WORK;
        return super::gemm_avx512::matmul(dst, Lhs::F16(w), m, k, b, false, parallel);
    }
    matmul_f16_lhs_gemm(dst, w, m, k, b)
}

/// [`matmul_f16_lhs`] through `gemm` (panels widened one at a time), after its checks.
pub(crate) fn matmul_f16_lhs_gemm(
    dst: &mut [f32],
    w: &[f16],
    m: usize,
    k: usize,
    b: MatRef,
) -> Result<(), String> {
    let n = b.cols;
    let Some(rows) = panel_rows(m, n, k) else {
        return with_widened(w, |wf| {
            matmul_into(dst, MatRef::row_major(wf, m, k), b, false)
        });
    };
    let panel = |wf: &mut Vec<f32>, r0: usize, d: &mut [f32]| {
        let r = d.len() / n;
        wf.resize(r * k, 0.0);
        widen(&w[r0 * k..(r0 + r) * k], wf);
        gemm_product(d, MatRef::row_major(wf, r, k), b, false, false);
        Ok(())
    };
    by_panels(dst, (rows, n), m * n * k >= PARALLEL_WORK, &panel)
}

/// One panel of a product: `(scratch, first_row, dst_rows)`.
type Panel<'a> = dyn Fn(&mut Vec<f32>, usize, &mut [f32]) -> Result<(), String> + Sync + 'a;

/// `panel(scratch, first_row, dst_rows)` for consecutive panels of `rows` rows of `n` values of
/// `dst` (the last may be shorter), spread over this thread's team when `parallel`; each
/// thread reuses one scratch buffer for its panels and frees it when the region ends. Returns
/// the first error met.
fn by_panels(
    dst: &mut [f32],
    (rows, n): (usize, usize),
    parallel: bool,
    panel: &Panel<'_>,
) -> Result<(), String> {
    let len = dst.len();
    let panel_len = (rows * n).max(1);
    let team = if parallel {
        crate::team::current()
    } else {
        None
    };
    let out = crate::team::SharedOut::new(dst);
    let failure = std::sync::Mutex::new(None);
    crate::team::for_each_block_with(
        team.as_deref(),
        len.div_ceil(panel_len),
        &Vec::new,
        &|scratch, i| {
            let range = i * panel_len..((i + 1) * panel_len).min(len);
            // SAFETY: panels are disjoint ranges of `dst`, which outlives the region.
            let d = unsafe { out.slice(range) };
            if let Err(e) = panel(scratch, i * rows, d) {
                let mut f = failure.lock().unwrap_or_else(|e| e.into_inner());
                f.get_or_insert(e);
            }
        },
    );
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

/// `dst [m × n] = W [m × k] · b` for a weight held compressed, whose row `i` `expand_row(i,
/// out)` writes as f32: the values of `matmul_into` on the whole weight expanded. Only a panel
/// of rows (`panel_rows`) is expanded at a time, into a per-thread buffer, and multiplied by
/// one single-threaded `matmul_on` call (the panels spread over the team): `gemm` and
/// [`super::gemm_avx512`] sum every element in blocks of a length that depends only on k for
/// such panels and the whole (module docs), so a panel's outputs are the whole product's rows.
/// Unsplittable shapes expand the whole weight (rows over the pool), as before.
pub fn matmul_rows_by(
    dst: &mut [f32],
    m: usize,
    k: usize,
    b: MatRef,
    expand_row: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Result<(), String> {
    let n = b.cols;
    if b.rows != k || dst.len() != m * n {
        return Err(format!(
            "compressed product: {m}×{k} weight, operand {}×{}, {} outputs",
            b.rows,
            b.cols,
            dst.len()
        ));
    }
    let Some(rows) = panel_rows(m, n, k) else {
        let fill = |buf: &mut [f32]| fill_by_rows(buf, k, expand_row);
        return with_filled(m * k, fill, |wf| {
            matmul_into(dst, MatRef::row_major(wf, m, k), b, false)
        });
    };
    let panel = |wf: &mut Vec<f32>, r0: usize, d: &mut [f32]| {
        let r = d.len() / n;
        wf.resize(r * k, 0.0);
        for (j, out) in wf.chunks_mut(k).enumerate() {
            expand_row(r0 + j, out);
        }
        matmul_on(d, MatRef::row_major(wf, r, k), b, false, false)
    };
    by_panels(dst, (rows, n), m * n * k >= PARALLEL_WORK, &panel)
}

/// Whether a convolution of `x_shape` by `w_shape` is one product per batch (1×1 kernel, unit
/// strides, no padding, one group) that [`pointwise_conv_f16`] runs.
pub fn is_pointwise(x_shape: &[usize], w_shape: &[usize], p: &ConvParams) -> bool {
    x_shape.len() == 4
        && w_shape.len() == 4
        && w_shape[2..] == [1, 1]
        && p.strides == [1, 1]
        && p.pad == [0, 0, 0, 0]
        && p.groups == 1
        && x_shape[1] == w_shape[1]
}

/// A pointwise convolution (see [`is_pointwise`]) of `x [N, C, H, W]` by the fp16 weight
/// `[O, C, 1, 1]` into `out [N, O, H, W]`, plus `bias` per output channel: the values of
/// [`super::linalg::conv2d`] on an f32 copy of the weight.
pub fn pointwise_conv_f16(
    out: &mut [f32],
    x: &[f32],
    x_shape: &[usize],
    w: &[f16],
    w_shape: &[usize],
    bias: Option<&[f32]>,
) -> Result<(), String> {
    let (o, c) = (w_shape[0], w_shape[1]);
    pointwise_conv_by(out, x, x_shape, w_shape, bias, |dst, xm| {
        matmul_f16_lhs(dst, w, o, c, xm)
    })
}

/// [`pointwise_conv_f16`] for a weight held compressed, whose row `i` `expand_row(i, out)`
/// writes as f32 ([`matmul_rows_by`]): the values of [`super::linalg::conv2d`] on the whole
/// weight expanded.
pub fn pointwise_conv_rows_by(
    out: &mut [f32],
    x: &[f32],
    x_shape: &[usize],
    w_shape: &[usize],
    bias: Option<&[f32]>,
    expand_row: &(dyn Fn(usize, &mut [f32]) + Sync),
) -> Result<(), String> {
    let (o, c) = (w_shape[0], w_shape[1]);
    pointwise_conv_by(out, x, x_shape, w_shape, bias, |dst, xm| {
        matmul_rows_by(dst, o, c, xm, expand_row)
    })
}

/// A pointwise convolution as [`super::linalg::conv2d`] runs it: per batch, `product(out_b
/// [O × HW], x_b [C × HW])` (the weight times `x_b`), then `bias` added per output channel.
fn pointwise_conv_by(
    out: &mut [f32],
    x: &[f32],
    x_shape: &[usize],
    w_shape: &[usize],
    bias: Option<&[f32]>,
    product: impl Fn(&mut [f32], MatRef) -> Result<(), String>,
) -> Result<(), String> {
    let (n, c, hw) = (x_shape[0], x_shape[1], x_shape[2] * x_shape[3]);
    let o = w_shape[0];
    if out.len() != n * o * hw || x.len() != n * c * hw {
        return Err(format!(
            "conv of {x_shape:?} by {w_shape:?}: {} output values",
            out.len()
        ));
    }
    for b in 0..n {
        let xm = MatRef::row_major(&x[b * c * hw..(b + 1) * c * hw], c, hw);
        product(&mut out[b * o * hw..(b + 1) * o * hw], xm)?;
    }
    if let Some(bias) = bias {
        for (i, chunk) in out.chunks_mut(hw.max(1)).enumerate() {
            let bv = bias[i % o];
            chunk.iter_mut().for_each(|v| *v += bv);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kernels::linalg::conv2d;
    use crate::kernels::Accumulation;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| {
                let h = (i as u32)
                    .wrapping_mul(2654435761)
                    .wrapping_add(seed.wrapping_mul(40503));
                ((h >> 8) % 20011) as f32 / 20011.0 - 0.5
            })
            .collect()
    }

    /// The 16-wide conversion is `half`'s, on every fp16 bit pattern and an odd tail.
    #[test]
    fn widening_is_exact() {
        let all: Vec<f16> = (0..=u16::MAX).map(f16::from_bits).collect();
        for len in [all.len(), 37, 15, 0] {
            let mut got = vec![0.0f32; len];
            widen(&all[..len], &mut got);
            for (h, g) in all[..len].iter().zip(&got) {
                let want = h.to_f32();
                assert!(
                    want.to_bits() == g.to_bits() || (want.is_nan() && g.is_nan()),
                    "{h:?}"
                );
            }
        }
    }

    /// Panels (fp16 widened, or rows expanded a panel at a time) give the whole-weight
    /// product bit for bit, on awkward shapes.
    #[test]
    fn panels_equal_the_whole_product() {
        // (o, c, t): splits with short last panels, k across gemm's 512 block, unsplittable ones
        for (o, c, t) in [
            (1536, 576, 64),
            (576, 1536, 64),
            (300, 577, 7),
            (576, 4864, 64),
            (193, 1100, 2),
            (130, 3, 64),
            (129, 64, 64),
            (896, 4864, 5),
            (4864, 896, 64),
        ] {
            let w16: Vec<f16> = values(o * c, 1).iter().map(|&v| f16::from_f32(v)).collect();
            let wf: Vec<f32> = w16.iter().map(|v| v.to_f32()).collect();
            let x = values(c * t, 2);
            let bias = values(o, 3);
            let shape_x = [1, c, 1, t];
            let shape_w = [o, c, 1, 1];
            let p = ConvParams {
                strides: [1, 1],
                pad: [0, 0, 0, 0],
                dilations: [1, 1],
                groups: 1,
            };
            assert!(is_pointwise(&shape_x, &shape_w, &p));
            let mut want = vec![0.0f32; o * t];
            let out_shape = [1, o, 1, t];
            conv2d(
                &mut want,
                &x,
                &shape_x,
                &wf,
                &shape_w,
                Some(&bias),
                &p,
                &out_shape,
                Accumulation::F32,
            )
            .unwrap();
            let mut got = vec![0.0f32; o * t];
            pointwise_conv_f16(&mut got, &x, &shape_x, &w16, &shape_w, Some(&bias)).unwrap();
            let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "{o}×{c}·{t}");
            // rows expanded a panel at a time (here: copied from the f32 weight)
            let expand_row =
                |i: usize, row: &mut [f32]| row.copy_from_slice(&wf[i * c..(i + 1) * c]);
            let mut by_rows = vec![0.0f32; o * t];
            pointwise_conv_rows_by(
                &mut by_rows,
                &x,
                &shape_x,
                &shape_w,
                Some(&bias),
                &expand_row,
            )
            .unwrap();
            assert_eq!(bits(&by_rows), bits(&want), "rows {o}×{c}·{t}");
        }
    }
}
