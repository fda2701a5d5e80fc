//! One query head's attention ops (`matmul → add mask → reduce_max → sub → softmax → matmul`)
//! run as one step over the filled columns of the KV window ([`kernels::attention`]), with the
//! same values as the six ops.
//!
//! [`kernels::attention`]: crate::kernels::attention

use anemone_backend::Tensor;
use anemone_mil::{BinaryOp, DType, Op, Precision, ReduceOp, Var};

use super::operands::Values;
use super::{finish_output, Frame, Slot};
use crate::kernels::attention::{
    attend_filled_columns, filled_columns, hidden_key_bound, HeadWindow, Rounding,
};
use crate::kernels::kv_elem::KvSlice;
use crate::kernels::Accumulation;
use crate::package::{Fused, Step};
use crate::team::{self, SharedOut};

/// Steps of the pattern.
pub(super) const STEPS: usize = 6;

/// Whether `steps` opens with one head's six attention ops whose intermediate values die
/// inside the pattern (so nothing else can read them).
pub(crate) fn matches(steps: &[Step]) -> bool {
    let [s0, s1, s2, s3, s4, s5, ..] = steps else {
        return false;
    };
    let group = [s0, s1, s2, s3, s4, s5];
    let plain = |s: &Step| {
        s.fused == Fused::No
            && s.outputs.len() == 1
            && s.out_types.len() == 1
            && matches!(s.out_types[0].dtype, DType::F16 | DType::F32)
    };
    if !group.iter().all(|s| plain(s)) {
        return false;
    }
    let rank = s1.out_types[0].shape.len();
    let (scores, masked, max, shifted, probs) = (
        s0.outputs[0],
        s1.outputs[0],
        s2.outputs[0],
        s3.outputs[0],
        s4.outputs[0],
    );
    let head = matches!(
        s0.op,
        Op::Matmul {
            transpose_x: true,
            transpose_y: false,
            ..
        }
    );
    let add = match s1.op {
        Op::Binary {
            kind: BinaryOp::Add,
            x,
            y,
        } => (x == scores) != (y == scores) && s1.release.contains(&scores),
        _ => false,
    };
    let reduce = match &s2.op {
        Op::Reduce {
            kind: ReduceOp::Max,
            x,
            axes,
            keep_dims: true,
        } => *x == masked && rank >= 2 && axes[..] == [rank - 1],
        _ => false,
    };
    let sub = match s3.op {
        Op::Binary {
            kind: BinaryOp::Sub,
            x,
            y,
        } => x == masked && y == max && s3.release.contains(&masked) && s3.release.contains(&max),
        _ => false,
    };
    let soft = match s4.op {
        Op::Softmax { x, axis } => {
            x == shifted && axis == rank - 1 && s4.release.contains(&shifted)
        }
        _ => false,
    };
    let out = match s5.op {
        Op::Matmul {
            x,
            y,
            transpose_x: false,
            transpose_y: true,
        } => y == probs && x != probs && s5.release.contains(&probs),
        _ => false,
    };
    head && add && reduce && sub && soft && out
}

/// Runs the six steps opening `steps` as one when they are a head's attention whose hidden
/// columns can be skipped exactly (their output stored, their dead values released); returns
/// how many steps ran, or `None` (nothing done) for the caller to run `steps[0]` as usual.
/// `head`: whether `steps` opens a head ([`matches`], planned at load).
pub(super) fn try_run(
    fr: &mut Frame,
    steps: &[Step],
    head: bool,
    memo: &mut HiddenMemo,
) -> Result<Option<usize>, String> {
    if fr.acc != Accumulation::F32 || !head {
        return Ok(None);
    }
    let group = &steps[..STEPS];
    let Some(t) = run(fr, group, memo)? else {
        return Ok(None);
    };
    let last = &group[STEPS - 1];
    let t = finish_output(t, &last.out_types[0], fr.precision)?;
    fr.slots[last.outputs[0].index()] = Slot::Owned(t);
    for v in group.iter().flat_map(|s| &s.release) {
        fr.slots[v.index()] = Slot::Empty;
    }
    Ok(Some(STEPS))
}

/// Every head's output (in the order of `starts`), or `None` when a head cannot be computed so.
pub(super) type HeadOutputs = Result<Option<Vec<Vec<f32>>>, String>;

/// Runs the heads (and the KV windows between them) opening `steps` whose first step passes
/// `opens` by `compute`, when there are at least `min_heads`, storing their outputs and
/// releasing their dead values as their steps would; returns how many steps ran, or `None`
/// (nothing changed but windows the caller would set the same way) for the caller to run
/// `steps[0]` as usual. `heads[i]`: whether `steps[i..]` opens a head ([`matches`], planned at
/// load).
pub(super) fn run_head_group<'a>(
    fr: &mut Frame<'a, '_>,
    steps: &'a [Step],
    heads: &[bool],
    (opens, min_heads): (fn(&Step) -> bool, usize),
    compute: impl FnOnce(&Frame, &[Step], &[usize]) -> HeadOutputs,
) -> Result<Option<usize>, String> {
    let (mut i, mut end, mut starts) = (0, 0, Vec::new());
    loop {
        match steps.get(i) {
            Some(s) if matches!(s.fused, Fused::View { .. }) => i += 1,
            Some(s) if heads.get(i) == Some(&true) && opens(s) => {
                starts.push(i);
                i += STEPS;
                end = i;
            }
            _ => break,
        }
    }
    if starts.len() < min_heads.max(1) {
        return Ok(None);
    }
    for step in &steps[..end] {
        if let Fused::View { state, offset } = &step.fused {
            if let (Some(v), Some(ty)) = (step.outputs.first(), step.out_types.first()) {
                fr.slots[v.index()] = Slot::Window {
                    state,
                    offset: *offset,
                    shape: &ty.shape,
                };
            }
        }
    }
    let Some(outs) = compute(fr, steps, &starts)? else {
        return Ok(None);
    };
    for (&at, data) in starts.iter().zip(outs) {
        fr.store_output(&steps[at + STEPS - 1], data)?;
    }
    for v in steps[..end].iter().flat_map(|s| &s.release) {
        fr.slots[v.index()] = Slot::Empty;
    }
    Ok(Some(end))
}

/// One head of a run over the team: writes head `b`'s output into `dst`; `Ok(false)` when it
/// cannot be computed so (the whole run then answers `None`).
pub(super) type HeadOnTeam<'a> = dyn Fn(usize, &mut [f32]) -> Result<bool, String> + Sync + 'a;

/// Every head's output (`lens[b]` values for head `b`), the heads spread over the team in runs
/// of adjacent heads, each writing its own range of one buffer; the first error met, or `None`
/// when a head declined.
pub(super) fn heads_on_team(lens: &[usize], head: &HeadOnTeam<'_>) -> HeadOutputs {
    let mut offsets = Vec::with_capacity(lens.len() + 1);
    offsets.push(0);
    for len in lens {
        offsets.push(offsets[offsets.len() - 1] + len);
    }
    let mut flat = vec![0.0f32; offsets[lens.len()]];
    let out = SharedOut::new(&mut flat);
    // the first error, or `Ok(())` for a head that declined
    let failure = std::sync::Mutex::new(None);
    let team = team::current();
    // runs of adjacent heads from both ends, a head at a time where the threads meet: heads
    // sharing a KV head are adjacent in the program, so a thread reads most KV windows alone,
    // from memory once, and neither waits for more than one head of the other's
    team::for_each_run_from_ends(team.as_deref(), lens.len(), 1, &|run| {
        for b in run {
            // SAFETY: heads own disjoint ranges of `flat`, which outlives the region.
            let dst = unsafe { out.slice(offsets[b]..offsets[b + 1]) };
            let outcome = match head(b, dst) {
                Ok(true) => continue,
                Ok(false) => Ok(()),
                Err(e) => Err(e),
            };
            let mut f = failure.lock().unwrap_or_else(|e| e.into_inner());
            f.get_or_insert(outcome);
            // the whole run is discarded
            break;
        }
    });
    match failure.into_inner().unwrap_or_else(|e| e.into_inner()) {
        Some(Err(e)) => Err(e),
        Some(Ok(())) => Ok(None),
        None => Ok(Some(
            offsets
                .windows(2)
                .map(|r| flat[r[0]..r[1]].to_vec())
                .collect(),
        )),
    }
}

/// One head's six steps read as operands: `q` `[d × t]` and `mask` `[t × c]` as f32, `k`
/// `[d × c]` and `v` `[dv × c]` in the element type their state holds; the op roundings of
/// the program; whether the mask is added to the scores (`scores + mask`) or the reverse.
pub(super) struct HeadOperands<'f> {
    pub(super) q: Values<'f>,
    pub(super) mask: Values<'f>,
    pub(super) k: KvSlice<'f>,
    pub(super) v: KvSlice<'f>,
    /// The program values K and V are read from.
    pub(super) kv_vars: (Var, Var),
    /// `(d, dv, t, c)`
    pub(super) dims: (usize, usize, usize, usize),
    pub(super) round: Rounding,
    pub(super) scores_first: bool,
}

/// The operands of the head whose six steps are `group` ([`matches`]), or `None` when their
/// shapes are not one head's (unit batch dims, agreeing sizes, lengths that fit).
pub(super) fn head_operands<'f>(
    fr: &'f Frame,
    group: &[Step],
) -> Result<Option<HeadOperands<'f>>, String> {
    let (Op::Matmul { x: q, y: k, .. }, Op::Binary { x: a, y: b, .. }, Op::Matmul { x: v, .. }) =
        (&group[0].op, &group[1].op, &group[5].op)
    else {
        return Ok(None);
    };
    let scores_first = *a == group[0].outputs[0];
    let mask = if scores_first { *b } else { *a };
    let (qv, (kd, k_shape), (vd, v_shape), mv) = (
        fr.operand(*q)?,
        fr.kv_operand(*k)?,
        fr.kv_operand(*v)?,
        fr.operand(mask)?,
    );
    let out_ty = &group[5].out_types[0];
    let shapes = (
        matrix(qv.shape),
        matrix(k_shape),
        matrix(v_shape),
        matrix(mv.shape),
        matrix(&out_ty.shape),
    );
    let (Some((d, t)), Some((dk, c)), Some((dv, cv)), Some((tm, cm)), Some((dvo, to))) = shapes
    else {
        return Ok(None);
    };
    if mv.shape != group[1].out_types[0].shape.as_slice()
        || dk != d
        || cv != c
        || (tm, cm) != (t, c)
        || (dvo, to) != (dv, t)
        || qv.data.len() != d * t
        || kd.len() != d * c
        || vd.len() != dv * c
        || mv.data.len() != t * c
    {
        return Ok(None);
    }
    let fp16 = |s: &Step| fr.precision == Precision::Fp16 && s.out_types[0].dtype == DType::F16;
    Ok(Some(HeadOperands {
        q: qv,
        mask: mv,
        k: kd,
        v: vd,
        kv_vars: (*k, *v),
        dims: (d, dv, t, c),
        round: Rounding {
            scores: fp16(&group[0]),
            masked: fp16(&group[1]),
            max: fp16(&group[2]),
            shifted: fp16(&group[3]),
            probs: fp16(&group[4]),
            out: fp16(&group[5]),
        },
        scores_first,
    }))
}

/// `[rows, cols]` of a matrix operand with unit batch dims.
pub(super) fn matrix(shape: &[usize]) -> Option<(usize, usize)> {
    let r = shape.len();
    (r >= 2 && shape[..r - 2].iter().all(|&b| b == 1)).then(|| (shape[r - 2], shape[r - 1]))
}

/// Which KV window (and filled width) a hidden-column bound was computed for.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(super) struct HiddenKey {
    k: (usize, usize),
    v: (usize, usize),
    l: usize,
}

/// Which mask (address, length and `[t, c]`) a filled width was computed for.
type MaskKey = (usize, usize, usize, usize);

/// The last filled width ([`filled_columns`]) and hidden-column bound computed; the caller
/// clears it whenever any other step runs, so each is only ever reused by the next head over
/// the very same, unchanged mask or KV window.
#[derive(Default)]
pub(super) struct Held {
    filled: Option<(MaskKey, Option<usize>)>,
    bound: Option<(HiddenKey, Option<f32>)>,
    /// K and V windows of a state held as fp16, widened to f32 (keyed by the state windows'
    /// addresses and lengths): query heads sharing a KV head widen it once.
    wide: Option<(WideKey, Vec<f32>, Vec<f32>)>,
}

/// The K and V windows (address, length) a widened copy was made of.
type WideKey = ((usize, usize), (usize, usize));

/// See [`Held`].
pub(super) type HiddenMemo = Option<Held>;

/// The pattern's output (rounded as its last op's), or `None` when the window's hidden columns
/// cannot be skipped exactly; then the caller runs the six steps.
fn run(fr: &Frame, steps: &[Step], memo: &mut HiddenMemo) -> Result<Option<Tensor>, String> {
    let Some(head) = head_operands(fr, steps)? else {
        return Ok(None);
    };
    let HeadOperands {
        q,
        mask,
        k,
        v,
        dims: (d, dv, t, c),
        round: rounding,
        ..
    } = head;
    let out_ty = &steps[5].out_types[0];
    // query heads sharing a KV head run back to back: their hidden-column bound is shared
    // (keyed by the state windows, whatever they are widened into)
    let key = HiddenKey {
        k: (k.addr(), k.len()),
        v: (v.addr(), v.len()),
        l: 0,
    };
    let held = memo.get_or_insert_with(Held::default);
    let (k, v): (&[f32], &[f32]) = match (k, v) {
        (KvSlice::F32(k), KvSlice::F32(v)) => (k, v),
        _ => {
            let wide_key = (key.k, key.v);
            if held.wide.as_ref().map(|w| w.0) != Some(wide_key) {
                let (mut kb, mut vb) = held
                    .wide
                    .take()
                    .map_or_else(Default::default, |(_, kb, vb)| (kb, vb));
                k.to_f32(&mut kb);
                v.to_f32(&mut vb);
                // `to_f32` leaves an f32 operand in place: copy it (a mixed pair)
                if let KvSlice::F32(k) = k {
                    kb.clear();
                    kb.extend_from_slice(k);
                }
                if let KvSlice::F32(v) = v {
                    vb.clear();
                    vb.extend_from_slice(v);
                }
                held.wide = Some((wide_key, kb, vb));
            }
            match &held.wide {
                Some((_, kb, vb)) => (kb, vb),
                None => return Ok(None),
            }
        }
    };
    let window = HeadWindow {
        q: &q.data,
        k,
        v,
        mask: &mask.data,
        d,
        dv,
        t,
        c,
    };
    let mask_key = (mask.data.as_ptr() as usize, mask.data.len(), t, c);
    let l = match held.filled {
        Some((key, l)) if key == mask_key => l,
        _ => {
            let l = filled_columns(&window);
            held.filled = Some((mask_key, l));
            l
        }
    };
    let Some(l) = l else {
        return Ok(None);
    };
    let key = HiddenKey { l, ..key };
    let k_max = match held.bound {
        Some((held_key, bound)) if held_key == key => bound,
        _ => {
            let bound = hidden_key_bound(&window, l);
            held.bound = Some((key, bound));
            bound
        }
    };
    let Some(k_max) = k_max else {
        return Ok(None);
    };
    Ok(
        attend_filled_columns(&window, l, k_max, rounding)?.map(|data| Tensor {
            dtype: out_ty.dtype,
            shape: out_ty.shape.clone(),
            data,
        }),
    )
}
