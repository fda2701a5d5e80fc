//! An op's arguments by name: the values behind each [`Signature`](crate::Signature) slot.
//! The writer and the printer walk these; names come from the signature table.

use crate::ir::op::Op;
use crate::ir::program::Var;
use crate::ir::signature::arg::*;
use crate::ir::tensor::TensorData;

/// The value of a static op parameter.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum ParamValue {
    I32(i32),
    I32s(Vec<i32>),
    Bool(bool),
    Str(String),
    Float(f32),
}

fn ints(v: &[usize]) -> ParamValue {
    ParamValue::I32s(v.iter().map(|&x| x as i32).collect())
}

impl Op {
    /// The bound tensor operands in signature order (absent optional operands left out;
    /// `values` of concat is variadic).
    pub(crate) fn operand_args(&self) -> Vec<(&'static str, Vec<Var>)> {
        let opt = |k: &'static str, v: &Option<Var>| v.map(|v| (k, vec![v]));
        match self {
            Op::Const { .. }
            | Op::ConstexprBlockwiseShiftScale { .. }
            | Op::ConstexprLutToDense { .. } => vec![],
            Op::ReadState { input } => vec![(INPUT, vec![*input])],
            Op::WriteState { input, data } => vec![(INPUT, vec![*input]), (DATA, vec![*data])],
            Op::SliceUpdate {
                x,
                update,
                begin,
                end,
            } => vec![
                (X, vec![*x]),
                (UPDATE, vec![*update]),
                (BEGIN, vec![*begin]),
                (END, vec![*end]),
            ],
            Op::Conv {
                x, weight, bias, ..
            }
            | Op::Linear { x, weight, bias } => {
                let mut v = vec![(X, vec![*x]), (WEIGHT, vec![*weight])];
                v.extend(opt(BIAS, bias));
                v
            }
            Op::Matmul { x, y, .. } | Op::Binary { x, y, .. } => {
                vec![(X, vec![*x]), (Y, vec![*y])]
            }
            Op::LayerNorm { x, gamma, beta, .. } => {
                let mut v = vec![(X, vec![*x])];
                v.extend(opt(GAMMA, gamma));
                v.extend(opt(BETA, beta));
                v
            }
            Op::Concat { values, .. } => vec![(VALUES, values.clone())],
            Op::Softmax { x, .. }
            | Op::Reduce { x, .. }
            | Op::Unary { x, .. }
            | Op::Rsqrt { x, .. }
            | Op::Gelu { x, .. }
            | Op::SliceByIndex { x, .. }
            | Op::Split { x, .. }
            | Op::Reshape { x, .. }
            | Op::Transpose { x, .. }
            | Op::ExpandDims { x, .. }
            | Op::Squeeze { x, .. }
            | Op::Cast { x, .. } => vec![(X, vec![*x])],
        }
    }

    /// Every static parameter, in signature (and coremltools' emission) order.
    pub(crate) fn param_args(&self) -> Vec<(&'static str, ParamValue)> {
        match self {
            Op::Const { .. }
            | Op::ReadState { .. }
            | Op::WriteState { .. }
            | Op::SliceUpdate { .. }
            | Op::Linear { .. }
            | Op::Unary { .. }
            | Op::Binary { .. }
            | Op::ConstexprBlockwiseShiftScale { .. }
            | Op::ConstexprLutToDense { .. } => vec![],
            Op::Conv { params, .. } => vec![
                (STRIDES, ints(&params.strides)),
                (PAD_TYPE, ParamValue::Str("custom".into())),
                (PAD, ints(&params.pad)),
                (DILATIONS, ints(&params.dilations)),
                (GROUPS, ParamValue::I32(params.groups as i32)),
            ],
            Op::Matmul {
                transpose_x,
                transpose_y,
                ..
            } => vec![
                (TRANSPOSE_X, ParamValue::Bool(*transpose_x)),
                (TRANSPOSE_Y, ParamValue::Bool(*transpose_y)),
            ],
            Op::Softmax { axis, .. } => vec![(AXIS, ParamValue::I32(*axis as i32))],
            Op::LayerNorm { axes, epsilon, .. } => {
                vec![(AXES, ints(axes)), (EPSILON, ParamValue::Float(*epsilon))]
            }
            Op::Reduce {
                axes, keep_dims, ..
            } => vec![
                (AXES, ints(axes)),
                (KEEP_DIMS, ParamValue::Bool(*keep_dims)),
            ],
            Op::Rsqrt { epsilon, .. } => vec![(EPSILON, ParamValue::Float(*epsilon))],
            Op::Gelu { mode, .. } => vec![(MODE, ParamValue::Str(mode.mil_name().into()))],
            Op::SliceByIndex {
                begin, end, stride, ..
            } => vec![
                (BEGIN, ints(begin)),
                (END, ints(end)),
                (STRIDE, ints(stride)),
            ],
            Op::Concat { axis, .. } => vec![
                (AXIS, ParamValue::I32(*axis as i32)),
                (INTERLEAVE, ParamValue::Bool(false)),
            ],
            Op::Split {
                split_sizes, axis, ..
            } => vec![
                (SPLIT_SIZES, ints(split_sizes)),
                (AXIS, ParamValue::I32(*axis as i32)),
            ],
            Op::Reshape { shape, .. } => vec![(SHAPE, ints(shape))],
            Op::Transpose { perm, .. } => vec![(PERM, ints(perm))],
            Op::ExpandDims { axes, .. } | Op::Squeeze { axes, .. } => vec![(AXES, ints(axes))],
            Op::Cast { dtype, .. } => vec![(DTYPE, ParamValue::Str(dtype.mil_name().into()))],
        }
    }

    /// Constant data carried by the op, in signature order (absent optional payloads left out).
    pub(crate) fn payload_args(&self) -> Vec<(&'static str, &TensorData)> {
        match self {
            Op::Const { value } => vec![(VAL, value)],
            Op::ConstexprBlockwiseShiftScale {
                data,
                scale,
                offset,
            } => {
                let mut v = vec![(DATA, data), (SCALE, scale)];
                v.extend(offset.as_ref().map(|o| (OFFSET, o)));
                v
            }
            Op::ConstexprLutToDense { indices, lut } => vec![(INDICES, indices), (LUT, lut)],
            Op::ReadState { .. }
            | Op::WriteState { .. }
            | Op::SliceUpdate { .. }
            | Op::Conv { .. }
            | Op::Matmul { .. }
            | Op::Linear { .. }
            | Op::Softmax { .. }
            | Op::LayerNorm { .. }
            | Op::Reduce { .. }
            | Op::Unary { .. }
            | Op::Rsqrt { .. }
            | Op::Gelu { .. }
            | Op::Binary { .. }
            | Op::SliceByIndex { .. }
            | Op::Concat { .. }
            | Op::Split { .. }
            | Op::Reshape { .. }
            | Op::Transpose { .. }
            | Op::ExpandDims { .. }
            | Op::Squeeze { .. }
            | Op::Cast { .. } => vec![],
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ir::op::{ConvParams, GeluMode};
    use crate::ir::signature::{OpKind, Slot};
    use crate::ir::types::DType;

    fn data(n: usize) -> TensorData {
        TensorData::f16_from_f32(vec![n], &vec![0.5; n]).unwrap()
    }

    /// One op of each kind with every optional argument bound.
    fn sample(kind: OpKind) -> Op {
        let (x, y, z, w) = (Var(0), Var(1), Var(2), Var(3));
        match kind {
            OpKind::Const => Op::Const { value: data(4) },
            OpKind::ReadState => Op::ReadState { input: x },
            OpKind::WriteState => Op::WriteState { input: x, data: y },
            OpKind::SliceUpdate => Op::SliceUpdate {
                x,
                update: y,
                begin: z,
                end: w,
            },
            OpKind::Conv => Op::Conv {
                x,
                weight: y,
                bias: Some(z),
                params: ConvParams::default(),
            },
            OpKind::Matmul => Op::Matmul {
                x,
                y,
                transpose_x: false,
                transpose_y: true,
            },
            OpKind::Linear => Op::Linear {
                x,
                weight: y,
                bias: Some(z),
            },
            OpKind::Softmax => Op::Softmax { x, axis: 1 },
            OpKind::LayerNorm => Op::LayerNorm {
                x,
                axes: vec![1],
                gamma: Some(y),
                beta: Some(z),
                epsilon: 1e-5,
            },
            OpKind::Reduce(kind) => Op::Reduce {
                kind,
                x,
                axes: vec![0],
                keep_dims: true,
            },
            OpKind::Unary(kind) => Op::Unary { kind, x },
            OpKind::Rsqrt => Op::Rsqrt { x, epsilon: 1e-6 },
            OpKind::Gelu => Op::Gelu {
                x,
                mode: GeluMode::TanhApproximation,
            },
            OpKind::Binary(kind) => Op::Binary { kind, x, y },
            OpKind::SliceByIndex => Op::SliceByIndex {
                x,
                begin: vec![0],
                end: vec![1],
                stride: vec![1],
            },
            OpKind::Concat => Op::Concat {
                values: vec![x, y],
                axis: 0,
            },
            OpKind::Split => Op::Split {
                x,
                split_sizes: vec![1, 1],
                axis: 0,
            },
            OpKind::Reshape => Op::Reshape { x, shape: vec![2] },
            OpKind::Transpose => Op::Transpose { x, perm: vec![0] },
            OpKind::ExpandDims => Op::ExpandDims { x, axes: vec![0] },
            OpKind::Squeeze => Op::Squeeze { x, axes: vec![0] },
            OpKind::Cast => Op::Cast {
                x,
                dtype: DType::F32,
            },
            OpKind::ConstexprBlockwiseShiftScale => Op::ConstexprBlockwiseShiftScale {
                data: data(4),
                scale: data(2),
                offset: Some(data(2)),
            },
            OpKind::ConstexprLutToDense => Op::ConstexprLutToDense {
                indices: data(4),
                lut: data(2),
            },
        }
    }

    fn names(slots: &[Slot]) -> Vec<&'static str> {
        slots.iter().map(|s| s.name).collect()
    }

    #[test]
    fn every_op_variant_round_trips_through_the_table() {
        for kind in OpKind::all() {
            let op = sample(kind);
            assert_eq!(op.kind(), kind);
            let sig = kind.signature();
            assert_eq!(op.mil_type(), sig.mil_type);
            let operands: Vec<_> = op.operand_args().iter().map(|(k, _)| *k).collect();
            assert_eq!(operands, names(sig.operands), "{kind:?} operands");
            let params: Vec<_> = op.param_args().iter().map(|(k, _)| *k).collect();
            assert_eq!(params, names(sig.params), "{kind:?} params");
            let payloads: Vec<_> = op.payload_args().iter().map(|(k, _)| *k).collect();
            assert_eq!(payloads, names(sig.payloads), "{kind:?} payloads");
        }
    }

    #[test]
    fn absent_optional_arguments_are_left_out_and_required_ones_never_are() {
        let without_optionals = [
            Op::Conv {
                x: Var(0),
                weight: Var(1),
                bias: None,
                params: ConvParams::default(),
            },
            Op::LayerNorm {
                x: Var(0),
                axes: vec![0],
                gamma: None,
                beta: None,
                epsilon: 0.0,
            },
            Op::ConstexprBlockwiseShiftScale {
                data: data(4),
                scale: data(2),
                offset: None,
            },
        ];
        for op in without_optionals {
            let sig = op.kind().signature();
            let required = |slots: &[Slot]| -> Vec<&'static str> {
                slots
                    .iter()
                    .filter(|s| s.is_required())
                    .map(|s| s.name)
                    .collect()
            };
            let operands: Vec<_> = op.operand_args().iter().map(|(k, _)| *k).collect();
            assert_eq!(operands, required(sig.operands), "{}", sig.mil_type);
            let payloads: Vec<_> = op.payload_args().iter().map(|(k, _)| *k).collect();
            assert_eq!(payloads, required(sig.payloads), "{}", sig.mil_type);
        }
    }
}
