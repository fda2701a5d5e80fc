//! How the interpreter hands out operands: a state window or chain value in the element type
//! the state is held in (fp16 read in place by the attention kernels), or as f32 (widened, a
//! copy of the window only, for the generic ops).

use std::borrow::Cow;

use anemone_backend::Tensor;
use anemone_mil::Var;

use super::{Frame, Slot};
use crate::kernels::elementwise::Operand;
use crate::kernels::kv_elem::KvSlice;
use crate::state::StateTensor;

impl Frame<'_, '_> {
    /// The value's tensor when it is held as one (not a whole state held as fp16).
    pub(super) fn tensor(&self, v: Var) -> Result<&Tensor, String> {
        match self.get(v)? {
            Cow::Borrowed(t) => Ok(t),
            Cow::Owned(_) => Err(format!("`{}` is a state held as fp16", self.name(v))),
        }
    }

    /// A weight's f32 values and shape: read in place ([`crate::f32_weight`]) or a constant's.
    pub(super) fn weight(&self, v: Var) -> Result<(&[f32], &[usize]), String> {
        match self.f.f32_weights.get(&v) {
            Some(w) => Ok((w.values(), &w.shape)),
            None => self
                .tensor(v)
                .map(|t| (t.data.as_slice(), t.shape.as_slice())),
        }
    }

    pub(super) fn held_state(&self, name: &str) -> Result<&StateTensor, String> {
        self.state
            .held(name)
            .ok_or_else(|| format!("state `{name}` is missing"))
    }

    /// The operand's values in the element type they are held in, and its shape: a state
    /// window or chain value read in place (fp16 when the state is held so), any other value
    /// as f32.
    pub(super) fn kv_operand(&self, v: Var) -> Result<(KvSlice<'_>, &[usize]), String> {
        match self.slots.get(v.index()) {
            Some(&Slot::Window {
                state,
                offset,
                shape,
            }) => {
                let held = self.held_state(state)?;
                let n: usize = shape.iter().product();
                let data = held.values().get(offset..offset + n).ok_or_else(|| {
                    format!("window {offset}+{n} outside state `{state}` of {held}")
                })?;
                Ok((data, shape))
            }
            Some(Slot::Alias(name)) => {
                let held = self.held_state(name)?;
                Ok((held.values(), held.shape()))
            }
            Some(Slot::Borrowed(t)) => Ok((KvSlice::F32(&t.data), &t.shape)),
            Some(Slot::Owned(t)) => Ok((KvSlice::F32(&t.data), &t.shape)),
            _ => Err(self
                .get(v)
                .err()
                .unwrap_or_else(|| format!("`{}` has no values here", self.name(v)))),
        }
    }

    /// The operand's values as f32 (a state window included: widened when the state is held
    /// as fp16, a copy of the window only) and its shape.
    pub(super) fn operand(&self, v: Var) -> Result<Values<'_>, String> {
        let (data, shape) = self.kv_operand(v)?;
        Ok(Values {
            data: match data {
                KvSlice::F32(d) => Cow::Borrowed(d),
                other => Cow::Owned(other.to_f32(&mut Vec::new()).to_vec()),
            },
            shape,
        })
    }
}

/// An operand's f32 values (borrowed, or widened from a state held as fp16) and shape.
pub(super) struct Values<'t> {
    pub(super) data: Cow<'t, [f32]>,
    pub(super) shape: &'t [usize],
}

impl Values<'_> {
    pub(super) fn op(&self) -> Operand<'_> {
        Operand {
            data: &self.data,
            shape: self.shape,
        }
    }
}
