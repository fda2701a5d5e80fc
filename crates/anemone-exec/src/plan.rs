//! Planning a function's steps once at load time: value lifetimes (what may be released or
//! taken over after each step) and the in-place runs of KV state chains.

use anemone_mil::{DType, Function, Op, Var};

use crate::decompress::strides;
use crate::kernels::linalg::PARALLEL_WORK;
use crate::package::{Fused, Step};

/// Fills each step's `release` (values dead after it) and `movable` (operands it may take).
pub(crate) fn plan_lifetimes(f: &Function, steps: &mut [Step]) {
    let n = f.values().len();
    let mut last_use: Vec<Option<usize>> = vec![None; n];
    let mut produced_at: Vec<Option<usize>> = vec![None; n];
    let mut handles: Vec<Option<Var>> = vec![None; n];
    for (i, s) in steps.iter().enumerate() {
        for v in s.op.operands() {
            last_use[v.index()] = Some(i);
            handles[v.index()] = Some(v);
        }
        for &v in &s.outputs {
            produced_at[v.index()] = Some(i);
            handles[v.index()] = Some(v);
        }
    }
    let mut keep = vec![false; n];
    for v in f.outputs() {
        keep[v.index()] = true;
    }
    for v in f.inputs() {
        keep[v.index()] = true;
    }
    for (v, handle) in handles.iter().enumerate() {
        let Some(handle) = handle else { continue };
        if keep[v] {
            continue;
        }
        // never-used outputs die right where they are made
        if let Some(i) = last_use[v].or(produced_at[v]) {
            steps[i].release.push(*handle);
        }
    }
    for s in steps.iter_mut() {
        let operands = s.op.operands();
        s.movable = operands
            .iter()
            .copied()
            .filter(|v| s.release.contains(v) && operands.iter().filter(|w| *w == v).count() == 1)
            .collect();
    }
}

/// Marks each `read_state(s) → slice_update(x = read) [→ slice_update(x = previous)…] →
/// write_state(s, data = last)` chain to run in place on the state: the read copies nothing, each
/// update writes its window straight into the state, the write does nothing, and every chain
/// value is the state itself. Allowed when no chain value is a function output, every other use
/// of a chain value comes before the chain's next update (so it reads exactly that value), and
/// nothing else reads or writes `s` in between.
///
/// A contiguous `slice_by_index` of a chain value whose result only matmuls read (before the
/// chain's next update) becomes a [`Fused::View`]: those matmuls read the window of the state
/// directly, the same values in the same layout as a copy. So does a cast of such a slice to
/// f32 (exact) whose result only matmuls read, as fp32 programs widen their fp16 cache.
pub(crate) fn fuse_state_updates(f: &Function, steps: &mut [Step]) {
    let n = f.values().len();
    let mut consumers: Vec<Vec<usize>> = vec![Vec::new(); n];
    for (j, s) in steps.iter().enumerate() {
        for v in s.op.operands() {
            if !consumers[v.index()].contains(&j) {
                consumers[v.index()].push(j);
            }
        }
    }
    let mut is_output = vec![false; n];
    for v in f.outputs() {
        is_output[v.index()] = true;
    }
    let touches = |op: &Op, state: Var| match op {
        Op::ReadState { input } | Op::WriteState { input, .. } => *input == state,
        _ => false,
    };
    for i in 0..steps.len() {
        let Op::ReadState { input: state } = steps[i].op else {
            continue;
        };
        let mut current = steps[i].outputs[0];
        let mut chain = Vec::new();
        // (reader step, index of the chain step that next changes the value it reads)
        let mut readers = Vec::new();
        let write = loop {
            if is_output[current.index()] {
                break None;
            }
            let cons = &consumers[current.index()];
            let next: Vec<usize> = cons
                .iter()
                .copied()
                .filter(|&j| match &steps[j].op {
                    Op::SliceUpdate {
                        x,
                        update,
                        begin,
                        end,
                    } => *x == current && ![*update, *begin, *end].contains(&current),
                    Op::WriteState { input, data } => *input == state && *data == current,
                    _ => false,
                })
                .collect();
            let [j] = next[..] else { break None };
            if cons.iter().any(|&r| r > j) {
                break None;
            }
            readers.extend(cons.iter().filter(|&&r| r != j).map(|&r| (r, j)));
            match steps[j].op {
                Op::WriteState { .. } => break Some(j),
                _ => {
                    chain.push(j);
                    current = steps[j].outputs[0];
                }
            }
        };
        let Some(k) = write else { continue };
        let untouched_between = (i + 1..k).all(|m| !touches(&steps[m].op, state));
        if chain.is_empty() || !untouched_between {
            continue;
        }
        let name = f.value_name(state).to_string();
        steps[i].fused = Fused::ReadsInPlace(name.clone());
        steps[k].fused = Fused::Elided;
        for &j in &chain {
            steps[j].fused = Fused::UpdatesState(name.clone());
        }
        let state_shape = &f.tensor_type(state).shape;
        for (r, next_change) in readers {
            let Some(offset) = view_offset(&steps[r], state_shape) else {
                continue;
            };
            let read_by_matmuls_only = |v: Var| {
                !is_output[v.index()]
                    && consumers[v.index()]
                        .iter()
                        .all(|&c| c < next_change && matches!(steps[c].op, Op::Matmul { .. }))
            };
            // exact widenings (to f32) of the window, read only by matmuls, are the window too
            let out = steps[r].outputs[0];
            let widenings: Vec<usize> = consumers[out.index()]
                .iter()
                .copied()
                .filter(|&c| {
                    matches!(
                        steps[c].op,
                        Op::Cast {
                            dtype: DType::F32,
                            ..
                        }
                    ) && read_by_matmuls_only(steps[c].outputs[0])
                })
                .collect();
            let viewable = !is_output[out.index()]
                && consumers[out.index()].iter().all(|&c| {
                    widenings.contains(&c)
                        || (c < next_change && matches!(steps[c].op, Op::Matmul { .. }))
                });
            if viewable {
                for s in std::iter::once(r).chain(widenings) {
                    steps[s].fused = Fused::View {
                        state: name.clone(),
                        offset,
                    };
                }
            }
        }
    }
}

/// The flat offset of a `slice_by_index` (stride 1) of a `shape` value whose window is one
/// contiguous run of the row-major data.
fn view_offset(step: &Step, shape: &[usize]) -> Option<usize> {
    let Op::SliceByIndex { begin, stride, .. } = &step.op else {
        return None;
    };
    let extent = &step.out_types.first()?.shape;
    let rank = shape.len();
    if begin.len() != rank || extent.len() != rank || stride.iter().any(|&s| s != 1) {
        return None;
    }
    if (0..rank).any(|a| begin[a] + extent[a] > shape[a]) {
        return None;
    }
    // after the first axis taking more than one index, every axis must be taken whole
    let first_wide = (0..rank).find(|&a| extent[a] > 1).unwrap_or(rank);
    let whole_after = (first_wide + 1..rank).all(|a| begin[a] == 0 && extent[a] == shape[a]);
    whole_after.then(|| begin.iter().zip(strides(shape)).map(|(b, s)| b * s).sum())
}

/// Whether running `steps` with f32 accumulation never enters rayon: every product is a
/// single-token projection (its parallel region runs on the decode [`crate::team`]), a matvec
/// (the same), or a `gemm` too small to be spread over a pool ([`PARALLEL_WORK`]); nothing else
/// forks. Shapes are static, so this holds for every call. Such a function (a decode step) may
/// run on the calling thread with its team instead of being handed to a pool's worker; where
/// it runs never changes its values.
pub(crate) fn runs_without_pool(f: &Function, steps: &[Step], half: &dyn Fn(Var) -> bool) -> bool {
    let single_position = |x: Var| {
        let s = &f.tensor_type(x).shape;
        s.len() == 4 && s.iter().product::<usize>() == s[1]
    };
    steps.iter().all(|s| match &s.op {
        Op::Conv {
            x, weight, params, ..
        } => {
            let w = &f.tensor_type(*weight).shape;
            let pointwise = w.len() == 4
                && w[2..] == [1, 1]
                && params.strides == [1, 1]
                && params.pad == [0, 0, 0, 0];
            // a pointwise conv of one position is a matvec per group
            pointwise && single_position(*x)
        }
        Op::Linear { x, weight, .. } => {
            let (xs, w) = (&f.tensor_type(*x).shape, &f.tensor_type(*weight).shape);
            let rows = xs.iter().product::<usize>() / w.get(1).copied().unwrap_or(1).max(1);
            let work = rows * w.iter().product::<usize>();
            (rows == 1 && half(*weight)) || work < PARALLEL_WORK
        }
        Op::Matmul { x, transpose_x, .. } => {
            let (xs, out) = (&f.tensor_type(*x).shape, &s.out_types[0].shape);
            let (Some(&m), Some(&n)) = (out.iter().rev().nth(1), out.last()) else {
                return false;
            };
            let k = match (transpose_x, xs.len()) {
                (_, 0 | 1) => return false,
                (false, r) => xs[r - 1],
                (true, r) => xs[r - 2],
            };
            n == 1 || m * n * k < PARALLEL_WORK
        }
        _ => true,
    })
}

/// Where a weight's bytes lie (`start` as an address) and how many there are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WeightBytes {
    pub start: usize,
    pub len: usize,
}

/// The projection step a projection's region is followed by, and its weight bytes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct WarmNext {
    pub step: usize,
    pub bytes: WeightBytes,
}

/// For every projection step (a conv or linear whose weight `streamed` places), the next
/// projection that reads another input — a layer's q/k/v → its output projection → gate/up →
/// down → the next layer's q/k/v: its weight bytes are what the team's idle helpers ask the
/// memory for while the serial ops between the two run ([`anemone_backend::team::Team::warm`]).
/// A projection reading the same input runs in the same region, so it is skipped. Only
/// single-position projections (a decode step's matvecs, which stream their weights once) take
/// part: a prefill's products reuse what is in the caches.
pub(crate) fn warm_after(
    steps: &[Step],
    streamed: &dyn Fn(Var) -> Option<WeightBytes>,
) -> Vec<Option<WarmNext>> {
    let projection = |s: &Step| match &s.op {
        Op::Conv { x, weight, .. } | Op::Linear { x, weight, .. } if one_position(s) => {
            streamed(*weight).map(|w| (*x, w))
        }
        _ => None,
    };
    let mut targets = vec![None; steps.len()];
    // the nearest later projection (its input and itself), and the nearest later one reading
    // another input than it
    let mut nearest: Option<(Var, WarmNext)> = None;
    let mut nearest_other: Option<WarmNext> = None;
    for (i, step) in steps.iter().enumerate().rev() {
        let Some((x, bytes)) = projection(step) else {
            continue;
        };
        match nearest {
            Some((later_x, later)) if later_x != x => {
                targets[i] = Some(later);
                nearest_other = Some(later);
            }
            _ => targets[i] = nearest_other,
        }
        nearest = Some((x, WarmNext { step: i, bytes }));
    }
    targets
}

/// Whether a conv's or linear's output is one position (`[1, C, 1, 1]`, `[1, C]`).
fn one_position(step: &Step) -> bool {
    step.out_types.first().is_some_and(|ty| {
        let shape = &ty.shape;
        match shape.len() {
            4 => shape[0] == 1 && shape[2] == 1 && shape[3] == 1,
            2 => shape[0] == 1,
            _ => false,
        }
    })
}
