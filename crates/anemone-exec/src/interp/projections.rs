//! Adjacent single-token projections of one input (a layer's q/k/v, its gate/up) run as one
//! parallel region ([`linalg::matvec_group`], or [`HalfWeight::matvec_fused_group`] when all
//! are compressed): one fork and join instead of one per projection.
//! Each projection's values are those its own step computes (the same dot per row, the same
//! bias add); the later members' results wait in a [`Stash`] until their step comes.

use anemone_backend::Tensor;
use anemone_mil::{Op, Var};

use super::{tensor, Frame};
use crate::kernels::linalg::{self, MatRef, Projection, RowWeights};
use crate::kernels::Accumulation;
use crate::package::{Fused, Step};
use crate::packed::HalfWeight;

/// Results computed ahead for later steps, by step index.
#[derive(Default)]
pub(super) struct Stash(Vec<(usize, Vec<f32>)>);

impl Stash {
    fn take(&mut self, step: usize) -> Option<Vec<f32>> {
        let at = self.0.iter().position(|(s, _)| *s == step)?;
        Some(self.0.swap_remove(at).1)
    }
}

/// A step that is a single-token projection: its input, weight rows and output rows.
struct Single<'b> {
    x: Var,
    w: Weights<'b>,
    rows: usize,
}

/// The weight of a [`Single`]: rows read as they are, or a compressed weight (its own step
/// runs [`HalfWeight::matvec`]).
#[derive(Clone, Copy)]
enum Weights<'b> {
    Rows(RowWeights<'b>),
    Packed(&'b HalfWeight),
}

/// `step` as a single-token projection its own step would compute with one matvec: a 1×1
/// conv (one group, no stride or padding) of a one-position input, or a linear with an fp16
/// weight of a one-row input (an f32-weight linear runs `gemm`, so it is left alone).
fn single<'b>(fr: &'b Frame, step: &Step) -> Option<Single<'b>> {
    if step.fused != Fused::No {
        return None;
    }
    let ty = step.out_types.first()?;
    let (x, weight) = match &step.op {
        Op::Conv {
            x, weight, params, ..
        } if params.strides == [1, 1] && params.pad == [0, 0, 0, 0] && params.groups == 1 => {
            (*x, *weight)
        }
        Op::Linear { x, weight, .. } => (*x, *weight),
        _ => return None,
    };
    let xt = fr.tensor(x).ok()?;
    // a compressed weight joins a group of compressed weights (`HalfWeight::matvec_fused_group`)
    let half = |w16: &'b HalfWeight| match w16.as_f16() {
        Some(d) => Weights::Rows(RowWeights::F16(d)),
        None => Weights::Packed(w16),
    };
    let (w, k) = match (fr.f.half_weights.get(&weight), &step.op) {
        (Some(w16), Op::Conv { .. }) if xt.shape.len() == 4 && xt.numel() == xt.shape[1] => {
            (half(w16), xt.shape[1])
        }
        (Some(w16), Op::Linear { .. }) if w16.shape.len() == 2 && xt.numel() == w16.shape[1] => {
            (half(w16), w16.shape[1])
        }
        (None, Op::Conv { .. }) if xt.shape.len() == 4 && xt.numel() == xt.shape[1] => {
            let k = xt.shape[1];
            let (w, w_shape) = fr.weight(weight).ok()?;
            let pointwise = w_shape.len() == 4 && w_shape[1] == k && w_shape[2..] == [1, 1];
            if !pointwise {
                return None;
            }
            (
                Weights::Rows(RowWeights::F32(MatRef::row_major(w, w_shape[0], k))),
                k,
            )
        }
        _ => return None,
    };
    let rows = match w {
        Weights::Rows(RowWeights::F16(d)) => d.len() / k.max(1),
        Weights::Rows(RowWeights::F32(a)) => a.rows,
        Weights::Packed(w16) => w16.rows_cols().0,
    };
    (k > 0 && ty.numel() == rows).then_some(Single { x, w, rows })
}

/// The output of step `i` if it was computed ahead, or if it opens a group of adjacent
/// single-token projections of one input (then the group runs now and the others wait).
pub(super) fn run(
    fr: &Frame,
    steps: &[Step],
    i: usize,
    stash: &mut Stash,
) -> Result<Option<Vec<Tensor>>, String> {
    let step = &steps[i];
    if let Some(data) = stash.take(i) {
        return finish(fr, step, data).map(Some);
    }
    if fr.acc != Accumulation::F32 {
        return Ok(None);
    }
    let Some(first) = single(fr, step) else {
        return Ok(None);
    };
    let mut members = vec![first];
    while let Some(next) = steps.get(i + members.len()).and_then(|s| single(fr, s)) {
        let packed = |m: &Single| matches!(m.w, Weights::Packed(_));
        if next.x != members[0].x || packed(&next) != packed(&members[0]) {
            break;
        }
        members.push(next);
    }
    if members.len() < 2 {
        return Ok(None);
    }
    let mut outs: Vec<Vec<f32>> = members.iter().map(|m| vec![0.0f32; m.rows]).collect();
    {
        let x = &fr.get(members[0].x)?.data;
        let rows: Option<Vec<RowWeights>> = members
            .iter()
            .map(|m| match m.w {
                Weights::Rows(w) => Some(w),
                Weights::Packed(_) => None,
            })
            .collect();
        match rows {
            Some(rows) => {
                let mut group: Vec<Projection> = outs
                    .iter_mut()
                    .zip(rows)
                    .map(|(dst, w)| Projection {
                        dst,
                        w,
                        accumulate: false,
                    })
                    .collect();
                linalg::matvec_group(&mut group, x)?;
            }
            None => {
                let mut group: Vec<(&HalfWeight, &mut [f32])> = outs
                    .iter_mut()
                    .zip(&members)
                    .filter_map(|(dst, m)| match m.w {
                        Weights::Packed(w) => Some((w, dst.as_mut_slice())),
                        Weights::Rows(_) => None,
                    })
                    .collect();
                // not all taken by the fused kernels: each step runs its own matvec
                if !HalfWeight::matvec_fused_group(&mut group, x) {
                    return Ok(None);
                }
            }
        }
    }
    let mut outs = outs.into_iter();
    let own = outs.next().ok_or("empty projection group")?;
    for (j, data) in outs.enumerate() {
        stash.0.push((i + 1 + j, data));
    }
    finish(fr, step, own).map(Some)
}

/// The projection's result with its bias added, as its own step adds it.
fn finish(fr: &Frame, step: &Step, mut data: Vec<f32>) -> Result<Vec<Tensor>, String> {
    let bias = match &step.op {
        Op::Conv { bias, .. } | Op::Linear { bias, .. } => *bias,
        _ => return Err("a grouped projection must be a conv or a linear".into()),
    };
    if let Some(b) = bias {
        let bt = fr.get(b)?;
        data.iter_mut().zip(&bt.data).for_each(|(v, b)| *v += b);
    }
    let ty = step
        .out_types
        .first()
        .ok_or("projection declares no output")?;
    Ok(vec![tensor(ty, data)])
}
