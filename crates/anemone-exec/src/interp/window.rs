//! Writes into a window of a tensor: the fused KV-state update and the window check it shares
//! with `slice_update`.

use anemone_backend::round_f16_in_place;
use anemone_mil::{Op, Precision};

use half::f16;

use super::Frame;
use crate::kernels::shape;
use crate::package::Step;
use crate::state::StateTensor;

/// A fused KV write: `state[begin..end] = update`, in place; the window is checked first, so a
/// failure leaves the state as it was.
pub(super) fn update_state_in_place(fr: &mut Frame, step: &Step, name: &str) -> Result<(), String> {
    let Op::SliceUpdate {
        update, begin, end, ..
    } = &step.op
    else {
        return Err("a fused state update must be a slice_update".into());
    };
    let b = fr.get(*begin)?.to_i32_vec();
    let e = fr.get(*end)?.to_i32_vec();
    let mut u = fr.get(*update)?.into_owned();
    if fr.precision == Precision::Fp16 {
        round_f16_in_place(&mut u.data);
    }
    // an fp16 holder takes the update as fp16 (exact: the values are fp16 values, else
    // `make_room` widened the holder to f32 first)
    let held = fr
        .state
        .make_room(name, &u.data)
        .ok_or_else(|| format!("state `{name}` is missing"))?;
    let begin = check_window(&b, &e, held.shape(), &u.shape)
        .map_err(|detail| format!("{detail} (state `{name}` of {held}, update {u})"))?;
    match held {
        StateTensor::F32(t) => {
            shape::slice_update(&mut t.data, &t.shape, &u.data, &u.shape, &begin)
        }
        StateTensor::F16(h) => {
            let half: Vec<f16> = u.data.iter().map(|&x| f16::from_f32(x)).collect();
            shape::slice_update(&mut h.data, &h.shape, &half, &u.shape, &begin)
        }
    }
    // the window ends at `e` on every axis (checked), the last one included
    let end = e.last().map_or(0, |&x| x as usize);
    fr.state.wrote_window(name, end);
    Ok(())
}

/// The window's begin as indices if `[begin, end)` fits `shape` and spans `update_shape`.
pub(super) fn check_window(
    b: &[i32],
    e: &[i32],
    shape: &[usize],
    update_shape: &[usize],
) -> Result<Vec<usize>, String> {
    let rank = shape.len();
    let fits = b.len() == rank
        && e.len() == rank
        && update_shape.len() == rank
        && (0..rank).all(|i| {
            b[i] >= 0
                && e[i] >= b[i]
                && e[i] as usize <= shape[i]
                && (e[i] - b[i]) as usize == update_shape[i]
        });
    if fits {
        Ok(b.iter().map(|&v| v as usize).collect())
    } else {
        Err(format!("window begin {b:?} end {e:?} does not fit"))
    }
}
