//! A prefill step's attention: a run of heads of several query rows (each the six ops
//! `matmul → add mask → reduce_max → sub → softmax → matmul`, with the KV windows they read
//! between them) computed by [`attend_head`] — the six ops' values bit for bit — the heads
//! spread over the team, each head's products on the thread that took it.
//!
//! A head's products are too small to split well over threads (a 64-token window against a
//! few hundred columns), and between them run the head's elementwise ops; whole heads side by
//! side keep every thread busy from the first head to the last. Which thread computes a head,
//! and whether its products are split, never changes its values.
//!
//! [`attend_head`]: crate::kernels::attention::attend_head

use std::borrow::Cow;

use anemone_mil::Op;

use super::attend::{head_operands, heads_on_team, matrix, run_head_group, HeadOutputs, STEPS};
use super::Frame;
use crate::kernels::attention::{
    attend_head, filled_columns, hidden_key_bound, keys_by_column, Columns, HeadWindow,
    MaskColumns, Rounding,
};
use crate::kernels::kv_elem::KvSlice;
use crate::kernels::Accumulation;
use crate::package::Step;
use crate::team;

/// Runs the heads of several query rows opening `steps` when there are at least two and a team
/// of two threads or more ([`run_head_group`]'s contract); `None` leaves them to the caller.
pub(super) fn try_run<'a>(
    fr: &mut Frame<'a, '_>,
    steps: &'a [Step],
    heads: &[bool],
) -> Result<Option<usize>, String> {
    if fr.acc != Accumulation::F32 || team::current().is_none_or(|t| t.threads() < 2) {
        return Ok(None);
    }
    run_head_group(fr, steps, heads, (several_queries, 2), compute)
}

/// Whether `s` opens a head of at least two query rows (`scores` is `[…, T, C]`, T ≥ 2).
fn several_queries(s: &Step) -> bool {
    let (Op::Matmul { .. }, Some(ty)) = (&s.op, s.out_types.first()) else {
        return false;
    };
    matches!(matrix(&ty.shape), Some((t, _)) if t >= 2)
}

/// A head's operands before K and V are known as f32: indices into the widened windows.
struct Planned<'f> {
    q: Cow<'f, [f32]>,
    mask: Cow<'f, [f32]>,
    kv: usize,
    shape: (usize, usize, usize, usize),
    round: Rounding,
}

/// A KV head's K and V windows as f32, keyed by the windows' addresses.
type KvWindow<'f> = ((usize, usize), Cow<'f, [f32]>, Cow<'f, [f32]>);

/// Every head's output, or `None` when one does not have the expected operands (or a filled
/// window's bound fails: the caller's per-head path then runs the six ops).
fn compute(fr: &Frame, steps: &[Step], starts: &[usize]) -> HeadOutputs {
    // K and V windows as f32, each once (query heads sharing a KV head read the same ones)
    let mut windows: Vec<KvWindow> = Vec::new();
    let mut planned = Vec::with_capacity(starts.len());
    for &at in starts {
        let Some(head) = head_operands(fr, &steps[at..at + STEPS])? else {
            return Ok(None);
        };
        let (k, v) = (head.k, head.v);
        let key = (k.addr(), v.addr());
        let kv = match windows.iter().position(|w| w.0 == key) {
            Some(i) => i,
            None => {
                windows.push((key, widened(k), widened(v)));
                windows.len() - 1
            }
        };
        planned.push(Planned {
            q: head.q.data,
            mask: head.mask.data,
            kv,
            shape: head.dims,
            round: head.round,
        });
    }
    let heads: Vec<(HeadWindow, Rounding)> = planned
        .iter()
        .map(|p| {
            let (d, dv, t, c) = p.shape;
            let (_, k, v) = &windows[p.kv];
            let w = HeadWindow {
                q: &p.q,
                k,
                v,
                mask: &p.mask,
                d,
                dv,
                t,
                c,
            };
            (w, p.round)
        })
        .collect();
    let columns = plan_columns(&heads);
    let shared = share_columns(&heads, &columns);
    run_heads(&heads, &columns, &shared)
}

/// Per head, indices into the mask columns and the key columns its run shares (each built once
/// per mask or K window and column count).
struct Shared {
    masks: Vec<MaskColumns>,
    keys: Vec<Vec<f32>>,
    of_head: Vec<(usize, usize)>,
}

fn share_columns(heads: &[(HeadWindow, Rounding)], columns: &[Columns]) -> Shared {
    type Key = (usize, usize, Option<usize>);
    let mut mask_keys: Vec<Key> = Vec::new();
    let mut key_keys: Vec<Key> = Vec::new();
    let mut shared = Shared {
        masks: Vec::new(),
        keys: Vec::new(),
        of_head: Vec::with_capacity(heads.len()),
    };
    let l_of = |c: Columns| match c {
        Columns::Filled { l, .. } => Some(l),
        Columns::All => None,
    };
    for ((w, _), &cols) in heads.iter().zip(columns) {
        let mask_key = (w.mask.as_ptr() as usize, w.mask.len(), l_of(cols));
        let m = position_or_push(&mut mask_keys, mask_key, || {
            shared.masks.push(MaskColumns::new(w, cols))
        });
        let key_key = (w.k.as_ptr() as usize, w.k.len(), l_of(cols));
        let k = position_or_push(&mut key_keys, key_key, || {
            shared.keys.push(keys_by_column(w, cols))
        });
        shared.of_head.push((m, k));
    }
    shared
}

/// The index of `key` in `keys`, pushing it (and calling `make`) when it is new.
fn position_or_push<K: PartialEq>(keys: &mut Vec<K>, key: K, make: impl FnOnce()) -> usize {
    match keys.iter().position(|k| *k == key) {
        Some(i) => i,
        None => {
            keys.push(key);
            make();
            keys.len() - 1
        }
    }
}

/// A window's values as f32: borrowed, or widened from a state held as fp16.
fn widened(s: KvSlice) -> Cow<[f32]> {
    match s {
        KvSlice::F32(d) => Cow::Borrowed(d),
        other => Cow::Owned(other.to_f32(&mut Vec::new()).to_vec()),
    }
}

/// Each head's columns: the filled ones where they can be proven to be the whole answer (the
/// bound computed once per mask and KV window), else all.
fn plan_columns(heads: &[(HeadWindow, Rounding)]) -> Vec<Columns> {
    type Key = (usize, usize, usize);
    let mut filled: Vec<(Key, Option<usize>)> = Vec::new();
    let mut bounds: Vec<((usize, usize, usize), Option<f32>)> = Vec::new();
    heads
        .iter()
        .map(|(w, _)| {
            let mask_key = (w.mask.as_ptr() as usize, w.mask.len(), w.c);
            let l = match filled.iter().find(|f| f.0 == mask_key) {
                Some(f) => f.1,
                None => {
                    let l = filled_columns(w);
                    filled.push((mask_key, l));
                    l
                }
            };
            let Some(l) = l else {
                return Columns::All;
            };
            let kv_key = (w.k.as_ptr() as usize, w.v.as_ptr() as usize, l);
            let k_max = match bounds.iter().find(|b| b.0 == kv_key) {
                Some(b) => b.1,
                None => {
                    let bound = hidden_key_bound(w, l);
                    bounds.push((kv_key, bound));
                    bound
                }
            };
            k_max.map_or(Columns::All, |k_max| Columns::Filled { l, k_max })
        })
        .collect()
}

/// The heads over the team, each on one thread; `None` when a filled head's bound fails.
fn run_heads(
    heads: &[(HeadWindow, Rounding)],
    columns: &[Columns],
    shared: &Shared,
) -> HeadOutputs {
    let lens: Vec<usize> = heads.iter().map(|(w, _)| w.dv * w.t).collect();
    heads_on_team(&lens, &|b, dst| {
        let (w, round) = &heads[b];
        let (m, k) = shared.of_head[b];
        let (mask, keys) = (&shared.masks[m], &shared.keys[k]);
        Ok(
            match attend_head(w, columns[b], mask, keys, *round, false)? {
                Some(data) => {
                    dst.copy_from_slice(&data);
                    true
                }
                None => false,
            },
        )
    })
}
