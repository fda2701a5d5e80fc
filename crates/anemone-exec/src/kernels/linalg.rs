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
const PARALLEL_WORK: usize = 1 << 18;

/// `dst (row-major m×n) = a (m×k) · b (k×n)`, or `dst += …` when `accumulate`.
pub fn matmul_into(dst: &mut [f32], a: MatRef, b: MatRef, accumulate: bool) -> Result<(), String> {
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
    let parallelism = if m * n * k >= PARALLEL_WORK {
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
    Ok(())
}

/// Rows per parallel task of a matvec (a few tasks per core, each a contiguous block of W).
const MATVEC_ROWS_PER_TASK: usize = 64;

fn matvec_strided(dst: &mut [f32], a: MatRef, x: &[f32], accumulate: bool) {
    let k = a.cols;
    let dot = simd::dot_f32_kernel();
    let row = |i: usize| -> f32 {
        if a.cs == 1 {
            dot(&a.data[i * a.rs..i * a.rs + k], x)
        } else {
            (0..k).map(|j| a.data[i * a.rs + j * a.cs] * x[j]).sum()
        }
    };
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, d) in chunk.iter_mut().enumerate() {
            let v = row(t * MATVEC_ROWS_PER_TASK + r);
            *d = if accumulate { *d + v } else { v };
        }
    };
    if a.rows * k >= PARALLEL_WORK {
        dst.par_chunks_mut(MATVEC_ROWS_PER_TASK)
            .enumerate()
            .for_each(kernel);
    } else {
        dst.chunks_mut(MATVEC_ROWS_PER_TASK)
            .enumerate()
            .for_each(kernel);
    }
}

/// `dst = W · x` for an fp16 row-major `W [rows × x.len()]`, widened to f32 (F16C where
/// available) and summed in f32. Half the memory traffic of an f32
/// matvec, which is what bounds a single-token projection.
pub fn matvec_f16(dst: &mut [f32], w: &[half::f16], x: &[f32]) -> Result<(), String> {
    let k = x.len();
    if w.len() != dst.len() * k {
        return Err(format!(
            "fp16 matvec: weight of {} values for {} rows of {k}",
            w.len(),
            dst.len()
        ));
    }
    if k == 0 {
        dst.fill(0.0);
        return Ok(());
    }
    let dot = simd::dot_f16_kernel();
    let kernel = |(t, chunk): (usize, &mut [f32])| {
        for (r, d) in chunk.iter_mut().enumerate() {
            let i = t * MATVEC_ROWS_PER_TASK + r;
            *d = dot(&w[i * k..(i + 1) * k], x);
        }
    };
    if dst.len() * k >= PARALLEL_WORK {
        dst.par_chunks_mut(MATVEC_ROWS_PER_TASK)
            .enumerate()
            .for_each(kernel);
    } else {
        dst.chunks_mut(MATVEC_ROWS_PER_TASK)
            .enumerate()
            .for_each(kernel);
    }
    Ok(())
}

std::thread_local! {
    /// Per-thread buffer that fp16 weights are widened into for wide (multi-token) products.
    static WIDENED: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}

/// Runs `f` on `w` widened to f32 (exact) in a buffer reused across calls on this thread, so a
/// wide product over an fp16 weight costs no allocation and no resident f32 copy of the weight.
pub fn with_widened<R>(w: &[half::f16], f: impl FnOnce(&[f32]) -> R) -> R {
    use half::slice::HalfFloatSliceExt;
    WIDENED.with(|cell| match cell.try_borrow_mut() {
        Ok(mut buf) => {
            buf.resize(w.len(), 0.0);
            w.convert_to_f32_slice(&mut buf);
            f(&buf)
        }
        // re-entered on this thread (a nested pool task): a buffer of its own
        Err(_) => f(&w.to_f32_vec()),
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
