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
