//! Matrix kernels: a multi-threaded matvec for single-token projections, `gemm` for
//! everything wider, and a direct convolution for kernels larger than 1×1. Sums in f32.

use anemone_mil::ConvParams;
use gemm::Parallelism;
use rayon::prelude::*;

use super::elementwise::Operand;
use super::{fp16acc, simd, Accumulation};

/// A strided read-only matrix view: element (i, j) at `data[i * rs + j * cs]`.
#[derive(Clone, Copy)]
pub struct MatRef<'a> {
    pub data: &'a [f32],
    pub rows: usize,
    pub cols: usize,
    pub rs: usize,
    pub cs: usize,
}

impl<'a> MatRef<'a> {
    /// A row-major `rows × cols` matrix starting at `data[0]`.
    pub fn row_major(data: &'a [f32], rows: usize, cols: usize) -> Self {
        MatRef {
            data,
            rows,
            cols,
            rs: cols,
            cs: 1,
        }
    }

    pub fn transposed(self) -> Self {
        MatRef {
            data: self.data,
            rows: self.cols,
            cols: self.rows,
            rs: self.cs,
            cs: self.rs,
        }
    }

    fn fits(&self) -> bool {
        self.rows == 0
            || self.cols == 0
            || (self.rows - 1) * self.rs + (self.cols - 1) * self.cs < self.data.len()
    }
}

/// Work (multiply-adds) above which a product is spread over the thread pool.
pub(crate) const PARALLEL_WORK: usize = 1 << 18;

/// The team a single-token region of `work` multiply-adds runs on (none below
/// [`PARALLEL_WORK`]: the calling thread alone) and the number of threads it has.
pub(crate) fn region_team(work: usize) -> (Option<std::sync::Arc<crate::team::Team>>, usize) {
    let team = if work >= PARALLEL_WORK {
        crate::team::current()
    } else {
        None
    };
    let threads = team.as_ref().map_or(1, |t| t.threads());
    (team, threads)
}

/// `dst (row-major m×n) = a (m×k) · b (k×n)`, or `dst += …` when `accumulate`.
pub fn matmul_into(dst: &mut [f32], a: MatRef, b: MatRef, accumulate: bool) -> Result<(), String> {
    let parallel = a.rows * b.cols * a.cols >= PARALLEL_WORK;
    matmul_on(dst, a, b, accumulate, parallel)
}

/// [`matmul_into`] with the `gemm` product spread over the thread pool or not (the values do
/// not depend on it).
pub(crate) fn matmul_on(
    dst: &mut [f32],
    a: MatRef,
    b: MatRef,
    accumulate: bool,
    parallel: bool,
) -> Result<(), String> {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    if b.rows != k || dst.len() != m * n || !a.fits() || !b.fits() {
        return Err(format!(
            "matmul operands disagree: {}×{} · {}×{} into {} values",
            a.rows,
            a.cols,
            b.rows,
            b.cols,
            dst.len()
        ));
    }
    if m == 0 || n == 0 {
        return Ok(());
    }
    if k == 0 {
        if !accumulate {
            dst.fill(0.0);
        }
        return Ok(());
    }
    if n == 1 {
        // y = A·x: one dot product per row of A
        let x: Vec<f32> = (0..k).map(|j| b.data[j * b.rs]).collect();
        matvec_strided(dst, a, &x, accumulate);
        return Ok(());
    }
    if super::gemm_avx512::applies(m, n, k, a.cs, &b) {
        let lhs = super::gemm_avx512::Lhs::F32 {
            data: a.data,
            rs: a.rs,
        };
        return super::gemm_avx512::matmul(dst, lhs, m, k, b, accumulate, parallel);
    }
    gemm_product(dst, a, b, accumulate, parallel);
    Ok(())
}

/// The `gemm` call of [`matmul_on`] (`dst` row-major, `alpha = beta = 1`), whose values
/// [`super::gemm_avx512`] reproduces. The caller checked the operands as `matmul_on` does
/// (`m, n, k ≥ 1`, both views inside their slices, `dst` of `m × n`).
pub(crate) fn gemm_product(
    dst: &mut [f32],
    a: MatRef,
    b: MatRef,
    accumulate: bool,
    parallel: bool,
) {
    let (m, k, n) = (a.rows, a.cols, b.cols);
    assert!(b.rows == k && dst.len() == m * n && a.fits() && b.fits());
    let parallelism = if parallel {
        Parallelism::Rayon(0)
    } else {
        Parallelism::None
    };
    // SAFETY: `fits` proved every (i, j) index of a and b lies inside its slice, and dst holds
    // exactly m×n row-major values; the three buffers do not overlap (dst is &mut).
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            dst.as_mut_ptr(),
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a.cs as isize,
            a.rs as isize,
            b.data.as_ptr(),
            b.cs as isize,
            b.rs as isize,
            1.0,
            1.0,
            false,
            false,
            false,
            parallelism,
        );
    }
}

/// The weight of a single-token projection `dst = W·x`.
#[derive(Clone, Copy)]
pub enum RowWeights<'a> {
    /// Row-major fp16 `[dst.len() × x.len()]`, read through [`simd::dot_f16_kernel`].
    F16(&'a [half::f16]),
    /// Any strided f32 matrix `[dst.len() × x.len()]`: rows with unit column stride through
    /// [`simd::dot_f32_kernel`], others summed in order.
    F32(MatRef<'a>),
}

/// One matvec of a region: `dst = W·x` (`dst += W·x` when `accumulate`).
pub struct Projection<'a> {
    pub dst: &'a mut [f32],
    pub w: RowWeights<'a>,
    pub accumulate: bool,
}

impl Projection<'_> {
    fn check(&self, k: usize) -> Result<(), String> {
        let rows = self.dst.len();
        match self.w {
            RowWeights::F16(w) if w.len() != rows * k => Err(format!(
                "fp16 matvec: weight of {} values for {rows} rows of {k}",
                w.len()
            )),
            RowWeights::F32(a) if a.rows != rows || a.cols != k || !a.fits() => Err(format!(
                "matvec: a {}×{} matrix for {rows} rows of {k}",
                a.rows, a.cols
            )),
            RowWeights::F16(_) | RowWeights::F32(_) => Ok(()),
        }
    }

    /// Rows per unit of work ([`crate::team::matvec_unit_rows`]): the team's threads claim runs
    /// of units from both ends (`for_each_run_from_ends`), so a late thread costs nothing and
    /// no thread waits long for another's last run.
    fn rows_per_unit(&self, k: usize) -> usize {
        let row_bytes = match self.w {
            RowWeights::F16(_) => 2 * k,
            RowWeights::F32(_) => 4 * k,
        };
        crate::team::matvec_unit_rows(row_bytes)
    }
}

/// `dst = W·x` for every projection of `group` (all of the same `x`) in one parallel region
/// of this thread's [`crate::team`]: one fork and join for, e.g., the q/k/v projections of a
/// layer. Every row is one dot product computed exactly as by [`matvec_f16`] /
/// `matmul_into`'s single-column path, whichever thread runs it.
pub fn matvec_group(group: &mut [Projection], x: &[f32]) -> Result<(), String> {
    let k = x.len();
    for p in group.iter() {
        p.check(k)?;
    }
    if k == 0 {
        for p in group.iter_mut() {
            if !p.accumulate {
                p.dst.fill(0.0);
            }
        }
        return Ok(());
    }
    struct Job<'a> {
        out: crate::team::SharedOut,
        rows: usize,
        rows_per_unit: usize,
        first_unit: usize,
        end_unit: usize,
        w: RowWeights<'a>,
        accumulate: bool,
    }
    let work: usize = group.iter().map(|p| p.dst.len() * k).sum();
    let (team, _) = region_team(work);
    let mut jobs = Vec::with_capacity(group.len());
    let mut units = 0;
    for p in group.iter_mut() {
        let rows = p.dst.len();
        let rows_per_unit = p.rows_per_unit(k);
        let first_unit = units;
        units += rows.div_ceil(rows_per_unit);
        jobs.push(Job {
            out: crate::team::SharedOut::new(p.dst),
            rows,
            rows_per_unit,
            first_unit,
            end_unit: units,
            w: p.w,
            accumulate: p.accumulate,
        });
    }
    let (dot16, dot32) = (simd::dot_f16_kernel(), simd::dot_f32_kernel());
    let (dot16x4, dot32x4) = (simd::dot_f16x4_kernel(), simd::dot_f32x4_kernel());
    // rows `first..last` of `job`
    let run_rows = |job: &Job, first: usize, last: usize| {
        // SAFETY: runs are disjoint row ranges inside the job's `dst`, which outlives the
        // region (`matvec_group` holds its borrow until `for_each_run_from_ends` returns).
        let out = unsafe { job.out.slice(first..last) };
        match job.w {
            RowWeights::F16(w) => {
                // four rows a pass where the CPU has it (each row's value is `dot16`'s)
                let mut r = 0;
                if let Some(dot4) = dot16x4 {
                    for d in out.chunks_exact_mut(4) {
                        let i = first + r;
                        d.copy_from_slice(&dot4(&w[i * k..(i + 4) * k], x));
                        r += 4;
                    }
                }
                for (r, d) in out.iter_mut().enumerate().skip(r) {
                    let i = first + r;
                    *d = dot16(&w[i * k..(i + 1) * k], x);
                }
            }
            RowWeights::F32(a) => {
                // four rows a pass where the CPU has it and the rows have unit column stride
                // (each row's value is `dot32`'s)
                let mut r = 0;
                if let (Some(dot4), 1) = (dot32x4, a.cs) {
                    for d in out.chunks_exact_mut(4) {
                        let i = first + r;
                        let v = dot4(&a.data[i * a.rs..(i + 3) * a.rs + k], a.rs, x);
                        for (d, v) in d.iter_mut().zip(v) {
                            *d = if job.accumulate { *d + v } else { v };
                        }
                        r += 4;
                    }
                }
                for (r, d) in out.iter_mut().enumerate().skip(r) {
                    let i = first + r;
                    let v = if a.cs == 1 {
                        dot32(&a.data[i * a.rs..i * a.rs + k], x)
                    } else {
                        (0..k).map(|j| a.data[i * a.rs + j * a.cs] * x[j]).sum()
                    };
                    *d = if job.accumulate { *d + v } else { v };
                }
            }
        }
    };
    let run = |run: std::ops::Range<usize>| {
        for job in jobs
            .iter()
            .filter(|j| j.first_unit < run.end && run.start < j.end_unit)
        {
            let first = (run.start.max(job.first_unit) - job.first_unit) * job.rows_per_unit;
            let last = (run.end.min(job.end_unit) - job.first_unit) * job.rows_per_unit;
            run_rows(job, first, last.min(job.rows));
        }
    };
    crate::team::for_each_run_from_ends(team.as_deref(), units, 1, &run);
    Ok(())
}

fn matvec_strided(dst: &mut [f32], a: MatRef, x: &[f32], accumulate: bool) {
    let mut group = [Projection {
        dst,
        w: RowWeights::F32(a),
        accumulate,
    }];
    // `matmul_into` checked the shapes, so this cannot fail
    let _ = matvec_group(&mut group, x);
}

/// `dst = W · x` for an fp16 row-major `W [rows × x.len()]`, widened to f32 (F16C where
/// available) and summed in f32. Half the memory traffic of an f32
/// matvec, which is what bounds a single-token projection.
pub fn matvec_f16(dst: &mut [f32], w: &[half::f16], x: &[f32]) -> Result<(), String> {
    matvec_group(
        &mut [Projection {
            dst,
            w: RowWeights::F16(w),
            accumulate: false,
        }],
        x,
    )
}

std::thread_local! {
    /// Per-thread buffer that fp16 weights are widened into for wide (multi-token) products.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Frees this thread's [`with_widened`] buffer.
pub(crate) fn release_scratch() {
    WIDENED.with(|cell| {
        if let Ok(mut buf) = cell.try_borrow_mut() {
            *buf = Vec::new();
        }
    });
}

/// Runs `f` on `w` widened to f32 (exact) in a buffer reused across calls on this thread, so a
/// wide product over an fp16 weight costs no allocation and no resident f32 copy of the weight.
pub fn with_widened<R>(w: &[half::f16], f: impl FnOnce(&[f32]) -> R) -> R {
    WIDENED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(w.len(), 0.0);
            super::gemm_f16::widen(w, &mut buf);
            f(&buf)
        }
        // re-entered on this thread (a nested pool task): a buffer of its own
        Err(_) => {
            let mut buf = vec![0.0f32; w.len()];
            super::gemm_f16::widen(w, &mut buf);
            f(&buf)
        }
    })
}

/// 2-D convolution of `x [N, C, H, W]` with `w [O, C/groups, kH, kW]` into `dst [N, O, oH, oW]`
/// (which must hold zeros).
#[allow(clippy::too_many_arguments)]
pub fn conv2d(
    out: &mut [f32],
    x: &[f32],
    x_shape: &[usize],
    w: &[f32],
    w_shape: &[usize],
    bias: Option<&[f32]>,
    p: &ConvParams,
    out_shape: &[usize],
    acc: Accumulation,
) -> Result<(), String> {
    let (n, c, h, wd) = (x_shape[0], x_shape[1], x_shape[2], x_shape[3]);
    let (o, cpg, kh, kw) = (w_shape[0], w_shape[1], w_shape[2], w_shape[3]);
    let (oh, ow) = (out_shape[2], out_shape[3]);
    let g = p.groups;
    let opg = o / g;
    if out.len() != n * o * oh * ow {
        return Err(format!(
            "conv output holds {} values, {n}×{o}×{oh}×{ow} expected",
            out.len()
        ));
    }
    let pointwise = kh == 1 && kw == 1 && p.strides == [1, 1] && p.pad == [0, 0, 0, 0];
    if pointwise {
        // per batch and group: out[opg × HW] = W[opg × cpg] · X[cpg × HW]
        let hw = h * wd;
        for b in 0..n {
            for gi in 0..g {
                let wm = MatRef::row_major(&w[gi * opg * cpg..(gi + 1) * opg * cpg], opg, cpg);
                let xs = (b * c + gi * cpg) * hw;
                let xm = MatRef::row_major(&x[xs..xs + cpg * hw], cpg, hw);
                let os = (b * o + gi * opg) * hw;
                let dst = &mut out[os..os + opg * hw];
                match acc {
                    Accumulation::F32 => matmul_into(dst, wm, xm, false)?,
                    Accumulation::Fp16Blocks => fp16acc::matmul_into(dst, wm, xm)?,
                }
            }
        }
    } else {
        let plane = oh * ow;
        let kernel = |(bo, dst): (usize, &mut [f32])| {
            let (b, oc) = (bo / o, bo % o);
            let gi = oc / opg;
            // fp16 blocks: taps summed in f32 into `block`, folded into dst every BLOCK taps
            let mut block = match acc {
                Accumulation::F32 => Vec::new(),
                Accumulation::Fp16Blocks => vec![0.0f32; dst.len()],
            };
            let mut taps = 0;
            for ci in 0..cpg {
                let xc = (b * c + gi * cpg + ci) * h * wd;
                for ki in 0..kh {
                    for kj in 0..kw {
                        let wv = w[((oc * cpg + ci) * kh + ki) * kw + kj];
                        let sink: &mut [f32] = match acc {
                            Accumulation::F32 => dst,
                            Accumulation::Fp16Blocks => &mut block,
                        };
                        for y in 0..oh {
                            let iy = (y * p.strides[0] + ki * p.dilations[0]) as isize
                                - p.pad[0] as isize;
                            if iy < 0 || iy >= h as isize {
                                continue;
                            }
                            for xo in 0..ow {
                                let ix = (xo * p.strides[1] + kj * p.dilations[1]) as isize
                                    - p.pad[2] as isize;
                                if ix < 0 || ix >= wd as isize {
                                    continue;
                                }
                                sink[y * ow + xo] += wv * x[xc + iy as usize * wd + ix as usize];
                            }
                        }
                        taps += 1;
                        if acc == Accumulation::Fp16Blocks && taps % fp16acc::BLOCK == 0 {
                            fp16acc::fold_block(dst, &mut block);
                        }
                    }
                }
            }
            if acc == Accumulation::Fp16Blocks && taps % fp16acc::BLOCK != 0 {
                fp16acc::fold_block(dst, &mut block);
            }
        };
        out.par_chunks_mut(plane.max(1))
            .enumerate()
            .for_each(kernel);
    }
    if let Some(bias) = bias {
        let plane = oh * ow;
        for (i, chunk) in out.chunks_mut(plane.max(1)).enumerate() {
            let bv = bias[i % o];
            chunk.iter_mut().for_each(|v| *v += bv);
        }
    }
    Ok(())
}

/// Batched `x · y` with numpy broadcasting of the batch dims.
pub fn batched_matmul(
    x: Operand,
    y: Operand,
    tx: bool,
    ty: bool,
    out_shape: &[usize],
    acc: Accumulation,
) -> Result<Vec<f32>, String> {
    let (xr, yr, or) = (x.shape.len(), y.shape.len(), out_shape.len());
    let (xa, xb) = (x.shape[xr - 2], x.shape[xr - 1]);
    let (ya, yb) = (y.shape[yr - 2], y.shape[yr - 1]);
    let (m, n) = (out_shape[or - 2], out_shape[or - 1]);
    let mut out = vec![0.0f32; out_shape.iter().product()];
    let mut failure = None;
    super::elementwise::for_each_broadcast(
        &out_shape[..or - 2],
        &x.shape[..xr - 2],
        &y.shape[..yr - 2],
        |o, xi, yi| {
            if failure.is_some() {
                return;
            }
            let xs = &x.data[xi * xa * xb..(xi + 1) * xa * xb];
            let ys = &y.data[yi * ya * yb..(yi + 1) * ya * yb];
            let mut a = MatRef::row_major(xs, xa, xb);
            let mut b = MatRef::row_major(ys, ya, yb);
            if tx {
                a = a.transposed();
            }
            if ty {
                b = b.transposed();
            }
            let dst = &mut out[o * m * n..(o + 1) * m * n];
            let done = match acc {
                Accumulation::F32 => matmul_into(dst, a, b, false),
                Accumulation::Fp16Blocks => fp16acc::matmul_into(dst, a, b),
            };
            if let Err(e) = done {
                failure = Some(e);
            }
        },
    );
    match failure {
        Some(e) => Err(e),
        None => Ok(out),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use half::f16;

    use super::*;
    use crate::team::{self, Team};

    fn values(n: usize, seed: usize) -> Vec<f32> {
        (0..n)
            .map(|i| (((i + seed) * 7919 % 2003) as f32 - 1001.0) / 613.0)
            .collect()
    }

    /// Every row of a grouped matvec (fp16 and f32 rows, strided f32 rows, accumulation) is
    /// the per-row dot bit for bit, whatever the team's width and however runs fall.
    #[test]
    fn grouped_matvecs_equal_the_per_row_dots_bit_for_bit() {
        let (dot16, dot32) = (simd::dot_f16_kernel(), simd::dot_f32_kernel());
        // 4867: an f32 row longer than a unit of work
        for k in [1usize, 7, 33, 583, 4867] {
            let x = values(k, 1);
            // enough rows that the region runs on the team (≥ PARALLEL_WORK multiply-adds)
            let rows = [PARALLEL_WORK / k / 2 + 5, 3, PARALLEL_WORK / k / 3 + 1];
            let w16: Vec<f16> = values(rows[0] * k, 2)
                .iter()
                .map(|&v| f16::from_f32(v))
                .collect();
            let w32 = values(rows[1] * k, 3);
            // a transposed view: rows with column stride rows[2]
            let wt = values(rows[2] * k, 4);
            let mut want = [
                vec![0.0f32; rows[0]],
                vec![0.0; rows[1]],
                vec![0.5; rows[2]],
            ];
            for (r, d) in want[0].iter_mut().enumerate() {
                *d = dot16(&w16[r * k..(r + 1) * k], &x);
            }
            for (r, d) in want[1].iter_mut().enumerate() {
                *d = dot32(&w32[r * k..(r + 1) * k], &x);
            }
            for (r, d) in want[2].iter_mut().enumerate() {
                let v: f32 = (0..k).map(|j| wt[j * rows[2] + r] * x[j]).sum();
                *d += v;
            }
            for threads in [1, 2, 3] {
                let team = Arc::new(Team::new(threads).unwrap());
                let mut got = [
                    vec![0.0f32; rows[0]],
                    vec![0.0; rows[1]],
                    vec![0.5; rows[2]],
                ];
                let [g0, g1, g2] = &mut got;
                let mut group = [
                    Projection {
                        dst: g0,
                        w: RowWeights::F16(&w16),
                        accumulate: false,
                    },
                    Projection {
                        dst: g1,
                        w: RowWeights::F32(MatRef::row_major(&w32, rows[1], k)),
                        accumulate: false,
                    },
                    Projection {
                        dst: g2,
                        w: RowWeights::F32(MatRef::row_major(&wt, k, rows[2]).transposed()),
                        accumulate: true,
                    },
                ];
                team::with_team(&team, || matvec_group(&mut group, &x)).unwrap();
                for (p, (g, w)) in got.iter().zip(&want).enumerate() {
                    let same = g.iter().zip(w).all(|(a, b)| a.to_bits() == b.to_bits());
                    assert!(same, "k={k} threads={threads} projection {p}");
                }
                let mut single = vec![0.0f32; rows[0]];
                team::with_team(&team, || matvec_f16(&mut single, &w16, &x)).unwrap();
                assert!(single
                    .iter()
                    .zip(&want[0])
                    .all(|(a, b)| a.to_bits() == b.to_bits()));
            }
        }
    }

    #[test]
    fn a_matvec_of_the_wrong_weight_size_is_refused() {
        let w = vec![f16::ZERO; 10];
        let err = matvec_f16(&mut [0.0; 3], &w, &[1.0; 4]).unwrap_err();
        assert!(err.contains("weight of 10 values for 3 rows of 4"), "{err}");
    }
}
