//! Elementwise kernels: broadcasting binary ops, unary activations, casts.

use anemone_backend::{round_f16, MAX_EXACT_INT};
use anemone_mil::{BinaryOp, DType, GeluMode, UnaryOp};

/// Strides of `shape` seen from a broadcast output of rank `out_rank` (0 on broadcast axes).
fn broadcast_strides(shape: &[usize], out_shape: &[usize]) -> Vec<usize> {
    let lead = out_shape.len() - shape.len();
    let own = crate::decompress::strides(shape);
    (0..out_shape.len())
        .map(|i| {
            if i < lead || shape[i - lead] == 1 {
                0
            } else {
                own[i - lead]
            }
        })
        .collect()
}

/// Calls `f(out_index, x_index, y_index)` for every output element, in order.
#[inline]
pub(crate) fn for_each_broadcast(
    out_shape: &[usize],
    x_shape: &[usize],
    y_shape: &[usize],
    mut f: impl FnMut(usize, usize, usize),
) {
    for_each_broadcast_run(out_shape, x_shape, y_shape, |o, (xb, xs), (yb, ys), n| {
        for j in 0..n {
            f(o + j, xb + j * xs, yb + j * ys);
        }
    });
}

/// Calls `f(out_start, (x_start, x_step), (y_start, y_step), len)` for every run of the
/// output's last axis, in order: output element `out_start + j` reads `x[x_start + j·x_step]`
/// and `y[y_start + j·y_step]` (steps 1, or 0 on a broadcast axis).
#[inline]
pub(crate) fn for_each_broadcast_run(
    out_shape: &[usize],
    x_shape: &[usize],
    y_shape: &[usize],
    mut f: impl FnMut(usize, (usize, usize), (usize, usize), usize),
) {
    let rank = out_shape.len();
    let numel: usize = out_shape.iter().product();
    if numel == 0 {
        return;
    }
    if rank == 0 {
        f(0, (0, 0), (0, 0), 1);
        return;
    }
    let xs = broadcast_strides(x_shape, out_shape);
    let ys = broadcast_strides(y_shape, out_shape);
    let inner = out_shape[rank - 1];
    let (xi_step, yi_step) = (xs[rank - 1], ys[rank - 1]);
    let mut coord = vec![0usize; rank - 1];
    let (mut xb, mut yb) = (0usize, 0usize);
    let mut o = 0;
    while o < numel {
        f(o, (xb, xi_step), (yb, yi_step), inner);
        o += inner;
        // advance the outer odometer
        for ax in (0..rank - 1).rev() {
            coord[ax] += 1;
            xb += xs[ax];
            yb += ys[ax];
            if coord[ax] < out_shape[ax] {
                break;
            }
            xb -= xs[ax] * out_shape[ax];
            yb -= ys[ax] * out_shape[ax];
            coord[ax] = 0;
        }
    }
}

/// `dst[j] = f(x[xb + j·xs], y[yb + j·ys])`, as slices where the steps allow (vectorisable).
#[inline(always)]
fn binary_run<F: Fn(f32, f32) -> f32>(
    f: &F,
    dst: &mut [f32],
    x: &[f32],
    (xb, xs): (usize, usize),
    y: &[f32],
    (yb, ys): (usize, usize),
) {
    let n = dst.len();
    match (xs, ys) {
        (1, 1) => dst
            .iter_mut()
            .zip(&x[xb..xb + n])
            .zip(&y[yb..yb + n])
            .for_each(|((d, &a), &b)| *d = f(a, b)),
        (1, 0) => {
            let b = y[yb];
            dst.iter_mut()
                .zip(&x[xb..xb + n])
                .for_each(|(d, &a)| *d = f(a, b))
        }
        (0, 1) => {
            let a = x[xb];
            dst.iter_mut()
                .zip(&y[yb..yb + n])
                .for_each(|(d, &b)| *d = f(a, b))
        }
        _ => {
            for (j, d) in dst.iter_mut().enumerate() {
                *d = f(x[xb + j * xs], y[yb + j * ys]);
            }
        }
    }
}

#[inline]
fn apply_binary<F: Fn(f32, f32) -> f32>(
    f: F,
    x: &[f32],
    x_shape: &[usize],
    y: &[f32],
    y_shape: &[usize],
    out_shape: &[usize],
    reuse: Option<Vec<f32>>,
) -> Vec<f32> {
    let numel: usize = out_shape.iter().product();
    // In place: `reuse` is x's own buffer, already of the output's shape.
    if let Some(mut buf) = reuse {
        in_place(&f, &mut buf, out_shape, y, y_shape);
        return buf;
    }
    if x_shape == out_shape && y_shape == out_shape {
        return x.iter().zip(y).map(|(&a, &b)| f(a, b)).collect();
    }
    if x_shape == out_shape && y.len() == 1 {
        let b = y[0];
        return x.iter().map(|&a| f(a, b)).collect();
    }
    if y_shape == out_shape && x.len() == 1 {
        let a = x[0];
        return y.iter().map(|&b| f(a, b)).collect();
    }
    let mut out = vec![0.0f32; numel];
    for_each_broadcast_run(out_shape, x_shape, y_shape, |o, xr, yr, n| {
        binary_run(&f, &mut out[o..o + n], x, xr, y, yr)
    });
    out
}

/// `buf[i] = f(buf[i], y[…])`: `buf` holds an operand of `out_shape`, `y` broadcasts to it.
#[inline]
fn in_place<F: Fn(f32, f32) -> f32>(
    f: &F,
    buf: &mut [f32],
    out_shape: &[usize],
    y: &[f32],
    y_shape: &[usize],
) {
    if y.len() == 1 {
        let b = y[0];
        buf.iter_mut().for_each(|a| *a = f(*a, b));
    } else if y_shape == out_shape {
        buf.iter_mut().zip(y).for_each(|(a, &b)| *a = f(*a, b));
    } else {
        for_each_broadcast_run(out_shape, out_shape, y_shape, |o, _, (yb, ys), n| {
            let run = &mut buf[o..o + n];
            match ys {
                0 => {
                    let b = y[yb];
                    run.iter_mut().for_each(|a| *a = f(*a, b));
                }
                _ => run
                    .iter_mut()
                    .enumerate()
                    .for_each(|(j, a)| *a = f(*a, y[yb + j * ys])),
            }
        });
    }
}

/// A flat buffer with its shape.
#[derive(Clone, Copy)]
pub struct Operand<'a> {
    pub data: &'a [f32],
    pub shape: &'a [usize],
}

/// `x ∘ y` with numpy broadcasting. `reuse`, when given, is x's buffer (x of the output's
/// shape, no longer needed; `x.data` is then ignored) and receives the result. Int32
/// results beyond ±2^24 become NaN (reported by the interpreter).
pub fn binary(
    kind: BinaryOp,
    dtype: DType,
    x: Operand,
    y: Operand,
    out_shape: &[usize],
    reuse: Option<Vec<f32>>,
) -> Vec<f32> {
    struct Whole<'a> {
        x: Operand<'a>,
        y: Operand<'a>,
        out_shape: &'a [usize],
        reuse: Option<Vec<f32>>,
    }
    impl WithOp for Whole<'_> {
        type Out = Vec<f32>;
        fn with<F: Fn(f32, f32) -> f32>(self, f: F) -> Vec<f32> {
            let (x, y) = (self.x, self.y);
            apply_binary(
                f,
                x.data,
                x.shape,
                y.data,
                y.shape,
                self.out_shape,
                self.reuse,
            )
        }
    }
    let whole = Whole {
        x,
        y,
        out_shape,
        reuse,
    };
    dispatch(kind, dtype, whole)
}

/// [`binary`] with `reuse`, into a slice: `buf` holds `x` of `out_shape` and receives `x ∘ y`
/// (`y` broadcast to `out_shape`).
pub fn binary_in_place(
    kind: BinaryOp,
    dtype: DType,
    buf: &mut [f32],
    out_shape: &[usize],
    y: Operand,
) {
    struct InPlace<'a> {
        buf: &'a mut [f32],
        out_shape: &'a [usize],
        y: Operand<'a>,
    }
    impl WithOp for InPlace<'_> {
        type Out = ();
        fn with<F: Fn(f32, f32) -> f32>(self, f: F) {
            in_place(&f, self.buf, self.out_shape, self.y.data, self.y.shape)
        }
    }
    let work = InPlace { buf, out_shape, y };
    dispatch(kind, dtype, work)
}

/// Work given the scalar function of a binary op ([`dispatch`]).
trait WithOp {
    type Out;
    fn with<F: Fn(f32, f32) -> f32>(self, f: F) -> Self::Out;
}

/// `work` with the scalar function of `kind` on values of `dtype` (int32 in f64, exact before
/// the range check).
fn dispatch<W: WithOp>(kind: BinaryOp, dtype: DType, work: W) -> W::Out {
    match (kind, dtype == DType::I32) {
        (BinaryOp::Add, false) => work.with(|a, b| a + b),
        (BinaryOp::Sub, false) => work.with(|a, b| a - b),
        (BinaryOp::Mul, false) => work.with(|a, b| a * b),
        (BinaryOp::RealDiv, _) => work.with(|a, b| a / b),
        (BinaryOp::Maximum, _) => work.with(f32::max),
        (BinaryOp::Minimum, _) => work.with(f32::min),
        (BinaryOp::Pow, _) => work.with(f32::powf),
        (BinaryOp::Add, true) => work.with(|a, b| int(a as f64 + b as f64)),
        (BinaryOp::Sub, true) => work.with(|a, b| int(a as f64 - b as f64)),
        (BinaryOp::Mul, true) => work.with(|a, b| int(a as f64 * b as f64)),
    }
}

/// An int32 result; values beyond the exactly representable range become NaN, which the
/// interpreter reports as an error for int32 outputs.
#[inline]
fn int(v: f64) -> f32 {
    if v.abs() <= MAX_EXACT_INT as f64 {
        v as f32
    } else {
        f32::NAN
    }
}

/// A unary activation applied in place.
pub fn unary(kind: UnaryOp, data: &mut [f32]) {
    match kind {
        UnaryOp::Sqrt => data.iter_mut().for_each(|v| *v = v.sqrt()),
        UnaryOp::Exp => data.iter_mut().for_each(|v| *v = v.exp()),
        // the same bits as `v / (1.0 + (-v).exp())` per value
        UnaryOp::Silu => super::exp_table::silu(data),
        UnaryOp::Tanh => data.iter_mut().for_each(|v| *v = v.tanh()),
        UnaryOp::Square => data.iter_mut().for_each(|v| *v = *v * *v),
        UnaryOp::Abs => data.iter_mut().for_each(|v| *v = v.abs()),
    }
}

/// `1 / sqrt(x + epsilon)` in place.
pub fn rsqrt(data: &mut [f32], epsilon: f32) {
    data.iter_mut()
        .for_each(|v| *v = 1.0 / (*v + epsilon).sqrt());
}

/// `gelu` in place, in the MIL mode's formula.
pub fn gelu(mode: GeluMode, data: &mut [f32]) {
    match mode {
        GeluMode::Exact => data
            .iter_mut()
            .for_each(|v| *v = 0.5 * *v * (1.0 + libm::erff(*v * std::f32::consts::FRAC_1_SQRT_2))),
        GeluMode::TanhApproximation => {
            let k = (2.0 / std::f32::consts::PI).sqrt();
            data.iter_mut().for_each(|v| {
                let x = *v;
                *v = 0.5 * x * (1.0 + (k * (x + 0.044715 * x * x * x)).tanh())
            })
        }
        GeluMode::SigmoidApproximation => data
            .iter_mut()
            .for_each(|v| *v = *v / (1.0 + (-1.702 * *v).exp())),
    }
}

/// Converts values to `to` as coremltools' `cast` does (numpy `astype`): to int32 truncates
/// toward zero (NaN for values outside the exactly representable range), to bool tests
/// `!= 0`, to fp16 rounds to nearest even.
pub fn cast(to: DType, data: &mut [f32]) {
    match to {
        DType::I32 => data.iter_mut().for_each(|v| {
            let t = v.trunc();
            *v = if t.abs() <= MAX_EXACT_INT {
                t
            } else {
                f32::NAN
            }
        }),
        DType::Bool => data
            .iter_mut()
            .for_each(|v| *v = if *v != 0.0 { 1.0 } else { 0.0 }),
        DType::F16 => data.iter_mut().for_each(|v| *v = round_f16(*v)),
        DType::F32
        | DType::I8
        | DType::U8
        | DType::I4
        | DType::U1
        | DType::U2
        | DType::U3
        | DType::U4
        | DType::U6 => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Broadcasting runs give, element by element, `f` of the numpy-broadcast operands.
    #[test]
    fn broadcast_runs_equal_elementwise_indexing() {
        let out = [2usize, 3, 1, 5];
        let cases: [(&[usize], &[usize]); 5] = [
            (&[2, 3, 1, 5], &[1, 1, 1, 5]),
            (&[2, 3, 1, 5], &[1, 3, 1, 1]),
            (&[1, 3, 1, 1], &[2, 3, 1, 5]),
            (&[2, 1, 1, 5], &[3, 1, 1]),
            (&[5], &[2, 3, 1, 1]),
        ];
        for (xs, ys) in cases {
            let (nx, ny): (usize, usize) = (xs.iter().product(), ys.iter().product());
            let x: Vec<f32> = (0..nx).map(|i| i as f32 * 0.75 - 3.0).collect();
            let y: Vec<f32> = (0..ny).map(|i| 1.5 - i as f32 * 0.25).collect();
            // the operand index of output coordinate `c` (right-aligned, size-1 axes broadcast)
            let index = |shape: &[usize], c: &[usize]| {
                let lead = c.len() - shape.len();
                shape.iter().enumerate().fold(0, |acc, (i, &d)| {
                    acc * d + if d == 1 { 0 } else { c[lead + i] }
                })
            };
            for kind in [BinaryOp::Sub, BinaryOp::RealDiv] {
                let got = binary(
                    kind,
                    DType::F32,
                    Operand {
                        data: &x,
                        shape: xs,
                    },
                    Operand {
                        data: &y,
                        shape: ys,
                    },
                    &out,
                    None,
                );
                let reused = (xs == out).then(|| {
                    binary(
                        kind,
                        DType::F32,
                        Operand {
                            data: &[],
                            shape: &out,
                        },
                        Operand {
                            data: &y,
                            shape: ys,
                        },
                        &out,
                        Some(x.clone()),
                    )
                });
                let mut o = 0;
                for a in 0..2 {
                    for b in 0..3 {
                        for e in 0..5 {
                            let c = [a, b, 0, e];
                            let (u, v) = (x[index(xs, &c)], y[index(ys, &c)]);
                            let want = match kind {
                                BinaryOp::Sub => u - v,
                                _ => u / v,
                            };
                            assert_eq!(got[o].to_bits(), want.to_bits(), "{xs:?} {ys:?} {c:?}");
                            if let Some(r) = &reused {
                                assert_eq!(r[o].to_bits(), want.to_bits(), "reused {ys:?} {c:?}");
                            }
                            o += 1;
                        }
                    }
                }
            }
        }
    }
}
