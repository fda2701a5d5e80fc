//! The max-scaled RMSNorm (twelve ops) and RoPE (six ops) chains of a decoder layer run as one
//! step each ([`crate::kernels::chains`]), with the values of the unfused ops. Recognised at
//! load by their ops and wiring ([`matches`]: every intermediate dies inside the chain, so
//! nothing else reads it); checked at run time for the shapes the fused kernels take (anything
//! else runs op by op).

use anemone_mil::{BinaryOp, DType, Op, Precision, ReduceOp, UnaryOp, Var};

use super::{Frame, Slot};
use crate::kernels::chains::{self, NormConstants, RopeShape, Rounding};
use crate::kernels::Accumulation;
use crate::package::{Fused, Step};

/// A chain of ops computed as one step, with the operands it reads from outside.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Chain {
    /// `abs → reduce_max → maximum → real_div → square → reduce_mean → real_div → square →
    /// add → rsqrt → mul → mul` (`ane::norm`'s `NormForm::MaxScaled`).
    MaxScaledNorm(NormOperands),
    /// `split → mul → concat → mul → mul → add` (`ane::rope`'s `RopeTables::apply`).
    Rope(RopeOperands),
}

impl Chain {
    fn len(self) -> usize {
        match self {
            Chain::MaxScaledNorm(_) => 12,
            Chain::Rope(_) => 6,
        }
    }
}

/// The chain `steps` opens with, if any.
pub(crate) fn matches(steps: &[Step]) -> Option<Chain> {
    norm_operands(steps)
        .map(Chain::MaxScaledNorm)
        .or_else(|| rope_operands(steps).map(Chain::Rope))
}

/// Runs the chain `steps` opens with (recognised at load) when its operands have the shapes
/// the fused kernel takes: stores the last op's output, releases the chain's dead values, and
/// returns how many steps ran; `None` (nothing changed) to run the ops one by one.
pub(super) fn try_run(
    fr: &mut Frame<'_, '_>,
    steps: &[Step],
    chain: Chain,
) -> Result<Option<usize>, String> {
    // the sums of the pessimistic accumulation are the generic reduce's business
    if fr.acc != Accumulation::F32 {
        return Ok(None);
    }
    let Some(steps) = steps.get(..chain.len()) else {
        return Ok(None);
    };
    let out = match chain {
        Chain::MaxScaledNorm(ops) => run_norm(fr, steps, ops)?,
        Chain::Rope(ops) => run_rope(fr, steps, ops)?,
    };
    let Some(data) = out else { return Ok(None) };
    fr.store_output(&steps[chain.len() - 1], data)?;
    for v in steps.iter().flat_map(|s| &s.release) {
        fr.slots[v.index()] = Slot::Empty;
    }
    Ok(Some(chain.len()))
}

/// Whether each step's output is rounded to fp16 where it is stored.
fn rounding<const N: usize>(fr: &Frame, steps: &[Step]) -> Rounding<N> {
    let mut flags = [false; N];
    let fp16 = fr.precision == Precision::Fp16;
    for (flag, s) in flags.iter_mut().zip(steps) {
        *flag = fp16 && s.out_types[0].dtype == DType::F16;
    }
    Rounding(flags)
}

/// A single value's scalar, when the operand is one.
fn scalar(fr: &Frame, v: Var) -> Result<Option<f32>, String> {
    let t = fr.get(v)?;
    Ok(match t.data[..] {
        [s] => Some(s),
        _ => None,
    })
}

fn run_norm(fr: &Frame, steps: &[Step], ops: NormOperands) -> Result<Option<Vec<f32>>, String> {
    let (x, w) = (fr.get(ops.x)?, fr.get(ops.weight)?);
    let out_shape = &steps[11].out_types[0].shape;
    let Some(&n) = x.shape.get(ops.axis) else {
        return Ok(None);
    };
    // x as `[outer, n, t]`, the weight `n` values along the axis (anything else runs op by op)
    let t: usize = x.shape[ops.axis + 1..].iter().product();
    let along_axis = w.shape.get(ops.axis) == Some(&n) && w.data.len() == n;
    if n == 0 || t == 0 || !along_axis || w.shape.len() != x.shape.len() || *out_shape != x.shape {
        return Ok(None);
    }
    let (Some(floor), Some(sqrt_eps)) = (scalar(fr, ops.floor)?, scalar(fr, ops.sqrt_eps)?) else {
        return Ok(None);
    };
    let constants = NormConstants {
        floor,
        sqrt_eps,
        rsqrt_epsilon: ops.rsqrt_epsilon,
    };
    let round = rounding(fr, steps);
    let mut out = vec![0.0f32; x.data.len()];
    for (x, out) in x.data.chunks_exact(n * t).zip(out.chunks_exact_mut(n * t)) {
        chains::rms_norm_max_scaled(x, (&w.data, t), constants, round, out);
    }
    Ok(Some(out))
}

fn run_rope(fr: &Frame, steps: &[Step], ops: RopeOperands) -> Result<Option<Vec<f32>>, String> {
    let (x, cos, sin) = (fr.get(ops.x)?, fr.get(ops.cos)?, fr.get(ops.sin)?);
    let Some(neg) = scalar(fr, ops.neg)? else {
        return Ok(None);
    };
    // x `[rows, 1, d, t]`, the tables `[1, 1, d, t]`
    let &[rows, 1, d, t] = &x.shape[..] else {
        return Ok(None);
    };
    let table = [1, 1, d, t];
    let out_shape = &steps[5].out_types[0].shape;
    if cos.shape[..] != table || sin.shape[..] != table || *out_shape != x.shape || d % 2 != 0 {
        return Ok(None);
    }
    let mut out = vec![0.0f32; x.data.len()];
    let shape = RopeShape { rows, d, t };
    let round = rounding::<6>(fr, steps);
    // split (0) and concat (2) move values only
    let round = Rounding([round.0[1], round.0[3], round.0[4], round.0[5]]);
    let tables = (cos.data.as_slice(), sin.data.as_slice());
    chains::rope(&x.data, tables, neg, shape, round, &mut out);
    Ok(Some(out))
}

/// The chain's steps run as themselves and produce one float value each.
fn plain(steps: &[Step], outputs: usize) -> bool {
    steps.iter().all(|s| {
        s.fused == Fused::No
            && s.outputs.len() == s.out_types.len()
            && s.outputs.len() == outputs
            && s.out_types
                .iter()
                .all(|t| matches!(t.dtype, DType::F16 | DType::F32))
    })
}

/// The outside operands of a max-scaled norm chain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct NormOperands {
    x: Var,
    axis: usize,
    floor: Var,
    sqrt_eps: Var,
    rsqrt_epsilon: f32,
    weight: Var,
}

fn norm_operands(steps: &[Step]) -> Option<NormOperands> {
    let s = steps.get(..12)?;
    if !plain(s, 1) {
        return None;
    }
    let out = |k: usize| s[k].outputs[0];
    // `v` (made in the chain) is read for the last time by step `k`
    let dies = |v: Var, k: usize| s[k].release.contains(&v);
    let unary = |k: usize, kind: UnaryOp| match s[k].op {
        Op::Unary { kind: got, x } if got == kind => Some(x),
        _ => None,
    };
    let binary = |k: usize, kind: BinaryOp| match s[k].op {
        Op::Binary { kind: got, x, y } if got == kind => Some((x, y)),
        _ => None,
    };
    let reduce = |k: usize, kind: ReduceOp| match &s[k].op {
        Op::Reduce {
            kind: got,
            x,
            axes,
            keep_dims: true,
        } if *got == kind => match axes[..] {
            [axis] => Some((*x, axis)),
            _ => None,
        },
        _ => None,
    };
    let x = unary(0, UnaryOp::Abs)?;
    let (max_in, axis) = reduce(1, ReduceOp::Max)?;
    let (max, floor) = binary(2, BinaryOp::Maximum)?;
    let (x_again, scale) = binary(3, BinaryOp::RealDiv)?;
    let scaled_in = unary(4, UnaryOp::Square)?;
    let (sq, mean_axis) = reduce(5, ReduceOp::Mean)?;
    let (sqrt_eps, scale_again) = binary(6, BinaryOp::RealDiv)?;
    let eps_in = unary(7, UnaryOp::Square)?;
    let (mean_sq, eps_sq) = binary(8, BinaryOp::Add)?;
    let Op::Rsqrt {
        x: total,
        epsilon: rsqrt_epsilon,
    } = s[9].op
    else {
        return None;
    };
    let (scaled, inv_rms) = binary(10, BinaryOp::Mul)?;
    let (normed, weight) = binary(11, BinaryOp::Mul)?;
    let wired = max_in == out(0)
        && dies(out(0), 1)
        && max == out(1)
        && dies(out(1), 2)
        && x_again == x
        && scale == out(2)
        && scaled_in == out(3)
        && sq == out(4)
        && dies(out(4), 5)
        && mean_axis == axis
        && scale_again == out(2)
        && dies(out(2), 6)
        && eps_in == out(6)
        && dies(out(6), 7)
        && (mean_sq, eps_sq) == (out(5), out(7))
        && dies(out(5), 8)
        && dies(out(7), 8)
        && total == out(8)
        && dies(out(8), 9)
        && (scaled, inv_rms) == (out(3), out(9))
        && dies(out(3), 10)
        && dies(out(9), 10)
        && normed == out(10)
        && dies(out(10), 11);
    (wired && made_outside(s, &[x, floor, sqrt_eps, weight])).then_some(NormOperands {
        x,
        axis,
        floor,
        sqrt_eps,
        rsqrt_epsilon,
        weight,
    })
}

/// The outside operands of a RoPE chain.
#[derive(Clone, Copy, Debug)]
pub(crate) struct RopeOperands {
    x: Var,
    neg: Var,
    cos: Var,
    sin: Var,
}

fn rope_operands(steps: &[Step]) -> Option<RopeOperands> {
    let s = steps.get(..6)?;
    if !plain(&s[..1], 2) || !plain(&s[1..], 1) {
        return None;
    }
    let dies = |v: Var, k: usize| s[k].release.contains(&v);
    let Op::Split {
        x,
        ref split_sizes,
        axis: 2,
    } = s[0].op
    else {
        return None;
    };
    let ([lo, hi], &[a, b]) = (&s[0].outputs[..], &split_sizes[..]) else {
        return None;
    };
    let mul = |k: usize| match s[k].op {
        Op::Binary {
            kind: BinaryOp::Mul,
            x,
            y,
        } => Some((x, y)),
        _ => None,
    };
    let (hi_in, neg) = mul(1)?;
    let Op::Concat {
        ref values,
        axis: 2,
    } = s[2].op
    else {
        return None;
    };
    let (x_again, cos) = mul(3)?;
    let (rotated, sin) = mul(4)?;
    let Op::Binary {
        kind: BinaryOp::Add,
        x: with_cos,
        y: with_sin,
    } = s[5].op
    else {
        return None;
    };
    let neg_hi = s[1].outputs[0];
    let wired = a == b
        && hi_in == *hi
        && dies(*hi, 1)
        && values[..] == [neg_hi, *lo]
        && dies(neg_hi, 2)
        && dies(*lo, 2)
        && x_again == x
        && rotated == s[2].outputs[0]
        && dies(rotated, 4)
        && (with_cos, with_sin) == (s[3].outputs[0], s[4].outputs[0])
        && dies(with_cos, 5)
        && dies(with_sin, 5);
    (wired && made_outside(s, &[x, neg, cos, sin])).then_some(RopeOperands { x, neg, cos, sin })
}

/// Whether none of `values` is produced by a step of the chain `steps`.
fn made_outside(steps: &[Step], values: &[Var]) -> bool {
    values
        .iter()
        .all(|v| steps.iter().all(|s| !s.outputs.contains(v)))
}
