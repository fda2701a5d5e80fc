//! A decode step's attention: a run of single-query heads (each the six ops `matmul → add mask
//! → reduce_max → sub → softmax → matmul`, with the KV windows they read between them) computed
//! by [`attend_one`] — the six ops' values bit for bit — the heads spread over the decode team.
//!
//! [`attend_one`]: crate::kernels::attend_one::attend_one

use std::borrow::Cow;

use anemone_mil::{Op, Var};
use half::f16;

use super::attend::{
    head_operands, heads_on_team, matrix, run_head_group, HeadOperands, HeadOutputs, STEPS,
};
use super::Frame;
use crate::kernels::attend_one::{
    attend_one, hidden_mask_max, live_columns, scores_match_gemm, Skip,
};
use crate::kernels::attention::{HeadWindow, Rounding};
use crate::kernels::kv_elem::KvSlice;
use crate::kernels::Accumulation;
use crate::package::Step;

/// A head's operands, K and V in the element type the state holds.
enum Window<'f> {
    F32(HeadWindow<'f, f32>),
    F16(HeadWindow<'f, f16>),
}

/// One head of the run: its operands.
struct Head<'f> {
    window: Window<'f>,
    round: Rounding,
    scores_first: bool,
    /// The columns past the written part of the KV state ([`attend_one`] checks the rest).
    skip: Option<Skip>,
}

/// Runs the heads (and the KV windows between them) opening `steps` when they are single-query
/// heads, storing their outputs and releasing their dead values as their steps would; returns
/// how many steps ran, or `None` (nothing changed but windows the caller would set the same
/// way) for the caller to run `steps[0]` as usual.
/// `heads[i]`: whether `steps[i..]` opens a head (`attend::matches`, planned at load).
pub(super) fn try_run<'a>(
    fr: &mut Frame<'a, '_>,
    steps: &'a [Step],
    heads: &[bool],
) -> Result<Option<usize>, String> {
    if fr.acc != Accumulation::F32 || !scores_match_gemm() {
        return Ok(None);
    }
    run_head_group(fr, steps, heads, (single_query, 1), compute)
}

/// Whether `s` opens a head of one query row (`scores` is `[…, 1, C]`, C ≥ 2, over d ≥ 3
/// channels: shapes `matmul` hands to `gemm`'s gemv, see [`crate::kernels::attend_one`]).
fn single_query(s: &Step) -> bool {
    let (Op::Matmul { .. }, Some(ty)) = (&s.op, s.out_types.first()) else {
        return false;
    };
    matches!(matrix(&ty.shape), Some((1, c)) if c >= 2)
}

/// Every head's output, or `None` when one does not have the expected operands.
fn compute(fr: &Frame, steps: &[Step], starts: &[usize]) -> HeadOutputs {
    let mut heads = Vec::with_capacity(starts.len());
    // the heads of a step share their mask: its largest skipped value, by first skipped column
    let mut mask_max: Option<(usize, usize, Option<f32>)> = None;
    let mut zero_memo: Option<(Var, Var, Option<usize>)> = None;
    for &at in starts {
        let Some(head) = head_operands(fr, &steps[at..at + STEPS])? else {
            return Ok(None);
        };
        let HeadOperands {
            q,
            mask,
            k,
            v,
            kv_vars,
            dims: (d, dv, t, c),
            round,
            scores_first,
        } = head;
        // K and V read in place in the element type the state holds (no copy)
        let (Cow::Borrowed(q_data), Cow::Borrowed(mask_data)) = (q.data, mask.data) else {
            return Ok(None);
        };
        if t != 1 || d < 3 {
            return Ok(None);
        }
        // query heads sharing a KV head read the same windows: their bound is looked up once
        let zero_from = match zero_memo {
            Some((kk, vv, z)) if (kk, vv) == kv_vars => z,
            _ => {
                let z = match (
                    fr.zero_columns_from(kv_vars.0),
                    fr.zero_columns_from(kv_vars.1),
                ) {
                    (Some(a), Some(b)) => Some(a.max(b)),
                    _ => None,
                };
                zero_memo = Some((kv_vars.0, kv_vars.1, z));
                z
            }
        };
        let window = match (k, v) {
            (KvSlice::F32(k), KvSlice::F32(v)) => Window::F32(HeadWindow {
                q: q_data,
                k,
                v,
                mask: mask_data,
                d,
                dv,
                t: 1,
                c,
            }),
            (KvSlice::F16(k), KvSlice::F16(v)) => Window::F16(HeadWindow {
                q: q_data,
                k,
                v,
                mask: mask_data,
                d,
                dv,
                t: 1,
                c,
            }),
            // K and V held in different types: the six ops run one by one
            _ => return Ok(None),
        };
        heads.push(Head {
            window,
            round,
            scores_first,
            skip: zero_from.and_then(|z| live_columns(c, z)).and_then(|cols| {
                let key = (mask_data.as_ptr() as usize, cols);
                let max = match mask_max {
                    Some((p, l, m)) if (p, l) == key => m,
                    _ => {
                        let m = hidden_mask_max(&mask_data[cols..]);
                        mask_max = Some((key.0, key.1, m));
                        m
                    }
                };
                max.map(|hidden_mask_max| Skip {
                    cols,
                    hidden_mask_max,
                })
            }),
        });
    }
    let lens: Vec<usize> = heads
        .iter()
        .map(|h| match &h.window {
            Window::F32(w) => w.dv,
            Window::F16(w) => w.dv,
        })
        .collect();
    heads_on_team(&lens, &|b, dst| {
        let h = &heads[b];
        SCRATCH.with_borrow_mut(|scratch| match &h.window {
            Window::F32(w) => attend_one(w, h.round, h.scores_first, h.skip, scratch, dst),
            Window::F16(w) => attend_one(w, h.round, h.scores_first, h.skip, scratch, dst),
        })?;
        Ok(true)
    })
}

thread_local! {
    /// A thread's room for one head's row and widened K/V blocks, kept from head to head (a
    /// decode step runs every layer's heads: an allocation and a zero fill of some 16 KiB each
    /// time otherwise). [`attend_one`] writes every element it reads.
    static SCRATCH: std::cell::RefCell<Vec<f32>> = const { std::cell::RefCell::new(Vec::new()) };
}
