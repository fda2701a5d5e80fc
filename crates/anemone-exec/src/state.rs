//! The values of a package's states (a KV cache), each held as f32 or, for an fp16 program's
//! fp16-declared state, as fp16: such a program rounds every value it writes there to fp16, so
//! fp16 storage holds exactly the same values in half the bytes (and widening back is exact).

use std::collections::BTreeMap;

use anemone_backend::{round_f16_in_place, Tensor};
use anemone_mil::DType;
use half::f16;

use crate::kernels::kv_elem::KvSlice;

/// An fp16 tensor held as fp16 values.
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct HalfTensor {
    pub shape: Vec<usize>,
    pub data: Vec<f16>,
}

/// One state's value. Invariant: an `F16` value is of a state declared fp16, and its values
/// are exactly the ones an f32 holder would hold (writes that fp16 cannot hold exactly turn
/// it into `F32` first, see [`State::make_room`]).
#[derive(Clone, Debug)]
pub(crate) enum StateTensor {
    F32(Tensor),
    F16(HalfTensor),
}

impl StateTensor {
    pub fn shape(&self) -> &[usize] {
        match self {
            StateTensor::F32(t) => &t.shape,
            StateTensor::F16(h) => &h.shape,
        }
    }

    pub fn dtype(&self) -> DType {
        match self {
            StateTensor::F32(t) => t.dtype,
            StateTensor::F16(_) => DType::F16,
        }
    }

    pub fn tensor_type(&self) -> anemone_mil::TensorType {
        anemone_mil::TensorType::new(self.dtype(), self.shape().to_vec())
    }

    /// The values as an f32 tensor (a copy; exact).
    pub fn to_tensor(&self) -> Tensor {
        match self {
            StateTensor::F32(t) => t.clone(),
            StateTensor::F16(h) => Tensor {
                dtype: DType::F16,
                shape: h.shape.clone(),
                data: h.data.iter().map(|x| x.to_f32()).collect(),
            },
        }
    }

    /// The values in their element type.
    pub fn values(&self) -> KvSlice<'_> {
        match self {
            StateTensor::F32(t) => KvSlice::F32(&t.data),
            StateTensor::F16(h) => KvSlice::F16(&h.data),
        }
    }

    /// Bytes of the held values.
    pub fn bytes(&self) -> usize {
        match self {
            StateTensor::F32(t) => t.data.len() * std::mem::size_of::<f32>(),
            StateTensor::F16(h) => h.data.len() * std::mem::size_of::<f16>(),
        }
    }

    fn numel(&self) -> usize {
        match self {
            StateTensor::F32(t) => t.data.len(),
            StateTensor::F16(h) => h.data.len(),
        }
    }

    fn fill_zero(&mut self) {
        match self {
            StateTensor::F32(t) => t.data.fill(0.0),
            StateTensor::F16(h) => h.data.fill(f16::ZERO),
        }
    }

    /// The smallest last-axis index from which on every element is ±0.
    fn zero_from(&self) -> usize {
        let Some(&n) = self.shape().last() else {
            return 0;
        };
        let last_nonzero = |row: KvSlice| match row {
            KvSlice::F32(r) => r.iter().rposition(|&x| x != 0.0),
            // ±0 are the two encodings with every bit but the sign clear
            KvSlice::F16(r) => r.iter().rposition(|x| x.to_bits() & 0x7fff != 0),
        };
        let rows = self.numel() / n.max(1);
        (0..rows)
            .map(|r| {
                let row = self.values().range(r * n..(r + 1) * n);
                last_nonzero(row).map_or(0, |j| j + 1)
            })
            .max()
            .unwrap_or(0)
    }
}

impl std::fmt::Display for StateTensor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.tensor_type())
    }
}

/// Whether every value is an fp16 value (so fp16 storage holds it exactly; NaN payloads
/// included, as fp16 rounding would keep them).
fn fits_f16(values: &[f32]) -> bool {
    anemone_backend::is_f16_exact(values)
}

/// The values of a package's states, by state name. States of the same name are shared by
/// every function of the package (e.g. prefill and decode write the same KV cache).
#[derive(Clone, Debug, Default)]
pub struct State {
    pub(crate) tensors: BTreeMap<String, StateTensor>,
    /// Per state, a last-axis index from which on every element is ±0 (a KV cache's unwritten
    /// slots), kept by every write ([`State::wrote_window`], [`State::replace`]): a bound, never
    /// below the truth. A state without an entry is taken as written everywhere.
    zero_from: BTreeMap<String, usize>,
    /// Whether fp16-declared states are held as fp16: set for states made by an fp16 program
    /// (whose writes to them are fp16-rounded), never for fp32 programs (whose fp16-declared
    /// states hold unrounded f32 values).
    half: bool,
}

/// States are equal when their values are (the zero bounds and the storage only summarise or
/// hold the values).
impl PartialEq for State {
    fn eq(&self, other: &Self) -> bool {
        self.tensors.len() == other.tensors.len()
            && self
                .tensors
                .iter()
                .zip(&other.tensors)
                .all(|((a, x), (b, y))| a == b && x.to_tensor() == y.to_tensor())
    }
}

impl State {
    /// Zero-filled states of the given names, types and shapes; fp16 ones held as fp16 when
    /// `half` (an fp16 program's states).
    pub(crate) fn zeros<'p>(
        ports: impl Iterator<Item = (&'p str, DType, &'p [usize])>,
        half: bool,
    ) -> Self {
        let tensors: BTreeMap<String, StateTensor> = ports
            .map(|(name, dtype, shape)| {
                let t = if half && dtype == DType::F16 {
                    StateTensor::F16(HalfTensor {
                        shape: shape.to_vec(),
                        data: vec![f16::ZERO; shape.iter().product()],
                    })
                } else {
                    StateTensor::F32(Tensor::zeros(dtype, shape.to_vec()))
                };
                (name.to_string(), t)
            })
            .collect();
        let zero_from = tensors.keys().map(|k| (k.clone(), 0)).collect();
        State {
            tensors,
            zero_from,
            half,
        }
    }

    /// A copy of the state's values as an f32 tensor (exact).
    pub fn get(&self, name: &str) -> Option<Tensor> {
        self.tensors.get(name).map(StateTensor::to_tensor)
    }

    /// Whether the state `name` is held as f32 (`None` when absent).
    pub fn holds_f32(&self, name: &str) -> Option<bool> {
        self.tensors
            .get(name)
            .map(|t| matches!(t, StateTensor::F32(_)))
    }

    /// Bytes the states' values take.
    pub fn bytes(&self) -> usize {
        self.tensors.values().map(StateTensor::bytes).sum()
    }

    pub(crate) fn held(&self, name: &str) -> Option<&StateTensor> {
        self.tensors.get(name)
    }

    /// Replaces (or adds) a state's value; fp16 values are rounded to fp16 (states hold what
    /// the device stores).
    pub fn insert(&mut self, name: &str, mut value: Tensor) {
        if value.dtype == DType::F16 {
            round_f16_in_place(&mut value.data);
        }
        let half = self.half || matches!(self.tensors.get(name), Some(StateTensor::F16(_)));
        self.store(name.to_string(), value, half);
    }

    /// Stores `value` as the state `name` (held as fp16 when it was and the values fit) and
    /// finds its zero bound.
    pub(crate) fn replace(&mut self, name: String, value: Tensor) {
        let half = matches!(self.tensors.get(&name), Some(StateTensor::F16(_)));
        self.store(name, value, half);
    }

    fn store(&mut self, name: String, value: Tensor, half: bool) {
        let held = if half && value.dtype == DType::F16 && fits_f16(&value.data) {
            StateTensor::F16(HalfTensor {
                shape: value.shape,
                data: value.data.iter().map(|&x| f16::from_f32(x)).collect(),
            })
        } else {
            StateTensor::F32(value)
        };
        self.zero_from.insert(name.clone(), held.zero_from());
        self.tensors.insert(name, held);
    }

    /// The state `name` ready for a write of `values`: an fp16 holder that cannot hold them
    /// exactly is widened to f32 first (exact), so no write ever loses a bit.
    pub(crate) fn make_room(&mut self, name: &str, values: &[f32]) -> Option<&mut StateTensor> {
        let held = self.tensors.get_mut(name)?;
        if matches!(held, StateTensor::F16(_)) && !fits_f16(values) {
            *held = StateTensor::F32(held.to_tensor());
        }
        Some(held)
    }

    /// Notes a write of the state `name` at last-axis indices below `end` (the bound rises to
    /// it; the state must exist).
    pub(crate) fn wrote_window(&mut self, name: &str, end: usize) {
        if let Some(z) = self.zero_from.get_mut(name) {
            *z = (*z).max(end);
        }
    }

    /// Every element of the state `name` at a last-axis index at or past the answer is ±0
    /// (the last axis' length when nothing is known).
    pub(crate) fn zero_from(&self, name: &str) -> usize {
        let whole = self
            .tensors
            .get(name)
            .and_then(|t| t.shape().last().copied())
            .unwrap_or(0);
        self.zero_from.get(name).map_or(whole, |&z| z.min(whole))
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.tensors.keys().map(String::as_str)
    }

    /// Sets every state value to zero.
    pub fn reset(&mut self) {
        self.tensors.values_mut().for_each(StateTensor::fill_zero);
        self.zero_from = self.tensors.keys().map(|k| (k.clone(), 0)).collect();
    }
}
